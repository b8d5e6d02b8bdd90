# SPDX-License-Identifier: Apache-2.0
"""An object that presents itself through DLPack as CUDA device memory, for machines without a
GPU: it lets the CPU tests reach the real binding path of a CUDA tensor (address, length and
device read by C++ from the object) and check that, without CUDA, every GPU entry point
refuses it before touching anything. Its address is never valid memory: a code path that
dereferenced it, or handed it to the kernel, would crash or fail the test."""

from __future__ import annotations

import ctypes
from typing import Any, List

_KDL_CUDA = 2
_KDL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeCudaBuffer:
    """`nbytes` bytes of uint8 "in the memory of CUDA device `device`" at a bogus address."""

    def __init__(self, nbytes: int, device: int = 0, address: int = 0x7F0000400000) -> None:
        self.nbytes = nbytes
        self.device = device
        self.address = address
        self._keep: List[Any] = []  # every struct handed out stays valid while we live

    def __dlpack_device__(self) -> tuple:
        return (_KDL_CUDA, self.device)

    def __dlpack__(self, **kwargs: Any) -> Any:
        shape = (ctypes.c_int64 * 1)(self.nbytes)
        mt = _DLManagedTensor()
        mt.dl_tensor.data = self.address
        mt.dl_tensor.device = _DLDevice(_KDL_CUDA, self.device)
        mt.dl_tensor.ndim = 1
        mt.dl_tensor.dtype = _DLDataType(_KDL_UINT, 8, 1)
        mt.dl_tensor.shape = shape
        mt.dl_tensor.strides = None
        mt.dl_tensor.byte_offset = 0
        mt.deleter = None
        self._keep += [shape, mt]
        return _capsule_new(ctypes.addressof(mt), b"dltensor", None)
