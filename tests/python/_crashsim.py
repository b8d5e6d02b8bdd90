# SPDX-License-Identifier: Apache-2.0
"""Power-loss simulation: what a power cut could leave of a directory tree, at every point.

A program runs with ``crashsim/fp_crashsim.c`` preloaded (:func:`record`). The recorder writes one
event per fsync, fdatasync, rename, unlink, mkdir, rmdir, creating open and acknowledgement mark,
and after each a snapshot of the tree (entries, identities, copies of the bytes).
:class:`Recording` then builds, for a power cut right after any event, the states the storage may
hold after reboot (:meth:`Recording.crash_states`):

- ``lost``: every directory holds the entries it had at its last fsync (entries created, renamed
  or removed since are undone); every file holds the bytes of its last fsync, or nothing if it
  was never synced (the tree as it was before the recording counts as synced);
- ``torn``: the same directories; a file never synced holds its bytes at the cut with the second
  half zeroed (a torn write);
- ``kept``: every directory change up to the cut survived (as after SIGKILL), but a file not
  synced since it last changed is torn as above.

Real filesystems leave something between these; a program that survives all three at every
event makes no assumption beyond what POSIX and ``fsync`` promise.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

SHIM_SOURCE = Path(__file__).resolve().parent / "crashsim" / "fp_crashsim.c"
VARIANTS = ("lost", "torn", "kept")

FileId = Tuple[int, int]  # (inode, birth time in ns)


def build_shim(out_dir: Path) -> Path:
    """Compiles the recorder; raises with the compiler's message if it cannot."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) to build the power-loss recorder")
    lib = out_dir / "fp_crashsim.so"
    proc = subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(SHIM_SOURCE),
                           "-ldl", "-lpthread"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cannot build the power-loss recorder:\n{proc.stderr}")
    return lib


@dataclass(frozen=True)
class Entry:
    kind: str  # 'd', 'f', 'l' or 'o'
    fid: FileId
    size: int
    copy: int  # data/<copy> holds the bytes (0: none)
    rel: str  # path under the root, "." for the root


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str  # init, sync, rename, unlink, mkdir, rmdir, create, mark
    thread: int
    a: str
    b: str


class Recording:
    """The events and tree snapshots one recorded run wrote under ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.events: List[Event] = []
        for line in (out / "events").read_text().splitlines():
            seq, kind, thread, a, b = line.split("\t")
            self.events.append(Event(int(seq), kind, int(thread), a, b))
        if not self.events or self.events[0].kind != "init":
            raise RuntimeError(f"{out}: the recorder did not start (no init event)")
        self._trees: Dict[int, List[Entry]] = {}

    def tree(self, seq: int) -> List[Entry]:
        if seq not in self._trees:
            entries = []
            for line in (self.out / "tree" / str(seq)).read_text().splitlines():
                kind, ino, birth, size, copy, rel = line.split("\t", 5)
                entries.append(Entry(kind, (int(ino), int(birth)), int(size), int(copy), rel))
            self._trees[seq] = entries
        return self._trees[seq]

    def content(self, copy: int) -> bytes:
        return (self.out / "data" / str(copy)).read_bytes() if copy else b""

    def marks(self, upto: int) -> List[str]:
        """The acknowledgements made at or before event ``upto``."""
        return [e.a for e in self.events if e.kind == "mark" and e.seq <= upto]

    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for e in self.events:
            out[e.kind] = out.get(e.kind, 0) + 1
        return out

    # -- what survives a cut right after event `k` -----------------------------------------------

    def _last_sync(self, kind: str, fid: FileId, k: int) -> Optional[int]:
        """The seq of the last fsync of that file (kind 'f') or directory ('d') at or before k."""
        key = f"{kind}:{fid[0]}:{fid[1]}"
        best = None
        for e in self.events:
            if e.seq > k:
                break
            if e.kind == "sync" and e.a == key:
                best = e.seq
        return best

    def _entry_at(self, seq: int, fid: FileId) -> Optional[Entry]:
        for e in self.tree(seq):
            if e.fid == fid:
                return e
        return None

    def _children(self, seq: int, dir_rel: str) -> List[Entry]:
        prefix = "" if dir_rel == "." else dir_rel + "/"
        return [e for e in self.tree(seq)
                if e.rel != "." and e.rel.startswith(prefix) and "/" not in e.rel[len(prefix):]]

    def _durable_file(self, entry: Entry, k: int, variant: str) -> bytes:
        synced = self._last_sync("f", entry.fid, k)
        if synced is not None:
            at_sync = self._entry_at(synced, entry.fid)
            if at_sync is not None:
                if variant != "kept" or at_sync.copy == entry.copy:
                    return self.content(at_sync.copy)
        initial = self._entry_at(0, entry.fid)
        if initial is not None and (variant != "kept" or initial.copy == entry.copy):
            return self.content(initial.copy)
        if variant == "lost":
            return b""
        latest = self._entry_at(k, entry.fid) or entry
        return torn(self.content(latest.copy))

    def _durable_listing(self, dir_entry: Entry, k: int) -> Tuple[int, str]:
        """Where the directory's surviving entries are read from: (tree seq, its path there)."""
        synced = self._last_sync("d", dir_entry.fid, k)
        if synced is not None:
            at_sync = self._entry_at(synced, dir_entry.fid)
            if at_sync is not None:
                return synced, at_sync.rel
        initial = self._entry_at(0, dir_entry.fid)
        if initial is not None:
            return 0, initial.rel
        return -1, ""  # created after the start and never synced: it survives empty

    def state(self, k: int, variant: str) -> Dict[str, Tuple[str, bytes]]:
        """{path under the root: (kind, bytes)} after a cut right after event ``k``."""
        if variant not in VARIANTS:
            raise ValueError(variant)
        out: Dict[str, Tuple[str, bytes]] = {}
        if variant == "kept":
            for e in self.tree(k):
                if e.rel == ".":
                    continue
                if e.kind == "d":
                    out[e.rel] = ("d", b"")
                elif e.kind == "l":
                    out[e.rel] = ("l", self.content(e.copy))
                elif e.kind == "f":
                    out[e.rel] = ("f", self._durable_file(e, k, variant))
            return out
        root = self._entry_at(0, self.tree(0)[0].fid)
        assert root is not None and root.rel == "."
        seen = set()

        def walk(dir_entry: Entry, rel_out: str) -> None:
            if dir_entry.fid in seen:
                return  # a directory listed in two surviving places: keep the first
            seen.add(dir_entry.fid)
            seq, rel_then = self._durable_listing(dir_entry, k)
            if seq < 0:
                return
            for child in self._children(seq, rel_then):
                name = child.rel.rsplit("/", 1)[-1]
                path = name if rel_out == "." else f"{rel_out}/{name}"
                if child.kind == "d":
                    out[path] = ("d", b"")
                    walk(child, path)
                elif child.kind == "l":
                    out[path] = ("l", self.content(child.copy))
                elif child.kind == "f":
                    out[path] = ("f", self._durable_file(child, k, variant))

        walk(root, ".")
        return out

    def crash_states(self, variants: Sequence[str] = VARIANTS
                     ) -> Iterator[Tuple[int, str, Dict[str, Tuple[str, bytes]]]]:
        """(event, variant, state) for a cut after every event, each distinct state once."""
        seen = set()
        for e in self.events:
            for variant in variants:
                state = self.state(e.seq, variant)
                digest = hashlib.sha256()
                for path in sorted(state):
                    kind, data = state[path]
                    digest.update(f"{path}\0{kind}\0{len(data)}\0".encode())
                    digest.update(data)
                # The same bytes after other acknowledgements are a different case.
                digest.update("\0".join(self.marks(e.seq)).encode())
                key = digest.hexdigest()
                if key in seen:
                    continue
                seen.add(key)
                yield e.seq, variant, state


def torn(data: bytes) -> bytes:
    """The bytes of a write torn halfway: the second half reads as zeros."""
    half = len(data) // 2
    return data[:half] + bytes(len(data) - half)


def materialize(state: Dict[str, Tuple[str, bytes]], root: Path) -> None:
    """Writes ``state`` as a fresh tree at ``root`` (which must not exist)."""
    root.mkdir(parents=True)
    for path in sorted(state, key=lambda p: p.count("/")):
        kind, data = state[path]
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "d":
            target.mkdir(exist_ok=True)
        elif kind == "l":
            os.symlink(data.decode(), target)
        else:
            target.write_bytes(data)


def _recorded_env(lib: Path, root: Path, out: Path, **extra: str) -> Dict[str, str]:
    # After what is already preloaded (an ASan runtime must stay first).
    preload = " ".join(p for p in (os.environ.get("LD_PRELOAD", ""), str(lib)) if p)
    return dict(os.environ, LD_PRELOAD=preload, FP_CRASHSIM_ROOT=str(root), FP_CRASHSIM_OUT=str(out),
                **extra)


def record(lib: Path, root: Path, out: Path, argv: List[str], timeout: float = 300) -> Recording:
    """Runs ``python argv...`` with the recorder watching ``root``; returns what it recorded."""
    out.mkdir(parents=True)
    proc = subprocess.run([sys.executable, *argv], env=_recorded_env(lib, root, out),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"recorded program failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return Recording(out)


def record_ranks(lib: Path, root: Path, out: Path, argv: List[str], world_size: int,
                 timeout: float = 300) -> Recording:
    """Runs ``world_size`` processes of ``python argv...`` at once, all recorded into one
    sequence of events; each gets ``RANK``, ``WORLD_SIZE`` and ``FP_CRASHSIM_STORE`` (a file for
    ``torch.distributed``'s file store, outside ``root``). Raises if any fails or the whole run
    takes longer than ``timeout`` seconds (the others are killed then)."""
    out.mkdir(parents=True)
    store = out.parent / f"{out.name}-store"
    logs = [out.parent / f"{out.name}-rank{r}.log" for r in range(world_size)]
    procs = []
    try:
        for rank in range(world_size):
            env = _recorded_env(lib, root, out, RANK=str(rank), WORLD_SIZE=str(world_size),
                                FP_CRASHSIM_STORE=str(store))
            with open(logs[rank], "w") as log:
                procs.append(subprocess.Popen([sys.executable, *argv], env=env, stdout=log,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        text = "\n".join(f"--- rank {r} (exit {code}):\n{logs[r].read_text()}" for r, code in failed)
        raise AssertionError(f"recorded ranks failed or timed out ({timeout} s):\n{text}")
    return Recording(out)
