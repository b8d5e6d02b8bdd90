# SPDX-License-Identifier: Apache-2.0
"""Import a checkpoint directory written by torch.distributed.checkpoint's ``FileSystemWriter``.

Such a directory (``dcp.save(state, checkpoint_id=DIR)``, by any number of ranks) holds
``DIR/.metadata``, the pickled ``Metadata`` the coordinator writes last, and the ranks' data
files (``__<rank>_<i>.distcp``; one file per item with ``single_file_per_rank=False``). The
metadata maps every stored item to ``(file, offset, length)``: a tensor chunk is a ``torch.save``
archive there, a non-tensor value (a ``BYTE_IO`` item: a step counter, ``param_groups``) the
``torch.save`` of that value.

:func:`load_dcp_dir` reassembles the full, unsharded state in this process, with DCP's own
reader and planner and no process group, as ``torch.distributed.checkpoint.format_utils.
dcp_to_torch_save`` does: every sharded tensor (DTensor, ShardedTensor, FSDP) becomes one tensor
of its global shape, and the nesting is restored from ``metadata.planner_data``.

Trust. A checkpoint directory is untrusted input. torch's ``FileSystemReader`` (2.13) unpickles
``.metadata`` with plain ``pickle.load``, and ``DefaultLoadPlanner.load_bytes`` loads ``BYTE_IO``
values with ``torch.load(weights_only=False)``: a hostile checkpoint runs code through either.
Here, unless ``weights_only=False``:

- ``.metadata`` is unpickled with only DCP's metadata classes (:data:`METADATA_GLOBALS`),
  ``pathlib`` paths and what ``torch.load(weights_only=True)`` allows (dtypes, ``torch.Size``);
- ``BYTE_IO`` values are loaded with ``torch.load(weights_only=True)`` (tensor items already are,
  by ``FileSystemReader``);
- every file, offset and length in the metadata is checked against the directory before a byte
  is read: a file must be a plain name inside it, and each range must lie within its file.

A refused global raises :class:`~fastpersist.import_errors.UnsafeForeignObjectError` naming it.
"""

from __future__ import annotations

import importlib
import io
import math
import os
import pickle
import warnings
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Set, Tuple

import torch

from .import_errors import (ForeignCheckpointError, UnsafeForeignObjectError,
                            weights_only_refusal)

__all__ = ["METADATA_FILE", "METADATA_GLOBALS", "is_dcp_dir", "load_dcp_dir", "read_metadata"]

METADATA_FILE = ".metadata"

# The classes a FileSystemWriter's .metadata names, by module (torch 2.0 to 2.13); nothing else
# from these modules is resolved. TensorProperties moved from the _shard module in torch 2.1.
METADATA_GLOBALS: Dict[str, Tuple[str, ...]] = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "_MEM_FORMAT_ENCODING"),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch.distributed._shard.sharded_tensor.metadata": ("TensorProperties",
                                                         "MEM_FORMAT_ENCODING"),
    # StorageMeta.checkpoint_id is the path the checkpoint was saved to
    "pathlib": ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"),
}

# report(done, total) in bytes of the items read
_Report = Optional[Callable[[int, int], None]]


def is_dcp_dir(path: str) -> bool:
    """Whether ``path`` is a directory with DCP's global ``.metadata`` file."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, METADATA_FILE))


def rank_local_metadata(path: str) -> List[str]:
    """The ``__<rank>.metadata`` files that ``dcp.save(..., use_collectives=False)`` writes."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith("__") and n.endswith(METADATA_FILE)
                  and n[2:-len(METADATA_FILE)].isdigit())


# ----------------------------------------------------------------------------- metadata
def _refused(what: str, full_name: str) -> UnsafeForeignObjectError:
    return UnsafeForeignObjectError(
        f"{what} needs {full_name}, which the restricted loader refuses (it allows DCP's "
        "metadata classes and what torch.load(weights_only=True) allows)")


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only :data:`METADATA_GLOBALS` and torch's weights-only allowlist."""

    def __init__(self, file: BinaryIO, what: str) -> None:
        super().__init__(file)
        self._what = what

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        full_name = f"{module}.{name}"
        if name in METADATA_GLOBALS.get(module, ()):
            try:
                found = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                raise ForeignCheckpointError(
                    f"{self._what} names {full_name}, which this torch "
                    f"({torch.__version__}) does not have: written by another version") from None
            if isinstance(found, type):
                return found
        from .checkpoint_state import UnsafeCheckpointObjectError, _torch_safe_global

        try:
            return _torch_safe_global(module, name)
        except UnsafeCheckpointObjectError:
            raise _refused(self._what, full_name) from None

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise pickle.UnpicklingError(f"{self._what} has a persistent id {pid!r}")


def read_metadata(path: str, *, weights_only: bool = True) -> Any:
    """The ``Metadata`` of the DCP checkpoint directory ``path``, checked against its files.

    Raises:
        UnsafeForeignObjectError: ``weights_only`` and the pickle needs a refused global.
        ForeignCheckpointError: not a readable DCP metadata file, or one that names files,
            offsets or lengths outside the directory's files.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    file = os.path.join(path, METADATA_FILE)
    what = f"DCP metadata {file}"
    with open(file, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, what).load() if weights_only else pickle.load(f)
        except ForeignCheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - a damaged pickle fails in many ways
            raise ForeignCheckpointError(
                f"{what} is not readable: {type(e).__name__}: {e}") from None
    if not isinstance(metadata, Metadata):
        raise ForeignCheckpointError(
            f"{what} holds a {type(metadata).__name__}, not a DCP Metadata")
    try:
        _check_metadata(metadata, path, what)
    except (AttributeError, TypeError) as e:  # fields missing or of the wrong type
        raise ForeignCheckpointError(f"{what} is malformed: {type(e).__name__}: {e}") from None
    return metadata


def _inside(directory: str, relative: Any, what: str) -> str:
    """``directory/relative`` for a plain relative file name; anything else is refused."""
    if (not isinstance(relative, str) or not relative or os.path.isabs(relative)
            or any(part in ("", ".", "..") for part in relative.replace("\\", "/").split("/"))):
        raise ForeignCheckpointError(f"{what} names the file {relative!r}, which is not a file "
                                     "name inside the checkpoint directory")
    return os.path.join(directory, relative)


def _check_metadata(metadata: Any, path: str, what: str) -> None:
    """Every item the metadata describes is stored, within a file of the directory; every
    tensor has a dtype and a shape; nesting paths are keys and in-range list indices."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, MetadataIndex,
                                                       TensorStorageMetadata)

    items = metadata.state_dict_metadata
    storage = metadata.storage_data
    if not isinstance(items, dict) or not isinstance(storage, dict):
        raise ForeignCheckpointError(f"{what} has no item table or no storage table")
    sizes: Dict[str, int] = {}
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise ForeignCheckpointError(f"{what} has a storage entry of type "
                                         f"{type(info).__name__}, not a file range")
        file = _inside(path, info.relative_path, what)
        if file not in sizes:
            if not os.path.isfile(file):
                raise ForeignCheckpointError(f"{what} names {info.relative_path}, which is "
                                             f"missing from {path}")
            sizes[file] = os.path.getsize(file)
        offset, length = info.offset, info.length
        if (type(offset) is not int or type(length) is not int or offset < 0 or length < 0
                or offset + length > sizes[file]):
            raise ForeignCheckpointError(
                f"{what}: {index.fqn} lies at offset {offset!r}, length {length!r} in "
                f"{info.relative_path}, beyond its {sizes[file]} bytes (a truncated file?)")
    for fqn, item in items.items():
        if not isinstance(fqn, str):
            raise ForeignCheckpointError(f"{what} has a key of type {type(fqn).__name__}")
        if isinstance(item, TensorStorageMetadata):
            _check_chunks(fqn, item, storage, what)
        elif isinstance(item, BytesStorageMetadata):
            if MetadataIndex(fqn) not in storage:
                raise ForeignCheckpointError(f"{what}: {fqn} is not stored in any file")
        else:
            raise ForeignCheckpointError(f"{what}: {fqn} is a {type(item).__name__}")
    _check_tensor_format(storage, items, path, what)
    for fqn, obj_path in (metadata.planner_data or {}).items():
        # set_element grows a list up to an index: a list in the state has at most one entry
        # per item, so a larger index can only be an attempt to exhaust memory.
        if (not isinstance(obj_path, tuple) or not obj_path
                or any(type(k) is not str and not (type(k) is int and 0 <= k < len(items))
                       for k in obj_path)):
            raise ForeignCheckpointError(f"{what}: the nesting path of {fqn} is {obj_path!r}")


def _check_chunks(fqn: str, item: Any, storage: Dict[Any, Any], what: str) -> None:
    """The tensor's chunks lie inside it and add up to it (what DCP's save planner checks
    before it writes), and each is stored in at least its bytes (an untransformed torch.save
    archive holds them all): so the tensors allocated for the state are no larger than the
    files, and no element is left unread."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    size = item.size
    if (not isinstance(item.properties.dtype, torch.dtype) or not isinstance(size, torch.Size)
            or not all(type(d) is int and d >= 0 for d in size)):
        raise ForeignCheckpointError(f"{what}: {fqn} has no dtype or shape")
    element = item.properties.dtype.itemsize
    covered = 0
    for chunk in item.chunks:
        offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
        if (len(offsets) != len(size) or len(sizes) != len(size)
                or any(type(o) is not int or type(n) is not int or o < 0 or n < 0 or o + n > d
                       for o, n, d in zip(offsets, sizes, size))):
            raise ForeignCheckpointError(f"{what}: a chunk of {fqn} (offsets {list(offsets)}, "
                                         f"sizes {list(sizes)}) is outside its shape "
                                         f"{list(size)}")
        info = storage.get(MetadataIndex(fqn, chunk.offsets))
        if info is None:
            raise ForeignCheckpointError(f"{what}: {fqn} (offsets {list(offsets)}) is not "
                                         "stored in any file")
        numel = math.prod(sizes)
        if not info.transform_descriptors and info.length < numel * element:
            raise ForeignCheckpointError(
                f"{what}: {fqn} (offsets {list(offsets)}) has {numel * element} bytes, but "
                f"only {info.length} are stored")
        covered += numel
    if covered != math.prod(size):
        raise ForeignCheckpointError(f"{what}: the chunks of {fqn} hold {covered} of its "
                                     f"{math.prod(size)} elements")


_ZIP_MAGIC = b"PK\x03\x04"


def _check_tensor_format(storage: Dict[Any, Any], items: Dict[str, Any], path: str,
                         what: str) -> None:
    """The first tensor item of each file is a torch.save archive (a zip), the format
    FileSystemReader reads; ``serialization_format=SAFETENSORS`` writes raw bytes instead."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    checked: Set[str] = set()
    for index, info in storage.items():
        if (info.relative_path in checked or info.transform_descriptors
                or not isinstance(items.get(index.fqn), TensorStorageMetadata)):
            continue
        checked.add(info.relative_path)
        with open(os.path.join(path, info.relative_path), "rb") as f:
            f.seek(info.offset)
            if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                raise ForeignCheckpointError(
                    f"{what}: the tensor {index.fqn} in {info.relative_path} is not a "
                    "torch.save archive: written with serialization_format=SAFETENSORS (or by "
                    "another StorageWriter), which torch's FileSystemReader does not read "
                    "either; not supported")


# ----------------------------------------------------------------------------- loading
def _load_value(data: io.BytesIO, fqn: str, weights_only: bool) -> Any:
    try:
        return torch.load(data, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as e:
        if weights_only:
            raise weights_only_refusal(e, f"the value {fqn}") from None
        raise ForeignCheckpointError(f"the value {fqn} is not loadable: {e}") from None


def _planner(weights_only: bool, metadata: Any, report: _Report) -> Any:
    """DCP's planner that rebuilds the state from the metadata, with BYTE_IO values loaded
    with ``weights_only`` and the bytes of each item reported when it has been read."""
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    total = sum(info.length for info in metadata.storage_data.values())
    done = [0]

    def item_read(read_item: Any) -> None:
        if report is not None:
            done[0] += metadata.storage_data[read_item.storage_index].length
            report(done[0], total)

    class Planner(_EmptyStateDictLoadPlanner):  # type: ignore[misc]
        loaded: Dict[str, Any] = {}

        def set_up_planner(self, state_dict: Dict[str, Any], metadata: Any = None,
                           is_coordinator: bool = False) -> None:
            # dcp.load hands the planner a dict of its own, which this fills: keep it.
            super().set_up_planner(state_dict, metadata, is_coordinator)
            self.loaded = state_dict

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            obj = _load_value(value, fqn, weights_only)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj
            item_read(read_item)

        def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
            item_read(read_item)

    if report is not None:
        report(0, total)
    return Planner()


def _reader(path: str, metadata: Any) -> Any:
    """DCP's FileSystemReader, handed the metadata read (and checked) here."""
    from torch.distributed.checkpoint import FileSystemReader

    class Reader(FileSystemReader):  # type: ignore[misc]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return metadata

    return Reader(path)


def load_dcp_dir(path: str, *, weights_only: bool = True, report: _Report = None) -> Any:
    """The full state saved in the DCP checkpoint directory ``path``, on the CPU.

    Args:
        path: a directory written by ``FileSystemWriter`` (``dcp.save(state, checkpoint_id=path)``).
        weights_only: see the module's docstring; ``False`` only for checkpoints you trust.
        report: called with (bytes read, total) as each stored item is read.

    Returns:
        The state as it was saved (nested dicts and lists), every tensor whole.

    Raises:
        UnsafeForeignObjectError: ``weights_only`` and a pickle needs a refused global.
        ForeignCheckpointError: a damaged or incomplete checkpoint.
    """
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.api import CheckpointException

    if not is_dcp_dir(path):
        local = rank_local_metadata(path)
        if local:
            raise ForeignCheckpointError(
                f"{path} was saved with use_collectives=False: it has only per-rank metadata "
                f"({', '.join(local[:4])}{', ...' if len(local) > 4 else ''}) and no global "
                f"{METADATA_FILE}, so its ranks' shards cannot be reassembled")
        raise ForeignCheckpointError(f"{path} has no {METADATA_FILE}: not a DCP checkpoint")
    metadata = read_metadata(path, weights_only=weights_only)
    planner = _planner(weights_only, metadata, report)
    try:
        with warnings.catch_warnings():
            # "torch.distributed is disabled ...: assuming the intent is to load in a single
            # process": that is the intent.
            warnings.simplefilter("ignore", UserWarning)
            dcp_load({}, storage_reader=_reader(path, metadata), planner=planner, no_dist=True)
    except CheckpointException as e:
        failures = list(e.failures.values())
        cause = failures[0][0] if failures else e
        if isinstance(cause, ForeignCheckpointError):
            raise cause from None
        raise ForeignCheckpointError(
            f"DCP could not read {path}: {type(cause).__name__}: {cause}") from None
    return planner.loaded
