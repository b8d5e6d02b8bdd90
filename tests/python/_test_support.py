# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by several test files: a loop-mounted ext4 for real ENOSPC, finding the
`fastpersist` CLI binary, and the small training states of the tier tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_quiet(cmd: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


@contextlib.contextmanager
def loop_ext4(base: Path, size: str) -> Iterator[Path]:
    """An ext4 filesystem of `size` (4 KiB blocks) on a loop device under `base`, mounted for
    the block and always unmounted afterwards. Skips the test where that is impossible."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop ext4 image needs root")
    if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
        pytest.skip("mkfs.ext4 or mount not installed (apt-get install e2fsprogs mount)")
    img, mnt = base / "img", base / "mnt"
    mnt.mkdir()
    for cmd in (["truncate", "-s", size, str(img)], ["mkfs.ext4", "-q", "-F", "-b", "4096", str(img)]):
        r = run_quiet(cmd)
        if r.returncode != 0:
            pytest.skip(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    r = run_quiet(["mount", "-o", "loop", str(img), str(mnt)])
    if r.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if run_quiet(["umount", str(mnt)]).returncode != 0:
            run_quiet(["umount", "-l", str(mnt)])


def find_cli() -> Optional[str]:
    """$FASTPERSIST_CLI, else build/tools/fastpersist, else `fastpersist` on PATH."""
    candidates = (os.environ.get("FASTPERSIST_CLI"), ROOT / "build" / "tools" / "fastpersist",
                  shutil.which("fastpersist"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def tier_state(step: int, n: int = 50_000) -> Dict[str, Any]:
    """A small model-and-optimizer state whose bytes depend on `step` (the tier tests)."""
    import torch

    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(n, generator=g), "b": torch.arange(7, dtype=torch.int64) + step},
            "optim": {"lr": 0.1 * step, "m": torch.randn(n // 2, generator=g).to(torch.bfloat16)},
            "step": step}


def assert_same_state(a: Any, b: Any) -> None:
    """`a` and `b` hold the same keys, tensors (dtype, shape, bytes) and values."""
    import torch

    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            assert_same_state(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    else:
        assert a == b
