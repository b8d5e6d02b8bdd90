# SPDX-License-Identifier: Apache-2.0
"""Read the ``.metadata`` of a torch.distributed.checkpoint directory without trusting it.

``FileSystemWriter``'s coordinator pickles DCP's ``Metadata`` into ``DIR/.metadata`` last: the
table of every item (tensor chunks with their offsets, non-tensor values), the nesting of the
state (``planner_data``) and where each item is stored (``storage_data``: file, offset, length).
torch's ``FileSystemReader`` (2.13) unpickles it with plain ``pickle.load``, which runs whatever
a hostile file says. :func:`read_metadata` instead

- unpickles it with only DCP's metadata classes (:data:`METADATA_GLOBALS`), ``pathlib`` paths and
  what ``torch.load(weights_only=True)`` allows (dtypes, ``torch.Size``), unless
  ``weights_only=False``; a refused global raises
  :class:`~fastpersist.import_errors.UnsafeForeignObjectError` naming it;
- checks it against the directory before a byte is read: each file is a plain name inside it,
  each range lies within its file, each tensor's chunks lie inside it, add up to it and are
  stored in at least their bytes (so what is allocated is bounded by the files), and nesting
  paths hold keys and in-range list indices.
"""

from __future__ import annotations

import importlib
import io
import math
import os
import pickle
from typing import Any, BinaryIO, Dict, List, Set, Tuple

import torch

from .pickle_bounds import SIZED, PickleRefusedError, bounded_constructor, check_pickle
from .import_errors import ForeignCheckpointError, UnsafeForeignObjectError, refuse_link

__all__ = ["METADATA_FILE", "METADATA_GLOBALS", "is_dcp_dir", "rank_local_metadata",
           "read_metadata", "unpickle_metadata", "check_planner_data"]

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

    def __init__(self, file: BinaryIO, what: str, limit: int) -> None:
        super().__init__(file)
        self._what = what
        self._limit = limit  # the input's size: no bytearray(N) larger (pickle_bounds.py)

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        full_name = f"{module}.{name}"
        if module in ("builtins", "__builtin__") and name in SIZED:
            return bounded_constructor(name, self._limit, self._what)
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


def unpickle_metadata(data: bytes, what: str) -> Any:
    """DCP ``Metadata`` pickled in `data`, unpickled with the restricted loader (DCP's metadata
    classes and torch's weights-only allowlist only; fastpersist.dcp writes its metadata this
    way too). ForeignCheckpointError / UnsafeForeignObjectError say what is wrong."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        check_pickle(data, len(data), what, bounded_constructors=True)  # pickle_bounds.py
        metadata = _MetadataUnpickler(io.BytesIO(data), what, len(data)).load()
    except (ForeignCheckpointError, UnsafeForeignObjectError):
        raise
    except PickleRefusedError as e:
        raise ForeignCheckpointError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise ForeignCheckpointError(f"{what} is not readable: {type(e).__name__}: {e}") from None
    if not isinstance(metadata, Metadata):
        raise ForeignCheckpointError(f"{what} holds a {type(metadata).__name__}, not a DCP Metadata")
    return metadata


def read_metadata(path: str, *, weights_only: bool = True) -> Any:
    """The ``Metadata`` of the DCP checkpoint directory ``path``, checked against its files.

    Raises:
        UnsafeForeignObjectError: ``weights_only`` and the pickle needs a refused global.
        ForeignCheckpointError: not a readable DCP metadata file, or one that names files,
            offsets or lengths outside the directory's files.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    file = refuse_link(os.path.join(path, METADATA_FILE))
    what = f"DCP metadata {file}"
    if weights_only:
        # Read whole (a file-backed unpickler allocates what a frame claims before reading it).
        with open(file, "rb") as f:
            metadata = unpickle_metadata(f.read(), what)
    else:
        with open(file, "rb") as f:
            try:
                metadata = pickle.load(f)
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
    return refuse_link(os.path.join(directory, relative))


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
    check_planner_data(metadata, what)


def check_planner_data(metadata: Any, what: str) -> None:
    """Every nesting path (``planner_data``) holds keys and in-range list indices: DCP's
    set_element grows a list up to an index, and a list in the state has at most one entry per
    item, so a larger index can only be an attempt to exhaust memory."""
    items = metadata.state_dict_metadata
    planner_data = metadata.planner_data or {}
    if not isinstance(planner_data, dict) or not isinstance(items, dict):
        raise ForeignCheckpointError(f"{what}: its nesting table is a {type(planner_data).__name__}")
    for fqn, obj_path in planner_data.items():
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
