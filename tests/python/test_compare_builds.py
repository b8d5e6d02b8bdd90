# SPDX-License-Identifier: Apache-2.0
"""bench/compare_builds.py: interleaved runs of two builds, whose script each one runs, the
table of medians, and the real benchmarks' --json output it reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPARE = REPO / "bench" / "compare_builds.py"

# A benchmark whose numbers depend on the build running it (FAKE_BUILD, set by the interpreter
# wrappers below): the baseline gives speed 2.0 +- 10% and latency 1 s, the candidate 1.5x the
# speed and half the latency. Every run appends "build script-tree" to <folder>/order.txt.
FAKE_BENCH = '''
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--folder", required=True)
p.add_argument("--json", required=True)
p.add_argument("--fail-under", default="")
args = p.parse_args()
build = os.environ["FAKE_BUILD"]
if build == args.fail_under or build == os.environ.get("FAIL_UNDER"):
    print("boom: this script does not work with the " + build + " package", file=sys.stderr)
    sys.exit(3)
order = os.path.join(args.folder, "order.txt")
tree = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(order, "a") as f:
    f.write(build + " " + tree + "\\n")
n = sum(1 for line in open(order) if line.startswith(build + " "))
jitter = [1.0, 1.1, 0.9][(n - 1) % 3]
speed = (2.0 if build == "baseline" else 3.0) * jitter
latency = 1.0 if build == "baseline" else 0.5
json.dump({"metrics": {
    "speed": {"unit": "GB/s", "higher_is_better": True, "values": [speed]},
    "latency": {"unit": "s", "higher_is_better": False, "values": [latency]},
}}, open(args.json, "w"))
'''
NO_JSON_BENCH = '''
import argparse
p = argparse.ArgumentParser()
p.add_argument("--folder", required=True)
p.parse_args()
'''


def make_tree(root: Path, build: str, bench_source: str = FAKE_BENCH) -> Path:
    """A checkout with bench/fake_bench.py and a .venv/bin/python that runs this interpreter as
    `build` (so the package under test is the same, and the scripts tell the builds apart)."""
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "fake_bench.py").write_text(bench_source)
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    python = venv_bin / "python"
    python.write_text(f'#!/bin/sh\nFAKE_BUILD={build} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return root


def compare(tmp_path: Path, *args: str, env_extra: dict | None = None,
            baseline_source: str = FAKE_BENCH) -> subprocess.CompletedProcess:
    base = make_tree(tmp_path / "base", "baseline", baseline_source)
    cand = make_tree(tmp_path / "cand", "candidate")
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, str(COMPARE), "bench/fake_bench.py",
         "--baseline", str(base / ".venv" / "bin" / "python"),
         "--candidate", str(cand / ".venv" / "bin" / "python"),
         "--candidate-tree", str(cand), "--folder", str(tmp_path / "data"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=300)


def order(tmp_path: Path, folder: str = "data") -> List[str]:
    return (tmp_path / folder / "order.txt").read_text().splitlines()


def test_rounds_interleave_and_the_table_gives_medians_ratio_and_spread(tmp_path):
    r = compare(tmp_path, "--rounds", "3", "--scripts", "candidate", "--json",
                str(tmp_path / "out.json"))
    assert r.returncode == 0, r.stderr
    assert order(tmp_path) == ["baseline cand", "candidate cand", "candidate cand",
                               "baseline cand", "baseline cand", "candidate cand"]
    assert "interleaved AB BA AB (A = baseline)" in r.stdout
    apart = "better: ranges apart (10% by chance)"  # 2 of the 20 ways to split 6 values 3 / 3
    speed = f"| speed | GB/s | 2 | 3 | 1.500 | 1.8–2.2 (20%) | 2.7–3.3 (20%) | {apart} |"
    latency = ("| latency | s, lower is better | 1 | 0.5 | 0.500 | 1–1 (0%) | 0.5–0.5 (0%) "
               f"| {apart} |")
    assert speed in r.stdout and latency in r.stdout
    assert "reproduce (from " in r.stdout and "compare_builds.py bench/fake_bench.py" in r.stdout
    rows = {row["metric"]: row for row in json.loads((tmp_path / "out.json").read_text())["rows"]}
    assert rows["speed"]["baseline_values"] == pytest.approx([2.0, 2.2, 1.8])
    assert rows["speed"]["candidate_values"] == pytest.approx([3.0, 3.3, 2.7])


def test_overlapping_ranges_are_not_called_better_or_worse(tmp_path):
    # A/A: the same build on both sides.
    base = make_tree(tmp_path / "base", "baseline")
    python = str(base / ".venv" / "bin" / "python")
    r = subprocess.run([sys.executable, str(COMPARE), "bench/fake_bench.py", "--baseline", python,
                        "--candidate", python, "--candidate-tree", str(base), "--rounds", "2",
                        "--scripts", "candidate", "--folder", str(tmp_path / "data")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| speed | GB/s | 2 | 2 | 1.000 |" in r.stdout
    table = r.stdout.split("| metric |")[1]
    assert "| ranges overlap |" in table and "ranges apart (" not in table


def test_own_scripts_run_each_trees_script(tmp_path):
    r = compare(tmp_path, "--rounds", "1", "--scripts", "own")
    assert r.returncode == 0, r.stderr
    assert order(tmp_path) == ["baseline base", "candidate cand"]
    assert "each build runs its own tree's (--scripts own)" in r.stdout


def test_auto_runs_the_candidates_script_for_both_when_the_probe_passes(tmp_path):
    r = compare(tmp_path, "--rounds", "1")
    assert r.returncode == 0, r.stderr
    assert order(tmp_path, "data/compare-probe") == ["baseline cand"]
    assert order(tmp_path) == ["baseline cand", "candidate cand"]
    assert "both builds run the candidate's: it ran under the baseline's package" in r.stdout


def test_auto_falls_back_to_own_scripts_when_the_candidates_fails_under_the_baseline(tmp_path):
    # Only the candidate tree's script fails under the baseline: its copy in the baseline tree
    # ignores FAIL_UNDER.
    r = compare(tmp_path, "--rounds", "1", env_extra={"FAIL_UNDER": "baseline"},
                baseline_source=FAKE_BENCH.replace('os.environ.get("FAIL_UNDER")', "None"))
    assert r.returncode == 0, r.stderr
    assert order(tmp_path) == ["baseline base", "candidate cand"]
    assert "each build runs its own tree's (the candidate's script failed under the baseline" \
        in r.stdout
    assert "boom: this script does not work with the baseline package" in r.stdout


def test_a_baseline_script_without_json_output_is_a_clear_error(tmp_path):
    r = compare(tmp_path, "--rounds", "1", env_extra={"FAIL_UNDER": "baseline"},
                baseline_source=NO_JSON_BENCH)
    assert r.returncode == 1
    assert "has no --json output" in r.stderr


def test_a_failing_run_stops_the_comparison_with_its_error(tmp_path):
    r = compare(tmp_path, "--rounds", "2", "--scripts", "candidate", "--", "--fail-under",
                "candidate")
    assert r.returncode == 1
    assert "round1 candidate failed (exit 3)" in r.stderr
    assert "boom: this script does not work with the candidate package" in r.stderr
    assert order(tmp_path) == ["baseline cand"], "the run stops at the first failure"


def _direct_io_works(folder: Path) -> bool:
    try:
        fd = os.open(folder / "probe", os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    return True


def _tiny_model_benchmark_ready(folder: Path) -> None:
    pytest.importorskip("transformers")
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (apt-get install fio)")
    if not _direct_io_works(folder):
        pytest.skip(f"{folder}: the filesystem refuses O_DIRECT, which fio's reference needs")


def _compare_a_a(tmp_path: Path, script: str) -> dict:
    """The real script, A/A with this interpreter, tiny-t5, one round: {metric: row}."""
    _tiny_model_benchmark_ready(tmp_path)
    out = tmp_path / "out.json"
    r = subprocess.run(
        [sys.executable, str(COMPARE), script, "--baseline", sys.executable, "--candidate",
         sys.executable, "--candidate-tree", str(REPO), "--rounds", "1", "--scripts", "candidate",
         "--model", "tiny-t5", "--folder", str(tmp_path / "data"), "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return {row["metric"]: row for row in json.loads(out.read_text())["rows"]}


def test_several_scripts_prefix_their_metrics_with_the_scripts_name(tmp_path):
    cand = make_tree(tmp_path / "cand", "candidate")
    shutil.copy(cand / "bench" / "fake_bench.py", cand / "bench" / "other_bench.py")
    python = str(cand / ".venv" / "bin" / "python")
    r = subprocess.run([sys.executable, str(COMPARE), "bench/fake_bench.py",
                        "bench/other_bench.py", "--baseline", python, "--candidate", python,
                        "--candidate-tree", str(cand), "--rounds", "1", "--scripts", "candidate",
                        "--folder", str(tmp_path / "data")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| fake_bench: speed | GB/s |" in r.stdout
    assert "| other_bench: speed | GB/s |" in r.stdout
    assert len(order(tmp_path)) == 4, "each build runs both scripts once"


def test_manager_bench_reads_checkpoint_files_smaller_than_fios_block(tmp_path):
    """tiny-t5's data file (0.9 MB) made fio's 8 MiB-block read fail; every metric the lead
    compares is measured under both builds, and save_async's blocking is over the sync save's
    time (it was divided by the save without checksums, which --no-references leaves out)."""
    rows = _compare_a_a(tmp_path, "bench/checkpoint_manager_bench.py")
    for name in ["save", "save_async_block", "load", "load_into", "verify", "fio_write",
                 "fio_read"]:
        row = rows[name]
        assert row["baseline_values"] and row["candidate_values"], name
        assert all(v > 0 for v in row["baseline_values"] + row["candidate_values"]), name
    assert "st_load" not in rows and "save_nock" not in rows, "--no-references leaves them out"
    assert rows["save_async_block"]["higher_is_better"] is False
    data = json.loads(next((tmp_path / "data").glob("compare-builds-*/01-*.json")).read_text())
    m = {k: v["values"][0] for k, v in data["metrics"].items()}
    save_seconds = data["bytes"] / 1e9 / m["save"]
    assert m["save_block"] == pytest.approx(m["save_async_block"] / save_seconds, rel=1e-6)


def test_checkpoint_vs_fio_survives_a_model_too_small_to_print_its_size(tmp_path):
    """tiny-t5's checkpoint prints as 0.00 GB, which made a rate of 0 and a division by zero."""
    rows = _compare_a_a(tmp_path, "bench/checkpoint_vs_fio.py")
    for tag in ["fio write", "test_ds_aio_fast_save", "fastpersist_load", "torch_load"]:
        assert rows[f"tiny-t5: {tag}"]["candidate_values"], tag
