# SPDX-License-Identifier: Apache-2.0
"""Single safetensors files at storage speed: ``save_safetensors`` / ``load_safetensors``.

Files are standard safetensors (the ``safetensors`` library, ``transformers`` and any other
reader load them). The header is padded with spaces so the data section starts on a 4096-byte
boundary, and tensors are ordered widest dtype first so each starts at a multiple of its
element size: a reader can then use the bytes in place (the layout is C++'s,
``_core.plan_safetensors_file``: the rule a checkpoint's data files follow). Writes go through the durable
:class:`~fastpersist.FastFileWriter` (temporary file, fdatasync, rename); reads are one parallel
O_DIRECT read, and the returned tensors are views of that buffer.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Set, Union

import torch

from . import _core
from .checkpoint_state import DTYPE_TO_SAFETENSORS, SAFETENSORS_TO_DTYPE
from .writer import FastFileWriter, engine_options

PathLike = Union[str, "os.PathLike[str]"]


def _as_bytes(t: torch.Tensor) -> Any:
    """A buffer over the tensor's bytes (CPU, contiguous), for the writer."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: PathLike,
                     metadata: Optional[Mapping[str, str]] = None, *,
                     durable: Optional[bool] = None,
                     progress: Optional[Callable[[int, int], None]] = None) -> None:
    """Writes `tensors` ({name: tensor}) to a safetensors file at `path`, atomically.

    `progress(bytes_written, file_size)` is called before the first write and after each tensor
    (bytes the writer accepted; it is at most its staging buffer ahead of the storage). The
    file is complete and in place when this function returns. `durable` (None: the writer's
    default, on) fsyncs the file and its folder.
    """
    entries = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.dtype not in DTYPE_TO_SAFETENSORS:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors equivalent")
        entries.append((name, t))
    meta = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    plan = _core.plan_safetensors_file(
        [(name, DTYPE_TO_SAFETENSORS[t.dtype], list(t.shape)) for name, t in entries], meta)
    header = plan.header
    ordered = [entries[k] for k in plan.order]
    file_size = len(header) + sum(t.numel() * t.element_size() for _, t in ordered)
    writer = FastFileWriter(path) if durable is None else FastFileWriter(path, durable=bool(durable))
    with writer as w:
        if progress is not None:
            progress(0, file_size)
        w.write(header)
        for _, t in ordered:
            if t.numel():
                w.write(_as_bytes(t))
            if progress is not None:
                progress(w.bytes_written, file_size)


def safetensors_header(path: PathLike) -> Dict[str, Any]:
    """The validated header: {"tensors": {name: (dtype, shape, begin, end)}, "metadata", ...}."""
    h = _core.read_safetensors_header(os.fspath(path))
    return {
        "tensors": {t.name: (t.dtype, list(t.shape), t.begin, t.end) for t in h.tensors},
        "metadata": dict(h.metadata),
        "data_start": h.data_start,
        "data_bytes": h.data_bytes,
    }


def load_safetensors(path: PathLike, device: Union[str, torch.device] = "cpu",
                     keys: Optional[Iterable[str]] = None) -> Dict[str, torch.Tensor]:
    """Reads a safetensors file (any writer's) into {name: tensor}, in file order."""
    header = safetensors_header(path)
    wanted = None if keys is None else set(keys)
    if wanted is not None:
        unknown = wanted - set(header["tensors"])
        if unknown:
            raise KeyError(f"{os.fspath(path)} has no tensor(s) {sorted(unknown)}")
    buffer = _core.read_file(os.fspath(path), engine_options())
    return tensors_from_buffer(path, header, buffer, device, wanted)


def tensors_from_buffer(path: PathLike, header: Dict[str, Any], buffer: Any,
                        device: Union[str, torch.device] = "cpu",
                        wanted: Optional[Set[str]] = None) -> Dict[str, torch.Tensor]:
    """{name: tensor} of a safetensors file already read whole into `buffer` (its header as
    :func:`safetensors_header` returns it): views of `buffer` where aligned, copies otherwise."""
    start = header["data_start"]
    out: Dict[str, torch.Tensor] = {}
    for name, (dtype_name, shape, begin, end) in header["tensors"].items():
        if wanted is not None and name not in wanted:
            continue
        dtype = SAFETENSORS_TO_DTYPE.get(dtype_name)
        if dtype is None:
            raise ValueError(f"tensor {name!r} in {os.fspath(path)} has dtype {dtype_name}, "
                             "which this torch cannot represent")
        # Each tensor gets a storage of its own starting at its first byte (storage_offset 0),
        # as safetensors.torch.load_file gives; it keeps `buffer` alive.
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end == begin:
            t = torch.empty(shape, dtype=dtype)
        elif (start + begin) % itemsize:
            # Other writers may leave tensors misaligned: copy those.
            t = torch.frombuffer(buffer, dtype=torch.uint8, count=end - begin,
                                 offset=start + begin).clone().view(dtype).reshape(shape)
        else:
            t = torch.frombuffer(buffer, dtype=dtype, count=(end - begin) // itemsize,
                                 offset=start + begin).reshape(shape)
        out[name] = t if torch.device(device).type == "cpu" else t.to(device)
    return out
