# SPDX-License-Identifier: Apache-2.0
"""The multi-rank side of :class:`fastpersist.CheckpointManager` (torch.distributed initialized,
more than one rank).

torch.distributed.checkpoint (DCP) plans every save and load (sharded DTensors, replicated
tensors written once with the writing spread over the ranks, resharding on load);
:mod:`fastpersist.dcp` moves the bytes. This module adds what a training job needs around it:

- Two gloo process groups of the manager's own: one for the background saves, one for the
  calls the training loop makes (list, latest, verify, load). Neither is the training loop's, so
  a checkpoint's collectives never interleave with the job's.
- Rank 0 is the coordinator: it holds the root's lock (a C++ CheckpointManager), commits every
  save with the manager's protocol, applies retention, and decides what ``latest``, ``list``,
  ``verify`` and ``resume`` answer; the answer is broadcast, so every rank agrees.
- A failed save commits nothing and raises the same :class:`DistributedCheckpointError` on
  every rank, naming the ranks that failed or never finished writing.
- Saves run one at a time, in the background (DCP's thread-mode ``async_save``): the
  training loop is blocked only while DCP copies the state to host memory. The copy goes into
  memory kept from the manager's previous save (one DCP stager for the manager's life, which
  caches its host copy of every tensor storage), so after the first save it costs a copy, not
  the allocation and first touch of new memory (4x less blocking on this VM). One save at a
  time is what makes reusing that memory safe.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from . import _core
from .dcp import FastPersistReader, FastPersistWriter
from .errors import CheckpointCorruptError, CheckpointLockedError, DistributedCheckpointError

# Seconds a multi-rank save or call waits for another rank (CheckpointManager(timeout=)).
DEFAULT_TIMEOUT = 600.0
# After a broken collective, survivors check in as "fastpersist/<save id>/alive/<rank>" in the
# job's store and wait this long for the others.
_STORE_PREFIX = "fastpersist"
_CHECK_IN_SECONDS = 5.0


def _rank_failures(e: CheckpointException) -> Dict[int, BaseException]:
    """DCP's failures by rank ({rank: (exception, stack)} in torch 2.x)."""
    out: Dict[int, BaseException] = {}
    for rank, failure in e.failures.items():
        out[int(rank)] = failure[0] if isinstance(failure, tuple) else failure
    return out


def _failure_text(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}".strip()


class _PendingSave:
    """One save in the background on this rank, with the interface of the C++ PendingSave
    (what :class:`fastpersist.SaveHandle` wraps). DCP copies the state to host memory before
    ``async_save`` returns, so the snapshot is over when the save starts."""

    def __init__(self, owner: "DistributedCheckpoints", tag: str, save_id: str, future: Any,
                 snapshot_seconds: float, started: float) -> None:
        self.owner = owner
        self.tag = tag
        self.save_id = save_id
        self.future = future
        self.snapshot_seconds = snapshot_seconds
        self.started = started
        self.finished: Optional[float] = None
        self.reported = False
        self.bytes = 0
        self.checksum_seconds = 0.0
        self.retention_error = ""
        self.base_tag = ""  # multi-rank saves are full checkpoints
        self.referenced_bytes = 0

    def snapshot_done(self) -> bool:
        return True

    def wait_snapshot(self) -> None:
        return None

    def done(self) -> bool:
        return bool(self.future.done())

    def wait(self) -> None:
        self.owner._settle(self)

    def wait_done(self) -> bool:
        """Blocks until done; True when committed. Reports nothing (an on-commit hook)."""
        return self.future.exception() is None  # blocks until the future is done

    @property
    def total_seconds(self) -> float:
        end = self.finished if self.finished is not None else time.monotonic()
        return end - self.started


class DistributedCheckpoints:
    """What CheckpointManager does when several ranks save together (see the module doc)."""

    def __init__(self, root: str, options: Any, settings: Dict[str, Any], timeout: float) -> None:
        self.root = root
        self.settings = settings
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        span = datetime.timedelta(seconds=timeout)
        self.save_group = dist.new_group(backend="gloo", timeout=span)
        self.control_group = dist.new_group(backend="gloo", timeout=span)
        core: Any = None
        error: Optional[BaseException] = None
        if self.rank == 0:
            try:
                core = _core.CheckpointManager(root, options)
            except BaseException as e:  # noqa: BLE001 (broadcast, then raised on every rank)
                error = e
        self._agree_or_raise(error)
        self.core = core
        # One writer for every save: its native ShardWriter (and staging memory) is reused.
        self.writer = FastPersistWriter(os.path.join(root, "pending"), **settings)
        if self.rank == 0:
            self.writer._committer = core
        self.stager = _caching_stager()
        self.pending: Optional[_PendingSave] = None
        self.saves = 0
        self.closed = False

    # ------------------------------------------------------------------------------ agreement
    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value`, on every rank (over the control group)."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    def _agree_or_raise(self, error: Optional[BaseException]) -> None:
        """Raises rank 0's error (same class where it is a known one) on every rank."""
        text = self.broadcast(None if error is None else (type(error).__name__, str(error)))
        if text is None:
            return
        name, message = text
        known: Dict[str, Callable[[str], BaseException]] = {
            "CheckpointLockedError": CheckpointLockedError, "FileNotFoundError": FileNotFoundError,
            "FileExistsError": FileExistsError, "ValueError": ValueError,
            "CheckpointCorruptError": CheckpointCorruptError, "PermissionError": PermissionError,
        }
        raise known.get(name, RuntimeError)(message if name in known else f"{name}: {message}")

    def on_coordinator(self, fn: Callable[[], Any]) -> Any:
        """Runs `fn` on rank 0 and returns its result on every rank, or raises its error on
        every rank."""
        result: Any = None
        error: Optional[BaseException] = None
        if self.rank == 0:
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001
                error = e
        self._agree_or_raise(error)
        return self.broadcast(result)

    # ------------------------------------------------------------------------------ saving
    def save_async(self, tag: str, state: Any, step: Optional[int],
                   metadata: Optional[Dict[str, Any]]) -> _PendingSave:
        """Starts a save of every rank's `state` (a collective call); returns once the state is
        copied to host memory, which is how long the training loop is blocked."""
        self._check_open()
        self.wait()  # one save at a time: the saves' collectives share one process group
        self.saves += 1
        save_id = f"{tag}-{self.saves}"
        writer = self.writer
        writer._step = step
        writer._metadata = dict(metadata or {})
        writer._retention_error = ""
        started = time.monotonic()
        try:
            response = dcp.async_save(state, checkpoint_id=os.path.join(self.root, tag),
                                      storage_writer=writer, process_group=self.save_group,
                                      async_checkpointer_type=AsyncCheckpointerType.THREAD,
                                      **({} if self.stager is None else {"async_stager": self.stager}))
        except BaseException as e:  # noqa: BLE001 (staging failed: no collective was started)
            writer.abort()
            raise DistributedCheckpointError(f"fastpersist: checkpoint {tag!r} was not saved: "
                                             f"{_failure_text(e)}", {self.rank: _failure_text(e)}) from e
        future = getattr(response, "upload_completion", response)
        self.pending = _PendingSave(self, tag, save_id, future, time.monotonic() - started, started)
        return self.pending

    def wait(self) -> None:
        """Waits for the save in flight; raises its failure (once)."""
        if self.pending is not None:
            self._settle(self.pending)

    def _settle(self, pending: _PendingSave) -> None:
        """Waits for `pending`; raises its failure once (to whoever waits first)."""
        try:
            pending.future.result()
        except BaseException as e:  # noqa: BLE001 (DCP's CheckpointException is a BaseException)
            self.writer.abort()
            self._finish(pending)
            if pending.reported:
                return
            pending.reported = True
            raise self._save_error(pending, e) from None
        self._finish(pending)
        pending.retention_error = self.writer._retention_error

    def _finish(self, pending: _PendingSave) -> None:
        if pending.finished is None:
            pending.finished = time.monotonic()
            pending.bytes = self.writer._bytes_written
        if self.pending is pending:
            self.pending = None

    def _save_error(self, pending: _PendingSave, e: BaseException) -> DistributedCheckpointError:
        """The same error on every rank: the ranks whose failure DCP gathered, or (a collective
        broke: a rank died or hung) the ranks that no longer answer."""
        if isinstance(e, CheckpointException):
            failures = {r: _failure_text(x) for r, x in _rank_failures(e).items()}
            said = "; ".join(f"rank {r}: {t}" for r, t in sorted(failures.items()))
            return DistributedCheckpointError(
                f"fastpersist: checkpoint {pending.tag!r} was not saved, nothing was committed "
                f"({said})", failures)
        silent = self._silent_ranks(pending.save_id)
        why = "does not answer (it died, hung or lost its connection)"
        failures = {r: why for r in silent}
        named = ", ".join(f"rank {r}" for r in silent) or "a rank"
        return DistributedCheckpointError(
            f"fastpersist: checkpoint {pending.tag!r} was not saved, nothing was committed: "
            f"{named} {why}; the save's collective failed with {_failure_text(e)}", failures)

    def _silent_ranks(self, save_id: str) -> List[int]:
        """After a broken collective: every surviving rank checks in through the job's store
        and waits a few seconds for the others; the ranks that never check in are named."""
        store = _default_store()
        if store is None:
            return []
        key = f"{_STORE_PREFIX}/{save_id}/alive/"
        deadline = time.monotonic() + _CHECK_IN_SECONDS
        try:
            store.set(key + str(self.rank), "1")
            while True:
                silent = [r for r in range(self.world_size) if not store.check([key + str(r)])]
                if not silent or time.monotonic() > deadline:
                    return silent
                time.sleep(0.1)
        except Exception:  # noqa: BLE001 (the store's host may be the rank that died)
            return []

    # ------------------------------------------------------------------------------ loading
    def load(self, directory: str, into: Any, verify: bool, strict: bool) -> Any:
        """Fills `into` (every rank's own layout: DCP reshards) from the checkpoint directory.
        Not strict: entries the checkpoint lacks (another world size's per-rank values) are left
        as they are."""
        if into is None:
            raise ValueError("fastpersist: a multi-rank load needs into= (the state to fill; "
                             "its sharding decides what each rank reads)")
        try:
            dcp.load(into, storage_reader=FastPersistReader(directory, verify=verify),
                     planner=DefaultLoadPlanner(allow_partial_load=not strict),
                     process_group=self.control_group)
        except CheckpointException as e:
            failures = _rank_failures(e)
            said = "; ".join(f"rank {r}: {_failure_text(x)}" for r, x in sorted(failures.items()))
            text = f"fastpersist: cannot load {directory}: {said}"
            if any(isinstance(x, CheckpointCorruptError) for x in failures.values()):
                raise CheckpointCorruptError(text) from None
            raise DistributedCheckpointError(text, {r: _failure_text(x) for r, x in failures.items()}) from None
        return into

    # ------------------------------------------------------------------------------ closing
    def close(self) -> None:
        if self.closed:
            return
        try:
            self.wait()
        finally:
            self.closed = True
            self.writer.close()
            if self.stager is not None:
                self.stager.close()  # frees the host copy of the state
            if self.core is not None:
                self.core.close()
            for group in (self.save_group, self.control_group):
                dist.destroy_process_group(group)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"the CheckpointManager for {self.root} is closed")


def _caching_stager() -> Any:
    """DCP's stager that copies the state to host memory it keeps for the next save (pinned
    where CUDA is there to pin it), or None where this torch has none (DCP then stages into new
    memory every time)."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # noqa: PLC0415
    except ImportError:  # torch before 2.8
        return None
    pinned = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=pinned, use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=False))


def _default_store() -> Any:
    """The default process group's key-value store (a TCPStore or FileStore), if reachable."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 (private API: without it errors name no rank)
        return None

