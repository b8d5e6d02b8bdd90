# SPDX-License-Identifier: Apache-2.0
"""The memory a save reads a tensor from: shared by CheckpointManager and the DCP writer."""

from __future__ import annotations

import warnings
from typing import Dict, Tuple

import torch

from . import _core

# The device of a host tensor (the C++ TensorSource's "no device").
NO_DEVICE = -1
_device_copy_ready: Dict[int, bool] = {}


def _snapshot_from_device(index: int) -> bool:
    """Whether the C++ snapshot can copy from CUDA device ``index`` (asked once per device)."""
    if index not in _device_copy_ready:
        why = _core.cuda_device_copy_status(index)
        _device_copy_ready[index] = not why
        if why:
            warnings.warn(f"fastpersist: GPU tensors of cuda:{index} are copied to the host on the "
                          f"caller's thread, because the snapshot cannot copy them itself: {why}",
                          RuntimeWarning, stacklevel=4)
    return _device_copy_ready[index]


def source_tensor(t: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """The C-contiguous tensor whose memory the (background) snapshot copies, and its device.

    CUDA tensors stay on the GPU: the snapshot copies them into pinned staging (device -> host
    DMA in the background, on its own stream). Other devices, or a CUDA runtime fastpersist
    cannot load, fall back to one copy to host memory on the caller's thread.
    """
    t = t.detach()
    device = NO_DEVICE
    if t.device.type == "cuda":
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        if _snapshot_from_device(index):
            device = index
        else:
            t = t.to("cpu")
    elif t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        t = t.contiguous()
    return t, device
