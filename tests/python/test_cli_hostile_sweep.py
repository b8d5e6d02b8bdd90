# SPDX-License-Identifier: Apache-2.0
"""Every CLI subcommand that reads a path, on every hostile input the fuzz corpora hold (issue
38, section 5): a clear line or a short plain list on stderr, exit code 0, 1 or 2; never a
traceback, an abort or a signal. The inputs are the corpora's ``regression-*`` files (each once
broke a reader) placed where a subcommand finds them: a checkpoint's manifest, a DCP
directory's ``.metadata``, a DeepSpeed tag's state file, a ``.pt`` or ``.safetensors`` file;
plus a path that does not exist, a FIFO and a link loop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
import torch

import fastpersist
from _test_support import find_cli

CLI = find_cli()
pytestmark = pytest.mark.skipif(CLI is None, reason="the fastpersist CLI is not built")
CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
MAX_STDERR_LINES = 12


def regressions(target: str) -> List[Path]:
    return sorted((CORPUS / target).glob("regression-*"))


def hostile_inputs(tmp: Path) -> List[Tuple[str, Path]]:
    """(what, path) for each hostile input, laid out where the CLI reads it."""
    out: List[Tuple[str, Path]] = []
    for i, bad in enumerate(regressions("manifest")):
        root = tmp / f"root-{i}"
        with fastpersist.CheckpointManager(root, durable=False) as mgr:
            mgr.save("s1", {"w": torch.arange(8.0)})
        (root / "s1" / "manifest.json").write_bytes(bad.read_bytes())
        out += [(f"root with manifest {bad.name}", root), (f"checkpoint with manifest {bad.name}", root / "s1")]
    for i, bad in enumerate(regressions("py_dcp_metadata")):
        folder = tmp / f"dcp-{i}"
        folder.mkdir()
        (folder / ".metadata").write_bytes(bad.read_bytes())
        with open(folder / "__0_0.distcp", "wb") as f:
            f.truncate(1 << 20)
        out.append((f"DCP directory with .metadata {bad.name}", folder))
    for i, bad in enumerate(regressions("py_deepspeed_states")):
        folder = tmp / f"ds-{i}"
        (folder / "global_step1").mkdir(parents=True)
        (folder / "latest").write_text("global_step1")
        for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
            (folder / "global_step1" / name).write_bytes(bad.read_bytes())
        out.append((f"DeepSpeed folder with {bad.name}", folder))
    for bad in regressions("py_dcp_value") + regressions("py_deepspeed_states"):
        path = tmp / f"{bad.parent.name}-{bad.name}.pt"
        path.write_bytes(bad.read_bytes())
        out.append((f"torch file {path.name}", path))
    for bad in regressions("safetensors_header") or sorted((CORPUS / "safetensors_header").glob("seed-huge-*")):
        path = tmp / f"{bad.name}.safetensors"
        path.write_bytes(bad.read_bytes())
        out.append((f"safetensors file {bad.name}", path))
    fifo = tmp / "fifo.pt"
    os.mkfifo(fifo)
    loop = tmp / "loop"
    loop.symlink_to(loop)
    out += [("a FIFO", fifo), ("a link loop", loop), ("a missing path", tmp / "missing")]
    return out


def commands(path: Path, tmp: Path) -> List[List[str]]:
    out = tmp / "out"
    return [["list", str(path)], ["inspect", str(path)], ["verify", str(path)],
            ["prune", str(path), "--keep-last", "1", "--dry-run"], ["clean", str(path), "--dry-run"],
            ["convert", str(path), str(out / "x.safetensors")], ["convert", str(path), str(out / "x.pt")]]


def run(argv: List[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    env["FASTPERSIST_PYTHON"] = sys.executable  # convert runs this interpreter's fastpersist
    return subprocess.run([str(CLI), *argv], capture_output=True, text=True, timeout=600,
                          check=False, stdin=subprocess.DEVNULL, env=env)


def test_every_subcommand_on_every_hostile_input_says_it_plainly(tmp_path: Path) -> None:
    ran = 0
    for what, path in hostile_inputs(tmp_path):
        for argv in commands(path, tmp_path):
            r = run(argv)
            where = f"fastpersist {' '.join(argv[:1])} on {what}: exit {r.returncode}\n{r.stderr}"
            assert r.returncode in (0, 1, 2), where
            assert "Traceback" not in r.stderr and "terminate called" not in r.stderr, where
            assert len(r.stderr.splitlines()) <= MAX_STDERR_LINES, where
            if r.returncode != 0:  # verify reports damage on stdout; errors go to stderr
                assert (r.stderr + r.stdout).strip(), f"{where}: failed without saying why"
            ran += 1
    assert ran >= 100
