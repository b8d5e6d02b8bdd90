# SPDX-License-Identifier: Apache-2.0
"""Smoke test of bench/dcp_scale.py (what grows with the number of ranks, docs/scale.md): two
tiny simulated world sizes and a real 2-rank gather. It checks the command line it prints, that
the counts grow as the model says (one block per rank per sharded tensor, one data file and one
objects file per rank), and that the folder is left empty."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dcp_scale.py"


def _row(out: str, label: str) -> list:
    m = re.search(rf"^\| {re.escape(label)} \| (.*) \|$", out, re.M)
    assert m, label + "\n" + out
    return [c.strip() for c in m.group(1).split("|")]


def test_dcp_scale_counts_what_grows_with_the_ranks(tmp_path: Path) -> None:
    folder = tmp_path / "scale"
    args = ["--folder", str(folder), "--ranks", "1,4", "--layers", "1", "--gather_ranks", "2"]
    r = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.splitlines()[0] == f"command: {sys.executable} {BENCH} " + " ".join(args)
    # 1 layer: 12 parameters, 36 sharded state tensors and 12 replicated `step` scalars.
    assert _row(out, "tensor blocks in the manifest") == ["48", f"{36 * 4 + 12}"]
    # per rank: one data file and one objects file; plus dcp-metadata.pt and manifest.json
    assert _row(out, "files in the checkpoint directory") == ["4", f"{2 * 4 + 2}"]
    for label in ["coordinator: FastPersistWriter.finish (commit)",
                  "every rank of a load: FastPersistReader.read_metadata"]:
        assert all(re.fullmatch(r"\d+\.\d{3}", c) for c in _row(out, label + " (s)")), label
    assert re.search(r"^\| 1\.0 KB \| \d+\.\d{4} \|$", out, re.M), out
    assert list(folder.iterdir()) == [], "the benchmark leaves its folder empty"
