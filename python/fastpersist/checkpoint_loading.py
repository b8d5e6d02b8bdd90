# SPDX-License-Identifier: Apache-2.0
"""Loading a checkpoint directory: glue around :meth:`fastpersist._core.CheckpointReader.load`.

C++ plans and runs the whole load (selection, aliases, strict checks, direct or staged reads
into destinations, grouped span reads into new memory, dtype conversion, streaming under
``max_memory``, progress, checksums; see docs/design.md, "Load planning in C++"). This module
only names the destinations (each with its address, byte capacity, dtype, shape and strides,
which C++ checks before any read), evaluates a ``keys=`` predicate, wraps the returned memory
as tensors without a copy, moves them to ``map_location`` and rebuilds the state.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch

from . import _core
from ._load_memory import dtype_name, load_destination, loaded_tensor
from .checkpoint_state import SAFETENSORS_TO_DTYPE as DTYPE_TO_TORCH
from .checkpoint_state import flatten_into, torch_dtype, unflatten_state

KeySelection = Union[None, Iterable[str], Callable[[str], bool]]
DtypeSpec = Union[None, torch.dtype, Mapping[str, torch.dtype]]

# Values of the C++ DestinationState (checkpoint_load.h).
_Dest = _core.DestinationState


def key_predicate(keys: KeySelection) -> Callable[[str], bool]:
    """A ``keys=`` selection (None for all, names, or a predicate) as a predicate."""
    if keys is None:
        return lambda _name: True
    if callable(keys):
        return keys
    if isinstance(keys, str):
        raise TypeError("keys= takes a list of names or a predicate, not a single string")
    return set(keys).__contains__


def _names(keys: KeySelection, manifest: Any, dest: Mapping[str, torch.Tensor]) -> Optional[List[str]]:
    """The names to load, or None for all. A predicate is evaluated here, over the checkpoint's
    names and the destinations' (so that a destination it selects is reported missing)."""
    if keys is None:
        return None
    selects = key_predicate(keys)
    if callable(keys):
        names = manifest.names()
        known = set(names)
        return [n for n in names if selects(n)] + [n for n in dest if n not in known and selects(n)]
    return list(keys)


def _dtypes(dtype: DtypeSpec) -> Tuple[str, Dict[str, str]]:
    """(blanket dtype name or "", {name: dtype name})."""
    if dtype is None:
        return "", {}
    if isinstance(dtype, torch.dtype):
        return dtype_name(dtype), {}
    if not isinstance(dtype, Mapping):
        raise TypeError("dtype= takes a torch.dtype or a {name: torch.dtype} mapping, "
                        f"not {type(dtype).__name__}")
    by_name = {}
    for name, want in dtype.items():
        if not isinstance(want, torch.dtype):
            raise TypeError(f"dtype[{name!r}] is {want!r}, not a torch.dtype")
        by_name[name] = dtype_name(want)
    return "", by_name


def _device(map_location: Any) -> Optional[torch.device]:
    if map_location is None:
        return None
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        return None if device.type == "cpu" else device
    raise TypeError("map_location must be None, a device string or a torch.device")


def written_through_dcp(manifest: Any) -> bool:
    """Whether a checkpoint was written through torch.distributed.checkpoint (fastpersist.dcp)."""
    return any(f.name == _core.layout.DCP_METADATA_FILE_NAME for f in manifest.files)


def _device_destinations(manifest: Any, names: Optional[List[str]],
                         device: torch.device) -> Dict[str, torch.Tensor]:
    """For ``map_location`` on a CUDA device: an empty device tensor per selected raw tensor,
    which C++ fills from the pinned slots of its staged read with host-to-device copies
    (LoadDestination's device memory) instead of the tensor passing through new host memory
    and ``.to(device)`` on this thread. Compressed tensors, and names selecting an alias, are
    left to that path."""
    wanted = None if names is None else set(names)
    out: Dict[str, torch.Tensor] = {}
    for t in manifest.tensors:
        if t.encoding != "raw" or (wanted is not None and t.name not in wanted):
            continue
        dtype = DTYPE_TO_TORCH.get(t.dtype)
        if dtype is None:
            continue  # torch has no such dtype: the host path raises the clear error
        out[t.name] = torch.empty(tuple(t.shape), dtype=dtype, device=device)
    # torch may hand out memory still in use by kernels queued on the current stream; C++
    # writes from a stream of its own, which would not wait for them.
    torch.cuda.current_stream(device).synchronize()
    return out


def _to_device(state: Any, device: torch.device) -> Any:
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _to_device(v, device) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_to_device(v, device) for v in state)
    return state


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

    `progress(bytes_read, bytes_to_read)` (tensor bytes) is called from C++ before the first
    read and after each batch of reads completed.
    """
    device = _device(map_location)
    blanket, by_name = _dtypes(dtype)
    reader = _core.CheckpointReader(str(path), engine_options)
    manifest = reader.manifest
    if written_through_dcp(manifest):
        # DCP plans this load (reassembling every rank's blocks); progress is not reported.
        for given, what in ((keys, "keys="), (dtype, "dtype="), (max_memory, "max_memory=")):
            if given is not None:
                raise ValueError(f"fastpersist: {what} is not supported for a checkpoint written "
                                 "through torch.distributed.checkpoint")
        from .dcp import load_dcp_checkpoint  # torch.distributed, only for such checkpoints

        state = load_dcp_checkpoint(str(path), into=into, verify=verify, strict=strict,
                                    unsafe_objects=not weights_only)
        return state if device is None else _to_device(state, device)
    dest: Dict[str, torch.Tensor] = flatten_into(into) if into is not None else {}
    names = _names(keys, manifest, dest)
    to_gpu = False
    if into is None and dtype is None and device is not None and device.type == "cuda":
        to_gpu = True
        dest = _device_destinations(manifest, names, device)
    dest_items = list(dest.items())
    device_tensors = ({i: t for i, (_, t) in enumerate(dest_items)} if to_gpu else {})
    outcome = reader.load(
        names=names, destinations=[load_destination(n, t) for n, t in dest_items],
        into=into is not None, dtype=blanket, dtype_by_name=by_name, strict=strict,
        verify=verify, max_memory=int(max_memory or 0), progress=progress,
        device_tensors=device_tensors)

    loaded: Dict[str, torch.Tensor] = {}  # by stored name
    for t in outcome.tensors:
        if t.destination >= 0:
            loaded[t.name] = dest_items[t.destination][1]
            continue
        value = loaded_tensor(outcome.buffers[t.buffer] if t.buffer >= 0 else None, t.offset,
                              t.nbytes, torch_dtype(t.dtype, t.name), t.shape)
        # A device destination C++ could not fill (to_gpu) is filled from `value` below.
        moved = device is None or (to_gpu and t.name in dest)
        loaded[t.name] = value if moved else value.to(device)
    states = outcome.destinations
    del outcome
    filled = {dest_items[i][0] for i, s in enumerate(states) if s == _Dest.FILLED}
    caller_copies = {dest_items[i][0] for i, s in enumerate(states) if s == _Dest.CALLER_COPIES}
    aliases = manifest.aliases
    selected = None if names is None else set(names)

    def lookup(name: str) -> Optional[torch.Tensor]:
        if selected is not None and name not in selected:
            return None
        value = loaded.get(aliases.get(name, name))
        if value is None:
            return None
        if name in filled:
            return dest[name]  # in-place loads return the caller's own tensors
        if name in caller_copies:
            with torch.no_grad():
                dest[name].copy_(value)
            return dest[name]
        return value

    return unflatten_state(reader.read_objects(), lookup, weights_only=weights_only)
