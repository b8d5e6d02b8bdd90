# SPDX-License-Identifier: Apache-2.0
"""``fastpersist.CheckpointManager``: durable, verified, asynchronous checkpoints.

::

    mgr = fastpersist.CheckpointManager("/mnt/nvme/run1", keep_last=3)
    mgr.hook_optimizer(optimizer)            # step() waits only until the snapshot is taken
    for step in range(...):
        ...
        if step % 1000 == 0:
            mgr.save_async(step, {"model": model.state_dict(), "optim": optimizer.state_dict(),
                                  "step": step})
    mgr.close()
    state = mgr.load(into={"model": model.state_dict()}, strict=False)   # or mgr.resume()

Each checkpoint is a directory of safetensors files (4096-aligned, readable by the
``safetensors`` library), a pickled sidecar for the non-tensor objects, and a manifest written
last with every tensor's checksum; it appears under its tag only when complete (the commit
protocol is in docs/commit_protocol.md, the format in docs/format.md).
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch.utils.dlpack import to_dlpack

from . import _core
from ._checkpoint_options import Size, checkpoint_options
from ._commit_hook import CommitHook, CommittedCheckpoint
from ._system import parse_size
from ._tensor_source import NO_DEVICE, source_tensor
from .checkpoint_loading import DtypeSpec, KeySelection, key_predicate, load_checkpoint_dir
from .checkpoint_state import DTYPE_TO_SAFETENSORS, flatten_state
from .errors import CheckpointCorruptError, CheckpointUnsupportedError
from .tiers import CheckpointLocation, Tier, TierStatus, TierWarning, tier_options
from .warm_restore import (FOREGROUND, MODES, HookedOptimizer, check_key, owns,
                           start_background)
from .writer import engine_options

if TYPE_CHECKING:
    from .distributed import DistributedCheckpoints

PathLike = Union[str, "os.PathLike[str]"]


def tag_for(step_or_tag: Union[int, str]) -> str:
    """The tag of a save: ``"step-00001000"`` for an int step, a string tag as it is."""
    if isinstance(step_or_tag, bool):
        raise TypeError("step_or_tag must be an int step or a str tag, not bool")
    if isinstance(step_or_tag, int):
        if not 0 <= step_or_tag < 2 ** 63:
            raise ValueError(f"step must be >= 0 and < 2**63, got {step_or_tag}")
        return f"step-{step_or_tag:08d}"
    if isinstance(step_or_tag, str):
        _core.validate_tag(step_or_tag)
        return step_or_tag
    raise TypeError(f"step_or_tag must be an int step or a str tag, not {type(step_or_tag).__name__}")


#: A committed checkpoint as :meth:`CheckpointManager.checkpoints` lists it (the C++ record,
#: read-only): tag, step, sequence, created_unix, tensor_bytes, total_bytes, own_bytes,
#: num_tensors, references (an incremental checkpoint's base), incremental.
CheckpointInfo = _core.CheckpointInfo


# Tensors up to this size are copied when save_async is called, not by the background snapshot:
# a model's forward pass updates some of them in place (BatchNorm's running statistics and
# batch counter), and the optimizer hook guards only optimizer.step(). Such tensors are small;
# weights and optimizer moments, which only step() modifies, are snapshotted in the background.
_COPY_AT_CALL_BYTES = 1 << 20


class SaveHandle:
    """One save in progress: ``done()``, ``wait()``, ``result()``, ``snapshot_done()``."""

    def __init__(self, pending: Any, keepalive: List[torch.Tensor]) -> None:
        self._pending = pending
        self._keepalive: Optional[List[torch.Tensor]] = keepalive
        self._lock = threading.Lock()
        self._retention_reported = False
        self._hook_called: Optional[threading.Event] = None  # on_commit ran for this save

    @property
    def tag(self) -> str:
        return str(self._pending.tag)

    def snapshot_done(self) -> bool:
        """True once every tensor is copied: the training loop may modify them again."""
        done = bool(self._pending.snapshot_done())
        if done:
            self._release()
        return done

    def done(self) -> bool:
        """True once the checkpoint is committed (or the save failed)."""
        return bool(self._pending.done())

    def wait_snapshot(self) -> None:
        """Blocks until the tensors are snapshotted; raises if the save failed before that."""
        try:
            self._pending.wait_snapshot()
        finally:
            if self._pending.snapshot_done():
                self._release()

    def wait(self) -> str:
        """Blocks until committed; returns the tag, or raises the save's error."""
        try:
            self._pending.wait()
        finally:
            self._release()
        self._report_retention()
        return self.tag

    result = wait

    @property
    def snapshot_seconds(self) -> float:
        return float(self._pending.snapshot_seconds)

    @property
    def total_seconds(self) -> float:
        return float(self._pending.total_seconds)

    @property
    def bytes(self) -> int:
        return int(self._pending.bytes)

    @property
    def checksum_seconds(self) -> float:
        """CPU seconds spent on checksums (computed on staged bytes while the writes run)."""
        return float(self._pending.checksum_seconds)

    @property
    def tier_errors(self) -> List[str]:
        """Drain failures that happened since the previous save (warned as TierWarning)."""
        return list(getattr(self._pending, "tier_errors", []))

    @property
    def base(self) -> Optional[str]:
        """Once done, for an incremental save: the tag of the full checkpoint whose files it
        references for the tensors that did not change; None for a full checkpoint."""
        return str(self._pending.base_tag) or None

    @property
    def referenced_bytes(self) -> int:
        """Tensor bytes an incremental save took from its base without writing them."""
        return int(self._pending.referenced_bytes)

    @property
    def retention_error(self) -> Optional[str]:
        """Why removing older checkpoints after this commit failed, or None.

        That does not fail the save (the checkpoint is committed); retention runs again after
        the next save. It is also reported once as a ``RuntimeWarning``.
        """
        return str(self._pending.retention_error) or None

    def _report_retention(self) -> None:
        """Warns once about a failed retention, when the save is done."""
        with self._lock:
            if self._retention_reported or not self._pending.done():
                return
            self._retention_reported = True
        error = self.retention_error
        if error:
            warnings.warn(f"fastpersist: {error}", RuntimeWarning, stacklevel=3)

    def _release(self) -> None:
        with self._lock:
            self._keepalive = None

    def __repr__(self) -> str:
        state = "done" if self.done() else ("writing" if self.snapshot_done() else "snapshotting")
        return f"<SaveHandle {self.tag} {state}>"


_OPEN_MANAGERS: "weakref.WeakSet[CheckpointManager]" = weakref.WeakSet()


@atexit.register
def _close_open_managers() -> None:
    # Interpreter exit finishes in-flight saves (the data is in staging memory already) rather
    # than abandoning them half-written; failures are printed, since nobody is left to catch them.
    for mgr in list(_OPEN_MANAGERS):
        try:
            mgr.close()
        except Exception as e:  # noqa: BLE001 - reporting at exit is all that is left
            warnings.warn(f"fastpersist: a checkpoint save failed at exit: {e}")


class CheckpointManager:
    """Saves and loads checkpoints under one root directory.

    Every setting left at None takes the C++ default (``CheckpointOptions`` in
    include/fastpersist/checkpoint.h, shown here in brackets); sizes are bytes or strings such
    as "4GiB", which is why the Python names drop the C++ ``_bytes`` suffix.

    Args:
        root: directory of the run's checkpoints (created if needed). One manager at a time may
            write to it: a second one raises :class:`CheckpointLockedError`.
        keep_last: after each commit keep only the newest N checkpoints (None: keep all).
        keep_every: with keep_last, also keep every checkpoint whose step is a multiple of K.
        max_in_flight: saves queued or running at once; ``save_async`` waits for room [1].
        staging_budget: pinned staging memory for snapshots [0: as much as one checkpoint
            needs, kept and reused by later saves]. Smaller budgets stream the snapshot in
            pieces (the caller's tensors are then held longer). A budget below one
            ``staging_window`` lowers the window to it (at least 4096).
        staging_window: the unit of staging and of one write [64 MiB].
        lock_staging_memory: mlock (pin) the staging memory [True].
        max_parallel_files, target_file_size, min_file_size: data files written at once [4],
            their size [1 GiB], and the size below which they are not split [64 MiB].
        durable: fsync every file and directory [True; turn off only for throwaway runs].
        checksums: XXH3-64 of every tensor, computed while staging and checked on load [True].
            Off, loads and ``verify`` check sizes and headers only.
        compression: "zstd" or "lz4" to store tensors compressed, losslessly [None: raw,
            plain safetensors files]. Each 4 MiB chunk is byte-grouped by element width and
            compressed on worker threads after the snapshot; tensors that do not shrink by 5%
            stay raw. Loads decode on every core. See docs/compression.md.
        compression_level: the codec's level [zstd 1, lz4 0]; zstd takes up to 22 (negative:
            faster), lz4 0..12 (3 and up: LZ4-HC).
        compression_threads: worker threads that compress, and that hash tensors for
            incremental saves [0: one per core].
        incremental: store the tensors that did not change since the last full checkpoint as
            references to its files instead of writing them again [False]. Every save then
            hashes each tensor (XXH3-128, in the background snapshot). Loads, ``verify``,
            ``export_hf`` and ``convert`` follow the references; retention and ``remove``
            never delete a base that a kept checkpoint references. See docs/incremental.md.
        full_every: with ``incremental``, every N-th save is a full checkpoint, the base of
            the next ones [10]; a save is also full when more than half of the bytes changed.
        xor_deltas: with ``incremental``, a changed float tensor whose previous version is in
            the base is stored as the byte-grouped, zstd-compressed XOR with it when that is
            smaller [False]: a full fine-tune then writes the bits that moved, not every
            tensor. Loads read the base's bytes to undo it. See docs/incremental.md.
        tiers: a list of :class:`fastpersist.Tier`: each committed checkpoint a tier selects
            is copied there in the background (verified on the way, committed there with the
            same protocol, the tier's own retention). A failed drain never fails a save: it is
            retried and warned about (TierWarning) by the next save; ``wait()`` and ``close()``
            wait for the drains; ``resume()`` takes the newest checkpoint anywhere, pulling it
            back when it is only in a tier. See docs/tiers.md.
        pin_until_drained: a checkpoint a tier selects stays on local storage until it is
            there (retention skips it, ``remove`` refuses it) [True]; False: only while copied.
        save_every_steps, save_every_seconds: the save policy of :meth:`should_save` and
            :meth:`maybe_save`: a save is due when the step is a multiple of N, or when T seconds
            passed since the last save, whichever comes first. ``fastpersist advise`` suggests
            an interval from the checkpoint's cost and the failure rate.
        backend, block_size, queue_depth, intra_op_parallelism: I/O engine settings.
        distributed: save and load together with the other ranks of torch.distributed
            [None: when it is initialized with more than one rank]. Every rank then creates
            the manager and makes the same calls in the same order (they are collectives);
            state may hold DTensors (sharded by FSDP2, tensor or ZeRO-style parallelism) and
            replicated tensors, written once with the writing split over the ranks; rank 0
            commits and holds the root's lock. See docs/distributed.md.
        timeout: seconds a multi-rank save or call waits for another rank before it fails
            naming the ranks that did not answer [600].
        on_commit: called as ``on_commit(committed)`` after each save commits, with a
            ``CommittedCheckpoint`` (root, tag, path, step, and info: its
            :class:`CheckpointInfo`), in commit order, on a thread of the manager's own
            (multi-rank: on rank 0, where the commit happens). ``save()`` returns after it ran for its checkpoint,
            ``close()`` after it ran for all. An exception from it is warned about and never
            fails a save; a failed save calls nothing. For logging, e.g.
            ``fastpersist.mlflow.on_commit()``.
    """

    def __init__(
        self,
        root: PathLike,
        keep_last: Optional[int] = None,
        keep_every: Optional[int] = None,
        *,
        max_in_flight: Optional[int] = None,
        staging_budget: Optional[Size] = None,
        staging_window: Optional[Size] = None,
        lock_staging_memory: Optional[bool] = None,
        max_parallel_files: Optional[int] = None,
        target_file_size: Optional[Size] = None,
        min_file_size: Optional[Size] = None,
        durable: Optional[bool] = None,
        checksums: Optional[bool] = None,
        compression: Optional[str] = None,
        compression_level: Optional[int] = None,
        compression_threads: Optional[int] = None,
        incremental: Optional[bool] = None,
        full_every: Optional[int] = None,
        xor_deltas: Optional[bool] = None,
        tiers: Optional[List[Tier]] = None,
        pin_until_drained: Optional[bool] = None,
        save_every_steps: Optional[int] = None,
        save_every_seconds: Optional[float] = None,
        backend: Optional[str] = None,
        block_size: Optional[int] = None,
        queue_depth: Optional[int] = None,
        intra_op_parallelism: Optional[int] = None,
        distributed: Optional[bool] = None,
        timeout: Optional[float] = None,
        on_commit: Optional[Callable[[CommittedCheckpoint], None]] = None,
    ) -> None:
        self._root = os.fspath(root)
        if on_commit is not None and not callable(on_commit):
            raise TypeError(f"fastpersist: on_commit must be callable, got "
                            f"{type(on_commit).__name__}")
        settings = {"max_in_flight": max_in_flight, "staging_budget": staging_budget,
                    "staging_window": staging_window, "lock_staging_memory": lock_staging_memory,
                    "max_parallel_files": max_parallel_files, "target_file_size": target_file_size,
                    "min_file_size": min_file_size, "durable": durable, "checksums": checksums,
                    "compression": compression, "compression_level": compression_level,
                    "compression_threads": compression_threads,
                    "incremental": incremental, "full_every": full_every, "xor_deltas": xor_deltas,
                    "save_every_steps": save_every_steps, "save_every_seconds": save_every_seconds,
                    "backend": backend, "block_size": block_size, "queue_depth": queue_depth,
                    "intra_op_parallelism": intra_op_parallelism}
        o = checkpoint_options(settings, keep_last, keep_every)
        o.tiers = tier_options(tiers)
        if pin_until_drained is not None:
            o.pin_until_drained = bool(pin_until_drained)
        self._engine_options = o.engine
        self._options = o  # what the C++ manager was opened with (defaults filled in)
        self._dist: Optional["DistributedCheckpoints"] = None
        if _is_distributed(distributed):
            if incremental:
                raise ValueError("fastpersist: incremental checkpoints are written by one "
                                 "process; a multi-rank CheckpointManager saves full ones "
                                 "(pass incremental=False, or distributed=False)")
            from .distributed import DEFAULT_TIMEOUT, DistributedCheckpoints  # torch.distributed

            given = {k: v for k, v in settings.items() if v is not None and k != "max_in_flight"}
            self._dist = DistributedCheckpoints(self._root, o, given,
                                                DEFAULT_TIMEOUT if timeout is None else float(timeout))
            self._core = self._dist.core  # rank 0's C++ manager (None on the other ranks)
        else:
            self._core = _core.CheckpointManager(self._root, o)
        self._handles: List[SaveHandle] = []
        self._optimizers: List[HookedOptimizer] = []
        self._commit_hook: Optional[CommitHook] = None
        if on_commit is not None and (self._dist is None or self._dist.rank == 0):
            self._commit_hook = CommitHook(on_commit, self._root)
        _OPEN_MANAGERS.add(self)

    # ------------------------------------------------------------------------------ saving
    @property
    def root(self) -> str:
        return self._root

    def save(self, step_or_tag: Union[int, str], state: Any, *,
             metadata: Optional[Dict[str, Any]] = None) -> str:
        """Saves `state` and returns once it is committed and durable (and ``on_commit`` ran for
        it). Returns the tag."""
        handle = self.save_async(step_or_tag, state, metadata=metadata)
        tag = handle.wait()
        if handle._hook_called is not None:
            handle._hook_called.wait()
        return tag

    def save_async(self, step_or_tag: Union[int, str], state: Any, *,
                   metadata: Optional[Dict[str, Any]] = None) -> SaveHandle:
        """Starts a save and returns at once; see :class:`SaveHandle`.

        The tensors are snapshotted into pinned staging memory in the background: do not modify
        them until ``handle.snapshot_done()`` (an optimizer hooked with :meth:`hook_optimizer`
        waits for that by itself). Tensors of at most 1 MiB (BatchNorm statistics, counters,
        which a forward pass may update in place) are copied right here instead. Raises here
        the failure of an earlier save nobody waited for.
        """
        pending = [h.key for h in self._optimizers if h.pending is not None]
        if pending:
            raise RuntimeError(
                f"fastpersist: the optimizer state {pending[0]!r} of a warm restore "
                "(resume(optimizer=\"background\")) is not in its optimizer yet, so this state "
                "would be saved without it; take an optimizer.step() or call "
                "mgr.finish_restore() before building the state to save. Nothing was saved")
        tag = tag_for(step_or_tag)
        step = step_or_tag if isinstance(step_or_tag, int) else None
        if (step is None and isinstance(state, dict) and isinstance(state.get("step"), int)
                and not isinstance(state["step"], bool) and -2 ** 63 <= state["step"] < 2 ** 63):
            step = state["step"]
        metadata_json = json.dumps(metadata if metadata is not None else {})
        if not metadata_json.startswith("{"):
            raise TypeError("metadata must be a dict of JSON-serializable values")
        if self._dist is not None:
            _core.validate_tag(tag)
            self._forget_finished()
            handle = SaveHandle(self._dist.save_async(tag, state, step, metadata), [])
            self._handles.append(handle)
            self._watch(handle)
            return handle
        flat = flatten_state(state)
        keepalive: List[torch.Tensor] = []
        # (name, dtype, shape, DLPack capsule of the tensor): C++ reads the memory, its length
        # and device from it and checks them against dtype and shape. to_dlpack costs a tenth of
        # Tensor.__dlpack__ (it matters at 10^5 tensors); `keepalive` owns the memory.
        tensors: List[Tuple[str, str, List[int], Any]] = []
        devices: "set[int]" = set()
        for name, t in flat.tensors:
            src, device = source_tensor(t)
            nbytes = src.numel() * src.element_size()
            if (0 < nbytes <= _COPY_AT_CALL_BYTES
                    and src.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()):
                src = src.clone()  # on its device; a GPU clone is covered by the sync below
            keepalive.append(src)
            if nbytes and device != NO_DEVICE:
                devices.add(device)
            tensors.append((name, DTYPE_TO_SAFETENSORS[src.dtype], list(src.shape),
                            to_dlpack(src)))
        for device in devices:
            # The snapshot copies on its own stream: everything queued so far that writes these
            # tensors (the step that produced them, .contiguous() above) must be finished first.
            torch.cuda.current_stream(device).synchronize()
        versions = {"torch": torch.__version__, "python": platform.python_version()}
        self._forget_finished()
        pending = self._core_manager().save_async(tag, tensors, flat.aliases, flat.objects, step,
                                                  metadata_json, versions)
        handle = SaveHandle(pending, keepalive)
        self._handles.append(handle)
        self._watch(handle)
        for error in handle.tier_errors:
            warnings.warn(f"fastpersist: a drain into a tier failed (local saves go on; it is "
                          f"retried): {error}", TierWarning, stacklevel=3)
        return handle

    def _watch(self, handle: SaveHandle) -> None:
        if self._commit_hook is not None:
            handle._hook_called = self._commit_hook.watch(handle._pending, handle.tag)

    def should_save(self, step: int) -> bool:
        """Whether the save policy (``save_every_steps`` / ``save_every_seconds``) says to save
        at `step`; never twice for one step. ValueError when the manager has no policy."""
        if self._dist is not None:
            return bool(self._agreed(lambda: self._core.should_save(step)))
        return bool(self._core_manager().should_save(step))

    def maybe_save(self, step: int, state: Any, *,
                   metadata: Optional[Dict[str, Any]] = None) -> Optional[SaveHandle]:
        """``save_async(step, state)`` when :meth:`should_save` says so, else None."""
        if not self.should_save(step):
            return None
        return self.save_async(step, state, metadata=metadata)

    @property
    def staging_bytes(self) -> int:
        """Staging memory allocated now (kept for reuse by later saves; at most the budget)."""
        if self._dist is not None:
            writer = self._dist.writer._shard_writer
            return 0 if writer is None else int(writer.staging_bytes)
        return int(self._core_manager().staging_bytes)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for every save in flight; raises the first failure nobody collected.

        With tiers it then waits (at most `timeout` seconds) until every committed checkpoint
        a tier selects is there, and raises the drain's failure if one is not (a timeout
        raises ``CheckpointLockedError`` naming what is left).
        """
        drain_timeout = None if timeout is None else float(timeout)
        if self._dist is not None:
            self._dist.wait()
            if self._options.tiers:  # rank 0's manager drains; its outcome is every rank's
                self._dist.on_coordinator(lambda: self._core_manager().wait_drains(drain_timeout))
        else:
            self._core_manager().wait_all()
            self._forget_finished()
            if self._options.tiers:
                self._core_manager().wait_drains(drain_timeout)
        self._forget_finished()

    def tier_status(self) -> List[TierStatus]:
        """Where each tier stands: what it is copying, what waits, the last error."""
        return list(self._agreed(lambda: list(self._core_manager().tier_states())))

    def locations(self) -> List[CheckpointLocation]:
        """Every committed checkpoint of the local root and of the tiers, oldest first, with the
        roots that hold it (the local root first). A tier that cannot be listed is warned about
        and left out."""
        found = self._agreed(lambda: self._core_manager().locations())
        for entry in found.unreachable:
            warnings.warn(f"fastpersist: tier unreachable: {entry}", TierWarning, stacklevel=2)
        return list(found.places)

    def pull(self, tag: Union[int, str], tier: Optional[PathLike] = None) -> int:
        """Copies a checkpoint from a tier (the first that holds it, or `tier`) into the local
        root, verified on the way, its base first; returns the bytes copied (0: it was local)."""
        name = tag_for(tag)
        if tier is None:
            places = [p for p in self.locations() if p.tag == name]
            if any(p.local for p in places):
                return 0
            if not places:
                raise FileNotFoundError(f"no checkpoint {name!r} under {self._root} or its tiers")
            tier = places[-1].roots[0]  # the newest copy
        where = os.fspath(tier)
        return int(self._agreed(lambda: self._core_manager().pull(where, name)))

    def wait_snapshots(self) -> None:
        """Waits until every in-flight save has snapshotted its tensors."""
        if self._dist is None:  # multi-rank saves snapshot before save_async returns
            self._core_manager().wait_snapshots()

    def hook_optimizer(self, optimizer: torch.optim.Optimizer, key: str = "optimizer") -> Any:
        """Makes ``optimizer.step()`` wait until pending snapshots are taken, and, after
        ``resume(optimizer="background")``, until the optimizer state is loaded into it.

        Args:
            key: the top-level key of the saved state that holds this optimizer's
                ``state_dict()`` (what a warm restore loads into it).

        Between saves the hook costs one check. Returns the hook handle (``.remove()``).
        """
        hooked = HookedOptimizer(optimizer, check_key(key), None)

        def _pre_step(_opt: Any, _args: Any, _kwargs: Any) -> None:
            hooked.apply_restore()
            if any(not h.snapshot_done() for h in self._handles):
                self.wait_snapshots()

        hooked.hook = optimizer.register_step_pre_hook(_pre_step)
        self._optimizers.append(hooked)
        return hooked.hook

    def finish_restore(self, timeout: Optional[float] = None) -> None:
        """Waits (at most `timeout` seconds each) for the optimizer states a warm restore is
        still loading and loads them into their optimizers now, rather than at their first
        ``step()``. Raises the load's failure, or ``TimeoutError``."""
        for h in self._optimizers:
            if h.pending is not None:
                h.pending.result(timeout)
                h.apply_restore()

    def close(self, timeout: Optional[float] = None) -> None:
        """Finishes in-flight saves and releases the root; raises an uncollected failure.

        With tiers it waits for the drains too, at most `timeout` seconds: a script that ends
        after its last save leaves a complete copy in every tier, or an exception saying
        which did not get one (a drain cut short resumes with the next manager).
        """
        if self.closed:
            return
        for hooked in self._optimizers:
            if hooked.pending is not None:  # no load thread outlives its manager
                hooked.pending.join()
                hooked.pending = None
            hooked.hook.remove()
        self._optimizers.clear()
        try:
            if self._dist is not None:
                self._dist.close()
            else:
                self._core.close(None if timeout is None else float(timeout))
        finally:
            if self._commit_hook is not None:
                self._commit_hook.close()
            for h in self._handles:
                h._report_retention()
            self._handles.clear()
            _OPEN_MANAGERS.discard(self)

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----------------------------------------------------------------------- listing/loading
    @property
    def closed(self) -> bool:
        return self._dist.closed if self._dist is not None else bool(self._core.closed)

    def checkpoints(self) -> List[CheckpointInfo]:
        """Committed checkpoints, oldest to newest (multi-rank: rank 0's answer, on every rank)."""
        return list(self._agreed(lambda: _core.list_checkpoints(self._root)).committed)

    def list(self) -> List[str]:
        """Committed tags, oldest to newest."""
        return [c.tag for c in self.checkpoints()]

    def latest(self) -> Optional[str]:
        """The newest committed tag (as the ``latest`` pointer names it), or None."""
        return self._agreed(lambda: _core.latest_checkpoint(self._root))

    def path(self, tag: Union[int, str]) -> str:
        """The directory of checkpoint `tag` (an int step or a str tag, as ``save`` takes)."""
        return os.path.join(self._root, tag_for(tag))

    def load(
        self,
        tag: Union[int, str] = "latest",
        into: Any = None,
        map_location: Any = "cpu",
        keys: KeySelection = None,
        dtype: DtypeSpec = None,
        strict: bool = True,
        verify: bool = True,
        *,
        max_memory: Optional[Size] = None,
        weights_only: bool = True,
    ) -> Any:
        """Loads a checkpoint and returns the saved state.

        Args:
            tag: a tag, a step, or "latest".
            into: existing tensors to fill in place (a nested dict like the saved state, e.g.
                ``{"model": model.state_dict()}``, or an ``nn.Module``). Their bytes are read
                into that memory (no full-size intermediate buffer); the returned state holds
                those same tensors. A load that fails (damage found by ``verify``, an I/O
                error) may have overwritten some of them already; ``resume(into=...)`` then
                fills them again from the next older checkpoint.
            keys: a list of names (``"model.lm_head.weight"``) or a predicate on names.
                Unselected tensors are left out of the returned state.
            dtype: convert on load: one dtype for every floating-point tensor, or {name: dtype}.
            strict: raise on missing/unexpected names and shape mismatches (all listed).
                Every destination is checked (shape, dtype, extent within its storage,
                writable memory) before anything is read, strict or not.
            verify: check every tensor's checksum (raises CheckpointCorruptError).
            max_memory: cap on the bytes read at a time (bytes or "1GiB"); in-place loads of a
                large checkpoint then need little extra memory. Tensors larger than the cap
                that are converted (dtype) or copied into non-contiguous destinations stream
                through it in pieces; a ``map_location`` device move follows the host load,
                except for ``map_location="cuda[:N]"`` without ``into=`` and ``dtype=``: raw
                tensors then go from the read's pinned slots to the device with async copies
                on a stream of fastpersist's own, complete when load() returns
                (docs/gpu.md).
            weights_only: restrict what the sidecar may unpickle (see checkpoint_state).
        """
        if self._dist is not None:
            for given, what in ((keys, "keys="), (dtype, "dtype="), (max_memory, "max_memory=")):
                if given is not None:
                    raise ValueError(f"fastpersist: {what} is not supported by a multi-rank load "
                                     "(into= decides what each rank reads)")
            directory = self.path(self._agreed(lambda: self._resolve(tag)))
            return self._dist.load(directory, into, verify, strict)
        name = self._resolve(tag)
        return load_checkpoint_dir(
            self.path(name), self._engine_options, into=into, map_location=map_location,
            keys=keys, dtype=dtype, strict=strict, verify=verify,
            max_memory=None if max_memory is None else parse_size(max_memory),
            weights_only=weights_only)

    def resume(self, *, optimizer: str = FOREGROUND, **load_args: Any) -> Tuple[Optional[str], Any]:
        """Loads the newest checkpoint that verifies: ``(tag, state)``, or ``(None, None)``.

        Damaged checkpoints are skipped with a warning naming the damage: those that fail the
        listing's checks (a missing or truncated file, a manifest that does not decode), then,
        newest first, those whose bytes do not match their checksums. With tiers, the newest
        checkpoint anywhere (see :meth:`locations`), pulled back first when only a tier has it.

        ``optimizer="background"`` (a warm restore): returns once everything but the states of
        the optimizers hooked with :meth:`hook_optimizer` is loaded; each of those loads on a
        background thread and goes into its optimizer at its first ``step()`` (which waits for
        it), or at :meth:`finish_restore`. The returned state holds a
        :class:`~fastpersist.warm_restore.BackgroundState` under each such key. Saves are
        refused until the states are in place. A damaged optimizer state found in the
        background raises at ``step()``; only the model's bytes are checked before returning.
        """
        background = self._check_resume_mode(optimizer)
        listing = self._agreed(lambda: _core.list_checkpoints(self._root))
        infos, damaged = listing.committed, listing.damaged
        for entry in damaged:
            warnings.warn(f"fastpersist: skipping damaged checkpoint {entry}", stacklevel=2)
        # (tag, tier to pull it from first, or None when it is local), newest first. With tiers:
        # the newest anywhere, the local copy preferred; one only a tier holds is pulled back
        # (verified on the way) before it is loaded.
        if self._options.tiers:
            candidates = [(p.tag, None if p.local else p.roots[0]) for p in reversed(self.locations())]
        else:
            candidates = [(i.tag, None) for i in reversed(infos)]
        for tag, tier in candidates:
            try:
                if tier is not None:
                    self.pull(tag, tier)
                if background:
                    return tag, self._warm_load(tag, {"verify": True, **load_args})
                return tag, self.load(tag, **{"verify": True, **load_args})
            except CheckpointCorruptError as e:
                warnings.warn(f"fastpersist: skipping damaged checkpoint {tag}: {e}", stacklevel=2)
            except CheckpointUnsupportedError as e:
                warnings.warn(f"fastpersist: skipping checkpoint {tag}, which this "
                              f"fastpersist cannot load: {e}", stacklevel=2)
        return None, None

    def _check_resume_mode(self, mode: Any) -> bool:
        """Whether `mode` asks for a warm restore; refuses one that cannot run here."""
        if mode not in MODES:
            raise ValueError(f"resume(optimizer=...) takes {' or '.join(map(repr, MODES))}, "
                             f"not {mode!r}")
        if mode == FOREGROUND:
            return False
        if self._dist is not None:
            raise ValueError("fastpersist: resume(optimizer=\"background\") is not supported by a "
                             "multi-rank manager yet; resume with the default optimizer=\"foreground\"")
        if not self._optimizers:
            raise ValueError("fastpersist: resume(optimizer=\"background\") needs the optimizer "
                             "hooked first: mgr.hook_optimizer(optimizer, key=\"optimizer\") (the "
                             "hook is what hands it its state before its first step())")
        keys = [h.key for h in self._optimizers]
        doubled = sorted({k for k in keys if keys.count(k) > 1})
        if doubled:
            raise ValueError(f"fastpersist: several hooked optimizers share the key {doubled[0]!r}; "
                             "pass each hook_optimizer(..., key=...) the key its state is saved under")
        for h in self._optimizers:  # a second resume replaces what an earlier one still loads
            if h.pending is not None:
                h.pending.join()
                h.pending = None
        return True

    def _warm_load(self, tag: str, load_args: Dict[str, Any]) -> Any:
        """The foreground part of a warm restore (every name no hooked optimizer owns), then one
        background load per hooked optimizer."""
        selects = key_predicate(load_args.pop("keys", None))
        keys = [h.key for h in self._optimizers]

        def foreground(name: str) -> bool:
            return selects(name) and not any(owns(k, name) for k in keys)

        state = self.load(tag, keys=foreground, **load_args)
        # The optimizers' states go into new memory (an optimizer has none before its first
        # step), so `into=` is the foreground's alone: strict=True then checks the model's part.
        background = {k: v for k, v in load_args.items() if k != "into"}
        return start_background(
            state, tag, self._optimizers,
            lambda chosen: self.load(tag, keys=lambda n: chosen(n) and selects(n), **background))

    def verify(self, tag: Union[int, str] = "latest",
               progress: Optional[Callable[[int, int], None]] = None) -> List[str]:
        """Checks every byte of a checkpoint; returns the problems found (empty when intact)."""
        def check() -> List[str]:
            report = _core.verify_checkpoint(self.path(self._resolve(tag)), self._engine_options,
                                             progress)
            return list(report.problems)
        return list(self._agreed(check))

    def remove(self, tag: Union[int, str]) -> None:
        self._agreed(lambda: self._core_manager().remove(tag_for(tag)))

    def materialize(self, tag: Union[int, str]) -> int:
        """Makes an incremental checkpoint standalone, in place: the base files it references
        are copied into it and its manifest is replaced atomically, so its base may then be
        removed. Returns the bytes copied (0: it referenced nothing)."""
        return int(self._agreed(lambda: self._core_manager().materialize(self._resolve(tag))))

    def prune(self, keep_last: Optional[int] = None, keep_every: Optional[int] = None, *,
              verify: bool = False) -> List[str]:
        """Applies a retention policy now; returns the removed tags.

        With ``verify`` the checkpoints that would be kept as the newest ``keep_last`` are read
        and checked against their checksums first: one that fails does not count, so an older
        intact one stays, and it is warned about (kept while it is the newest).
        """
        outcome = self._agreed(lambda: self._core_manager().prune(keep_last, keep_every, verify))
        for entry in outcome.damaged:
            warnings.warn(f"fastpersist: damaged checkpoint (fails verification): {entry}",
                          stacklevel=2)
        return list(outcome.removed)

    def export_hf(self, tag: Union[int, str], out_dir: PathLike, *, config: Any = None,
                  prefix: str = "model.", max_shard_size: Size = "5GB") -> List[str]:
        """Writes a Hugging Face model folder from a checkpoint; see fastpersist.hf."""
        from .hf import export_hf  # transformers-specific code stays out of the import path

        return export_hf(self, self._resolve(tag), out_dir, config=config, prefix=prefix,
                         max_shard_size=max_shard_size)

    # ---------------------------------------------------------------------------- helpers
    def _agreed(self, fn: Callable[[], Any]) -> Any:
        """`fn()` here; with several ranks, rank 0's result (or error) on every rank."""
        return fn() if self._dist is None else self._dist.on_coordinator(fn)

    def _resolve(self, tag: Union[int, str]) -> str:
        """The tag `tag` names (no collective: with several ranks, callers run it on rank 0)."""
        if tag == _core.layout.LATEST_FILE_NAME:
            latest = _core.latest_checkpoint(self._root)
            if latest is None:
                raise FileNotFoundError(f"no committed checkpoint under {self._root}")
            return latest
        name = tag_for(tag)
        if not os.path.isdir(self.path(name)):
            committed = [i.tag for i in _core.list_checkpoints(self._root).committed]
            raise FileNotFoundError(f"no checkpoint {name!r} under {self._root} "
                                    f"(committed: {', '.join(committed) or 'none'})")
        return name

    def _core_manager(self) -> Any:
        # Saves and removals need the root's lock, which close() released; reads (list, load,
        # verify) do not, as the CLI's do not.
        if self.closed:
            raise ValueError(f"the CheckpointManager for {self._root} is closed")
        return self._core

    def _forget_finished(self) -> None:
        keep = []
        for h in self._handles:
            if h.done():
                h._report_retention()
            else:
                keep.append(h)
        self._handles = keep

    def __repr__(self) -> str:
        return f"<CheckpointManager {self._root}{' closed' if self.closed else ''}>"


def _is_distributed(distributed: Optional[bool]) -> bool:
    """Whether a manager works with the other ranks of torch.distributed: when asked, else
    when it is initialized with more than one rank."""
    if distributed is False:
        return False
    import torch.distributed as dist

    ready = dist.is_available() and dist.is_initialized()
    if distributed is None:
        return ready and dist.get_world_size() > 1
    if not ready:
        raise RuntimeError("fastpersist: CheckpointManager(distributed=True) needs "
                           "torch.distributed.init_process_group() first")
    return True


def load_checkpoint(path: PathLike, **load_args: Any) -> Any:
    """Loads one checkpoint directory without a manager (and without taking the root's lock)."""
    opts = engine_options()
    size = load_args.pop("max_memory", None)
    return load_checkpoint_dir(os.fspath(path), opts,
                               max_memory=None if size is None else parse_size(size), **load_args)
