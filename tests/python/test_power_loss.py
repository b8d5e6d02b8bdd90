# SPDX-License-Identifier: Apache-2.0
"""Simulated power loss: after a cut at any point of a save, what was acknowledged survives.

SIGKILL (test_checkpoint_crash.py) keeps the page cache, so it cannot catch a missing fsync. Here
each committing path runs once under the recorder (``_crashsim``), and for a power cut right
after every recorded event the test builds the states the storage could hold after reboot
(unsynced data lost or torn, unsynced directory changes undone or kept), writes each into a fresh
directory, and checks it as a restarted job would:

- the manager opens the root (nothing left by the cut makes it unusable);
- every checkpoint it lists verifies and loads, bit-identical to what was saved at its step;
- ``latest`` is never older than the last save acknowledged before the cut, and no acknowledged
  checkpoint is missing unless retention had a reason to remove it.

A control run with ``durable=False`` must fail these checks: it proves the simulation sees a
save that skips its fsyncs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest

import fastpersist
from fastpersist.checkpoint import tag_for
import _crashsim
import _power_loss_child as child
from _checkpoint_models import assert_state_equal

CHILD = str(Path(child.__file__).resolve())
State = Dict[str, Tuple[str, bytes]]


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    try:
        return _crashsim.build_shim(tmp_path_factory.mktemp("crashsim"))
    except RuntimeError as exc:
        pytest.skip(f"power-loss recorder unavailable: {exc}")


def _acks(marks: List[str], prefix: str = "ack ") -> List[Tuple[str, int]]:
    out = []
    for m in marks:
        if m.startswith(prefix):
            _, what, step = m.split()
            out.append((what, int(step)))
    return out


def _step_of(tag: str) -> int:
    return int(tag.rsplit("-", 1)[-1])


def check_manager_root(root: Path, acks: List[Tuple[str, int]], expected: Callable[[int], object],
                       keep_last: int) -> None:
    mgr = fastpersist.CheckpointManager(root)
    try:
        infos = mgr.checkpoints()
        tags = [c.tag for c in infos]
        for info in infos:
            assert mgr.verify(info.tag) == [], f"listed {info.tag} does not verify"
            assert_state_equal(mgr.load(info.tag), expected(_step_of(info.tag)), info.tag)
        if not acks:
            return
        latest = mgr.latest()
        assert latest is not None, f"saves {acks} were acknowledged, nothing is listed"
        assert _step_of(latest) >= acks[-1][1], f"latest {latest} older than acknowledged {acks[-1]}"
        listed = sorted(_step_of(t) for t in tags)
        for tag, step in acks:
            newer = [s for s in listed if s > step]
            if keep_last == 0 or len(newer) < keep_last:
                assert tag in tags, f"acknowledged {tag} is gone (listed {tags})"
    finally:
        mgr.close()


def check_writer_file(root: Path, acks: List[Tuple[str, int]]) -> None:
    path = root / child.WRITER_FILE
    if not acks:
        if not path.exists():
            return
        candidates = list(child.STEPS)
    else:
        assert path.exists(), f"{child.WRITER_FILE} acknowledged at step {acks[-1][1]} is gone"
        candidates = [s for s in child.STEPS if s >= acks[-1][1]]
    loaded = fastpersist.load(str(path), weights_only=True)
    step = int(loaded["step"])
    assert step in candidates, f"{child.WRITER_FILE} holds step {step}, acknowledged {acks}"
    assert_state_equal(loaded, child.small_state(step), child.WRITER_FILE)


def explore(shim: Path, tmp_path: Path, scenario: str, check: Callable[..., None],
            durable: bool = True, with_drains: bool = False, ranks: int = 0,
            setup: str = "") -> Dict[str, object]:
    """Records the scenario (with `ranks`, that many processes of it at once, into one
    recording), then checks every distinct crash state; returns the tally. The scenario
    `setup`, if given, runs first, unrecorded: what it leaves is durable before the recording.
    `check(root, acks)`, or with `with_drains` `check(root, acks, drained)`."""
    root = tmp_path / "root"
    root.mkdir()
    if setup:
        subprocess.run([sys.executable, CHILD, setup, str(root)], check=True, timeout=300)
        os.sync()
    args = [CHILD, scenario, str(root)] + ([] if durable else ["not-durable"])
    if ranks:
        rec = _crashsim.record_ranks(shim, root, tmp_path / "rec", args, ranks)
    else:
        rec = _crashsim.record(shim, root, tmp_path / "rec", args)
    counts = rec.counts()
    assert counts.get("mark", 0) >= 2, f"the program acknowledged nothing: {counts}"
    tally: Dict[str, object] = {"events": len(rec.events), "states": 0, "failures": [],
                                "by_kind": counts}
    for i, (seq, variant, state) in enumerate(rec.crash_states()):
        where = tmp_path / f"state-{i}"
        _crashsim.materialize(state, where)
        marks = rec.marks(seq)
        acks = _acks(marks)
        try:
            if with_drains:
                check(where, acks, _acks(marks, "drained "))
            else:
                check(where, acks)
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its cut
            tally["failures"].append(f"cut after event {seq} ({rec.events[seq].kind} "
                                     f"{rec.events[seq].a}), {variant}: {type(exc).__name__}: {exc}")
        tally["states"] += 1
        shutil.rmtree(where)
    processes = len({e.thread for e in rec.events if e.kind == "init"})
    tally["processes"] = processes
    tally["synced"] = sorted({e.b for e in rec.events if e.kind == "sync" and e.b})
    tally["created"] = sorted({e.a for e in rec.events if e.kind == "create"})
    print(f"\npower loss {scenario} (durable={durable}, {processes} recorded processes): "
          f"{tally['events']} events "
          f"{counts}, {tally['states']} distinct crash states checked, "
          f"{len(tally['failures'])} failed", file=sys.stderr)
    return tally


def _assert_clean(tally: Dict[str, object]) -> None:
    failures = tally["failures"]
    assert not failures, f"{len(failures)} crash states fail:\n" + "\n".join(failures[:20])
    # Each sync is a point where the durable state changes; all were explored.
    assert tally["states"] >= tally["by_kind"].get("sync", 0) > 0


def test_manager_saves_survive_power_loss_at_every_point(shim, tmp_path):
    tally = explore(shim, tmp_path, "manager",
                    lambda root, acks: check_manager_root(root, acks, child.make_state, child.KEEP_LAST))
    _assert_clean(tally)


def test_compressed_manager_saves_survive_power_loss_at_every_point(shim, tmp_path):
    tally = explore(shim, tmp_path, "manager-zstd",
                    lambda root, acks: check_manager_root(root, acks, child.make_state, child.KEEP_LAST))
    _assert_clean(tally)


def test_incremental_manager_saves_survive_power_loss_at_every_point(shim, tmp_path):
    incremental_states = []

    def check(root: Path, acks: List[Tuple[str, int]]) -> None:
        check_manager_root(root, acks, child.make_state, child.KEEP_LAST)
        with fastpersist.CheckpointManager(root) as mgr:
            listed = mgr.checkpoints()
        if any(c.references for c in listed):
            incremental_states.append(root)

    _assert_clean(explore(shim, tmp_path, "manager-incremental", check))
    # The crash states did hold checkpoints that reference their base (with full_every 3 and
    # keep_last 2, the base outlives the newest two whenever they reference it).
    assert incremental_states, "no crash state held an incremental checkpoint"


def _check_tiered_root(expected: Callable[[int], object]) -> Callable[..., None]:
    def check(root: Path, acks: List[Tuple[str, int]], drained: List[Tuple[str, int]]) -> None:
        # The local root as after any save; the tier holds every drain acknowledged before the
        # cut (its own keep_last aside), and each checkpoint it lists verifies and loads.
        check_manager_root(root / "local", acks, expected, child.KEEP_LAST)
        if (root / "tier").is_dir():
            check_manager_root(root / "tier", drained, expected, child.KEEP_LAST)
        else:
            assert not drained, "a drain was acknowledged but the tier is gone"
    return check


def test_tier_drains_survive_power_loss_at_every_point(shim, tmp_path):
    _assert_clean(explore(shim, tmp_path, "manager-tier", _check_tiered_root(child.make_state),
                          with_drains=True))


def test_pulls_from_a_tier_survive_power_loss_at_every_point(shim, tmp_path):
    # A new local root filled back from the tier (`pull`, then `resume()` pulling the newest):
    # what a pull acknowledged is in the local root, and nothing in the tier is lost.
    def check(root: Path, acks: List[Tuple[str, int]]) -> None:
        if (root / "local").is_dir():
            check_manager_root(root / "local", acks, child.make_state, keep_last=0)
        else:
            assert not acks, f"pulls {acks} were acknowledged but the local root is gone"
        in_tier = [(tag_for(step), step) for step in child.PULLED_STEPS]
        check_manager_root(root / "tier", in_tier, child.make_state, keep_last=0)

    _assert_clean(explore(shim, tmp_path, "pull", check, setup="pull-setup"))


def test_writer_files_survive_power_loss_at_every_point(shim, tmp_path):
    _assert_clean(explore(shim, tmp_path, "writer", check_writer_file))


def test_dcp_saves_survive_power_loss_at_every_point(shim, tmp_path):
    def check(root: Path, acks: List[Tuple[str, int]]) -> None:
        check_manager_root(root, acks, child.small_state, keep_last=0)

    _assert_clean(explore(shim, tmp_path, "dcp", check))


def _check_ranks_root(root: Path, acks: List[Tuple[str, int]], keep_last: int) -> None:
    check_manager_root(root, acks, child.full_ranks_state, keep_last)


def _assert_every_rank_recorded(tally: Dict[str, object], ranks: int, durable: bool = True) -> None:
    assert tally["processes"] == ranks, f"{tally['processes']} of {ranks} ranks recorded"
    # Each rank creates (and, durable, syncs) data files of its own, named for its rank.
    for rank in range(ranks):
        for what in ("created", "synced") if durable else ("created",):
            mine = [p for p in tally[what] if f"-r{rank:05d}" in p]
            assert mine, f"no file of rank {rank} {what} in the recording: {tally[what]}"


def test_multi_rank_dcp_saves_survive_power_loss_at_every_point(shim, tmp_path):
    # Two ranks, each writing its own shards through FastPersistWriter, rank 0 committing: every
    # rank's files and syncs are in the one recording, so a cut falls between any two of them.
    tally = explore(shim, tmp_path, "dcp-ranks",
                    lambda root, acks: _check_ranks_root(root, acks, keep_last=0), ranks=2)
    _assert_every_rank_recorded(tally, 2)
    _assert_clean(tally)


def test_multi_rank_manager_saves_survive_power_loss_at_every_point(shim, tmp_path):
    tally = explore(shim, tmp_path, "manager-ranks",
                    lambda root, acks: _check_ranks_root(root, acks, child.KEEP_LAST), ranks=2)
    _assert_every_rank_recorded(tally, 2)
    _assert_clean(tally)


def test_multi_rank_tier_drains_survive_power_loss_at_every_point(shim, tmp_path):
    tally = explore(shim, tmp_path, "manager-ranks-tier", _check_tiered_root(child.full_ranks_state),
                    with_drains=True, ranks=2)
    _assert_every_rank_recorded(tally, 2)
    _assert_clean(tally)


def test_the_simulation_catches_multi_rank_saves_that_skip_fsync(shim, tmp_path):
    tally = explore(shim, tmp_path, "manager-ranks",
                    lambda root, acks: _check_ranks_root(root, acks, child.KEEP_LAST),
                    durable=False, ranks=2)
    _assert_every_rank_recorded(tally, 2, durable=False)
    assert tally["by_kind"].get("sync", 0) == 0, "durable=False still synced"
    lost = [f for f in tally["failures"] if "gone" in f or "older than" in f or "nothing is listed" in f]
    assert lost, "no crash state lost an acknowledged multi-rank save without fsync"


def test_the_simulation_catches_saves_that_skip_fsync(shim, tmp_path):
    tally = explore(shim, tmp_path, "manager",
                    lambda root, acks: check_manager_root(root, acks, child.make_state, child.KEEP_LAST),
                    durable=False)
    assert tally["by_kind"].get("sync", 0) == 0, "durable=False still synced"
    lost = [f for f in tally["failures"] if "gone" in f or "older than" in f or "nothing is listed" in f]
    assert lost, "no crash state lost an acknowledged save without fsync: the simulation sees nothing"
