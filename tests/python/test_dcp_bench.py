# SPDX-License-Identifier: Apache-2.0
"""Smoke test of bench/dcp_bench.py (DCP saves and loads, fastpersist's plug-in against DCP's
FileSystemWriter/Reader): a tiny state on 2 real ranks, 1 round. It checks the command line it
prints, a row for every variant, the targets, and that the folder is left empty; the numbers
mean nothing at this size."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dcp_bench.py"
RATE = r"\d+\.\d\d \| \d+\.\d\d"


def test_dcp_bench_runs_every_variant_on_two_ranks(tmp_path: Path) -> None:
    folder = tmp_path / "dcp"
    args = ["--folder", str(folder), "--size_gb", "0.01", "--tensor_mib", "1,2", "--ranks", "2",
            "--rounds", "1", "--threads", "1,2", "--no_fio"]
    r = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.splitlines()[0] == f"command: {sys.executable} {BENCH} " + " ".join(args)
    for op in ["save fastpersist", "save fastpersist: first in process", "save fastpersist 256MiB",
               "save fs t1", "save fs t2", "load fastpersist", "load fs"]:
        assert re.search(rf"^\| {re.escape(op)} \(GB/s\) \| {RATE} \|$", out, re.M), op + "\n" + out
    for op in ["async_save fastpersist: blocked", "async_save fastpersist: committed",
               "async_save fastpersist: first in process: blocked"]:
        assert re.search(rf"^\| {re.escape(op)} \(s\) \| {RATE} \|$", out, re.M), op + "\n" + out
    for target in ["save fastpersist / fs t1 ≥ 3.0", "save fastpersist / fs best thread_count ≥ 1.3",
                   "load fastpersist / fs ≥ 1.5"]:
        assert re.search(rf"^\| {re.escape(target)} \| \d+\.\d\d \(\d+\.\d\d\) (yes|NO) \|$", out,
                         re.M), target + "\n" + out
    assert re.search(r"^\| best thread_count \(median\) \| [12] \|$", out, re.M), out
    assert "fio read" not in out
    assert list(folder.iterdir()) == [], "the benchmark leaves its folder empty"


def test_dcp_bench_refuses_a_folder_with_files(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    r = subprocess.run([sys.executable, str(BENCH), "--folder", str(tmp_path), "--rounds", "1"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode != 0 and "is not empty" in r.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"
