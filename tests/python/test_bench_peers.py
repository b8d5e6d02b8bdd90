# SPDX-License-Identifier: Apache-2.0
"""``python -m fastpersist.bench peers``: one real run over every case on a small flat workload
(real files, real torch, safetensors, DCP, DeepSpeed and fio where installed), its outputs, and
the pieces it is made of (workload checks, medians and ratios, targets, the Markdown section)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from fastpersist.bench import peers, peers_report, workloads
from fastpersist.bench.peers_cli import LOAD_KEYS, SAVE_KEYS


def _peers(args: List[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "fastpersist.bench", "peers", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Dict[str, Any]:
    folder = tmp_path_factory.mktemp("peers")
    out = tmp_path_factory.mktemp("peers-out")
    md = out / "bench.md"
    md.write_text("# Benchmarks\n\nkept text\n")
    args = ["--folder", str(folder), "--size", "48MiB", "--rounds", "2", "--dcp-threads", "1", "2",
            "--json", str(out / "peers.json"), "--markdown", str(md)]
    if shutil.which("fio") is None:
        args += ["--fio", ""]
    have_plot = True
    try:
        import matplotlib  # noqa: F401
        args += ["--plot", str(out / "peers.png")]
    except ImportError:
        have_plot = False
    done = _peers(args)
    return {"done": done, "folder": folder, "out": out, "md": md, "plot": have_plot}


def test_every_case_runs_twice_and_is_reported(run) -> None:
    done = run["done"]
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((run["out"] / "peers.json").read_text())
    assert doc["benchmark"] == "peers" and doc["rounds"] == 2
    cases = {c["key"]: c for c in doc["cases"]}
    expected = set(SAVE_KEYS + LOAD_KEYS)
    if shutil.which("fio") is None:
        expected -= {"fio_write", "fio_read"}
    assert set(cases) == expected
    ours = {k for k, c in cases.items() if c["ours"]}
    assert ours == {"fastpersist_save", "manager_save", "manager_save_async", "fastpersist_load",
                    "manager_load", "manager_load_into"}
    for key, c in cases.items():
        if c["skipped"]:
            # Only an optional peer may be missing, and then it says why.
            assert key in ("deepspeed_save", "safetensors_save", "safetensors_load"), c
            continue
        assert len(c["samples"]) == 2, key
        rates = sorted(c["bytes"] / 1e9 / s["seconds"] for s in c["samples"])
        assert c["gb_per_s"] == pytest.approx(sum(rates) / 2), key  # the median of two
        assert c["cpu_seconds_per_gb"] >= 0
        assert c["name"] in done.stdout, key
    assert cases["manager_save_async"]["blocking_seconds"] <= cases["manager_save_async"]["seconds"]
    assert cases["torch_save"]["durable"] is False
    # DCP ran at the thread_count that was fastest in the set-up, among those given.
    assert any(f"thread_count {n})" in cases["dcp_save"]["name"] for n in (1, 2))
    if "fio_write" in cases:
        assert cases["fio_write"]["of_limit"] == pytest.approx(1.0)
        assert cases["fastpersist_save"]["of_limit"] == pytest.approx(
            cases["fastpersist_save"]["gb_per_s"] / cases["fio_write"]["gb_per_s"])
    # The run's own folder is gone; the given folder is left as it was.
    assert list(run["folder"].iterdir()) == []


def test_markdown_and_plot(run) -> None:
    assert run["done"].returncode == 0, run["done"].stderr[-3000:]
    text = run["md"].read_text()
    assert text.startswith("# Benchmarks\n\nkept text\n")
    assert "<!-- peers:flat-48MiB:begin -->" in text and "<!-- peers:flat-48MiB:end -->" in text
    assert "| CheckpointManager.save [ours] |" in text and "- cpu: " in text
    assert "python -m fastpersist.bench peers --folder" in text
    if run["plot"]:
        assert (run["out"] / "peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_section_is_replaced_in_place(tmp_path: Path) -> None:
    md = tmp_path / "b.md"
    md.write_text("intro\n")
    peers_report.write_markdown(str(md), "flat-1GiB", "first table")
    peers_report.write_markdown(str(md), "gpt2-large", "model table")
    peers_report.write_markdown(str(md), "flat-1GiB", "second table")
    text = md.read_text()
    assert "first table" not in text and text.count("second table") == 1
    assert text.index("second table") < text.index("model table")  # stayed where it was
    assert text.startswith("intro\n")


def _result(key: str, kind: str, seconds: List[float], nbytes: int = 2 * 10**9, **kw: Any) -> peers.CaseResult:
    case = peers.Case(key, key, kind, lambda: None, **kw)
    return peers.CaseResult(case, nbytes, [peers.Sample(s, s / 2, 100) for s in seconds])


def test_ratios_are_of_medians_against_the_fastest_durable_peer() -> None:
    results = [
        _result("torch_save", "save", [0.5, 0.5, 0.5], durable=False),  # 4 GB/s, not durable
        _result("deepspeed_save", "save", [2.0, 1.0, 4.0]),  # median 1 GB/s... of 2, 1, 0.5
        _result("fastpersist_save", "save", [1.0, 0.8, 2.0], ours=True),  # 2 GB/s
        _result("fio_write", "save", [0.5, 0.5, 0.4], limit=True),  # 4 GB/s
        _result("safetensors_load", "load", [1.0]),
        _result("manager_load", "load", [], ours=True, skipped="failed: OSError: boom"),
    ]
    rows = peers_report.summarize(results)
    by = {r.case.key: r for r in rows["save"] + rows["load"]}
    assert by["deepspeed_save"].rate == pytest.approx(1.0)
    assert by["fastpersist_save"].rate == pytest.approx(2.0)
    assert by["fastpersist_save"].vs_peer == pytest.approx(2.0)  # not against torch_save
    assert by["torch_save"].vs_peer == pytest.approx(4.0)
    assert by["fastpersist_save"].of_limit == pytest.approx(0.5)
    assert by["fio_write"].vs_peer is None
    assert by["fastpersist_save"].cpu_per_gb == pytest.approx(0.5 / 2)
    assert by["manager_load"].rate is None
    table = peers_report.tables(rows)
    assert "failed: OSError: boom" in table
    verdicts = {t[0]: t for t in peers_report.targets(rows)}
    assert verdicts["best save / DeepSpeed FastFileWriter"][3:] == ["2.00", "≥ 1.3", "pass"]
    assert verdicts["best save / fio's best O_DIRECT write"][-1] == "FAIL"
    assert "best load / fio's best O_DIRECT read" not in verdicts  # no fio read measured


def test_workload_check_catches_a_changed_byte() -> None:
    wl = workloads.flat(3 * (1 << 20) + 6)
    assert {t.dtype for t in wl.tensors.values()} <= {torch.float32, torch.bfloat16, torch.float16,
                                                      torch.int64}
    assert wl.nbytes <= 3 * (1 << 20) + 6
    copy = {k: v.clone() for k, v in wl.tensors.items()}
    wl.check(copy, "clone")
    name = next(iter(copy))
    copy[name].view(torch.uint8)[123] ^= 1
    with pytest.raises(AssertionError, match="differs"):
        wl.check(copy, "flipped")
    del copy[name]
    with pytest.raises(AssertionError, match="missing"):
        wl.check(copy, "short")


@pytest.mark.parametrize("args, message", [
    (["--folder", "/nonexistent-peers"], "is not a directory"),
    (["--size", "lots"], "--size"),
    (["--workload", "resnet"], "--workload"),
    (["--rounds", "0"], "--rounds"),
    (["--dcp-threads", "0"], "--dcp-threads"),
    (["--json", "/nonexistent-dir/x.json"], "--json"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path, args: List[str], message: str) -> None:
    base = [] if "--folder" in args else ["--folder", str(tmp_path)]
    done = _peers(base + args, timeout=120)
    assert done.returncode != 0
    assert message in done.stderr
    assert list(tmp_path.iterdir()) == []
