# SPDX-License-Identifier: Apache-2.0
"""Loading a checkpoint directory: selection, in-place loads, dtype conversion, strict checks.

The bytes move in C++ (:class:`fastpersist._core.CheckpointReader`): tensors that land in new
memory are read with parallel O_DIRECT into page-aligned spans and become views of them (no
copy after the read); tensors loaded ``into=`` existing CPU tensors of the same dtype are read
straight into that memory. Checksums are checked as each read completes.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch

from . import _core
from .checkpoint_state import SAFETENSORS_TO_DTYPE, flatten_into, unflatten_state

_PROGRESS_BATCH_BYTES = 64 << 20

KeySelection = Union[None, Iterable[str], Callable[[str], bool]]
DtypeSpec = Union[None, torch.dtype, Mapping[str, torch.dtype]]


def _selection(keys: KeySelection, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(selected names in checkpoint order, requested names that do not exist)."""
    if keys is None:
        return list(names), []
    if callable(keys):
        return [n for n in names if keys(n)], []
    if isinstance(keys, str):
        raise TypeError("keys= takes a list of names or a predicate, not a single string")
    wanted = list(keys)
    present = set(names)
    wanted_set = set(wanted)
    return [n for n in names if n in wanted_set], [k for k in wanted if k not in present]


def _view(span: Any, offset: int, nbytes: int, dtype: torch.dtype,
          shape: Sequence[int]) -> torch.Tensor:
    """The bytes at `offset` of `span` as a tensor, without a copy when aligned for `dtype`.

    Each tensor gets its own storage that starts at its first byte (storage_offset 0), as
    torch.load gives: torch APIs that read a tensor's storage rather than its data pointer
    (``torch.set_rng_state`` crashes on an RNG state with a storage offset) then work, and
    saving one loaded tensor with torch.save does not write the whole span. The storage
    keeps `span` alive.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(tuple(shape), dtype=dtype)
    if offset % itemsize != 0:
        # Files from other writers may misalign; copy rather than fail.
        raw = torch.frombuffer(span, dtype=torch.uint8, count=nbytes, offset=offset).clone()
        return raw.view(dtype).reshape(tuple(shape))
    return torch.frombuffer(span, dtype=dtype, count=nbytes // itemsize,
                            offset=offset).reshape(tuple(shape))


def _target_dtype(name: str, stored: torch.dtype, dtype: DtypeSpec) -> torch.dtype:
    if dtype is None:
        return stored
    if isinstance(dtype, torch.dtype):
        # A blanket dtype converts floating-point tensors only: step counters stay integers.
        return dtype if stored.is_floating_point else stored
    return dtype.get(name, stored)


def _dtype_by_stored_name(dtype: DtypeSpec, aliases: Mapping[str, str]) -> DtypeSpec:
    """`dtype` with a {name: dtype} mapping keyed by stored names (an alias names the tensor
    it shares memory with: tied weights are one tensor, converted once whichever name the
    caller used)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, Mapping):
        raise TypeError("dtype= takes a torch.dtype or a {name: torch.dtype} mapping, "
                        f"not {type(dtype).__name__}")
    by_target: Dict[str, torch.dtype] = {}
    for name, want in dtype.items():
        if not isinstance(want, torch.dtype):
            raise TypeError(f"dtype[{name!r}] is {want!r}, not a torch.dtype")
        target = aliases.get(name, name)
        if by_target.get(target, want) != want:
            raise ValueError(f"dtype= asks for both {by_target[target]} and {want} for {target!r} "
                             "(tied names share one tensor)")
        by_target[target] = want
    return by_target


def _device(map_location: Any) -> Optional[torch.device]:
    if map_location is None:
        return None
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        return None if device.type == "cpu" else device
    raise TypeError("map_location must be None, a device string or a torch.device")


def _to_stream(via_span: Sequence[str], tensors: List[Dict[str, Any]], index: Mapping[str, int],
               needed: Mapping[str, Optional[torch.Tensor]], dtype: DtypeSpec,
               device: Optional[torch.device], budget: int) -> List[str]:
    """The tensors that a bounded load reads in pieces: larger than the budget, and converted
    (another dtype or device) or copied into a contiguous destination. Others are read whole:
    into a span that becomes the result without a copy, or (a non-contiguous destination)
    into one span of the tensor's size, the one case where a load may exceed max_memory."""
    if not budget:
        return []
    out = []
    for target in via_span:
        t = tensors[index[target]]
        if t["length"] <= budget:
            continue
        d = needed[target]
        stored = SAFETENSORS_TO_DTYPE[t["dtype"]]
        if d is not None:
            if d.is_contiguous():
                out.append(target)
        elif device is not None or _target_dtype(target, stored, dtype) != stored:
            out.append(target)
    return out


def _stream_into(reader: Any, tensor: int, stored: torch.dtype, out: torch.Tensor, verify: bool,
                 budget: int) -> None:
    """Fills the contiguous `out` with tensor `tensor`, converted piece by piece (two pieces of
    about budget / 2 in flight: one read while the other is converted)."""
    piece_bytes = max(4096, budget // 2 // 4096 * 4096)
    itemsize = torch.empty((), dtype=stored).element_size()
    with torch.no_grad():
        flat = out.view(-1)

        def sink(offset: int, piece: memoryview) -> None:
            src = torch.frombuffer(piece, dtype=stored)
            start = offset // itemsize
            flat[start:start + src.numel()].copy_(src)
            del src  # the piece's memory is reused once this returns

        reader.read_pieces(tensor, piece_bytes, verify, sink)


def load_checkpoint_dir(
    path: str,
    engine_options: Any,
    *,
    into: Any = None,
    map_location: Any = "cpu",
    keys: KeySelection = None,
    dtype: DtypeSpec = None,
    strict: bool = True,
    verify: bool = True,
    max_memory: Optional[int] = None,
    weights_only: bool = True,
    progress: Optional[Callable[[int, int], None]] = None,
) -> Any:
    """Loads the checkpoint directory `path`; see :meth:`CheckpointManager.load`.

    `progress(bytes_read, bytes_to_read)` (tensor bytes) is called before the first read and
    after each batch of reads completed; with it, reads go in batches of at most 64 MiB (or
    `max_memory`) unless one tensor is larger.
    """
    reader = _core.CheckpointReader(str(path), engine_options)
    manifest = json.loads(reader.manifest_json())
    tensors = manifest["tensors"]
    index = {t["name"]: i for i, t in enumerate(tensors)}
    aliases: Dict[str, str] = dict(manifest.get("aliases", {}))
    all_names = [t["name"] for t in tensors] + list(aliases)
    if strict and isinstance(dtype, Mapping):
        unknown = sorted(n for n in dtype if n not in index and n not in aliases)
        if unknown:
            raise ValueError(f"dtype= names tensors that checkpoint {path} does not have: "
                             f"{', '.join(map(str, unknown[:20]))}" + (" ..." if len(unknown) > 20 else "")
                             + ". Pass strict=False to ignore them.")
    dtype = _dtype_by_stored_name(dtype, aliases)
    selected, missing = _selection(keys, all_names)

    dest: Dict[str, torch.Tensor] = {}
    mismatched: List[str] = []
    unexpected: List[str] = []
    if into is not None:
        dest = flatten_into(into)
        if keys is None or callable(keys):
            pred = (lambda n: True) if keys is None else keys
            missing += [n for n in dest if n not in index and n not in aliases and pred(n)]
        unexpected = [n for n in selected if n not in dest]
        for n in selected:
            if n in dest:
                stored = tensors[index[aliases.get(n, n)]]
                if tuple(dest[n].shape) != tuple(stored["shape"]):
                    mismatched.append(f"{n}: checkpoint {tuple(stored['shape'])}, "
                                      f"destination {tuple(dest[n].shape)}")
    if strict and (missing or unexpected or mismatched):
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {', '.join(sorted(missing)[:20])}"
                         + (" ..." if len(missing) > 20 else ""))
        if unexpected:
            parts.append(f"in the checkpoint but not in into=: {', '.join(unexpected[:20])}"
                         + (" ..." if len(unexpected) > 20 else ""))
        if mismatched:
            parts.append("shape mismatch: " + "; ".join(mismatched[:20]))
        raise ValueError(f"checkpoint {path} does not match what was asked (strict=True): "
                         + " | ".join(parts) + ". Pass strict=False to load what matches.")
    bad_shape = {m.split(":", 1)[0] for m in mismatched}

    # Stored tensors needed, and where each goes: straight into a destination, or a span.
    needed: Dict[str, Optional[torch.Tensor]] = {}
    for n in selected:
        target = aliases.get(n, n)
        d = dest.get(n) if n not in bad_shape else None
        if d is not None and target not in needed:
            needed[target] = d
        elif target not in needed:
            needed[target] = None

    direct: List[tuple[int, int]] = []
    via_span: List[str] = []
    direct_names: List[str] = []
    for target, d in needed.items():
        t = tensors[index[target]]
        stored_dtype = SAFETENSORS_TO_DTYPE[t["dtype"]]
        if (d is not None and d.device.type == "cpu" and d.is_contiguous()
                and d.dtype == stored_dtype and t["length"] > 0):
            direct.append((index[target], d.data_ptr()))
            direct_names.append(target)
        else:
            via_span.append(target)

    loaded: Dict[str, torch.Tensor] = {}
    budget = int(max_memory) if max_memory else 0
    to_read = sum(tensors[index[t]]["length"] for t in needed)
    bytes_read = 0
    if progress is not None:
        progress(0, to_read)
    if direct:
        reader.read(direct, verify, budget, 1 << 20)
        for target in direct_names:
            loaded[target] = needed[target]  # type: ignore[assignment]
        if progress is not None:
            bytes_read += sum(tensors[index[t]]["length"] for t in direct_names)
            progress(bytes_read, to_read)

    # A tensor larger than the budget that must be converted (dtype, device) or copied into a
    # destination streams in pieces into its final memory: the bytes in flight stay within
    # max_memory whatever the tensor's size.
    device = _device(map_location)
    streamed = _to_stream(via_span, tensors, index, needed, dtype, device, budget)
    for target in streamed:
        t = tensors[index[target]]
        stored_dtype = SAFETENSORS_TO_DTYPE[t["dtype"]]
        out = needed[target]
        if out is None:
            out = torch.empty(tuple(t["shape"]), dtype=_target_dtype(target, stored_dtype, dtype),
                              device=device or "cpu")
        _stream_into(reader, index[target], stored_dtype, out, verify, budget)
        loaded[target] = out
        if progress is not None:
            bytes_read += t["length"]
            progress(bytes_read, to_read)
    if streamed:
        streamed_set = set(streamed)
        via_span = [target for target in via_span if target not in streamed_set]

    # Span reads, in batches of at most max_memory bytes when bounded (or smaller ones to report
    # progress between them).
    batch_limit = budget
    if progress is not None:
        batch_limit = min(budget or _PROGRESS_BATCH_BYTES, _PROGRESS_BATCH_BYTES)
    batches: List[List[str]] = [[]]
    batch_bytes = 0
    for target in via_span:
        n = tensors[index[target]]["length"]
        if batch_limit and batches[-1] and batch_bytes + n > batch_limit:
            batches.append([])
            batch_bytes = 0
        batches[-1].append(target)
        batch_bytes += n
    for batch in batches:
        if not batch:
            continue
        spans, placement = reader.read([(index[n], 0) for n in batch], verify, 0, 1 << 20)
        for target, (span, offset) in zip(batch, placement):
            t = tensors[index[target]]
            stored_dtype = SAFETENSORS_TO_DTYPE[t["dtype"]]
            if span < 0:  # an empty tensor: nothing was read
                value = torch.empty(tuple(t["shape"]), dtype=stored_dtype)
            else:
                value = _view(spans[span], offset, t["length"], stored_dtype, t["shape"])
            d = needed[target]
            if d is not None:
                with torch.no_grad():
                    d.copy_(value)  # converts dtype / moves to d's device
                loaded[target] = d
                continue
            want = _target_dtype(target, stored_dtype, dtype)
            if want != stored_dtype:
                value = value.to(want)
            if device is not None:
                value = value.to(device)
            loaded[target] = value
        del spans
        if progress is not None:
            bytes_read += sum(tensors[index[t]]["length"] for t in batch)
            progress(bytes_read, to_read)

    selected_set = set(selected)

    def lookup(name: str) -> Optional[torch.Tensor]:
        if name not in selected_set:
            return None
        target = aliases.get(name, name)
        if name in dest and name not in bad_shape:
            # In-place loads return the caller's own tensors (aliases included).
            if target not in loaded or loaded[target] is not dest[name]:
                with torch.no_grad():
                    dest[name].copy_(loaded[target])
            return dest[name]
        return loaded.get(target)

    return unflatten_state(reader.read_objects(), lookup, weights_only=weights_only)
