# SPDX-License-Identifier: Apache-2.0
"""``load_checkpoint(engine, load_dir, tag=None, dtype=None, keys=None, validate=True)``: DeepSpeed's
``engine.load_checkpoint`` through fastpersist, with the tag validated first and the model's
weights filtered by name and converted by dtype on the way in."""

from __future__ import annotations

import contextlib
import fnmatch
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import torch

from .install import installed, resolve_tag

Keys = Union[None, str, Iterable[str], Callable[[str], bool]]
DType = Union[None, torch.dtype, Mapping[str, torch.dtype]]


def load_checkpoint(engine: Any, load_dir: Any, tag: Optional[Any] = None, *, dtype: DType = None,
                    keys: Keys = None, validate: bool = True, **kwargs: Any) -> Any:
    """Loads a tag into `engine` (every rank calls it) and returns what
    ``engine.load_checkpoint`` returns: ``(load_path, client_state)``.

    Args:
        tag: the tag; None: the one ``load_dir/latest`` names (as DeepSpeed picks it). A tag that
            is not a plain tag name is refused (ValueError): it could lead outside `load_dir`.
        dtype: a torch dtype for every floating weight of the model, or ``{pattern: dtype}``
            (fnmatch patterns over the weights' names, first match wins), applied to the model
            states file's ``module`` before DeepSpeed copies it into the model (the seed's
            ``precision=``). ZeRO-3 restores the weights from its partitions, not from ``module``.
        keys: the weights to load (fnmatch patterns, or a predicate on the name; the seed's
            ``layer_filter``); the others keep their values. Implies
            ``load_module_strict=False`` unless given.
        validate: check every file of the tag against its manifest (size and XXH3-64; the ranks
            share the files) before anything is loaded: CheckpointCorruptError naming the bad
            file. A tag without a manifest (another engine's) cannot be checked: a warning.
        kwargs: passed to ``engine.load_checkpoint`` (load_optimizer_states, ...).
    """
    ours = installed(engine)
    if not isinstance(validate, bool):
        raise TypeError(f"fastpersist: validate must be True or False, got {type(validate).__name__}")
    keep = _key_filter(keys)
    cast = _dtype_rule(dtype)
    ours.wait()
    load_dir = os.fspath(load_dir)
    tag = resolve_tag(engine, load_dir, tag)
    if tag is not None:
        folder = os.path.join(load_dir, tag)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"fastpersist: no tag {tag!r} in {load_dir}")
        if validate:
            ours.verify_tag(folder)
    if keep is not None:
        kwargs.setdefault("load_module_strict", False)
    with _module_transform(ours, keep, cast):
        return engine.load_checkpoint(load_dir, tag, **kwargs)


def _key_filter(keys: Keys) -> Optional[Callable[[str], bool]]:
    if keys is None:
        return None
    if callable(keys):
        return keys
    patterns = [keys] if isinstance(keys, str) else list(keys)
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise TypeError("fastpersist: keys must be fnmatch patterns (a string or a non-empty list "
                        "of strings) or a predicate on the weight's name")
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _dtype_rule(dtype: DType) -> Optional[Callable[[str], Optional[torch.dtype]]]:
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        return lambda name: dtype
    if isinstance(dtype, Mapping) and all(isinstance(k, str) and isinstance(v, torch.dtype)
                                          for k, v in dtype.items()):
        rules = list(dtype.items())
        return lambda name: next((d for p, d in rules if fnmatch.fnmatchcase(name, p)), None)
    raise TypeError("fastpersist: dtype must be a torch.dtype or a {pattern: torch.dtype} dict")


@contextlib.contextmanager
def _module_transform(ours: Any, keep: Any, cast: Any) -> Iterator[None]:
    if keep is None and cast is None:
        yield
        return

    def transform(state: Any) -> Any:
        module = state.get("module") if isinstance(state, dict) else None
        if not isinstance(module, dict):
            return state
        out = {}
        for name, value in module.items():
            if keep is not None and not keep(name):
                continue
            if cast is not None and isinstance(value, torch.Tensor) and value.is_floating_point():
                want = cast(name)
                if want is not None and value.dtype != want:
                    value = value.to(want)
            out[name] = value
        state["module"] = type(module)(out) if type(module) is not dict else out
        return state

    ours.transform = transform
    try:
        yield
    finally:
        ours.transform = None
