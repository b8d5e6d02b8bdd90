# SPDX-License-Identifier: Apache-2.0
"""The memory a load crosses with C++ (``_core.CheckpointReader.load``): a tensor given as a
destination C++ writes into, and the memory C++ returns, wrapped as tensors without a copy.
Shared by load_checkpoint_dir (fastpersist.checkpoint_loading) and the DCP reader
(fastpersist.dcp)."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import torch

from .checkpoint_state import DTYPE_TO_SAFETENSORS

# (name, address, capacity, dtype, shape, strides): what CheckpointReader.load takes per
# destination.
Destination = Tuple[str, int, int, str, List[int], List[int]]


def dtype_name(dtype: torch.dtype) -> str:
    """The dtype's name in a checkpoint. A dtype checkpoints do not hold is passed by its torch
    name: C++ refuses it by that name."""
    return DTYPE_TO_SAFETENSORS.get(dtype, str(dtype))


def load_destination(name: str, t: torch.Tensor) -> Destination:
    """Destination `t` for the tensor `name`. The capacity is what its storage holds from its
    first element on; memory C++ cannot write (another device) goes as address 0, filled by the
    caller from a host copy."""
    shape = list(t.shape)
    if t.device.type != "cpu":
        return (name, 0, 0, dtype_name(t.dtype), shape, [])
    capacity = int(t.untyped_storage().nbytes() - t.storage_offset() * t.element_size())
    return (name, t.data_ptr(), max(capacity, 0), dtype_name(t.dtype), shape, list(t.stride()))


def loaded_tensor(buffer: Any, offset: int, nbytes: int, dtype: torch.dtype,
                  shape: Sequence[int]) -> torch.Tensor:
    """The bytes at `offset` of `buffer` as a tensor, without a copy. Each tensor's storage
    starts at its first byte (storage_offset 0), as torch.load gives: torch APIs that read a
    tensor's storage (``torch.set_rng_state``) then work, and torch.save of one loaded tensor
    does not write the whole buffer. The storage keeps `buffer` alive."""
    if nbytes == 0:
        return torch.empty(tuple(shape), dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype, count=nbytes // dtype.itemsize,
                            offset=offset).reshape(tuple(shape))
