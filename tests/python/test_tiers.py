# SPDX-License-Identifier: Apache-2.0
"""Tiers through the Python façade: ``CheckpointManager(..., tiers=[fastpersist.Tier(...)])``
drains committed checkpoints into a second root (here a loop-mounted ext4 when root is
available: a real second filesystem), reports failures as TierWarning without failing a save,
waits in ``wait()`` / ``close()``, restores from a tier when the local root is lost, survives a
SIGKILL in the middle of a drain, and refuses bad settings with clear errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
import torch

import fastpersist
from _test_support import assert_same_state, loop_ext4, tier_state


def make_state(step: int, n: int = 50_000) -> Dict[str, Any]:
    return tier_state(step, n)


assert_same = assert_same_state


@pytest.fixture(scope="module")
def second_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A second filesystem for the tier: a 64 MiB loop-mounted ext4 when possible."""
    base = tmp_path_factory.mktemp("tier_fs")
    if os.geteuid() != 0:
        yield base  # another directory on the same filesystem still exercises every path
        return
    with loop_ext4(base, "64M") as mnt:
        yield mnt


@pytest.fixture
def tier_dir(second_fs: Path) -> Iterator[Path]:
    d = second_fs / "tier"
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_drain_round_trip_to_a_second_filesystem(tmp_path: Path, tier_dir: Path) -> None:
    local = tmp_path / "local"
    states = {s: make_state(s) for s in (10, 20, 30)}
    with fastpersist.CheckpointManager(local, durable=False,
                                       tiers=[fastpersist.Tier(tier_dir, keep_last=2)]) as mgr:
        for step, state in states.items():
            mgr.save(step, state)
        mgr.wait()
        status = mgr.tier_status()
        assert [t.path for t in status] == [str(tier_dir)]
        assert status[0].last_error == "" and status[0].waiting == ()
        assert status[0].checkpoints_drained >= 2 and status[0].bytes_drained > 0
        places = {p.tag: p for p in mgr.locations()}
        assert places["step-00000030"].roots == (str(local), str(tier_dir))
        assert places["step-00000010"].roots == (str(local),)  # the tier keeps the last 2
    tier = fastpersist.CheckpointManager(tier_dir)
    try:
        assert tier.list() == ["step-00000020", "step-00000030"]
        assert tier.verify("step-00000030") == []
        assert_same(tier.load("step-00000030"), states[30])
        assert tier.latest() == "step-00000030"
    finally:
        tier.close()


def test_a_failing_tier_warns_never_fails_a_save_and_recovers(tmp_path: Path) -> None:
    blocker = tmp_path / "tier"
    blocker.write_text("a file where the tier should be")
    mgr = fastpersist.CheckpointManager(tmp_path / "local", keep_last=1, durable=False,
                                        tiers=[fastpersist.Tier(blocker)])
    try:
        with warnings.catch_warnings():  # the pass made at open may already have failed
            warnings.simplefilter("ignore", fastpersist.TierWarning)
            mgr.save(1, make_state(1))
        with pytest.raises(OSError, match="tier"):
            mgr.wait()
        with pytest.warns(fastpersist.TierWarning, match="tier"):
            handle = mgr.save_async(2, make_state(2))
        assert handle.wait() == "step-00000002"
        assert handle.tier_errors
        assert mgr.list() == ["step-00000001", "step-00000002"]  # pinned: not in the tier yet
        assert "Not a directory" in mgr.tier_status()[0].last_error
        blocker.unlink()
        mgr.wait()
        assert mgr.list() == ["step-00000002"]  # drained, then local retention caught up
        tier = fastpersist.CheckpointManager(blocker)  # the drainer holds it only during a pass
        assert tier.list() == ["step-00000001", "step-00000002"]
        tier.close()
    finally:
        mgr.close()


def test_retention_keeps_the_base_of_incremental_checkpoints_waiting_for_a_tier(tmp_path: Path) -> None:
    # Found by the soak: retention (keep_last=1) removes the checkpoints older than the newest,
    # users before their base; the users still waiting for the tier stay (pinned), and their
    # base, already drained and not pinned itself, must stay with them: removing it damaged
    # both, locally and for the drain that was to copy them.
    # The tier is reached through a symbolic link, switched atomically (os.replace) between the
    # real directory and a file, so a retrying drain never sees the path missing.
    real, blocker, tier = tmp_path / "tier-real", tmp_path / "not-a-directory", tmp_path / "tier"
    real.mkdir()
    blocker.write_text("the tier is unreachable for a while")

    def point_tier_to(target: Path) -> None:
        link = tmp_path / "tier.new"
        link.symlink_to(target)
        os.replace(link, tier)

    point_tier_to(real)
    frozen = torch.randn(1 << 16, generator=torch.Generator().manual_seed(3))

    def state(step: int) -> Dict[str, Any]:
        return {"frozen": frozen, "w": torch.full((4096,), float(step))}

    mgr = fastpersist.CheckpointManager(tmp_path / "local", keep_last=1, durable=False, incremental=True,
                                        full_every=3, tiers=[fastpersist.Tier(tier)])
    try:
        mgr.save(1, state(1))
        mgr.wait()  # the base is in the tier: no longer pinned
        point_tier_to(blocker)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastpersist.TierWarning)
            for step in (2, 3, 4):  # 2 and 3 reference step 1; 4 is a full one
                mgr.save(step, state(step))
        listed = {c.tag: c.references for c in mgr.checkpoints()}
        assert listed == {"step-00000001": (), "step-00000002": ("step-00000001",),
                          "step-00000003": ("step-00000001",), "step-00000004": ()}, listed
        assert mgr.verify() == []
        for step in (2, 3):
            assert_same(mgr.load(step), state(step))
        point_tier_to(real)
        mgr.wait()  # 2, 3 and 4 drained: retention catches up, base last
        assert mgr.list() == ["step-00000004"]
        with fastpersist.CheckpointManager(real) as in_tier:
            assert in_tier.verify() == []
            assert_same(in_tier.load(3), state(3))
    finally:
        mgr.close()


def test_resume_restores_from_the_tier_when_local_storage_is_lost(tmp_path: Path, tier_dir: Path) -> None:
    local = tmp_path / "local"
    tiers = [fastpersist.Tier(tier_dir)]
    with fastpersist.CheckpointManager(local, durable=False, tiers=tiers) as mgr:
        mgr.save(5, make_state(5))
        mgr.save(6, make_state(6))
    shutil.rmtree(local)
    with fastpersist.CheckpointManager(local, durable=False, tiers=tiers) as mgr:
        tag, state = mgr.resume()
        assert tag == "step-00000006"
        assert_same(state, make_state(6))
        assert mgr.list() == ["step-00000006"]  # pulled back, verified on the way
        assert mgr.pull(5) > 0
        assert mgr.pull(5) == 0
        with pytest.raises(FileNotFoundError):
            mgr.pull(99)


def test_resume_prefers_the_newest_anywhere(tmp_path: Path, tier_dir: Path) -> None:
    local = tmp_path / "local"
    with fastpersist.CheckpointManager(local, durable=False, tiers=[fastpersist.Tier(tier_dir)]) as mgr:
        mgr.save(1, make_state(1))
    with fastpersist.CheckpointManager(local, durable=False) as mgr:  # no tier: stays local
        mgr.save(2, make_state(2))
    with fastpersist.CheckpointManager(local, durable=False, tiers=[fastpersist.Tier(tier_dir)],
                                       keep_last=1) as mgr:
        mgr.wait()
        tag, state = mgr.resume()
        assert tag == "step-00000002"
        assert_same(state, make_state(2))


_SLOW_DRAIN = textwrap.dedent("""
    import sys, torch, fastpersist
    local, tier = sys.argv[1], sys.argv[2]
    mgr = fastpersist.CheckpointManager(local, durable=False,
                                        tiers=[fastpersist.Tier(tier, bandwidth="2MiB")])
    mgr.save(1, {"w": torch.arange(4 << 20, dtype=torch.float32)})  # 16 MiB: ~8 s to drain
    print("saved", flush=True)
    mgr.wait()
""")


def test_sigkill_during_a_drain_leaves_no_partial_checkpoint_and_the_drain_resumes(
        tmp_path: Path, tier_dir: Path) -> None:
    local = tmp_path / "local"
    child = subprocess.Popen([sys.executable, "-c", _SLOW_DRAIN, str(local), str(tier_dir)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "saved"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the copy is under way in the tier
            if tier_dir.is_dir() and any(n.startswith(".tmp-") for n in os.listdir(tier_dir)):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the drain never started")
        time.sleep(0.5)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert fastpersist.CheckpointManager(tier_dir).list() == []  # never a partial checkpoint
    with fastpersist.CheckpointManager(local, durable=False, tiers=[fastpersist.Tier(tier_dir)]) as mgr:
        mgr.wait()
    assert not any(n.startswith(".tmp-") for n in os.listdir(tier_dir))
    tier = fastpersist.CheckpointManager(tier_dir)
    try:
        assert tier.list() == ["step-00000001"] and tier.verify("step-00000001") == []
        assert torch.equal(tier.load("step-00000001")["w"], torch.arange(4 << 20, dtype=torch.float32))
    finally:
        tier.close()


def test_close_with_a_timeout_returns_and_names_what_is_left(tmp_path: Path, tier_dir: Path) -> None:
    mgr = fastpersist.CheckpointManager(tmp_path / "local", durable=False,
                                        tiers=[fastpersist.Tier(tier_dir, bandwidth=256 << 10)])
    mgr.save(1, make_state(1, n=400_000))  # ~2.4 MiB at 256 KiB/s
    began = time.monotonic()
    with pytest.raises(fastpersist.CheckpointLockedError, match="did not finish"):
        mgr.close(timeout=0.3)
    assert time.monotonic() - began < 10
    assert mgr.closed
    assert fastpersist.CheckpointManager(tier_dir).list() == []


def test_bad_tier_settings_are_refused_clearly(tmp_path: Path) -> None:
    local = tmp_path / "local"
    with pytest.raises(TypeError, match="list of fastpersist.Tier"):
        fastpersist.CheckpointManager(local, tiers=str(tmp_path / "t"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Tier objects"):
        fastpersist.CheckpointManager(local, tiers=[str(tmp_path / "t")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="object stores"):  # S3 settings on a directory tier
        fastpersist.CheckpointManager(local, tiers=[fastpersist.Tier(tmp_path / "t", part_size="8MiB")])
    with pytest.raises(ValueError, match="keep_last"):
        fastpersist.CheckpointManager(local, tiers=[fastpersist.Tier(tmp_path / "t", keep_last=0)])
    with pytest.raises(ValueError, match="every"):
        fastpersist.CheckpointManager(local, tiers=[fastpersist.Tier(tmp_path / "t", every=0)])
    with pytest.raises(TypeError, match="every"):
        fastpersist.CheckpointManager(local, tiers=[fastpersist.Tier(tmp_path / "t", every=1.5)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inside"):
        fastpersist.CheckpointManager(local, tiers=[fastpersist.Tier(local / "tier")])
    with pytest.raises(ValueError, match="size"):
        fastpersist.CheckpointManager(local, tiers=[fastpersist.Tier(tmp_path / "t", bandwidth="fast")])
    assert not (local / "tier").exists()


def test_resume_skips_a_damaged_tier_copy_for_an_older_one(tmp_path: Path, tier_dir: Path) -> None:
    local = tmp_path / "local"
    tiers = [fastpersist.Tier(tier_dir)]
    with fastpersist.CheckpointManager(local, durable=False, tiers=tiers) as mgr:
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
    shutil.rmtree(local)
    data = sorted(p for p in (tier_dir / "step-00000002").iterdir() if p.suffix == ".safetensors")[0]
    with open(data, "r+b") as f:
        f.seek(-64, os.SEEK_END)
        f.write(b"\xff" * 8)
    with fastpersist.CheckpointManager(local, durable=False, tiers=tiers) as mgr:
        with pytest.warns(UserWarning, match="skipping damaged checkpoint step-00000002"):
            tag, state = mgr.resume()
        assert tag == "step-00000001"
        assert_same(state, make_state(1))
        assert mgr.list() == ["step-00000001"]  # nothing partial was pulled
