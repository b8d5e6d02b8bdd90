# SPDX-License-Identifier: Apache-2.0
"""torch.distributed.checkpoint (DCP) storage plug-in: ``FastPersistWriter`` and ``FastPersistReader``.

DCP plans (which rank writes which item, resharding on load); fastpersist moves the bytes and
commits. A checkpoint written this way is a fastpersist checkpoint like any other
(docs/format.md): ``<root>/<tag>/`` with ``manifest.json`` listing every rank's data files,
every tensor block (with its ``global_shape`` and ``shard_offsets``) and every checksum, plus
DCP's ``Metadata`` in ``dcp-metadata.pt`` (pickled; read back by a loader that resolves only
DCP's metadata classes, shared with the importer of DCP's own checkpoints).
``fastpersist list/inspect/verify/prune`` and
:class:`fastpersist.CheckpointManager` work on it unchanged.

Saving, with ``dcp.save(state, storage_writer=FastPersistWriter("<root>/<tag>"))``:

1. the coordinator (``prepare_global_plan``) takes the root's lock and begins the commit:
   a temporary directory under the root (C++ ``CheckpointManager::begin_commit``), which it
   hands to every rank inside its plan;
2. every rank (``write_data``) writes its tensors through the C++ ``ShardWriter`` (O_DIRECT,
   pinned staging, several files in parallel, a checksum per tensor) and its non-tensor items
   into one sidecar file, and returns the records;
3. the coordinator (``finish``) writes DCP's metadata, then commits every rank's records with
   the manager's protocol (manifest last, fsync, rename, ``latest``). If any rank fails, DCP
   never calls ``finish``: the commit is aborted (temporary directory removed, lock released)
   by :meth:`FastPersistWriter.abort`, the writer's next save, or when the writer is freed.

The writer pickles (DCP's process-mode ``async_save`` sends it to a daemon) and opens its
native resources lazily, in the process that uses them. The writers of one process share one
native ShardWriter per rank and settings, so a new writer per tag reuses the pinned staging
memory of the saves before it instead of pinning it again. The reader reads each stored tensor
block once, with parallel direct reads and its checksum verified, straight into the
destination when a read item covers the whole block, and lets DCP reshard otherwise.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import threading
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future
from torch.utils.dlpack import to_dlpack

from . import _core
from ._checkpoint_options import ENGINE, SETTINGS, checkpoint_options
from ._load_memory import Destination, load_destination, loaded_tensor
from ._tensor_source import source_tensor
from .checkpoint_state import DTYPE_TO_SAFETENSORS, UnsafeCheckpointObjectError, torch_dtype
from .errors import CheckpointCorruptError, CheckpointUnsupportedError
from .import_dcp_metadata import check_planner_data, unpickle_metadata
from .import_errors import ForeignCheckpointError
from .pickle_bounds import PickleRefusedError, check_torch_file

__all__ = ["FastPersistReader", "FastPersistWriter", "load_dcp_checkpoint"]

PathLike = Union[str, "os.PathLike[str]"]


def stored_name(fqn: str, offsets: Sequence[int], sizes: Sequence[int], global_size: Sequence[int]) -> str:
    """The manifest name of a tensor item: its fully qualified name when it is the whole tensor,
    else the block as a slice, ``"layer.w[0:4,0:1024]"``."""
    if list(sizes) == list(global_size) and not any(offsets):
        return fqn
    return fqn + "[" + ",".join(f"{o}:{o + s}" for o, s in zip(offsets, sizes)) + "]"


def _checkpoint_path(path: PathLike) -> Tuple[str, str, str]:
    """(path, root, tag) of a checkpoint directory ``<root>/<tag>``; the tag is checked."""
    full = os.path.abspath(os.fspath(path))
    root, tag = os.path.split(full.rstrip(os.sep))
    try:
        _core.validate_tag(tag)
    except ValueError as e:
        raise ValueError(f"fastpersist: a DCP checkpoint path is <root>/<tag>; {e}") from None
    return full, root, tag


@dataclasses.dataclass(frozen=True)
class _RankTarget:
    """What the coordinator tells each rank in its plan: where to write, as which rank."""
    directory: str
    rank: int
    world_size: int


@dataclasses.dataclass(frozen=True)
class _Written:
    """A WriteResult's storage_data: the record of one item, on its way to the coordinator.
    A rank's first result also carries the records of the files it wrote."""
    tensor: Any = None                      # _core.ManifestTensor of a tensor item
    blob: Optional[Tuple[str, int, int]] = None  # (file, offset, length) of a bytes item
    files: Tuple[Any, ...] = ()             # _core.ManifestFile records


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class FastPersistWriter(StorageWriter):
    """DCP ``StorageWriter`` that commits ``path`` (``<root>/<tag>``) as a fastpersist checkpoint.

    Args:
        path: the checkpoint directory ``<root>/<tag>``; ``dcp.save(checkpoint_id=...)`` may
            replace it for each save. The tag must not exist yet (committed checkpoints are
            never replaced).
        step: the training step recorded in the manifest (None: none).
        metadata: user metadata (a JSON-serializable dict) recorded in the manifest.
        keep_last, keep_every: retention in the root after each commit, as for
            :class:`fastpersist.CheckpointManager` (None: keep every checkpoint).
        **settings: the data-file settings of :class:`fastpersist.CheckpointManager`
            (``staging_budget``, ``staging_window``, ``max_parallel_files``,
            ``target_file_size``, ``min_file_size``, ``durable``, ``checksums``,
            ``lock_staging_memory``, ``backend``, ``block_size``, ``queue_depth``,
            ``intra_op_parallelism``); None or absent: the C++ default.
    """

    def __init__(self, path: PathLike, *, step: Optional[int] = None,
                 metadata: Optional[Dict[str, Any]] = None, keep_last: Optional[int] = None,
                 keep_every: Optional[int] = None, **settings: Any) -> None:
        super().__init__()
        # Incremental checkpoints are the single-process manager's (docs/incremental.md).
        unknown = sorted(set(settings) - set(SETTINGS) - {"max_in_flight", "incremental", "full_every", "xor_deltas"})
        if unknown:
            raise TypeError(f"fastpersist: FastPersistWriter got unknown setting(s): {', '.join(unknown)}")
        # Checked now, built again in the process that writes.
        checkpoint_options(settings, keep_last, keep_every)
        self._settings = dict(settings)
        self._retention = (keep_last, keep_every)
        self._path, self._root, self._tag = _checkpoint_path(path)
        self._step = step
        self._metadata = dict(metadata) if metadata is not None else {}
        self._save_id = uuid.uuid4().hex
        self._is_coordinator = False
        self._native_reset()
        # A CheckpointManager (C++) that holds the root's lock and commits for us (the
        # multi-rank CheckpointManager sets it); otherwise the coordinator opens one per save.
        self._committer: Any = None
        self._retention_error = ""  # why retention failed after this writer's last commit
        self._bytes_written = 0     # by this process in the last save

    # ------------------------------------------------------------------ pickling (process mode)
    def _native_reset(self) -> None:
        self._shard_writer: Any = None   # _core.ShardWriter, per process
        self._shard_writer_rank = -1
        self._manager: Any = None        # _core.CheckpointManager opened for one commit
        self._commit: Any = None         # _core.CheckpointCommit in progress (coordinator)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        for native in ("_shard_writer", "_manager", "_commit", "_committer"):
            state[native] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)

    # ------------------------------------------------------------------ StorageWriter
    @property
    def checkpoint_id(self) -> str:
        return self._path

    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        self.abort()
        if checkpoint_id is not None:
            self._path, self._root, self._tag = _checkpoint_path(checkpoint_id)
        self._save_id = uuid.uuid4().hex

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self._path, save_id=self._save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise ValueError("fastpersist: FastPersistWriter commits one checkpoint for all ranks "
                             "and needs DCP's collectives (use_collectives=True)")
        self._is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        _check_unique_names(plans)
        self.abort()  # an earlier save of this writer that failed on some rank
        if self._committer is not None:
            self._commit = self._committer.begin_commit(self._tag)
        else:
            self._manager = _core.CheckpointManager(
                self._root, checkpoint_options(self._settings, *self._retention))
            try:
                self._commit = self._manager.begin_commit(self._tag)
            except BaseException:
                self._close_manager()
                raise
        directory = self._commit.directory
        return [dataclasses.replace(p, storage_data=_RankTarget(directory, i, len(plans)))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        target = plan.storage_data
        if not isinstance(target, _RankTarget):
            raise RuntimeError("fastpersist: the save plan carries no FastPersistWriter target; "
                               "was prepare_global_plan skipped (plan caching is not supported)?")
        options = checkpoint_options(self._settings)
        results = _write_rank(self._rank_writer(target.rank, options), target, plan.items, planner,
                              bool(options.durable), bool(options.checksums))
        self._bytes_written = sum(f.size for r in results[:1] for f in r.storage_data.files)
        return _done(results)

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        commit = self._commit
        if commit is None:
            raise RuntimeError("fastpersist: finish() without a save in progress")
        try:
            files: List[Any] = []
            tensors: List[Any] = []
            storage: Dict[MetadataIndex, Tuple[Any, ...]] = {}
            for rank_results in results:
                for r in rank_results:
                    written: _Written = r.storage_data
                    files.extend(written.files)
                    if written.tensor is not None:
                        tensors.append(written.tensor)
                        storage[r.index] = ("tensor", written.tensor.name)
                    elif written.blob is not None:
                        storage[r.index] = ("bytes",) + tuple(written.blob)
            metadata.storage_data = storage
            options = checkpoint_options(self._settings)
            files.append(_core.write_sidecar_file(
                commit.directory, _core.layout.DCP_METADATA_FILE_NAME, pickle.dumps(metadata),
                bool(options.durable), bool(options.checksums), None))
            versions = {"torch": torch.__version__, "writer": "fastpersist.dcp"}
            commit.commit(_core.CommitContent(
                files=files, tensors=tensors, step=self._step,
                metadata_json=json.dumps(self._metadata), versions=versions,
                world_size=len(results), checksums=bool(options.checksums)))
            self._retention_error = commit.retention_error
        finally:
            self._commit = None
            if commit.finished is False:
                commit.abort()
            self._close_manager()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, "os.PathLike[str]"]) -> bool:
        try:
            _checkpoint_path(checkpoint_id)
        except (ValueError, TypeError):
            return False
        return True

    # ------------------------------------------------------------------ fastpersist
    def abort(self) -> None:
        """Abandons a save this writer began as coordinator and did not commit (a rank failed):
        removes its temporary directory and releases the root. Idempotent."""
        commit, self._commit = self._commit, None
        try:
            if commit is not None:
                commit.abort()
        finally:
            self._close_manager()

    def close(self) -> None:
        """Aborts an unfinished save and releases the native writer (staging memory, engine),
        which the writers of this process share: it is freed once no save uses it."""
        self.abort()
        if self._shard_writer is not None:
            _release_shard_writer(self._shard_writer)
            self._shard_writer = None

    def _close_manager(self) -> None:
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.close()

    def _rank_writer(self, rank: int, options: Any) -> Any:
        """The ShardWriter of this process for this rank and these settings."""
        if self._shard_writer is None or self._shard_writer_rank != rank:
            self._shard_writer = _shard_writer(rank, self._settings, options)
            self._shard_writer_rank = rank
        return self._shard_writer


# One ShardWriter per (rank, settings) in this process, shared by all its FastPersistWriters:
# a training loop makes a new writer for each checkpoint tag, and a new ShardWriter would pin
# its staging memory again on every save (seconds per GB on a busy machine), where reused
# staging costs nothing (as CheckpointManager keeps its own). ShardWriter.write may run in
# several threads at once (an async_save in flight and a save).
_SHARED_WRITERS: Dict[Tuple[int, str], Any] = {}
_SHARED_WRITERS_LOCK = threading.Lock()


def _shard_writer(rank: int, settings: Dict[str, Any], options: Any) -> Any:
    key = (rank, json.dumps(settings, sort_keys=True, default=str))
    with _SHARED_WRITERS_LOCK:
        writer = _SHARED_WRITERS.get(key)
        if writer is None:
            writer = _SHARED_WRITERS[key] = _core.ShardWriter(options, rank)
        return writer


def _release_shard_writer(writer: Any) -> None:
    """Forgets `writer`: it is freed with the last FastPersistWriter or save that holds it."""
    with _SHARED_WRITERS_LOCK:
        for key in [k for k, w in _SHARED_WRITERS.items() if w is writer]:
            del _SHARED_WRITERS[key]


def _check_unique_names(plans: List[SavePlan]) -> None:
    """Every tensor item's stored name is unique across ranks (a state dict key that looks
    like another key's block, "w[0:2]", would collide)."""
    seen: Dict[str, MetadataIndex] = {}
    for plan in plans:
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
                continue
            name = _item_name(item)
            other = seen.setdefault(name, item.index)
            if other != item.index:
                raise ValueError(f"fastpersist: state dict keys {other.fqn!r} and {item.index.fqn!r} "
                                 f"would both be stored as {name!r}; rename one of them")


def _item_name(item: WriteItem) -> str:
    td = item.tensor_data
    assert td is not None
    return stored_name(item.index.fqn, td.chunk.offsets, td.chunk.sizes, td.size)


def _write_rank(writer: Any, target: _RankTarget, items: List[WriteItem], planner: SavePlanner,
                durable: bool, checksums: bool) -> List[WriteResult]:
    """Writes one rank's items: tensors through the ShardWriter, the serialized non-tensor
    items into one sidecar; returns the WriteResults, the first carrying the file records."""
    tensor_items: List[WriteItem] = []
    sources: List[Tuple[str, str, List[int], Any]] = []
    keepalive: List[torch.Tensor] = []
    blob_items: List[Tuple[WriteItem, int, int]] = []
    blob = io.BytesIO()
    for item in items:
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            payload = data.getbuffer() if isinstance(data, io.BytesIO) else memoryview(bytes(data))
            blob_items.append((item, blob.tell(), payload.nbytes))
            blob.write(payload)
            continue
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"fastpersist: the planner resolved {item.index.fqn!r} to a "
                            f"{type(data).__name__}, not a tensor")
        tensor, _device = source_tensor(data)
        if tensor.dtype not in DTYPE_TO_SAFETENSORS:
            raise TypeError(f"fastpersist: {item.index.fqn!r} has dtype {tensor.dtype}, which "
                            "safetensors files cannot hold")
        if tensor.device.type == "cuda":
            torch.cuda.current_stream(tensor.device).synchronize()
        keepalive.append(tensor)
        tensor_items.append(item)
        sources.append((_item_name(item), DTYPE_TO_SAFETENSORS[tensor.dtype], list(tensor.shape),
                        to_dlpack(tensor)))
    written = writer.write(target.directory, sources) if sources else None
    del keepalive
    files = list(written.files) if written is not None else []
    records = list(written.tensors) if written is not None else []
    blob_name = _core.layout.dcp_objects_file_name(target.rank)
    if blob_items:
        files.append(_core.write_sidecar_file(target.directory, blob_name, blob.getvalue(),
                                              durable, checksums, target.rank))
    results: List[WriteResult] = []
    for item, record in zip(tensor_items, records):
        td = item.tensor_data
        assert td is not None
        if list(td.chunk.sizes) != list(td.size) or any(td.chunk.offsets):
            record = record.with_block(list(td.size), list(td.chunk.offsets))
        results.append(WriteResult(index=item.index, size_in_bytes=record.length,
                                   storage_data=_Written(tensor=record)))
    for item, offset, length in blob_items:
        results.append(WriteResult(index=item.index, size_in_bytes=length,
                                   storage_data=_Written(blob=(blob_name, offset, length))))
    if results:
        first = results[0]
        results[0] = dataclasses.replace(
            first, storage_data=dataclasses.replace(first.storage_data, files=tuple(files)))
    elif files:
        raise RuntimeError("fastpersist: files written for a rank without items")
    return results


class FastPersistReader(StorageReader):
    """DCP ``StorageReader`` of a fastpersist checkpoint written by :class:`FastPersistWriter`.

    Args:
        path: the checkpoint directory ``<root>/<tag>``, or a root (its ``latest`` checkpoint).
        verify: check every tensor block's checksum as it is read [True].
        unsafe_objects: let DCP unpickle non-tensor values that need more than torch's
            ``weights_only`` allowlist. Off (the default), such a value is refused before DCP
            sees it, since a checkpoint on disk is untrusted input.
        backend, block_size, queue_depth, intra_op_parallelism: I/O engine settings.
    """

    def __init__(self, path: PathLike, *, verify: bool = True, unsafe_objects: bool = False,
                 **engine: Any) -> None:
        super().__init__()
        unknown = sorted(set(engine) - set(ENGINE))
        if unknown:
            raise TypeError(f"fastpersist: FastPersistReader got unknown setting(s): {', '.join(unknown)}")
        self._engine = dict(engine)
        self._path = os.fspath(path)
        self._verify = bool(verify)
        self._unsafe_objects = bool(unsafe_objects)
        self._reader: Any = None
        self._storage: Dict[MetadataIndex, Tuple[Any, ...]] = {}
        self._tensor_metadata: Dict[str, Any] = {}  # fqn -> DCP's record (chunks, dtype)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_reader"] = None
        return state

    @property
    def checkpoint_id(self) -> str:
        return self._path

    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        if checkpoint_id is not None:
            self._path = os.fspath(checkpoint_id)
        self._reader = None

    def _open(self) -> Any:
        if self._reader is None:
            from .writer import engine_options  # noqa: PLC0415
            self._reader = _core.CheckpointReader(_checkpoint_dir(self._path),
                                                  engine_options(**self._engine))
        return self._reader

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        reader = self._open()
        name = _core.layout.DCP_METADATA_FILE_NAME
        if reader.manifest.tensors and all(f.name != name for f in reader.manifest.files):
            raise CheckpointCorruptError(
                f"fastpersist: {reader.dir} has no {name}: it was not written through "
                "torch.distributed.checkpoint (load it with CheckpointManager.load or fastpersist.load)")
        data = reader.read_file(name)
        try:
            metadata = unpickle_metadata(data, f"{reader.dir}/{name}")
        except Exception as e:  # noqa: BLE001 (any failure means the file is not DCP metadata)
            raise CheckpointCorruptError(f"fastpersist: {reader.dir}/{name} is not DCP metadata "
                                         f"fastpersist can read safely: {e}") from None
        if not isinstance(metadata.storage_data, dict):
            raise CheckpointCorruptError(f"fastpersist: {reader.dir}/{name} is not DCP metadata")
        try:
            check_planner_data(metadata, f"{reader.dir}/{name}")
        except ForeignCheckpointError as e:
            raise CheckpointCorruptError(f"fastpersist: {e}") from None
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self._storage = metadata.storage_data
        self._tensor_metadata = metadata.state_dict_metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        reader = self._open()
        byte_items = [i for i in plan.items if i.type == LoadItemType.BYTE_IO]
        tensor_items = [i for i in plan.items if i.type != LoadItemType.BYTE_IO]
        self._read_bytes(reader, byte_items, planner)
        self._read_tensors(reader, tensor_items, planner)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, "os.PathLike[str]"]) -> bool:
        try:
            _checkpoint_dir(os.fspath(checkpoint_id))
        except (OSError, ValueError):
            return False
        return True

    # ------------------------------------------------------------------ reading
    def _where(self, item: ReadItem) -> Tuple[Any, ...]:
        where = self._storage.get(item.storage_index)
        if not isinstance(where, tuple) or not where or where[0] not in ("tensor", "bytes"):
            raise CheckpointCorruptError(f"fastpersist: the checkpoint's metadata has no valid "
                                         f"location for {item.storage_index.fqn!r}")
        return where

    def _read_bytes(self, reader: Any, items: List[ReadItem], planner: LoadPlanner) -> None:
        files: Dict[str, bytes] = {}
        for item in items:
            where = self._where(item)
            if where[0] != "bytes" or len(where) != 4:
                raise CheckpointCorruptError(f"fastpersist: {item.storage_index.fqn!r} is not stored "
                                             "as a non-tensor value")
            _, file, offset, length = where
            if file not in files:
                files[file] = reader.read_file(file)  # checksum-checked
            data = files[file]
            if not (isinstance(offset, int) and isinstance(length, int)
                    and 0 <= offset <= offset + length <= len(data)):
                raise CheckpointCorruptError(f"fastpersist: {item.storage_index.fqn!r} lies outside {file}")
            value = data[offset:offset + length]
            if not self._unsafe_objects:
                check_value(value, item.dest_index.fqn)
            planner.load_bytes(item, io.BytesIO(value))

    def _check_block(self, item: ReadItem, stored: Any) -> None:
        """The DCP metadata's chunk for `item` and the stored block are two records of the same
        tensor: a shape or dtype on which they disagree is damage, refused (never narrowed or
        converted into what the metadata claims)."""
        index = item.storage_index
        fqn = index.fqn
        meta = self._tensor_metadata.get(fqn)
        chunks = getattr(meta, "chunks", None)
        if not isinstance(chunks, list):
            raise CheckpointCorruptError(f"fastpersist: the checkpoint's metadata has no tensor "
                                         f"record for {fqn!r}")
        chunk = None
        if isinstance(index.index, int) and 0 <= index.index < len(chunks):
            chunk = chunks[index.index]
        if chunk is None or list(chunk.offsets) != list(index.offset or []):
            chunk = next((c for c in chunks if list(c.offsets) == list(index.offset or [])), None)
        if chunk is None:
            raise CheckpointCorruptError(f"fastpersist: the checkpoint's metadata has no chunk "
                                         f"of {fqn!r} at {list(index.offset or [])}")
        if [int(n) for n in chunk.sizes] != list(stored.shape):
            raise CheckpointCorruptError(
                f"fastpersist: {fqn!r}: the DCP metadata gives its block the shape "
                f"{[int(n) for n in chunk.sizes]}, the stored block {list(stored.shape)} "
                "(damaged or edited metadata)")
        dtype = getattr(getattr(meta, "properties", None), "dtype", None)
        if not isinstance(dtype, torch.dtype) or DTYPE_TO_SAFETENSORS.get(dtype) != stored.dtype:
            raise CheckpointCorruptError(
                f"fastpersist: {fqn!r}: the DCP metadata says {dtype}, the stored block is "
                f"{stored.dtype} (damaged or edited metadata)")

    def _read_tensors(self, reader: Any, items: List[ReadItem], planner: LoadPlanner) -> None:
        """One C++ load for every stored block this rank needs. A block that one read item
        covers whole is offered to C++ with the item's destination, and C++ chooses the route
        (load_plan.cc): straight into it (any strides, converted to its dtype), or, where it
        cannot write there (device memory) or convert (``unconvertible_to_caller``), into new
        memory for the copy below. The other blocks are read once into new memory and DCP's
        pieces are copied out of them."""
        if not items:
            return
        manifest = reader.manifest
        by_name = {t.name: t for t in manifest.tensors}
        users: Dict[str, List[ReadItem]] = {}
        for item in items:
            where = self._where(item)
            if where[0] != "tensor" or len(where) != 2 or where[1] not in by_name:
                raise CheckpointCorruptError(f"fastpersist: the stored block of "
                                             f"{item.storage_index.fqn!r} is not in the manifest")
            self._check_block(item, by_name[where[1]])
            users.setdefault(where[1], []).append(item)
        targets: Dict[int, torch.Tensor] = {}
        offered: List[Destination] = []
        for name, group in users.items():
            if len(group) != 1:
                continue
            item = group[0]
            dst = planner.resolve_tensor(item).detach()
            targets[id(item)] = dst
            if list(item.lengths) == list(by_name[name].shape) and not any(item.storage_offsets):
                offered.append(load_destination(name, dst))
        outcome = reader.load(names=list(users), destinations=offered, into=False, dtype="",
                              dtype_by_name={}, strict=False, verify=self._verify, max_memory=0,
                              progress=None, unconvertible_to_caller=True)
        if outcome.missing:
            raise CheckpointCorruptError(f"fastpersist: blocks missing from {reader.dir}: "
                                         f"{list(outcome.missing)[:5]}")
        for t in outcome.tensors:
            group = users[t.name]
            if (t.destination >= 0
                    and outcome.destinations[t.destination] == _core.DestinationState.FILLED):
                planner.commit_tensor(group[0], targets[id(group[0])])
                continue
            block = loaded_tensor(outcome.buffers[t.buffer] if t.buffer >= 0 else None, t.offset,
                                  t.nbytes, torch_dtype(t.dtype, t.name), t.shape)
            for item in group:
                piece = block
                for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                    piece = piece.narrow(dim, start, length)
                known = targets.get(id(item))
                dst = known if known is not None else planner.resolve_tensor(item).detach()
                if dst.shape != piece.shape:
                    raise CheckpointCorruptError(
                        f"fastpersist: {item.dest_index.fqn!r}: the stored block gives "
                        f"{tuple(piece.shape)}, the destination wants {tuple(dst.shape)}")
                dst.copy_(piece)
                planner.commit_tensor(item, dst)


def load_dcp_checkpoint(path: str, *, into: Any = None, verify: bool = True, strict: bool = True,
                        unsafe_objects: bool = False) -> Any:
    """Loads a checkpoint written through DCP in this one process (no process group): into
    `into` (resharded to its tensors' layout; DTensors need their process group), or, without
    `into`, the whole state with every tensor whole (the blocks of every rank reassembled)."""
    reader = FastPersistReader(path, verify=verify, unsafe_objects=unsafe_objects)
    # Read (and check) the metadata first: DCP turns a failure there into an AssertionError
    # ("metadata is None") that hides ours.
    reader.read_metadata()
    try:
        if into is None:
            state: Dict[str, Any] = {}
            _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(),
                             no_dist=True)
            return state
        dcp_load(into, storage_reader=reader,
                 planner=DefaultLoadPlanner(allow_partial_load=not strict), no_dist=True)
    except CheckpointException as e:
        raise _single_process_error(path, e) from None
    return into


def _single_process_error(path: str, e: CheckpointException) -> Exception:
    """DCP's CheckpointException (a BaseException, which ``except Exception`` misses) as the
    error its failure was: fastpersist's own classes (damage, an unsupported or unsafe
    checkpoint) keep theirs, so callers such as ``resume()`` fall back past a damaged
    checkpoint; anything else is raised as itself."""
    failures = [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
    for cls in (CheckpointCorruptError, UnsafeCheckpointObjectError, CheckpointUnsupportedError):
        for failure in failures:
            if isinstance(failure, cls):
                return cls(f"fastpersist: cannot load {path}: {failure}")
    first = failures[0] if failures else None
    if isinstance(first, Exception):
        return first
    return CheckpointCorruptError(f"fastpersist: cannot load {path}: {e}")


def check_value(value: bytes, fqn: str) -> None:
    """Raises unless torch's weights-only unpickler loads the value (a small ``torch.save``
    archive) of `fqn` within what its bytes justify: CheckpointCorruptError for a size bomb
    (pickle_bounds.py), UnsafeCheckpointObjectError for anything it refuses."""
    try:
        check_torch_file(value, f"the value of {fqn!r}")
        torch.load(io.BytesIO(value), weights_only=True)
    except PickleRefusedError as e:
        raise CheckpointCorruptError(f"fastpersist: {e}") from None
    except Exception as e:  # noqa: BLE001
        raise UnsafeCheckpointObjectError(
            f"fastpersist: the value of {fqn!r} needs more than torch's weights_only unpickler "
            f"({_why(e)}); pass FastPersistReader(..., unsafe_objects=True) only if you trust "
            "this checkpoint") from None


def _why(e: Exception) -> str:
    """The line of torch's weights_only refusal that says what was refused."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "global" in line]
    return (named or lines or [type(e).__name__])[0]


def _checkpoint_dir(path: str) -> str:
    """The checkpoint directory `path` names, by the library's one path classifier
    (``_core.classify_path``): itself when it is a checkpoint directory (a damaged one too: its
    reader raises CheckpointCorruptError), else the newest checkpoint of the root `path`.
    FileNotFoundError for anything else: a directory without a checkpoint, a manifest.json named
    as a file, a file, a missing path."""
    info = _core.classify_path(path)
    if info.kind == _core.PathKind.CHECKPOINT and info.path == path:  # not a manifest.json file
        return path
    # Any other directory is a root, as for CheckpointManager: one with stray data files at its
    # top (INCOMPLETE_CHECKPOINT) too.
    directory = info.kind in (_core.PathKind.ROOT, _core.PathKind.INCOMPLETE_CHECKPOINT)
    latest = _core.latest_checkpoint(path) if directory else None
    if latest is None:
        raise FileNotFoundError(f"fastpersist: {path} is neither a checkpoint nor a root with one")
    return os.path.join(path, latest)
