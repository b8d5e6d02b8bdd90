# SPDX-License-Identifier: Apache-2.0
"""`fastpersist tune` and configuration files (issue 14), with the real CLI on a real folder: a
short tune writes a configuration that every part reads back (the CLI's --config and
FASTPERSIST_CONFIG, fastpersist.load_config, FastFileWriter's staging size), ranks what it
measured, prints DeepSpeed's "aio" section; damaged or mistyped configurations are refused with
the file and the field named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

import fastpersist
from _test_support import find_cli

CLI = find_cli()
needs_cli = pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built: set FASTPERSIST_CLI")


def run_cli(*args: object, env: Dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    assert CLI is not None
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**base, **(env or {})})


@pytest.fixture(autouse=True)
def no_chosen_config():
    yield
    fastpersist.load_config("")  # back to FASTPERSIST_CONFIG (unset): the defaults


def config_text(engine: Dict[str, Any], **sections: Any) -> str:
    return json.dumps({"format": "fastpersist-config", "version": 1, "engine": engine, **sections})


@needs_cli
def test_a_short_tune_ranks_its_measurements_and_writes_a_configuration(tmp_path: Path) -> None:
    out = tmp_path / "fastpersist.json"
    png = tmp_path / "sweep.png"
    r = run_cli("tune", "--folder", tmp_path, "--size", "16MiB", "--budget", "8s", "--output", out,
                "--json", "--plot", png, env={"FASTPERSIST_PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in r.stderr
    assert set(report["phases"]) == {"write", "read", "writer staging"}
    for phase in report["phases"].values():
        rates = [row["gb_per_s"] for row in phase["ranked"]]
        assert rates == sorted(rates, reverse=True) and rates[0] > 0
        assert phase["measurements"] >= len(phase["ranked"]) >= 1
    written = json.loads(out.read_text())
    assert written == report["config"]
    assert written["engine"]["backend"] in {b.name for b in fastpersist.backends() if b.available}
    assert written["writer"]["io_buffer_bytes"] % 8192 == 0
    assert written["tuned"]["write_gb_per_s"] > 0 and written["tuned"]["read_gb_per_s"] > 0
    assert report["deepspeed"]["aio"]["block_size"] == written["engine"]["block_size"]
    assert set(report["deepspeed"]["aio"]) == {"block_size", "queue_depth", "intra_op_parallelism",
                                              "single_submit", "overlap_events", "use_gds"}
    assert sorted(os.listdir(tmp_path)) == ["fastpersist.json", "sweep.png"], "tune removes its files"

    # The configuration is what every part starts from.
    loaded = fastpersist.load_config(out)
    assert loaded["engine"] == {k: written["engine"][k] for k in loaded["engine"]}
    assert fastpersist.active_config()["path"] == str(out)
    text = run_cli("tune", "--folder", tmp_path, "--size", "8MiB", "--budget", "2s", "--write",
                   "--no-progress")
    assert text.returncode == 0, text.stderr
    assert "RANK" in text.stdout and "best:" in text.stdout and '"aio"' in text.stdout


@needs_cli
def test_the_cli_reads_a_configuration_from_config_and_the_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text(config_text({"block_size": "2MiB", "queue_depth": 6}))
    for how in ("flag", "env"):
        args = ["io-bench", "--folder", tmp_path, "--size", "8MiB", "--loops", "1", "--json"]
        r = (run_cli("--config", cfg, *args) if how == "flag"
             else run_cli(*args, env={"FASTPERSIST_CONFIG": str(cfg)}))
        assert r.returncode == 0, r.stderr
        options = json.loads(r.stdout)
        assert options["block_size"] == 2 << 20 and options["queue_depth"] == 6, (how, options)
    # A variable still overrides the file.
    r = run_cli("--config", cfg, "io-bench", "--folder", tmp_path, "--size", "8MiB", "--loops", "1",
                "--json", env={"FASTPERSIST_QUEUE_DEPTH": "3"})
    assert json.loads(r.stdout)["queue_depth"] == 3
    cfg.write_text(config_text({"queue_depht": 6}))
    r = run_cli("io-bench", "--folder", tmp_path, "--size", "8MiB", "--loops", "1",
                env={"FASTPERSIST_CONFIG": str(cfg)})
    assert r.returncode == 2 and "queue_depht" in r.stderr and "cfg.json" in r.stderr, r.stderr


def test_load_config_checks_the_file_and_sets_the_writers_staging(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text(config_text({"queue_depth": 5}, writer={"io_buffer_bytes": "16MiB"}))
    fastpersist.load_config(cfg)
    with fastpersist.FastFileWriter(tmp_path / "a.bin") as w:
        w.write(b"x" * 100_000)
        assert w._w.options.io_buffer_bytes == 16 << 20
    with fastpersist.FastFileWriter(tmp_path / "b.bin", io_buffer_mb=8) as w:  # an argument wins
        assert w._w.options.io_buffer_bytes == 8 << 20
    assert (tmp_path / "a.bin").read_bytes() == b"x" * 100_000
    for text, needle in ((config_text({"queue_depth": 0}), "queue_depth must be in"),
                         (config_text({}, writer={"io_buffer_bytes": 100}), "multiple of 8 KiB"),
                         ('{"format": "fastpersist-config"', "not valid JSON")):
        cfg.write_text(text)
        with pytest.raises(ValueError, match=needle) as e:
            fastpersist.load_config(cfg)
        assert "cfg.json" in str(e.value)
    with pytest.raises(ValueError, match="not found|No such file"):
        fastpersist.load_config(tmp_path / "missing.json")
    # A refused file leaves the earlier choice in force.
    assert fastpersist.active_config()["engine"]["queue_depth"] == 5
