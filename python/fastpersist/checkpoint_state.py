# SPDX-License-Identifier: Apache-2.0
"""How a training state is split into named tensors plus a small pickled sidecar, and rebuilt.

A training state is a nested structure such as::

    {"model": model.state_dict(), "optimizer": opt.state_dict(),
     "scheduler": sched.state_dict(), "rng": {"torch": torch.get_rng_state(), ...}, "step": 100}

:func:`flatten_state` walks it and returns a :class:`FlatState`:

- ``tensors``: every tensor reached through the *traversed containers* (see below), named by
  the path of dict keys and list/tuple indices joined with ``"."``, e.g.
  ``"model.transformer.h.0.attn.c_attn.weight"`` or ``"optimizer.state.0.exp_avg"``. The
  tensors are the caller's objects as they are: never copied, moved or made contiguous.
- ``aliases``: names of tensors that are the *same view of the same memory* as an earlier
  stored tensor (same storage, storage offset, shape, stride, dtype and device), mapped to that
  stored name. Tied weights (GPT-2's ``lm_head.weight`` / ``transformer.wte.weight``) are
  stored once.
- ``objects``: the *sidecar*, a protocol-4 pickle of the whole structure in which each
  traversed tensor is a persistent id ``("fastpersist.tensor", name)``. Everything that is not
  a traversed tensor (ints, floats, strings, ``None``, optimizer ``param_groups``, scheduler
  state, ``random.getstate()``, numpy RNG state, custom objects) is pickled normally.

:func:`unflatten_state` unpickles the sidecar and asks a ``lookup`` callable for each tensor
by name; with ``weights_only=True`` (the default) the sidecar may load exactly the globals
``torch.load(weights_only=True)`` allows (see :func:`unflatten_state`).

Traversed containers are exactly ``dict``, ``collections.OrderedDict``, ``list`` and ``tuple``
(not their other subclasses: ``defaultdict``, namedtuples and custom dict subclasses are
pickled whole). Dict keys must be ``str`` or ``int`` (an ``int`` key ``k`` is named
``str(k)``; the key itself keeps its type in the sidecar). A subtree under any other key type
(a tuple, a float, a bool, ...) is pickled whole into the sidecar, which is only allowed when
it contains no traversed tensor; otherwise :func:`flatten_state` raises ``ValueError``.

Tensors inside other objects (dataclasses, custom classes, sets, namedtuples, ...) are *not*
traversed: they are pickled by value inside the sidecar with the rest of that object. They
round-trip with ``weights_only=False`` only (torch's tensor pickling needs globals that the
restricted unpickler refuses), and they are never selected or dropped by name.

A bare tensor at the top level (``flatten_state(t)``) is named ``"_"``. Every other name is
non-empty; two paths that produce the same name (``{"a.b": t1, "a": {"b": t2}}`` or
``{0: t1, "0": t2}``) raise ``ValueError``. A container that is reached twice is written (and
loaded) once per path, each copy with its own names; a container that contains itself raises
``ValueError``.

:func:`flatten_into` applies the same naming to a *destination* structure (or an
``nn.Module``), so that a loader can fill existing tensors in place by name.
"""

from __future__ import annotations

import collections
import io
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Set, Tuple

import torch

from .pickle_bounds import SIZED, bounded_constructor, check_pickle

from . import _core
from .errors import CheckpointUnsupportedError

__all__ = [
    "DTYPE_TO_SAFETENSORS",
    "SAFETENSORS_TO_DTYPE",
    "torch_dtype",
    "TENSOR_PID_TAG",
    "BARE_TENSOR_NAME",
    "FlatState",
    "UnsafeCheckpointObjectError",
    "flatten_state",
    "flatten_into",
    "tensor_names",
    "unflatten_state",
]

#: The first element of every persistent id in a sidecar: ``("fastpersist.tensor", name)``.
TENSOR_PID_TAG = "fastpersist.tensor"

#: The name of a bare tensor given as the whole state.
BARE_TENSOR_NAME = "_"

_PICKLE_PROTOCOL = 4

#: torch dtype -> safetensors dtype string, from the C++ dtype table (``_core.dtype_table()``,
#: include/fastpersist/dtype.h), for the dtypes the installed torch has.
DTYPE_TO_SAFETENSORS: dict[torch.dtype, str] = {
    getattr(torch, d.torch_name): d.name
    for d in _core.dtype_table()
    if d.torch_name and isinstance(getattr(torch, d.torch_name, None), torch.dtype)
}

#: safetensors dtype string -> torch dtype (the reverse of :data:`DTYPE_TO_SAFETENSORS`).
SAFETENSORS_TO_DTYPE: dict[str, torch.dtype] = {code: dtype for dtype, code in DTYPE_TO_SAFETENSORS.items()}


def torch_dtype(code: str, name: str) -> torch.dtype:
    """The torch dtype of a stored tensor; CheckpointUnsupportedError naming the tensor for a
    safetensors dtype this torch has none for (C64, F8_E8M0 in some versions)."""
    dtype = SAFETENSORS_TO_DTYPE.get(code)
    if dtype is None:
        raise CheckpointUnsupportedError(
            f"fastpersist: tensor {name!r} is stored as {code}, which torch {torch.__version__} "
            "has no dtype for (leave it out with keys=)")
    return dtype


@dataclass
class FlatState:
    """A training state split into stored tensors, tensor aliases and the pickled sidecar.

    Attributes:
        tensors: ``(name, tensor)`` for each unique stored tensor, in traversal order. The
            tensors are the caller's own objects (no copy, no ``.contiguous()``, any device).
        aliases: alias name -> stored name, for tensors that are the same view of the same
            memory as a stored tensor (tied weights). Alias names are not in ``tensors``.
        objects: the sidecar: a protocol-4 pickle of the whole structure with every
            traversed tensor replaced by the persistent id ``("fastpersist.tensor", name)``.
    """

    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    objects: bytes = b""

    def names(self) -> list[str]:
        """Every tensor name in the state: stored names, then alias names."""
        return [name for name, _ in self.tensors] + list(self.aliases)


class UnsafeCheckpointObjectError(pickle.UnpicklingError):
    """The sidecar references a global that ``weights_only=True`` does not allow."""


# --------------------------------------------------------------------------------------------
# Traversal


class _TensorRef:
    """Placeholder for a traversed tensor inside the skeleton that gets pickled."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_MAPPING_TYPES = (dict, collections.OrderedDict)
_SEQUENCE_TYPES = (list, tuple)


def _is_mapping(obj: Any) -> bool:
    return type(obj) in _MAPPING_TYPES


def _is_sequence(obj: Any) -> bool:
    return type(obj) in _SEQUENCE_TYPES


def _path_repr(path: Tuple[Any, ...]) -> str:
    """``("model", 0, "w")`` -> ``state['model'][0]['w']`` (how a user would index it)."""
    return "state" + "".join(f"[{k!r}]" for k in path)


def _contains_tensor(obj: Any, active: Set[int]) -> bool:
    """Whether a traversed container (recursively) holds a tensor; cycles count as none."""
    if isinstance(obj, torch.Tensor):
        return True
    if _is_mapping(obj) or _is_sequence(obj):
        if id(obj) in active:
            return False
        active.add(id(obj))
        try:
            values = obj.values() if _is_mapping(obj) else obj
            return any(_contains_tensor(v, active) for v in values)
        finally:
            active.discard(id(obj))
    return False


class _Walker:
    """Walks a state, names its tensors and builds the skeleton that gets pickled."""

    def __init__(self, on_tensor: Callable[[str, Tuple[Any, ...], torch.Tensor], None]) -> None:
        self._on_tensor = on_tensor
        self._paths: Dict[str, Tuple[Any, ...]] = {}
        self._active: Set[int] = set()

    def walk(self, state: Any) -> Any:
        if isinstance(state, torch.Tensor):
            return self._tensor(state, (), BARE_TENSOR_NAME)
        return self._visit(state, ())

    def _tensor(self, tensor: torch.Tensor, path: Tuple[Any, ...], name: str) -> _TensorRef:
        if name == "":
            raise ValueError(
                f"the tensor at {_path_repr(path)} would get an empty name; use non-empty dict keys")
        previous = self._paths.get(name)
        if previous is not None:
            raise ValueError(
                f"two tensors would both be named {name!r}: {_path_repr(previous)} and "
                f"{_path_repr(path)}; names join dict keys and list indices with '.', so rename "
                "one of the keys")
        self._paths[name] = path
        self._on_tensor(name, path, tensor)
        return _TensorRef(name)

    def _visit(self, obj: Any, path: Tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path, ".".join(str(k) for k in path))
        mapping = _is_mapping(obj)
        if not mapping and not _is_sequence(obj):
            return obj  # pickled as it is (tensors inside are pickled by value)
        if id(obj) in self._active:
            raise ValueError(f"the state contains a reference cycle: {_path_repr(path)} contains itself")
        self._active.add(id(obj))
        try:
            if mapping:
                out = type(obj)()
                for key, value in obj.items():
                    if type(key) is str or type(key) is int:
                        out[key] = self._visit(value, path + (key,))
                    elif _contains_tensor(value, set(self._active)):
                        raise ValueError(
                            f"{_path_repr(path + (key,))} holds tensors under a dict key of type "
                            f"{type(key).__name__}; tensor names are built from str and int keys "
                            "only, so use a str or int key there")
                    else:
                        out[key] = value  # a tensor-free subtree: goes into the sidecar whole
                # Attributes ride along, as torch.save keeps them: a state_dict's `_metadata`
                # (module versions that load_state_dict consults) is one.
                extra = getattr(obj, "__dict__", None)
                if extra:
                    out.__dict__.update(extra)
                return out
            items = [self._visit(value, path + (i,)) for i, value in enumerate(obj)]
            return items if type(obj) is list else tuple(items)
        finally:
            self._active.discard(id(obj))


def _check_storable(name: str, tensor: torch.Tensor) -> None:
    if tensor.layout != torch.strided:
        raise ValueError(
            f"tensor {name!r} has layout {tensor.layout}; only dense (strided) tensors can be "
            "stored (convert it with .to_dense() first)")
    if tensor.dtype not in DTYPE_TO_SAFETENSORS:
        if tensor.dtype.is_complex:
            raise ValueError(
                f"tensor {name!r} has complex dtype {tensor.dtype}, which checkpoint files cannot "
                "store; save torch.view_as_real(tensor) instead")
        raise ValueError(
            f"tensor {name!r} has dtype {tensor.dtype}, which checkpoint files cannot store; "
            f"supported dtypes: {', '.join(str(d) for d in DTYPE_TO_SAFETENSORS)}")


def _view_key(tensor: torch.Tensor) -> Optional[Tuple[Any, ...]]:
    """What makes two tensors the same view of the same memory; None if not comparable."""
    try:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        nbytes = storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return None
    if ptr == 0 or nbytes == 0:  # no memory (empty or meta): nothing to share
        return None
    return (str(tensor.device), ptr, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
            tensor.dtype)


class _SidecarPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Optional[Tuple[str, str]]:  # noqa: D102
        if type(obj) is _TensorRef:
            return (TENSOR_PID_TAG, obj.name)
        return None


def flatten_state(state: Any) -> FlatState:
    """Splits ``state`` into its traversed tensors, their aliases and the pickled sidecar.

    Args:
        state: a dict (most common), OrderedDict, list, tuple or a bare tensor (named
            ``"_"``), nested arbitrarily; leaves are tensors or picklable objects.

    Returns:
        A :class:`FlatState` whose tensors are the given objects themselves, in traversal
        (insertion) order.

    Raises:
        ValueError: two paths give the same name, a tensor sits under a dict key that is not
            ``str``/``int``, a tensor would get an empty name, a traversed container contains
            itself, or a tensor's dtype (complex, ...) or layout (sparse, ...) cannot be stored.
        pickle.PicklingError, TypeError, AttributeError: an object in the state is not
            picklable.
    """
    flat = FlatState()
    stored_by_view: Dict[Tuple[Any, ...], str] = {}

    def on_tensor(name: str, path: Tuple[Any, ...], tensor: torch.Tensor) -> None:
        _check_storable(name, tensor)
        key = _view_key(tensor)
        if key is not None:
            stored = stored_by_view.get(key)
            if stored is not None:
                flat.aliases[name] = stored
                return
            stored_by_view[key] = name
        flat.tensors.append((name, tensor))

    skeleton = _Walker(on_tensor).walk(state)
    buf = io.BytesIO()
    _SidecarPickler(buf, protocol=_PICKLE_PROTOCOL).dump(skeleton)
    flat.objects = buf.getvalue()
    return flat


def flatten_into(into: Any) -> dict[str, torch.Tensor]:
    """Names the tensors of a destination structure the way :func:`flatten_state` would.

    Args:
        into: a nested dict/OrderedDict/list/tuple of tensors (e.g. ``{"model":
            model.state_dict(), "optimizer": opt.state_dict()}``), a bare tensor (named
            ``"_"``) or an ``nn.Module`` (named by its ``state_dict()`` keys, no prefix; the
            values share memory with the module's parameters and buffers).

    Returns:
        name -> tensor for every tensor path, aliases included (tied weights appear under
        each of their names, as the same memory), in traversal order. Non-tensor leaves are
        ignored. Dtypes are not checked.

    Raises:
        ValueError: as :func:`flatten_state` for duplicate names, tensors under non-str/int
            keys, empty names and reference cycles.
    """
    if isinstance(into, torch.nn.Module):
        into = into.state_dict()
    out: dict[str, torch.Tensor] = {}

    def on_tensor(name: str, path: Tuple[Any, ...], tensor: torch.Tensor) -> None:
        out[name] = tensor

    _Walker(on_tensor).walk(into)
    return out


def tensor_names(state: Any) -> list[str]:
    """The tensor names :func:`flatten_state` gives ``state`` (aliases included), in order."""
    return list(flatten_into(state))


# --------------------------------------------------------------------------------------------
# Loading


class _Dropped:
    """Stands in for a tensor that ``lookup`` did not select, until the cleanup pass."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<fastpersist dropped tensor>"


_DROPPED = _Dropped()


def _torch_safe_global(module: str, name: str) -> Any:
    """The object ``torch.load(weights_only=True)`` resolves the global ``module.name`` to.

    The answer is torch's own, from the tables of its weights-only unpickler: its default
    allowlist (tensor and storage classes and their rebuild functions, dtypes, ``torch.Size``,
    ``torch.device``, ``collections.OrderedDict``, ``set``, ``complex``, ...), minus its blocked
    modules, plus what ``torch.serialization.add_safe_globals`` or the ``safe_globals`` context
    manager registered, looked up at each call as torch does. torch's unpickler itself cannot
    read a sidecar (it takes pickle protocol 2 and only ``"storage"`` persistent ids), so the
    opcodes are Python's and every global goes through this gate.

    Raises:
        UnsafeCheckpointObjectError: torch refuses the global.
    """
    from torch import _weights_only_unpickler as torch_unpickler

    full_name = f"{module}.{name}"
    if module not in torch_unpickler._blocklisted_modules:
        for table in (torch_unpickler._get_allowed_globals(),
                      torch_unpickler._get_user_allowed_globals()):
            if full_name in table:
                return table[full_name]
    raise UnsafeCheckpointObjectError(
        f"checkpoint object sidecar needs {full_name}, which is not allowed with "
        "weights_only=True; pass weights_only=False if you trust this checkpoint, or "
        "register it with torch.serialization.add_safe_globals")


class _LoadMixin:
    """``persistent_load`` shared by both unpicklers: tensors come from ``lookup``."""

    _lookup: Callable[[str], Optional[torch.Tensor]]
    dropped: bool

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == TENSOR_PID_TAG
                and isinstance(pid[1], str)):
            raise pickle.UnpicklingError(f"checkpoint object sidecar has an unknown persistent id {pid!r}")
        tensor = self._lookup(pid[1])
        if tensor is None:
            self.dropped = True
            return _DROPPED
        return tensor


class _TrustedUnpickler(_LoadMixin, pickle.Unpickler):
    def __init__(self, data: bytes, lookup: Callable[[str], Optional[torch.Tensor]]) -> None:
        super().__init__(io.BytesIO(data))
        self._lookup = lookup
        self.dropped = False


class _RestrictedUnpickler(_LoadMixin, pickle.Unpickler):
    def __init__(self, data: bytes, lookup: Callable[[str], Optional[torch.Tensor]]) -> None:
        super().__init__(io.BytesIO(data))
        self._lookup = lookup
        self.dropped = False
        self._limit = len(data)

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        found = _torch_safe_global(module, name)
        if module in ("builtins", "__builtin__") and name in SIZED:
            # No bytearray(N) larger than the sidecar itself (pickle_bounds.py).
            return bounded_constructor(name, self._limit, "the checkpoint's object sidecar")
        return found


def _remove_dropped(obj: Any) -> Any:
    """Removes dict entries whose value is a dropped tensor; None for those in lists/tuples."""
    if obj is _DROPPED:
        return None
    if _is_mapping(obj):
        for key in [k for k, v in obj.items() if v is _DROPPED]:
            del obj[key]
        for key, value in list(obj.items()):
            if _is_mapping(value) or _is_sequence(value):
                obj[key] = _remove_dropped(value)
        return obj
    if type(obj) is list:
        for i, value in enumerate(obj):
            if value is _DROPPED or _is_mapping(value) or _is_sequence(value):
                obj[i] = _remove_dropped(value)
        return obj
    if type(obj) is tuple:
        return tuple(_remove_dropped(v) for v in obj)
    return obj


def unflatten_state(
    objects: bytes,
    lookup: Callable[[str], torch.Tensor | None],
    *,
    weights_only: bool = True,
) -> Any:
    """Rebuilds a state from its sidecar, taking each tensor from ``lookup(name)``.

    Args:
        objects: the sidecar (:attr:`FlatState.objects`).
        lookup: returns the tensor for a name (resolving aliases is its business: return the
            same object for an alias and its stored name to keep tied weights tied), or
            ``None`` for a tensor that a partial load does not select. A dict entry whose
            value is an unselected tensor is removed from its dict; an unselected tensor in a
            list or tuple becomes ``None`` (so indices do not shift); an unselected bare tensor
            state loads as ``None``.
        weights_only: when true (the default), the sidecar may load exactly the globals
            ``torch.load(weights_only=True)`` allows: torch's default allowlist plus what
            ``torch.serialization.add_safe_globals`` or ``safe_globals`` registered (numpy
            values such as ``np.random.get_state()`` need registering, as with torch.load).
            Anything else raises :class:`UnsafeCheckpointObjectError`. When false, the sidecar
            is an ordinary pickle: load only checkpoints you trust.

    Returns:
        The state, with containers, keys and their order as they were saved.

    Raises:
        UnsafeCheckpointObjectError: (a ``pickle.UnpicklingError``) a global outside the
            allowlist with ``weights_only=True``.
        pickle.UnpicklingError: a corrupt sidecar or an unknown persistent id (with
            ``weights_only``, every failure of the pickle is this class).
    """
    if weights_only:
        check_pickle(objects, len(objects), "the checkpoint's object sidecar",  # pickle_bounds.py
                     bounded_constructors=True)
    cls = _RestrictedUnpickler if weights_only else _TrustedUnpickler
    unpickler = cls(objects, lookup)
    try:
        state = unpickler.load()
    except pickle.UnpicklingError:
        raise
    except Exception as e:
        if not weights_only:
            raise  # a trusted pickle's own errors (its classes') pass unchanged
        # A hostile or damaged pickle fails in many ways: one class for all of them.
        raise pickle.UnpicklingError(f"the checkpoint's object sidecar is damaged: "
                                     f"{type(e).__name__}: {e}") from None
    if unpickler.dropped:
        state = _remove_dropped(state)
    return state

