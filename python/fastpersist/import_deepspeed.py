# SPDX-License-Identifier: Apache-2.0
"""Import the fp32 model weights of a DeepSpeed ZeRO checkpoint folder (stages 1, 2 and 3).

The folder is what ``engine.save_checkpoint(DIR)`` writes and DeepSpeed's ``zero_to_fp32.py``
reads: ``DIR/latest`` names the tag folder, which holds model states and one optimizer states
file per data parallel rank (:mod:`fastpersist.import_deepspeed_layout` finds them).

What the files say (facts of the format; the code is fastpersist's own):

- model states: ``param_shapes``, a list (one per optimizer parameter group) of ordered
  ``{name: shape}`` of the trained parameters; ``buffer_names`` and ``module`` (the module's
  state dict, where the buffers are whole); ``frozen_param_shapes`` and
  ``frozen_param_fragments`` (parameters without gradients: whole at stages 1-2, one partition
  per rank at stage 3); ``shared_params`` (``{alias: name}`` of tied parameters).
- optimizer states, ``optimizer_state_dict``: ``zero_stage``; ``partition_count`` (an int, or
  one per group); stages 1-2: ``single_partition_of_fp32_groups``, per group this rank's slice
  of the group's flat fp32 vector (the group's parameters one after another, each followed by
  its ``param_alignment_paddings`` entry when present, the whole padded to a multiple of
  2 x world size), so the ranks' slices, concatenated in rank order, are the vector; stage 3:
  ``fp32_flat_groups``, per group a flat fp32 tensor holding, for each parameter of the group in
  order, this rank's ``ceil(numel / N)`` elements of it (the last rank's zero-padded), so a
  parameter is its slices of every rank concatenated and cut to its size.

:func:`load_deepspeed_dir` rebuilds ``{name: tensor}``, in the module's order, as
``zero_to_fp32`` does: the trained parameters from the optimizer's fp32 master copy, buffers
with floating ones as fp32, frozen parameters as they were saved, tied names sharing one tensor.
At stage 1, which records no frozen parameters (``zero_to_fp32`` leaves them out), they come
from ``module``, where they are whole. The optimizer's moments are not part of the result.

Trust: the ``.pt`` files are pickles that name DeepSpeed classes (``LossScaler``,
``ZeroStageEnum``, ``fragment_address``), so ``zero_to_fp32`` loads them with
``torch.load(weights_only=False)``, which runs whatever a hostile file says. Here they are loaded
with ``torch.load(weights_only=True)``, with those names (:data:`STAND_INS`) bound to inert
stand-ins of this module (DeepSpeed is neither needed nor imported): any other global is refused
with :class:`~fastpersist.import_errors.UnsafeForeignObjectError` naming it.
``weights_only=False`` loads with plain ``torch.load`` (then the pickles' DeepSpeed classes need
DeepSpeed installed).
"""

from __future__ import annotations

import errno
import math
import os
import pickle
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .import_deepspeed_layout import LATEST_FILE, find_deepspeed_checkpoint, zero_files
from .import_errors import ForeignCheckpointError, weights_only_refusal
from .pickle_bounds import PickleRefusedError, check_torch_file

__all__ = ["STAND_INS", "find_deepspeed_checkpoint", "load_deepspeed_dir"]

# report(done, total) in bytes of the files read
_Report = Optional[Callable[[int, int], None]]


class _Opaque:
    """Stands in for a DeepSpeed object the weights do not need (a loss scaler, a fragment
    address): keeps the state it was pickled with, runs nothing."""

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return "<DeepSpeed object not loaded>"


def _zero_stage(value: Any) -> int:
    """Stands in for ``ZeroStageEnum(value)``: the stage as an int."""
    if type(value) is not int:
        raise pickle.UnpicklingError(f"ZeroStageEnum of {value!r}")
    return value


# The DeepSpeed globals the ZeRO files name (DeepSpeed 0.9 to 0.19) and their stand-ins.
STAND_INS: Tuple[Tuple[Any, str], ...] = (
    (_Opaque, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (_Opaque, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
    (_Opaque, "deepspeed.utils.tensor_fragment.fragment_address"),
    (_zero_stage, "deepspeed.runtime.zero.config.ZeroStageEnum"),
)


# ----------------------------------------------------------------------------- reading
def _load(path: str, weights_only: bool) -> Any:
    """One .pt file, memory-mapped (the moments the weights do not need are never read)."""
    try:
        if not weights_only:
            return torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        check_torch_file(path, path)  # no bytearray(N) beyond the file (pickle_bounds.py)
        with torch.serialization.safe_globals(list(STAND_INS)):
            return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except PickleRefusedError as e:
        raise ForeignCheckpointError(str(e)) from None
    except pickle.UnpicklingError as e:
        if weights_only:
            raise weights_only_refusal(e, path) from None
        raise ForeignCheckpointError(f"{path} is not loadable: {e}") from None
    except ModuleNotFoundError as e:
        raise ForeignCheckpointError(f"{path} needs the module {e.name}, which is not installed "
                                     "(unpickling with weights_only=False imports its classes)"
                                     ) from None
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise  # the file could not be read
        # torch's zip reader says EINVAL about an archive it cannot parse
        raise ForeignCheckpointError(f"{path} is not a loadable torch file ({e})") from None
    except Exception as e:  # noqa: BLE001 - torch.load fails on garbage in many ways
        raise ForeignCheckpointError(f"{path} is not a loadable torch file "
                                     f"({type(e).__name__}: {e})") from None


def _field(state: Any, key: str, types: Any, path: str) -> Any:
    if not isinstance(state, dict) or key not in state:
        raise ForeignCheckpointError(f"{path} has no {key!r}: not a DeepSpeed ZeRO checkpoint file")
    value = state[key]
    if not isinstance(value, types):
        raise ForeignCheckpointError(f"{path}: {key!r} is a {type(value).__name__}")
    return value


def _numel(shape: Any, name: str, path: str) -> int:
    if not isinstance(shape, (tuple, list)) or not all(type(d) is int and d >= 0 for d in shape):
        raise ForeignCheckpointError(f"{path}: the shape of {name} is {shape!r}")
    return math.prod(shape)


def _flat_groups(groups: Any, path: str) -> List[torch.Tensor]:
    if not isinstance(groups, list) or not all(
            isinstance(t, torch.Tensor) and t.dim() == 1 for t in groups):
        raise ForeignCheckpointError(f"{path}: the fp32 groups are not a list of flat tensors")
    return [t.detach() for t in groups]


def _slices(parts: Sequence[torch.Tensor], start: int, length: int) -> List[torch.Tensor]:
    """The elements [start, start + length) of the concatenation of the 1-D ``parts``, as views
    of them (None of the parts is concatenated)."""
    out: List[torch.Tensor] = []
    base = 0
    for part in parts:
        lo, hi = max(start, base), min(start + length, base + part.numel())
        if lo < hi:
            out.append(part[lo - base:hi - base])
        base += part.numel()
    return out


def _whole(pieces: List[torch.Tensor], numel: int, shape: Any, name: str,
           where: str) -> torch.Tensor:
    """One tensor of ``shape`` (owning its memory) from the first ``numel`` elements of
    ``pieces``."""
    kept: List[torch.Tensor] = []
    need = numel
    for piece in pieces:
        if need == 0:
            break
        kept.append(piece[:need])
        need -= kept[-1].numel()
    if need:
        raise ForeignCheckpointError(f"{where}: {name} needs {numel} elements, "
                                     f"{numel - need} are stored")
    if not kept:
        return torch.empty(shape, dtype=pieces[0].dtype if pieces else torch.float32)
    return torch.cat(kept).view(shape)


@dataclass
class _ModelStates:
    path: str
    module: Dict[str, Any]
    buffer_names: List[str]
    param_shapes: List[Dict[str, Any]]
    frozen_shapes: Dict[str, Any]
    frozen_fragments: Dict[str, Any]
    shared: Dict[str, str]


def _model_states(path: str, weights_only: bool) -> _ModelStates:
    state = _load(path, weights_only)
    shapes = _field(state, "param_shapes", list, path)
    if not all(isinstance(group, dict) for group in shapes):
        raise ForeignCheckpointError(f"{path}: 'param_shapes' is not a list of dicts")
    return _ModelStates(
        path=path,
        module=_field(state, "module", dict, path),
        buffer_names=list(_field(state, "buffer_names", (list, tuple, set), path)),
        param_shapes=shapes,
        frozen_shapes=state.get("frozen_param_shapes") or {},
        frozen_fragments=state.get("frozen_param_fragments") or {},
        shared=state.get("shared_params") or {})


@dataclass
class _OptimStates:
    stage: int
    world_size: int
    groups: List[torch.Tensor]
    alignment_paddings: Optional[List[List[int]]]


def _optim_states(path: str, weights_only: bool) -> _OptimStates:
    osd = _field(_load(path, weights_only), "optimizer_state_dict", dict, path)
    stage = _field(osd, "zero_stage", int, path)
    if stage not in (1, 2, 3):
        raise ForeignCheckpointError(f"{path}: ZeRO stage {stage} is not 1, 2 or 3")
    count = _field(osd, "partition_count", (int, list), path)
    counts = count if isinstance(count, list) else [count]
    if not counts or not all(type(c) is int and c > 0 for c in counts):
        raise ForeignCheckpointError(f"{path}: 'partition_count' is {count!r}")
    key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    paddings = osd.get("param_alignment_paddings") if stage < 3 else None
    return _OptimStates(stage, max(counts), _flat_groups(_field(osd, key, list, path), path),
                        paddings)


# ----------------------------------------------------------------------------- rebuilding
def _merge_zero12(out: Dict[str, torch.Tensor], model: _ModelStates,
                  optims: List[_OptimStates]) -> None:
    """Stages 1-2: each group's vector is the ranks' partitions one after another."""
    world = len(optims)
    if any(len(o.groups) != len(model.param_shapes) for o in optims):
        raise ForeignCheckpointError(
            f"{model.path} has {len(model.param_shapes)} parameter group(s), the optimizer "
            f"states {', '.join(str(len(o.groups)) for o in optims)}")
    for name, shape in model.frozen_shapes.items():
        fragment = model.frozen_fragments.get(name)
        if not isinstance(fragment, torch.Tensor):
            raise ForeignCheckpointError(f"{model.path}: frozen parameter {name} is not stored")
        out[name] = _whole([fragment.detach().reshape(-1)], _numel(shape, name, model.path),
                           shape, name, model.path)
    paddings = optims[0].alignment_paddings
    for g, shapes in enumerate(model.param_shapes):
        parts = [o.groups[g] for o in optims]
        available = sum(p.numel() for p in parts)
        group_paddings = paddings[g] if paddings is not None else [0] * len(shapes)
        if len(group_paddings) != len(shapes):
            raise ForeignCheckpointError(f"{model.path}: group {g} has {len(shapes)} parameters "
                                         f"but {len(group_paddings)} alignment paddings")
        offset = 0
        for (name, shape), padding in zip(shapes.items(), group_paddings):
            numel = _numel(shape, name, model.path)
            out[name] = _whole(_slices(parts, offset, numel), numel, shape, name,
                               f"group {g} of {model.path}")
            offset += numel + padding
        # DeepSpeed pads each group to a multiple of 2 x world size, so what is left over is
        # less than that.
        align = 2 * world
        if math.ceil(offset / align) != math.ceil(available / align):
            raise ForeignCheckpointError(
                f"the parameters of group {g} take {offset} elements, its {world} partitions "
                f"hold {available}: the model and optimizer states disagree")


def _merge_zero3(out: Dict[str, torch.Tensor], models: List[_ModelStates],
                 optims: List[_OptimStates]) -> None:
    """Stage 3: each parameter is its slice of every rank, one after another, cut to size."""
    world = len(optims)
    first = models[0]
    for name, shape in first.frozen_shapes.items():
        numel = _numel(shape, name, first.path)
        fragments: List[torch.Tensor] = []
        for m in models:
            fragment = m.frozen_fragments.get(name)
            if not isinstance(fragment, torch.Tensor):
                raise ForeignCheckpointError(f"{m.path}: frozen parameter {name} is not stored")
            fragments.append(fragment.detach().reshape(-1))
        out[name] = _whole(fragments, numel, shape, name, "the frozen parameter fragments")
    params = [(n, s) for group in first.param_shapes for n, s in group.items()]
    offset = 0
    for name, shape in params:
        numel = _numel(shape, name, first.path)
        part = math.ceil(numel / world)
        pieces = [p for o in optims for p in _slices(o.groups, offset, part)]
        out[name] = _whole(pieces, numel, shape, name, f"the fp32 groups of {world} ranks")
        offset += part
    for rank, o in enumerate(optims):
        held = sum(t.numel() for t in o.groups)
        if held != offset:
            raise ForeignCheckpointError(
                f"the parameters take {offset} elements per rank, rank {rank}'s fp32 groups "
                f"hold {held}: the model and optimizer states disagree")


def load_deepspeed_dir(path: str, *, weights_only: bool = True,
                       report: _Report = None) -> Dict[str, torch.Tensor]:
    """The fp32 model weights of the ZeRO checkpoint at ``path`` (see the module's docstring).

    Args:
        path: the checkpoint folder (with ``latest``) or one of its tag folders.
        weights_only: ``False`` only for checkpoints you trust (see the module's docstring).
        report: called with (bytes read, total) as each file has been loaded.

    Returns:
        ``{name: tensor}`` in the module's names, on the CPU; tied names share one tensor.

    Raises:
        UnsafeForeignObjectError: ``weights_only`` and a file needs a global outside the
            allowlist.
        ForeignCheckpointError: not a ZeRO checkpoint, or an incomplete or inconsistent one.
    """
    folder = find_deepspeed_checkpoint(path)
    if folder is None:
        raise ForeignCheckpointError(f"{path} is not a DeepSpeed checkpoint folder (no "
                                     "*_model_states.pt in it or in the folder its "
                                     f"{LATEST_FILE} names)")
    files = zero_files(folder)
    # Stage 3 writes a model states file per rank, stages 1-2 one: the stage is checked below.
    model_files = files.rank_model_files or ([files.model_file] if files.model_file else [])
    done, total = 0, sum(os.path.getsize(f) for f in files.optim_files + model_files)

    def read(f: str) -> None:
        nonlocal done
        done += os.path.getsize(f)
        if report is not None:
            report(done, total)

    if report is not None:
        report(0, total)
    optims: List[_OptimStates] = []
    for f in files.optim_files:
        optims.append(_optim_states(f, weights_only))
        read(f)
    stage, world = optims[0].stage, optims[0].world_size
    if any(o.stage != stage for o in optims):
        raise ForeignCheckpointError(f"{folder}: the optimizer states disagree on the ZeRO stage")
    if world != len(optims):
        raise ForeignCheckpointError(
            f"{folder} holds {len(optims)} optimizer state file(s) but was saved by {world} "
            "ranks: an incomplete or overwritten checkpoint")
    if stage == 3 and len(files.rank_model_files) != world:
        raise ForeignCheckpointError(f"{folder} holds {len(files.rank_model_files)} per-rank "
                                     f"model state file(s) for a ZeRO-3 checkpoint of {world} "
                                     "ranks")
    if stage < 3 and (files.model_file is None or files.rank_model_files):
        raise ForeignCheckpointError(f"{folder}: a ZeRO-{stage} checkpoint has one model state "
                                     "file, mp_rank_00_model_states.pt")
    models: List[_ModelStates] = []
    for f in model_files:
        models.append(_model_states(f, weights_only))
        read(f)

    first = models[0]
    out: Dict[str, torch.Tensor] = OrderedDict()
    for name in first.buffer_names:
        buffer = first.module.get(name)
        if isinstance(buffer, torch.Tensor):
            # copies: nothing of the result maps the files
            dtype = torch.float32 if buffer.is_floating_point() else buffer.dtype
            out[name] = buffer.detach().to(dtype, copy=True)
    if stage == 3:
        _merge_zero3(out, models, optims)
    else:
        _merge_zero12(out, first, optims)
    for alias, name in first.shared.items():
        if isinstance(alias, str) and name in out:
            out[alias] = out[name]
    if stage < 3:
        # Stage 1 records no frozen parameters (zero_to_fp32 leaves them out); the module's
        # state has them whole, as saved.
        for name, value in first.module.items():
            if name not in out and isinstance(value, torch.Tensor):
                out[name] = value.detach().clone()
    # The module's order, as its state_dict() gives it.
    order = [n for n in first.module if n in out] + [n for n in out if n not in first.module]
    return OrderedDict((n, out[n]) for n in order)
