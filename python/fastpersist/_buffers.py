# SPDX-License-Identifier: Apache-2.0
"""What the façade does to a buffer before C++ reads its memory: nothing, except for torch.

C++ reads the address, length, layout and device of every buffer from the object itself
(python/bindings/checked_buffer.cc) and refuses, with a ValueError, memory it cannot use. torch
tensors cross through DLPack, which torch refuses for tensors that require grad (so they are
detached: same memory) and for lazy conjugate / negative views, whose memory does not hold the
values they show. torch is never imported here: an object can only be a tensor if the user
already imported torch, so ``sys.modules`` is consulted instead.
"""

from __future__ import annotations

import sys
from typing import Any


def is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def lendable(obj: Any) -> Any:
    """`obj` itself (what async requests keep alive), or for a torch tensor that requires grad
    the detached tensor over the same memory."""
    if not is_torch_tensor(obj):
        return obj
    if obj.is_conj() or obj.is_neg():
        raise ValueError(
            "fastpersist: the tensor has a lazy conjugate/negative bit; call t.resolve_conj() / "
            "t.resolve_neg() first"
        )
    return obj.detach() if obj.requires_grad else obj


def settle_device_memory(obj: Any) -> None:
    """Before C++ moves a CUDA tensor's memory: waits for the work queued on the current stream
    of the tensor's device, which is where torch's ops that produced (or will overwrite) it ran.

    C++ copies on a stream of its own (or with cuFile's DMA), which does not wait for the
    caller's streams. Work on other streams touching the tensor is the caller's to finish
    (an event or ``torch.cuda.synchronize()``), as for any cross-stream use in torch.
    """
    if is_torch_tensor(obj) and obj.is_cuda:
        torch = sys.modules["torch"]
        torch.cuda.current_stream(obj.device).synchronize()
