# SPDX-License-Identifier: Apache-2.0
"""``CheckpointManager`` survives SIGKILL at any moment (docs/commit_protocol.md).

A child process (real torch, real files) saves a few-MB training state in a loop with
``keep_last=3``, mixing ``save`` and ``save_async``, and prints every tag it knows is committed.
The parent kills it with SIGKILL at a random moment, many times over the same root, and after
each kill checks what a restarted job would see:

- a new manager opens the root (the dead child's ``flock`` went with it) and removes the
  ``.tmp-*`` / ``.trash-*`` debris;
- every listed checkpoint is complete: it verifies, loads, and holds exactly its step's state;
- ``latest()`` names one of them;
- every tag the child reported as committed is still there unless retention removed it;
- no unreported tag shows up except ones the killed child was saving.

The delays come from a fixed seed (printed; override with FASTPERSIST_CRASH_SEED). Importing
torch takes seconds here, so most children are forked from one server process that imported
it once (``_checkpoint_crash_child.py serve``); one test uses fresh interpreters throughout.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

import fastpersist
import _checkpoint_crash_child as child
from _checkpoint_models import assert_state_equal

CHILD_SCRIPT = str(Path(child.__file__).resolve())
SEED = int(os.environ.get("FASTPERSIST_CRASH_SEED", "20240917"))
DEBRIS_PREFIXES = (".tmp-", ".trash-", ".latest.tmp-")
MAX_KILL_DELAY_S = 0.3


def _step_of(tag: str) -> int:
    assert tag.startswith("step-"), tag
    return int(tag[len("step-"):])


class LineReader:
    """Lines from a pipe with a deadline (select + os.read: never blocks past the deadline)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False

    def _fill(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            return False
        data = os.read(self.fd, 65536)
        if not data:
            self.eof = True
        self.buf += data
        return True

    def readline(self, deadline: float) -> Optional[str]:
        """The next line, or None at EOF or when the deadline passes."""
        while b"\n" not in self.buf:
            if self.eof or not self._fill(deadline - time.monotonic()):
                return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def drain(self) -> List[str]:
        """Every complete line already written (the writer is dead or idle)."""
        while not self.eof and self._fill(0.0):
            pass
        lines = self.buf.split(b"\n")
        self.buf = lines.pop()
        return [line.decode() for line in lines]


class ForkServer:
    """``_checkpoint_crash_child.py serve``: forks children that already imported torch."""

    def __init__(self, stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self.proc = subprocess.Popen([sys.executable, CHILD_SCRIPT, "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        self.out = LineReader(self.proc.stdout.fileno())
        self.lines: Dict[int, List[str]] = {}  # child pid -> its lines not yet consumed
        self.live: Set[int] = set()  # forked, not reaped yet
        self._expect("ready", time.monotonic() + 120)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def _dispatch(self, line: str) -> Tuple[int, str]:
        pid, _, text = line.partition(" ")
        return int(pid), text

    def _expect(self, prefix: str, deadline: float) -> str:
        """Reads until the server's own line starting with `prefix`; keeps children's lines."""
        while True:
            line = self.out.readline(deadline)
            assert line is not None, f"fork server silent or dead; stderr:\n{self.stderr()}"
            pid, text = self._dispatch(line)
            if pid == self.proc.pid:
                assert text.startswith(prefix), f"fork server said {text!r}, expected {prefix!r}"
                return text
            self.lines.setdefault(pid, []).append(text)

    def _send(self, command: str) -> None:
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def fork(self, root: Path, seed: int, tier: Optional[Path] = None) -> int:
        self._send(f"fork {root} {seed}" + (f" {tier}" if tier else ""))
        pid = int(self._expect("forked", time.monotonic() + 30).split()[1])
        self.live.add(pid)
        self.lines.setdefault(pid, [])
        return pid

    def child_line(self, pid: int, deadline: float) -> Optional[str]:
        """The child's next line, or None when the deadline passes."""
        while not self.lines.get(pid):
            line = self.out.readline(deadline)
            if line is None:
                return None
            p, text = self._dispatch(line)
            self.lines.setdefault(p, []).append(text)
        return self.lines[pid].pop(0)

    def reap(self, pid: int) -> Tuple[int, List[str]]:
        """Waits for the child's death: (wait status, the child's remaining lines)."""
        self._send(f"reap {pid}")
        text = self._expect("reaped", time.monotonic() + 30)
        _, reaped, status = text.split()
        assert int(reaped) == pid
        self.live.discard(pid)
        for line in self.out.drain():  # a child's writes all precede its death
            p, t = self._dispatch(line)
            self.lines.setdefault(p, []).append(t)
        return int(status), self.lines.pop(pid, [])

    def close(self) -> None:
        for pid in self.live:  # a test that failed half-way: no child may outlive it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self._send("exit")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self._stderr.close()


class History:
    """What the children reported across all iterations over one root."""

    def __init__(self) -> None:
        self.reported: List[str] = []
        self.iterations = 0
        self.debris_seen = 0
        self.unreported_commits = 0
        self.max_listed = 0
        self.incremental_listed = 0  # checks that found an incremental checkpoint listed
        self.stale_latest = 0
        self.listed_steps: List[int] = []
        self.ever_listed: Set[str] = set()
        # The newest step a job without a tier reported: its retention had no tier pins.
        self.newest_unpinned: Optional[int] = None
        # Reported commits whose retention pass failed (removals left for the next pass).
        self.retention_failed: Set[str] = set()


def check_root_after_kill(root: Path, history: History, killed_first_step: int,
                          context: str, drained_into_tier: bool = False) -> None:
    """Everything a restarted job relies on, checked with a fresh manager in this process.
    ``drained_into_tier``: the killed job drained into a tier, so its retention skipped what
    waited for the tier (pinned), and keep_last bounds only what a job without one reported.
    The caller adds the job's ``retention-failed`` tags to ``history.retention_failed`` first."""
    debris_before = [n for n in os.listdir(root) if n.startswith(DEBRIS_PREFIXES)]
    history.debris_seen += bool(debris_before)
    # The dead child's flock is gone: no CheckpointLockedError.
    mgr = fastpersist.CheckpointManager(root)
    try:
        left = [n for n in os.listdir(root) if n.startswith(DEBRIS_PREFIXES)]
        assert left == [], f"{context}: debris left after the manager opened: {left}"

        infos = mgr.checkpoints()
        tags = [c.tag for c in infos]
        assert tags == mgr.list()
        history.max_listed = max(history.max_listed, len(tags))
        history.incremental_listed += any(c.references for c in infos)
        # Commit order is step order.
        assert [c.step for c in infos] == sorted(c.step for c in infos), f"{context}: {tags}"
        assert len({c.sequence for c in infos}) == len(infos), f"{context}: duplicate sequence"
        # The killed job's own commits (steps from killed_first_step on) whose retention ran.
        complete = [t for t in history.reported
                    if _step_of(t) >= killed_first_step and t not in history.retention_failed]
        if complete and not drained_into_tier:
            history.newest_unpinned = max(_step_of(t) for t in complete)
        if history.newest_unpinned is not None:
            # A save reports its commit only after its retention pass: at that moment at most
            # keep_last checkpoints up to it existed, and no older one can appear later. (Newer
            # ones may exceed keep_last: each kill between a commit and its prune leaves one.)
            # The base of a kept incremental checkpoint is kept with it, beyond keep_last. A
            # job with a tier keeps what waits for the tier beyond keep_last (pins, tiers.md),
            # so the bound holds up to the newest commit a job without a tier reported (whose
            # retention pass did not fail: a removal that fails leaves that one in place).
            newest = history.newest_unpinned
            bases = {base for c in infos for base in c.references}
            upto = [t for t in tags if _step_of(t) <= newest and t not in bases]
            assert len(upto) <= child.KEEP_LAST, (
                f"{context}: retention broken: {upto} kept after {newest} was reported")

        for info in infos:
            step = _step_of(info.tag)
            assert info.step == step, f"{context}: {info.tag} lists step {info.step}"
            problems = mgr.verify(info.tag)
            assert problems == [], f"{context}: listed {info.tag} does not verify: {problems}"
            state = mgr.load(info.tag)
            assert_state_equal(state, child.expected_state(step), f"{context}: {info.tag}")
            manifest = json.loads((root / info.tag / "manifest.json").read_text())
            assert manifest["metadata"]["step"] == step, f"{context}: metadata of {info.tag}"

        latest = mgr.latest()
        if tags:
            # The documented rule: the `latest` pointer's tag while that one is committed, else
            # the newest. A kill between the rename and the pointer update leaves the pointer
            # on an older checkpoint (and several such kills in a row, on an even older one).
            pointer_file = root / "latest"
            pointer = pointer_file.read_text().strip() if pointer_file.exists() else None
            expected_latest = pointer if pointer in tags else tags[-1]
            assert latest == expected_latest, (f"{context}: latest() {latest!r}, pointer "
                                               f"{pointer!r}, listed {tags}")
            history.stale_latest += latest != tags[-1]
            assert mgr.verify("latest") == []
            assert_state_equal(mgr.load(), child.expected_state(_step_of(latest)),
                               f"{context}: latest {latest}")
        else:
            assert latest is None
            assert not history.reported, f"{context}: reported {history.reported}, none listed"

        listed_steps = sorted(_step_of(t) for t in tags)
        history.listed_steps = listed_steps
        for tag in history.reported:
            newer = [s for s in listed_steps if s > _step_of(tag)]
            if len(newer) < child.KEEP_LAST:
                assert tag in tags, (f"{context}: {tag} was reported committed and only "
                                     f"{len(newer)} newer checkpoints exist, but it is gone: "
                                     f"listed {tags}")
        reported = set(history.reported)
        for tag in tags:
            if tag not in reported and tag not in history.ever_listed:
                # Committed, but the child died before it printed so: only its own saves.
                assert _step_of(tag) >= killed_first_step, (
                    f"{context}: {tag} listed but never reported, and not the killed child's")
                history.unreported_commits += 1
        history.ever_listed.update(tags)
    finally:
        mgr.close()


def _kill_at_random(pid: int, rng: random.Random) -> float:
    delay = rng.uniform(0.0, MAX_KILL_DELAY_S)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    return delay


def _parse_child_lines(lines: List[str], context: str) -> List[str]:
    tags = []
    for line in lines:
        word, _, tag = line.partition(" ")
        assert word == "committed", f"{context}: unexpected child output {line!r}"
        tags.append(tag)
    return tags


def _next_first_step(history: History) -> int:
    """The first step the next child saves: it continues after the newest listed step."""
    return (max(history.listed_steps) if history.listed_steps else 0) + 11


def test_sigkill_at_random_moments_keeps_every_commit(tmp_path):
    iterations = int(os.environ.get("FASTPERSIST_CRASH_ITERATIONS", "25"))
    print(f"\ncrash test seed {SEED} (FASTPERSIST_CRASH_SEED), {iterations} kills")
    rng = random.Random(SEED)
    root = tmp_path / "run"
    history = History()
    server = ForkServer(tmp_path / "fork_server.stderr")
    try:
        for it in range(iterations):
            first_step = _next_first_step(history)
            context = f"seed {SEED}, iteration {it}"
            pid = server.fork(root, rng.randrange(1 << 30))
            started = server.child_line(pid, time.monotonic() + 60)
            if started != "started":
                os.kill(pid, signal.SIGKILL)
                status, _ = server.reap(pid)
                pytest.fail(f"{context}: child did not start ({started!r}, wait status {status}); "
                            f"stderr:\n{server.stderr()}")
            early: List[str] = []
            if it % 4 == 3:
                # Every 4th child first reports a commit (the first save of a process is the
                # slowest: staging memory is allocated and locked), so that commits accumulate
                # and retention runs even when fsync is slow and most kills land mid-save.
                line = server.child_line(pid, time.monotonic() + 60)
                assert line is not None, f"{context}: no commit within 60 s"
                early.append(line)
            delay = _kill_at_random(pid, rng)
            status, lines = server.reap(pid)
            lines = early + lines
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
                f"{context}: the child died on its own (wait status {status}) before the kill "
                f"after {delay:.3f}s; stderr:\n{server.stderr()}")
            committed = _parse_child_lines(lines, context)
            assert all(_step_of(t) >= first_step for t in committed), (context, committed)
            history.reported += committed
            check_root_after_kill(root, history, first_step, f"{context} (killed after "
                                  f"{delay * 1000:.0f} ms, reported {committed})")
            history.iterations += 1
    finally:
        server.close()
    print(f"crash test: {history.iterations} kills, {len(history.reported)} reported commits, "
          f"{history.debris_seen} kills left debris, {history.unreported_commits} unreported "
          f"commits seen, at most {history.max_listed} listed, incremental checkpoints listed "
          f"after {history.incremental_listed} kills, latest() behind the newest "
          f"{history.stale_latest} times")
    assert history.reported, "no child ever committed: the kills came too early to test much"
    assert history.debris_seen > 0, "no kill ever landed mid-save: the test exercised nothing"


def test_sigkill_fresh_interpreters(tmp_path):
    """The same with children started as fresh interpreters (no fork server in between): the
    first is killed after its first reported commit, the second at once, on the used root."""
    rng = random.Random(SEED + 1)
    root = tmp_path / "run"
    history = History()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for it in range(2):
        context = f"seed {SEED + 1}, fresh interpreter {it}"
        first_step = _next_first_step(history)
        proc = subprocess.Popen([sys.executable, CHILD_SCRIPT, "run", str(root),
                                 str(rng.randrange(1 << 30))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out = LineReader(proc.stdout.fileno())
        lines: List[str] = []
        try:
            started = out.readline(time.monotonic() + 120)
            assert started == "started", f"{context}: {started!r}"
            if it == 0:
                line = out.readline(time.monotonic() + 60)
                assert line is not None and line.startswith("committed "), f"{context}: {line!r}"
                lines.append(line)
            _kill_at_random(proc.pid, rng)
        finally:
            proc.kill()
            proc.wait(timeout=30)
            stderr = proc.stderr.read().decode(errors="replace")
            lines += out.drain()
            proc.stdout.close()
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL, f"{context}: exit {proc.returncode}; {stderr}"
        committed = _parse_child_lines(lines, context)
        history.reported += committed
        check_root_after_kill(root, history, first_step, f"{context} (reported {committed})")
    assert history.reported
