# SPDX-License-Identifier: Apache-2.0
"""`fastpersist drain ROOT TIER`: one pass of a tier's drain from the command line (the real CLI
binary on real roots): the plan of a dry run, a copy that verifies and loads, the tier's
retention and selection, JSON, a damaged local checkpoint (exit 1, named, nothing partial), a
tier locked by another manager, and bad arguments (exit 2, nothing done)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import fastpersist
from _test_support import find_cli

CLI = find_cli()
pytestmark = pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built: set FASTPERSIST_CLI")


def run_cli(*args: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    assert CLI is not None
    return subprocess.run([CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300, env=env)


@pytest.fixture
def local(tmp_path: Path) -> Path:
    root = tmp_path / "local"
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        for step in (100, 200, 300):
            mgr.save(step, {"w": torch.arange(50_000, dtype=torch.float32) * step, "step": step})
    return root


def test_dry_run_then_drain_with_retention_and_selection(local: Path, tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    r = run_cli("drain", local, tier, "--every", "200", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would drain step-00000200" in r.stdout and "step-00000100" not in r.stdout
    assert not tier.exists()
    r = run_cli("drain", local, tier, "--keep-last", "2")
    assert r.returncode == 0, r.stderr
    assert "drained step-00000200" in r.stdout and "drained step-00000300" in r.stdout
    assert "step-00000100" not in r.stdout  # the tier's retention would remove it at once
    state = fastpersist.load_checkpoint(tier / "step-00000300")
    assert torch.equal(state["w"], torch.arange(50_000, dtype=torch.float32) * 300)
    assert run_cli("verify", tier / "step-00000300").returncode == 0
    again = json.loads(run_cli("drain", local, tier, "--json").stdout)
    assert again["drained"] == [] and again["failures"] == []


def test_a_damaged_local_checkpoint_fails_and_leaves_nothing_partial(local: Path, tmp_path: Path) -> None:
    data = sorted(p for p in (local / "step-00000300").iterdir() if p.suffix == ".safetensors")[0]
    with open(data, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x5A]))
    tier = tmp_path / "tier"
    r = run_cli("drain", local, tier, "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["drained"] == ["step-00000100", "step-00000200"]
    assert len(report["failures"]) == 1 and "'w'" in report["failures"][0]
    assert not any(n.startswith(".tmp-") for n in os.listdir(tier))


def test_a_locked_tier_and_bad_arguments_are_refused(local: Path, tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    holder = fastpersist.CheckpointManager(tier)
    try:
        r = run_cli("drain", local, tier)
        assert r.returncode == 1 and "in use" in r.stderr
    finally:
        holder.close()
    for args, needle in (((local, local / "inside"), "inside"),
                         ((local, tier, "--keep-last", "0"), "keep-last"),
                         ((local, tier, "--bandwidth", "fast"), "bandwidth"),
                         ((tmp_path / "missing", tier), "does not exist"),
                         ((local / "step-00000100", tier), "root")):
        r = run_cli("drain", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr, (args, r.stderr)
    assert not (local / "inside").exists()
    assert fastpersist.CheckpointManager(tier).list() == []


def test_list_with_tiers_shows_where_each_checkpoint_lives(local: Path, tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    assert run_cli("drain", local, tier).returncode == 0
    # A checkpoint only the tier holds: drained, then removed locally.
    with fastpersist.CheckpointManager(local) as mgr:
        mgr.remove("step-00000100")
    missing = tmp_path / "never-created"
    r = run_cli("list", local, "--tier", tier, "--tier", missing)
    assert r.returncode == 0, r.stderr
    rows = {line.lstrip("* ").split()[0]: line for line in r.stdout.splitlines()
            if line.lstrip("* ").startswith("step-")}
    assert "ALSO IN" in r.stdout and set(rows) == {"step-00000200", "step-00000300"}
    assert all(line.endswith(str(tier)) for line in rows.values())
    assert f"only in {tier}: step-00000100 (step 100," in r.stdout
    assert f"tier unreachable: {missing}" in r.stdout
    j = json.loads(run_cli("list", local, "--tier", tier, "--tier", missing, "--json").stdout)
    assert {c["tag"]: c["tiers"] for c in j["checkpoints"]} == {
        "step-00000200": [str(tier)], "step-00000300": [str(tier)]}
    assert [(c["tag"], c["step"], c["tiers"]) for c in j["only_in_tiers"]] == [
        ("step-00000100", 100, [str(tier)])]
    assert len(j["unreachable_tiers"]) == 1
    assert j["unreachable_tiers"][0].startswith(f"{missing}: not found")
    # Without --tier the listing is unchanged: no tier fields.
    plain = json.loads(run_cli("list", local, "--json").stdout)
    assert "only_in_tiers" not in plain and "tiers" not in plain["checkpoints"][0]
