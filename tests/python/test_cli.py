# SPDX-License-Identifier: Apache-2.0
"""The `fastpersist` command-line tool: report, io-bench, argument errors.

Runs the built executable in a subprocess. Found via $FASTPERSIST_CLI, else build/tools/fastpersist
in this checkout, else `fastpersist` on PATH (what `pip install .` provides).
"""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from _test_support import find_cli

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("io_uring", "libaio", "threads")


CLI = find_cli()
pytestmark = pytest.mark.skipif(
    CLI is None,
    reason="fastpersist CLI not built: set FASTPERSIST_CLI or build build/tools/fastpersist")


def run_cli(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    full_env.update(env or {})
    return subprocess.run([CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300, env=full_env)


@pytest.fixture(scope="module")
def report():
    proc = run_cli("report", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def available(report, backend):
    return next(b for b in report["backends"] if b["name"] == backend)


# --- report -----------------------------------------------------------------------------------

def test_report_lists_every_backend_as_okay_or_no(tmp_path):
    proc = run_cli("report", "--folder", tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in BACKENDS:
        assert re.search(rf"^{name} \.+ \[(OKAY|NO)\] \S", proc.stdout, re.MULTILINE), proc.stdout
    assert "auto picks" in proc.stdout
    assert "O_DIRECT" in proc.stdout and "memlock limit" in proc.stdout
    assert "CUDA runtime" in proc.stdout and "cuFile" in proc.stdout


def test_report_json_matches_text(report, tmp_path):
    assert [b["name"] for b in report["backends"]] == list(BACKENDS)
    assert available(report, "threads")["available"], "the thread pool backend is always available"
    for b in report["backends"]:
        assert b["reason"], f"{b['name']} has no reason"
        if not b["available"]:
            assert not b["built_in"] or b["reason"]
    assert report["auto"]["backend"] in BACKENDS
    assert available(report, report["auto"]["backend"])["available"]
    for key in ("version", "folder", "memlock", "cuda_runtime", "cufile", "build"):
        assert key in report
    assert isinstance(report["build"]["io_uring"], bool)

    text = run_cli("report", "--folder", tmp_path).stdout
    for b in report["backends"]:
        status = "[OKAY]" if b["available"] else "[NO]"
        assert re.search(rf"^{b['name']} \.+ {re.escape(status)}", text, re.MULTILINE)


def test_report_probes_the_given_folder(tmp_path):
    proc = run_cli("report", "--json", "--folder", tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = json.loads(proc.stdout)["folder"]
    assert folder["path"] == str(tmp_path)
    if folder["direct_io"]:
        assert folder["offset_alignment"] >= 512 and folder["memory_alignment"] >= 1
    else:
        assert folder["fallback_reason"]
    assert list(tmp_path.iterdir()) == [], "the probe must not leave files behind"


def test_version_flag_matches_report(report):
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == report["version"]


# --- io-bench ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend_name", BACKENDS)
def test_io_bench_write_each_backend(report, backend_name, tmp_path):
    probe = available(report, backend_name)
    if not probe["available"]:
        pytest.skip(f"{backend_name} unavailable here: {probe['reason']}")
    proc = run_cli("io-bench", "--folder", tmp_path, "--size", "64MiB", "--loops", "2",
                   "--backend", backend_name)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"backend: {backend_name} " in out
    assert re.search(r"^loop 1: \d+\.\d\d GB/s \(\d+\.\d\d s\)$", out, re.MULTILINE), out
    assert re.search(r"^loop 2: ", out, re.MULTILINE)
    assert re.search(r"^best: \d+\.\d\d GB/s$", out, re.MULTILINE), out
    assert "GB = 1e9 bytes" in out
    assert list(tmp_path.iterdir()) == [], "io-bench must remove its file"


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_io_bench_read_json(report, backend_name, tmp_path):
    probe = available(report, backend_name)
    if not probe["available"]:
        pytest.skip(f"{backend_name} unavailable here: {probe['reason']}")
    proc = run_cli("io-bench", "--folder", tmp_path, "--size", "16MiB", "--loops", "2", "--read",
                   "--backend", backend_name, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["op"] == "read" and result["backend"] == backend_name
    assert result["size"] == 16 << 20
    assert len(result["loops"]) == 2
    assert result["best_gb_per_s"] == max(loop["gb_per_s"] for loop in result["loops"]) > 0
    assert result["stats"]["direct_bytes"] + result["stats"]["buffered_bytes"] == 2 * (16 << 20)
    assert list(tmp_path.iterdir()) == []


def test_io_bench_defaults_and_flags(tmp_path):
    proc = run_cli("io-bench", "--folder", tmp_path, "--size", "8MiB", "--loops", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    settings = (r["op"], r["block_size"], r["queue_depth"], r["intra_op_parallelism"])
    assert settings == ("write", 8 << 20, 32, 1)
    assert r["overlap_events"] and not r["single_submit"] and r["direct_io"]

    proc = run_cli("io-bench", "--folder", tmp_path, "--size", "3MiB", "--loops", "1", "--json",
                   "--block-size", "1M", "--queue-depth", "4", "--parallelism", "3", "--sequential",
                   "--single-submit", "--no-direct", "--keep")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["block_size"], r["queue_depth"], r["intra_op_parallelism"]) == (1 << 20, 4, 3)
    assert not r["overlap_events"] and r["single_submit"] and not r["direct_io"]
    assert r["stats"]["direct_bytes"] == 0
    kept = tmp_path / "fastpersist-io-bench.dat"
    assert kept.stat().st_size == 3 << 20, "--keep leaves the file, exactly --size bytes"


def test_io_bench_environment_applies_but_flags_win(tmp_path):
    env = {"FASTPERSIST_QUEUE_DEPTH": "5", "FASTPERSIST_BLOCK_SIZE": "2M"}
    proc = run_cli("io-bench", "--folder", tmp_path, "--size", "4MiB", "--loops", "1", "--json",
                   "--block-size", "1M", env=env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["queue_depth"], r["block_size"]) == (5, 1 << 20)


@pytest.mark.parametrize("args, needle", [
    (["--size", "abc"], "--size"),
    (["--size", "0"], "--size"),
    (["--backend", "nope"], "nope"),
    (["--block-size", "eight"], "--block-size"),
    (["--queue-depth", "0"], "queue_depth"),
    (["--parallelism", "0"], "intra_op_parallelism"),
    (["--loops", "0"], "--loops"),
    (["--read", "--write"], "--write"),
    (["--overlap-events", "--sequential"], "--sequential"),
    (["--size", "1000TiB"], "memory"),
])
def test_io_bench_rejects_bad_arguments(args, needle, tmp_path):
    proc = run_cli("io-bench", "--folder", tmp_path, *args)
    assert proc.returncode != 0
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "terminate" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_io_bench_reports_missing_folder(tmp_path):
    missing = tmp_path / "does-not-exist"
    proc = run_cli("io-bench", "--folder", missing, "--size", "1MiB")
    assert proc.returncode != 0
    assert "no such directory" in proc.stderr and str(missing) in proc.stderr

    proc = run_cli("io-bench", "--size", "1MiB")
    assert proc.returncode != 0
    assert "--folder" in proc.stderr


def test_io_bench_reports_bad_environment(tmp_path):
    proc = run_cli("io-bench", "--folder", tmp_path, "--size", "1MiB",
                   env={"FASTPERSIST_QUEUE_DEPTH": "lots"})
    assert proc.returncode != 0
    assert "FASTPERSIST_QUEUE_DEPTH" in proc.stderr


def test_unknown_subcommand_fails():
    proc = run_cli("frobnicate")
    assert proc.returncode != 0


def test_every_cli_flag_in_settings_doc_exists():
    doc = (ROOT / "docs" / "settings.md").read_text()
    help_text = run_cli("io-bench", "--help").stdout
    flags = set()
    in_table = False
    for line in doc.splitlines():
        if line.startswith("| Field |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if in_table and not line.startswith("|---"):
            cli_cell = line.split("|")[4]
            flags.update(re.findall(r"--[a-z][a-z-]*", cli_cell))
    assert flags, "no CLI flags found in docs/settings.md"
    for flag in flags:
        assert re.search(rf"{re.escape(flag)}\b", help_text), \
            f"{flag} is in docs/settings.md but not in io-bench --help"
