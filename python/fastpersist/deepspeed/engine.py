# SPDX-License-Identifier: Apache-2.0
"""``FastPersistCheckpointEngine``: DeepSpeed's checkpoint-engine interface over fastpersist.

One ``engine.save_checkpoint(save_dir, tag)`` is one fastpersist commit (docs/commit_protocol.md):

- ``create(info)``: rank 0 opens a ``CheckpointManager`` on ``save_dir`` (its lock, retention,
  commit order) and begins a commit: a temporary folder ``save_dir/.tmp-<tag>-*``; every rank
  learns it. An existing tag is refused before anything is written.
- ``save(state, save_dir/tag/name)``: the state is pickled on the caller's thread into a
  ``DeferredFileWriter`` that borrows the tensors' storages, and persisted into the temporary
  folder (O_DIRECT, fdatasync, XXH3-64 of the whole file): at once, or with ``async_save`` on a
  background thread while training goes on. Names and bytes are DeepSpeed's own.
- Compressed or incremental tags (``compression=``, ``incremental=True``) are stored split
  (include/fastpersist/split_file.h): each file's tensor storages become checkpoint tensors
  (compressed, or references to the last full tag), the rest a skeleton file under the file's
  own name. A rank writes all its files at once, in one ``ShardWriter.write_split``, once
  DeepSpeed has saved them all (at ``commit``, or with ``async_save`` when save_checkpoint
  returns). Such a tag loads through this engine; ``fastpersist convert`` makes plain files.
- ``commit(info)``: waits for this rank's files, gathers every rank's file records to rank 0,
  which writes the manifest, renames the folder to ``save_dir/tag`` and replaces ``latest``
  atomically; the outcome reaches every rank. Until that rename no tag exists: a crash of any
  rank at any moment leaves ``latest`` naming the previous complete tag.

With ``async_save`` the engine is decoupled (DeepSpeed's own term): ``save_checkpoint`` returns
after pickling, and DeepSpeed calls ``commit`` at the next optimizer step, before the step changes
the tensors the files are written from. ``wait()`` (the next save, a load, ``engine.destroy()``,
interpreter exit) commits a save that no step committed yet.
"""

from __future__ import annotations

import datetime
import json
import os
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine  # type: ignore[import-not-found, import-untyped, unused-ignore]

from .. import _core
from ..split_tags import SPLIT_KEY, is_split_tag
from ..errors import CheckpointCorruptError, CheckpointLockedError
from .files import capture, check, load_file, load_split_file
from .settings import EngineSettings

# How a coordinator's error reaches the other ranks: its class name and message.
_KNOWN_ERRORS = {cls.__name__: cls for cls in (
    FileExistsError, FileNotFoundError, PermissionError, ValueError, TypeError, OSError,
    CheckpointCorruptError, CheckpointLockedError, RuntimeError)}


class _Save:
    """One tag between create() and commit()."""

    def __init__(self, info: CheckpointCommitInfo, save_dir: str, tmp: str, base_tag: str,
                 commit: Any, step: Optional[int], metadata: Dict[str, Any]) -> None:
        self.info = info
        self.tag = str(info.tag)
        self.save_dir = save_dir
        self.tag_dir = os.path.join(save_dir, self.tag)
        self.tmp = tmp
        self.base_tag = base_tag  # incremental: the full tag the pieces may reference ("" none)
        self.commit = commit  # rank 0's _core.CheckpointCommit
        self.step = step
        self.metadata = metadata
        self.names: List[str] = []
        self.records: List[Any] = []
        self.tensors: List[Any] = []  # split tags: the pieces' records
        self.jobs: List[Tuple[Future, Any]] = []  # async: (persist future, state kept alive)
        # Split tags: the captured files (with their states, kept alive until written), and
        # the write of all of them (async: a future; sync: run by commit()).
        self.captured: List[Tuple[Any, Any]] = []
        self.split_job: Optional[Future] = None
        self.error: Optional[BaseException] = None
        # save_checkpoint returned: every file of the tag is saved (or being written, async).
        # Only such a save may commit outside DeepSpeed's own commit call (wait, exit).
        self.complete = False
        self.stats: Dict[str, int] = {}


class FastPersistCheckpointEngine(CheckpointEngine):
    """DeepSpeed's ``CheckpointEngine`` writing durable, checksummed, atomically committed tags.

    Made by :func:`fastpersist.deepspeed.install`, which also routes ``save_checkpoint`` and
    ``load_checkpoint`` through it. Every rank of the job makes one (a collective call).
    """

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(None)
        self.name = "FastPersistCheckpointEngine"
        self.settings = settings
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self._group = None
        if self.world_size > 1:
            self._group = dist.new_group(backend="gloo",
                                         timeout=datetime.timedelta(seconds=settings.timeout))
        self._managers: Dict[str, Any] = {}  # rank 0: save folder -> _core.CheckpointManager
        self._shard_writer: Any = None  # split tags: this rank's _core.ShardWriter (staging reused)
        self._save: Optional[_Save] = None
        self._executor: Optional[ThreadPoolExecutor] = None
        self._manifests: Dict[str, Any] = {}  # tag folder -> (key, reader) for loads
        self._warned: set = set()
        self._next: Dict[str, Any] = {"step": None, "metadata": {}}
        self.closed = False
        self.last_commit: Optional[Dict[str, Any]] = None  # what the last commit wrote
        # This rank's counters: the last save's files (bytes; lent to the writer, not copied;
        # copied), and its loads (files, bytes, seconds in load(); reset by assigning).
        self.save_stats: Dict[str, int] = {}
        self.load_stats: Dict[str, float] = {"files": 0, "bytes": 0, "seconds": 0.0}
        self.transform: Optional[Any] = None  # load_checkpoint's dtype/keys, for one load

    # ------------------------------------------------------------------ DeepSpeed's interface
    def create(self, info: CheckpointCommitInfo) -> None:
        self._check_open()
        self.wait()  # a save no optimizer step committed yet commits first
        tag = str(info.tag)
        save_dir = os.path.abspath(os.fspath(info.save_dir))

        def begin() -> Any:
            _core.validate_tag(tag)
            return self._manager(save_dir).begin_commit(tag)

        commit, (tmp, base_tag) = self._coordinate(begin, lambda c: (c.directory, c.base_tag))
        self._save = _Save(info, save_dir, tmp, base_tag, commit, self._next["step"],
                           self._next["metadata"])
        self._next = {"step": None, "metadata": {}}

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        s = self._save
        if s is not None and _inside(os.path.abspath(path), s.tag_dir):
            return  # the tag's files go to the commit's temporary folder
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        s = self._save
        if s is None:
            raise RuntimeError("fastpersist: DeepSpeed saved a file outside save_checkpoint "
                               f"({path}); the engine commits files only inside a tag")
        if s.error is not None:
            return  # this rank failed already: commit() reports it on every rank
        try:
            folder, name = os.path.split(os.path.abspath(os.fspath(path)))
            if folder != s.tag_dir:
                raise ValueError(f"fastpersist: DeepSpeed saved {path}, which is not in the tag "
                                 f"folder {s.tag_dir}; the engine writes plain files of a tag only")
            if name in s.names:
                raise FileExistsError(f"fastpersist: {path} was saved twice in tag {s.tag!r}")
            s.names.append(name)
            rank = self.rank if self.world_size > 1 else None
            f = capture(state_dict, s.tmp, name, self.settings, rank)
            for key, value in f.stats().items():
                if key in ("bytes", "borrowed_bytes", "copied_bytes"):
                    s.stats[key] = s.stats.get(key, 0) + int(value)
            if self.settings.split:
                s.captured.append((f, state_dict))  # written with the others (_write_split)
            elif self.settings.async_save:
                s.jobs.append((self._pool().submit(f.persist), (state_dict, f)))
            else:
                s.records.append(f.persist())
        except BaseException as e:  # noqa: BLE001 (reported on every rank by commit())
            s.error = e

    def commit(self, info: CheckpointCommitInfo) -> bool:
        s = self._save
        if s is None or str(info.tag) != s.tag:
            return True  # nothing of ours is open (a commit DeepSpeed repeats)
        self._save = None
        self.save_stats = dict(s.stats)
        if self.settings.split and s.error is None:
            try:
                result = (s.split_job.result() if s.split_job is not None
                          else self._write_split(s))
                s.records.extend(result.files)
                s.tensors.extend(result.tensors)
                self.save_stats["referenced_bytes"] = int(result.referenced_bytes)
                self.save_stats["written_bytes"] = int(result.bytes_written)
            except BaseException as e:  # noqa: BLE001
                s.error = e
        for f, _state in s.captured:
            f.abort()  # a no-op for a written file; drops the stream of one never written
        s.captured.clear()
        for future, _keep in s.jobs:
            try:
                s.records.append(future.result())
            except BaseException as e:  # noqa: BLE001
                if s.error is None:
                    s.error = e
        s.jobs.clear()  # the states may change again
        error = None if s.error is None else (type(s.error).__name__, str(s.error))
        gathered = self._gather((s.records, s.tensors, error))

        def finish() -> Dict[str, Any]:
            failures = [(r, e) for r, (_, _, e) in enumerate(gathered) if e is not None]
            if failures:
                s.commit.abort()
                rank, (kind, text) = failures[0]
                raise _KNOWN_ERRORS.get(kind, RuntimeError)(
                    f"tag {s.tag!r} was not committed: rank {rank} failed: {text}")
            unique: Dict[str, Any] = {}  # a base file several ranks reference is listed once
            for records, _, _ in gathered:
                for rec in records:
                    unique.setdefault(rec.name, rec)
            files = list(unique.values())
            tensors = [t for _, ts, _ in gathered for t in ts]
            metadata = dict(s.metadata, world_size=self.world_size)
            if self.settings.split:
                metadata[SPLIT_KEY] = True  # loads reassemble its files (split_tags.py)
            versions = {"torch": torch.__version__, "deepspeed": _deepspeed_version()}
            s.commit.commit(_core.CommitContent(
                files=files, tensors=tensors, step=s.step,
                metadata_json=json.dumps({"deepspeed": metadata}), versions=versions,
                world_size=self.world_size, checksums=self.settings.checksums))
            return {"tag": s.tag, "files": len(files), "bytes": sum(int(f.size) for f in files),
                    "retention_error": s.commit.retention_error}

        _, self.last_commit = self._coordinate(finish, lambda r: r)
        if self.last_commit and self.last_commit.get("retention_error"):
            warnings.warn(f"fastpersist: {self.last_commit['retention_error']}", stacklevel=2)
        return True

    def load(self, path: str, map_location: Any = None) -> Any:
        self._check_open()
        started = time.perf_counter()
        path = os.path.abspath(os.fspath(path))
        folder, name = os.path.split(path)
        reader = self._reader(folder)
        manifest = None if reader is None else reader.manifest
        record = None
        checksums = False
        if manifest is None:
            if folder not in self._warned:
                self._warned.add(folder)
                warnings.warn(f"fastpersist: {folder} has no fastpersist manifest (written by "
                              "another checkpoint engine): its files cannot be verified, only "
                              "loaded", stacklevel=2)
        else:
            record = next((f for f in manifest.files if f.name == name), None)
            if record is None:
                raise CheckpointCorruptError(f"fastpersist: {path} is not a file of the committed "
                                             f"tag {os.path.basename(folder)!r} (its manifest "
                                             "does not list it)")
            checksums = manifest.checksum_algorithm != "none"
        if manifest is not None and is_split_tag(manifest):
            state, size = load_split_file(reader, path, checksums, map_location,
                                          self.settings.weights_only)
        else:
            state = load_file(path, record, checksums, map_location, self.settings.weights_only)
            size = os.path.getsize(path)
        self.load_stats["files"] += 1
        self.load_stats["bytes"] += size
        self.load_stats["seconds"] += time.perf_counter() - started
        return state if self.transform is None else self.transform(state)

    def is_decoupled(self) -> bool:
        return self.settings.async_save

    def get_commit_info(self) -> Optional[CheckpointCommitInfo]:
        """The save that the next optimizer step commits (DeepSpeed then writes ``latest`` only
        when save_latest is set: it is not, our commit replaced it atomically already)."""
        s = self._save
        if s is None:
            return None
        return CheckpointCommitInfo(tag=s.tag, save_dir=s.save_dir, save_latest=False)

    def cleanup(self) -> None:
        self.close()

    def preserves_storage_sharing(self) -> bool:
        return True  # torch.save keeps views sharing a storage; DeepSpeed clones before save()

    # ------------------------------------------------------------------ ours
    def expect(self, step: Optional[int], metadata: Dict[str, Any]) -> None:
        """What the next save's manifest records (the engine's global step and ZeRO stage)."""
        self._next = {"step": step, "metadata": metadata}

    def pending(self) -> Optional[str]:
        """The tag saved but not committed yet (async), or None."""
        return None if self._save is None else self._save.tag

    def saved(self) -> None:
        """save_checkpoint returned: the open save holds every file of its tag (a split tag's
        files are then written, in the background with async_save)."""
        s = self._save
        if s is None:
            return
        s.complete = True
        if self.settings.split and self.settings.async_save and s.error is None:
            s.split_job = self._pool().submit(self._write_split, s)

    def wait(self) -> None:
        """Commits the save that is still open (async), on every rank together (a collective
        call, like save_checkpoint); returns at once when none is. A save whose
        save_checkpoint raised is not committed: its files are dropped (on this rank alone)."""
        s = self._save
        if s is None:
            return
        if not s.complete:
            self._abandon(s)
            return
        self.commit(s.info)

    def _abandon(self, s: _Save) -> None:
        self._save = None
        for future, (_state, f) in s.jobs:
            future.cancel()
            try:
                future.result()
            except BaseException:  # noqa: BLE001 (the save is dropped anyway)
                pass
            f.abort()
        s.jobs.clear()
        if s.split_job is not None:
            try:
                s.split_job.result()
            except BaseException:  # noqa: BLE001 (the save is dropped anyway)
                pass
        for f, _state in s.captured:
            f.abort()
        s.captured.clear()
        if s.commit is not None:
            s.commit.abort()

    def close(self) -> None:
        """Commits what is open, then releases the save folders' locks and the I/O thread."""
        if self.closed:
            return
        try:
            self.wait()
        finally:
            self.closed = True
            for m in self._managers.values():
                m.close()
            self._managers.clear()
            if self._shard_writer is not None:
                self._shard_writer.close()
                self._shard_writer = None
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def verify_tag(self, folder: str) -> Dict[str, Any]:
        """Checks every file of a committed tag (ranks share the files) before it is loaded:
        raises CheckpointCorruptError naming the first bad file on every rank. A tag without a
        manifest (another engine's) cannot be checked: it is reported, not refused."""
        reader = self._reader(folder)
        if reader is None:
            return {"verified": False, "files": 0}
        manifest = reader.manifest
        checksums = manifest.checksum_algorithm != "none"
        problem = None
        if is_split_tag(manifest):
            # Skeletons and tensors together: fastpersist verify's check, on rank 0.
            if self.rank == 0:
                problems = _core.verify_checkpoint(folder, self.settings.engine, None).problems
                problem = problems[0] if problems else None
            problems = [p for p in self._all_gather(problem) if p is not None]
            if problems:
                raise CheckpointCorruptError(f"fastpersist: tag {folder} failed validation: "
                                             f"{problems[0]}")
            return {"verified": checksums, "files": len(manifest.files)}
        for i, record in enumerate(manifest.files):
            if i % self.world_size != self.rank:
                continue
            try:
                check(os.path.join(folder, record.name), record, checksums)
            except (OSError, ValueError) as e:
                problem = f"{type(e).__name__}: {e}"
                break
        problems = [p for p in self._all_gather(problem) if p is not None]
        if problems:
            raise CheckpointCorruptError(f"fastpersist: tag {folder} failed validation: {problems[0]}")
        return {"verified": checksums, "files": len(manifest.files)}

    # ------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("fastpersist: the DeepSpeed checkpoint engine is closed")

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastpersist-ds")
        return self._executor

    def _manager(self, save_dir: str) -> Any:
        m = self._managers.get(save_dir)
        if m is None:
            m = _core.CheckpointManager(save_dir, self.settings.checkpoint)
            self._managers[save_dir] = m
        return m

    def _write_split(self, s: _Save) -> Any:
        """This rank's captured files of `s`, written split (GIL released); their states are
        released after."""
        if self._shard_writer is None:
            rank = self.rank if self.world_size > 1 else None
            self._shard_writer = _core.ShardWriter(self.settings.checkpoint, rank)
        files = [f.writer for f, _state in s.captured]
        return self._shard_writer.write_split(s.tmp, files, s.save_dir, s.base_tag or None)

    def _reader(self, folder: str) -> Any:
        """The tag's ``_core.CheckpointReader``, None without a manifest; cached by the
        manifest's identity."""
        path = os.path.join(folder, _core.layout.MANIFEST_FILE_NAME)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._manifests.get(folder)
        if cached is not None and cached[0] == key:
            return cached[1]
        reader = _core.CheckpointReader(folder, self.settings.engine)
        self._manifests[folder] = (key, reader)
        return reader

    def _coordinate(self, fn: Any, share: Any) -> Tuple[Any, Any]:
        """Runs `fn` on rank 0; returns (its result there and None elsewhere, share(result) on
        every rank), or raises its error on every rank."""
        result: Any = None
        shared: Any = None
        error = None
        if self.rank == 0:
            try:
                result = fn()
                shared = share(result)
            except BaseException as e:  # noqa: BLE001 (raised on every rank)
                error = (type(e).__name__, str(e))
        shared, error = self._broadcast((shared, error))
        if error is not None:
            kind, text = error
            raise _KNOWN_ERRORS.get(kind, RuntimeError)(text)
        return result, shared

    def _broadcast(self, value: Any) -> Any:
        if self._group is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def _gather(self, value: Any) -> List[Any]:
        if self._group is None:
            return [value]
        out: List[Any] = [None] * self.world_size if self.rank == 0 else []
        dist.gather_object(value, out if self.rank == 0 else None, dst=0, group=self._group)
        return out

    def _all_gather(self, value: Any) -> List[Any]:
        if self._group is None:
            return [value]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self._group)
        return out


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def _deepspeed_version() -> str:
    import deepspeed  # type: ignore[import-not-found, import-untyped, unused-ignore]

    return str(getattr(deepspeed, "__version__", "unknown"))
