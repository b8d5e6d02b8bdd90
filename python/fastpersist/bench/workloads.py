# SPDX-License-Identifier: Apache-2.0
"""The states the peer benchmark saves and loads: a flat set of tensors every format takes.

- ``flat``: tensors of 64 MiB (the last one shorter) of random values, cycling through fp32,
  bf16, fp16 and int64, ``size`` bytes in all;
- a model of :mod:`fastpersist.bench.models` with its Adam optimizer state materialized:
  ``model.<name>`` for every parameter and buffer (tied weights once), ``optimizer.<i>.<key>``
  for the optimizer's tensors.

Every peer gets the same tensors as one flat ``{name: tensor}`` dict, so that safetensors (which
takes nothing else) and DCP save exactly the bytes torch.save and fastpersist save.
Fingerprints (CRC-32 of each tensor's bytes, computed once) check what a load returns.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple

import torch

from . import models

_MiB = 1 << 20
_FLAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64)

Fingerprint = Tuple[torch.dtype, Tuple[int, ...], int]


def _bytes_of(t: torch.Tensor) -> Any:
    """The tensor's bytes as a buffer (no copy for a contiguous CPU tensor)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def fingerprint(t: torch.Tensor) -> Fingerprint:
    return (t.dtype, tuple(t.shape), zlib.crc32(_bytes_of(t)) if t.numel() else 0)


@dataclass
class Workload:
    name: str
    tensors: Dict[str, torch.Tensor]
    fingerprints: Dict[str, Fingerprint] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.fingerprints:
            self.fingerprints = {k: fingerprint(v) for k, v in self.tensors.items()}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def check(self, loaded: Mapping[str, Any], what: str) -> None:
        """Raises AssertionError when `loaded` is not exactly this workload's tensors."""
        missing = sorted(set(self.fingerprints) - set(loaded))
        if missing:
            raise AssertionError(f"{what}: {len(missing)} tensors missing, e.g. {missing[:3]}")
        extra = sorted(set(loaded) - set(self.fingerprints))
        if extra:
            raise AssertionError(f"{what}: unexpected entries {extra[:3]}")
        for name, want in self.fingerprints.items():
            got = loaded[name]
            if not isinstance(got, torch.Tensor):
                raise AssertionError(f"{what}: {name!r} is a {type(got).__name__}, not a tensor")
            if fingerprint(got) != want:
                raise AssertionError(f"{what}: tensor {name!r} differs from the saved one")


def flat(size: int, seed: int = 0) -> Workload:
    if size < 1:
        raise ValueError("the flat workload needs at least one byte")
    g = torch.Generator().manual_seed(seed)
    tensors: Dict[str, torch.Tensor] = {}
    left, i = size, 0
    while left > 0:
        dtype = _FLAT_DTYPES[i % len(_FLAT_DTYPES)]
        width = torch.tensor([], dtype=dtype).element_size()
        count = max(1, min(64 * _MiB, left) // width)
        if dtype.is_floating_point:
            t = torch.randn(count, generator=g, dtype=torch.float32).to(dtype)
        else:
            t = torch.randint(-(1 << 40), 1 << 40, (count,), generator=g, dtype=dtype)
        tensors[f"layer{i:04d}.{str(dtype).removeprefix('torch.')}"] = t
        left -= count * width
        i += 1
    return Workload(f"flat {size / 2**30:.3g} GiB", tensors)


def model_with_adam(name: str, seed: int = 0) -> Workload:
    model = models.build(name, seed=seed)
    opt = models.with_optimizer_state(model)
    tensors: Dict[str, torch.Tensor] = {}
    seen = set()
    for key, t in model.state_dict().items():
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if ident in seen:  # tied weights: safetensors refuses tensors that share memory
            continue
        seen.add(ident)
        tensors[f"model.{key}"] = t.detach().contiguous()
    for index, entry in opt.state_dict()["state"].items():
        for key, t in entry.items():
            if isinstance(t, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = t.detach().contiguous()
    return Workload(f"{name} + Adam", tensors)


def build(spec: str, size: int) -> Workload:
    """``flat`` (of `size` bytes) or a model name of :data:`models.MODELS`."""
    if spec == "flat":
        return flat(size)
    if spec in models.MODELS:
        return model_with_adam(spec)
    raise ValueError(f"unknown workload {spec!r}: flat or one of {', '.join(sorted(models.MODELS))}")
