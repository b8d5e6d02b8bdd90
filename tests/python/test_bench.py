# SPDX-License-Identifier: Apache-2.0
"""Smoke tests of ``python -m fastpersist.bench``: the output lines other tools parse, and the
round trip through every save mechanism giving the same model outputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

RESULT = r"-- \d+\.\d\d GB, \d+\.\d\d secs, \d+\.\d\d GB/s$"
TAGS_WITH_RESULTS = ["test_save", "test_save_fsync", "test_ds_mock_save", "test_ds_py_save",
                     "test_ds_aio_fast_save"]


def _bench(args: List[str], folder: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fastpersist.bench", *args, "--folder",
                             str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory) -> Dict[str, subprocess.CompletedProcess]:
    """`tensor` and `model` started together (two cores; only the output format is checked)."""
    pytest.importorskip("transformers")
    runs = {"tensor": ["tensor", "--mb_size", "8"],
            "model": ["model", "--model", "tiny-t5", "--optimizer"]}
    folders = {name: tmp_path_factory.mktemp(name) for name in runs}
    procs = {name: (args, _bench(args, folders[name])) for name, args in runs.items()}
    out = {}
    for name, (args, p) in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            pytest.fail(f"python -m fastpersist.bench {' '.join(args)} hangs")
        out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
        out[name].folder = folders[name]
    return out


def _lines(text: str) -> Dict[str, str]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+) -- ", line)
        if m:
            out[m.group(1)] = line
    return out


@pytest.mark.parametrize("run", ["tensor", "model"])
def test_bench_prints_one_line_per_tag(bench_runs, run):
    r = bench_runs[run]
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("# python -m fastpersist.bench " + run), "the reproducing command"
    lines = _lines(r.stdout)
    # The first mechanism ran once, untimed, before the first measured line.
    out = r.stdout.splitlines()
    warmup = [i for i, line in enumerate(out) if line == "# warm-up, untimed: test_save"]
    first_result = min(i for i, line in enumerate(out) if re.match(r"^\w+ -- ", line))
    assert warmup and warmup[0] < first_result, r.stdout
    for tag in TAGS_WITH_RESULTS:
        assert tag in lines, f"no line for {tag}:\n{r.stdout}"
        assert re.match(f"^{tag} {RESULT}", lines[tag]), lines[tag]
    assert re.match(r"^test_ds_gds_fast_save -- skipped: \S.*$", lines["test_ds_gds_fast_save"])
    ds = lines.get("deepspeed_fast_save", "")
    assert re.match(f"^deepspeed_fast_save ({RESULT}|-- skipped: \\S.*$)", ds), r.stdout


def test_bench_leaves_no_files(bench_runs):
    for name, r in bench_runs.items():
        assert list(r.folder.iterdir()) == [], f"{name} left files in its folder"


@pytest.mark.parametrize("variant", [[], ["--regular_torch_save"], ["--safetensors"]],
                         ids=["fastpersist", "torch", "safetensors"])
def test_roundtrip_outputs_match(tmp_path, capsys, variant):
    """In-process (the model code is already imported): save, load into a model with other
    weights, same outputs."""
    pytest.importorskip("transformers")
    if "--safetensors" in variant:
        pytest.importorskip("safetensors")
    from fastpersist.bench.__main__ import main

    rc = main(["roundtrip", "--model", "tiny-t5", "--folder", str(tmp_path), *variant])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"^roundtrip tiny-t5: .*outputs match$", out, re.M), out
    assert list(tmp_path.iterdir()) == []


def test_unknown_folder_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fastpersist.bench", "tensor", "--mb_size", "1",
                        "--folder", str(tmp_path / "missing")], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode != 0 and "not a directory" in r.stderr and "Traceback" not in r.stderr



def test_deepspeed_bench_prints_the_seed_lines_and_a_table(tmp_path):
    """`python -m fastpersist.bench deepspeed` on a real DeepSpeed engine (tiny-t5, ZeRO 1, one
    rank): the seed's line for each engine it can build, durable or not said on each, DeepSpeed's
    FastCheckpointEngine shown with the reason when it cannot be built, and the table."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    pytest.importorskip("transformers")
    import os

    env = dict(os.environ, DS_ACCELERATOR="cpu")
    r = subprocess.run([sys.executable, "-m", "fastpersist.bench", "deepspeed", "--model",
                        "tiny-t5", "--optimizer", "--zero_stage", "1", "--folder", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=env, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for tag, durable in (("ds_torch_engine", "not durable"), ("ds_torch_engine_fsync", "durable"),
                         ("fastpersist", "durable"), ("fastpersist_async", "durable at the next step"),
                         ("fastpersist_zstd", "durable"), ("fastpersist_incremental", "durable")):
        assert re.search(rf"^{tag} {RESULT[:-1]} \[{durable}\]$", out, re.M), (tag, out)
    assert re.search(r"^ds_fast_engine -- (skipped: .+|\d+\.\d\d GB, .+)$", out, re.M), out
    assert re.search(r"^fastpersist_async -- save_checkpoint blocked \d+\.\d\d secs", out, re.M)
    assert re.search(r"^fastpersist_incremental -- with no step since the base, \d+\.\d\d GB",
                     out, re.M), out
    assert "load +GB" in out and "vs torch+fsync" in out
    # Every tag was removed after its load; what stays is DeepSpeed's scripts and latest files.
    left = sorted(p.name for p in (tmp_path / "ds_tiny-t5").iterdir() if p.is_dir())
    assert left == [], left
