# SPDX-License-Identifier: Apache-2.0
"""The save policy (``should_save`` / ``maybe_save`` with ``save_every_steps`` /
``save_every_seconds``) and ``fastpersist advise`` (Young/Daly), including ``--measure`` on a
real root whose manifests record each save's blocking time."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

import fastpersist
from _test_support import find_cli

CLI = find_cli()


def run_cli(*args: object) -> subprocess.CompletedProcess:
    assert CLI is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    return subprocess.run([CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120, env=env)


def test_maybe_save_every_n_steps(tmp_path: Path) -> None:
    with fastpersist.CheckpointManager(tmp_path, durable=False, save_every_steps=3) as mgr:
        handles = [mgr.maybe_save(step, {"w": torch.full((4,), float(step))}) for step in range(1, 10)]
        mgr.wait()
        assert [h is not None for h in handles] == [s % 3 == 0 for s in range(1, 10)]
        assert mgr.list() == ["step-00000003", "step-00000006", "step-00000009"]
        assert not mgr.should_save(9)  # never twice for one step


def test_should_save_every_t_seconds(tmp_path: Path) -> None:
    # The clock runs from each save_async: an interval far above the time a tiny save takes on
    # a loaded machine (a 0.2 s interval once failed in a full suite run).
    with fastpersist.CheckpointManager(tmp_path, durable=False, save_every_seconds=1.5) as mgr:
        assert not mgr.should_save(1)
        time.sleep(1.6)
        assert mgr.should_save(2)
        mgr.save(2, {"w": torch.zeros(3)})
        assert not mgr.should_save(3)  # the save restarted the clock


def test_no_or_bad_policy_is_refused(tmp_path: Path) -> None:
    with fastpersist.CheckpointManager(tmp_path / "a", durable=False) as mgr:
        with pytest.raises(ValueError, match="no save policy"):
            mgr.should_save(1)
    with pytest.raises(ValueError, match="save_every_steps"):
        fastpersist.CheckpointManager(tmp_path / "b", save_every_steps=0)
    with pytest.raises(ValueError, match="save_every_seconds"):
        fastpersist.CheckpointManager(tmp_path / "c", save_every_seconds=math.nan)
    with pytest.raises(TypeError, match="save_every_seconds"):
        fastpersist.CheckpointManager(tmp_path / "d", save_every_seconds="1h")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="save_every_steps"):
        fastpersist.CheckpointManager(tmp_path / "e", save_every_steps=2.5)  # type: ignore[arg-type]


@pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built")
def test_advise_prints_the_young_daly_interval() -> None:
    r = run_cli("advise", "--checkpoint-seconds", 30, "--mtbf-hours", 24, "--step-seconds", 1.5, "--json")
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    assert a["young_seconds"] == pytest.approx(math.sqrt(2 * 30 * 86400))
    x = 30 / (2 * 86400)
    assert a["interval_seconds"] == pytest.approx(a["young_seconds"] * (1 + math.sqrt(x) / 3 + x / 9) - 30)
    assert a["interval_steps"] == round(a["interval_seconds"] / 1.5)
    assert a["total_waste"] == pytest.approx(a["checkpoint_overhead"] + a["expected_loss"])
    text = run_cli("advise", "--checkpoint-seconds", 30, "--mtbf-hours", 24, "--step-seconds", 1.5)
    assert "save every" in text.stdout and f"every {a['interval_steps']} steps" in text.stdout


@pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built")
def test_advise_measures_the_blocking_time_a_root_records(tmp_path: Path) -> None:
    with fastpersist.CheckpointManager(tmp_path, durable=False) as mgr:
        for step in range(3):
            mgr.save(step, {"w": torch.randn(100_000)})
    recorded = sorted(json.loads((tmp_path / t / "manifest.json").read_text())["blocking_seconds"]
                      for t in os.listdir(tmp_path) if t.startswith("step-"))
    r = run_cli("advise", "--measure", tmp_path, "--mtbf-hours", 10, "--json")
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    assert a["measured_checkpoints"] == 3
    assert a["checkpoint_seconds"] == pytest.approx(recorded[1])  # the median


@pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built")
def test_advise_refuses_bad_calls(tmp_path: Path) -> None:
    for args in (("--mtbf-hours", 24),
                 ("--checkpoint-seconds", 30, "--measure", tmp_path, "--mtbf-hours", 24),
                 ("--checkpoint-seconds", "nan", "--mtbf-hours", 24),
                 ("--checkpoint-seconds", 30, "--mtbf-hours", 0),
                 ("--measure", tmp_path / "missing", "--mtbf-hours", 24)):
        r = run_cli("advise", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.strip()  # says what is wrong
    (tmp_path / "empty").mkdir()
    r = run_cli("advise", "--measure", tmp_path / "empty", "--mtbf-hours", 24)
    assert r.returncode == 1 and "--checkpoint-seconds" in r.stderr
