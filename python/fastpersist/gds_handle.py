# SPDX-License-Identifier: Apache-2.0
"""`GdsHandle`: DeepNVMe's ``gds_handle`` API. CUDA tensors move between GPU memory and files
with NVIDIA cuFile (GPUDirect Storage); CPU tensors go through the same engine as AioHandle
(as DeepNVMe's gds_handle sends them to its CPU path).

Same constructor, methods and return values as :class:`fastpersist.AioHandle`, plus DeepNVMe's
four GDS calls: ``new_pinned_device_tensor``, ``free_pinned_device_tensor``,
``pin_device_tensor`` and ``unpin_device_tensor`` (cuFileBufRegister / Deregister: a registered
tensor is read and written by DMA straight to and from it; unregistered device memory works
too, through cuFile's own bounce buffers).

cuFile and the CUDA runtime are loaded at run time: ``pip install nvidia-cufile-cu12`` (or the
CUDA toolkit's GDS package) provides cuFile; nothing is needed to build. Without them the handle
still moves CPU tensors, and every call that needs the GPU raises
:class:`fastpersist.GpuUnavailableError` naming what is missing, before it opens, creates or
truncates anything. Where the nvidia-fs driver is absent cuFile runs in compatibility mode
(correct, through host memory, no faster than AioHandle); :func:`gds_info` and
``fastpersist report`` say which. Stream semantics are AioHandle's: the façade waits for the
current stream of the tensor's device before cuFile touches it (docs/gpu.md).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict

from . import _core
from ._buffers import lendable
from ._engine_options import check_uint
from .aio_handle import AioHandle, _torch


def _point_at_pip_cufile() -> None:
    """Lets C++ find PyPI's cuFile (site-packages/nvidia/cufile/lib), which is not on the
    loader path: sets FASTPERSIST_CUFILE_LIBRARY to that folder unless the variable is set.
    Only a path is looked up here; C++ loads it (src/io/cufile_library.h)."""
    if os.environ.get("FASTPERSIST_CUFILE_LIBRARY"):
        return
    for entry in sys.path:
        folder = os.path.join(entry or ".", "nvidia", "cufile", "lib")
        if os.path.isfile(os.path.join(folder, "libcufile.so.0")):
            os.environ["FASTPERSIST_CUFILE_LIBRARY"] = folder
            return


def gds_info() -> "_core.GdsInfo":
    """Whether CUDA and cuFile are loaded in this process, from where or why not, and the mode
    cuFile runs in (GPUDirect Storage, or compatibility mode and why). Opens no driver and
    creates no CUDA context."""
    _point_at_pip_cufile()
    return _core.gds_info()


class GdsHandle(AioHandle):
    """A GPUDirect Storage handle with DeepNVMe's knobs (see :class:`AioHandle` for them)."""

    @staticmethod
    def _create(options: "_core.EngineOptions") -> Any:
        _point_at_pip_cufile()
        return _core.GdsHandle.create(options)

    def _owned(self) -> Dict[int, Any]:
        """Tensors from new_pinned_device_tensor, by address: held until freed or closed."""
        owned: Dict[int, Any] = self.__dict__.setdefault("_device_tensors", {})
        return owned

    @property
    def mode(self) -> str:
        """What cuFile does here: "GPUDirect Storage: ...", "compatibility mode: ..." or
        "unavailable: ..." (what is missing)."""
        return str(self._h.mode())

    # ---------------------------------------------------------------- DeepNVMe's GDS calls
    def new_pinned_device_tensor(self, num_elem: int, example_tensor: Any = None,
                                 **kwargs: Any) -> Any:
        """A 1-D CUDA tensor of `num_elem` elements of example_tensor's dtype, registered with
        cuFile. On example_tensor's device if it is a CUDA tensor, else the current device."""
        self._h.check_gpu()  # GpuUnavailableError before torch is asked for device memory
        torch = _torch()
        if example_tensor is None:
            example_tensor = kwargs.pop("example_tenosr", None)  # DeepNVMe's spelling
        if kwargs:
            raise TypeError(f"fastpersist: unexpected keyword arguments {sorted(kwargs)}")
        if example_tensor is None:
            raise TypeError("fastpersist: new_pinned_device_tensor needs an example tensor "
                            "(or a dtype)")
        if isinstance(example_tensor, torch.dtype):
            dtype, device = example_tensor, None
        else:
            dtype = example_tensor.dtype
            device = example_tensor.device if example_tensor.is_cuda else None
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        num_elem = check_uint("num_elem", int(num_elem), (1 << 62) - 1)
        tensor = torch.empty(num_elem, dtype=dtype, device=device)
        if num_elem == 0:
            return tensor  # nothing to register (cuFile refuses empty ranges)
        self._h.pin_device_buffer(tensor)
        self._owned()[tensor.data_ptr()] = tensor
        return tensor

    def free_pinned_device_tensor(self, tensor: Any) -> bool:
        """Unregisters a tensor from new_pinned_device_tensor and forgets it; False if unknown."""
        self._h.check_gpu()
        owned = self._owned().pop(int(tensor.data_ptr()), None)
        if owned is None:
            return False
        return bool(self._h.unpin_device_buffer(owned))

    def pin_device_tensor(self, tensor: Any) -> None:
        """Registers a contiguous CUDA tensor's memory with cuFile until unpin_device_tensor."""
        self._h.check_gpu()
        self._h.pin_device_buffer(lendable(tensor))

    def unpin_device_tensor(self, tensor: Any) -> bool:
        """Unregisters a tensor registered by pin_device_tensor; False if it was not."""
        self._h.check_gpu()
        return bool(self._h.unpin_device_buffer(lendable(tensor)))

    def is_device_pinned(self, tensor: Any) -> bool:
        """True for device memory inside a range this handle registered with cuFile."""
        return bool(self._h.is_device_pinned(lendable(tensor)))

    def close(self) -> None:
        """Waits for outstanding requests, unregisters what it pinned, frees the handle."""
        try:
            super().close()
        finally:
            self._owned().clear()


# DeepNVMe's spelling.
gds_handle = GdsHandle
