# SPDX-License-Identifier: Apache-2.0
"""AioHandle and GdsHandle with GPU memory (docs/gpu.md).

Without CUDA (CI, most machines): every GPU entry point raises GpuUnavailableError naming what
is missing and changes nothing; the device "tensor" is tests/python/_fake_cuda.py's, which
reaches the real binding path and whose address would crash anything that dereferenced it.
With a GPU: round trips through both handles for every dtype, at sizes and offsets that are not
multiples of 4096, through pinned device tensors, and without a CUDA context on a device the
caller did not use. The cuFile tests also need cuFile (nvidia-cufile); each skip says what is
missing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy
import pytest

import fastpersist
from fastpersist import _core

from _fake_cuda import FakeCudaBuffer

torch = pytest.importorskip("torch")

GDS = fastpersist.gds_info()
HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA,
                                reason="needs a CUDA device (torch.cuda.is_available() is False)")
needs_gds = pytest.mark.skipif(not HAS_CUDA or bool(GDS.unavailable_reason()),
                               reason="needs a CUDA device and cuFile: "
                                      + (GDS.unavailable_reason() or "no CUDA device"))
without_cuda = pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is here; the GPU tests cover it")
without_gds = pytest.mark.skipif(HAS_CUDA and not GDS.unavailable_reason(),
                                 reason="a CUDA device and cuFile are here; the GPU tests cover it")


def _old_file(tmp_path):
    path = tmp_path / "old.bin"
    path.write_bytes(bytes(range(256)) * 40)
    return path


def _assert_unchanged(tmp_path, old):
    assert sorted(os.listdir(tmp_path)) == ["old.bin"]
    assert old.read_bytes() == bytes(range(256)) * 40


# ------------------------------------------------------------------------------ without a GPU
def test_gpu_unavailable_error_is_a_runtime_error():
    assert issubclass(fastpersist.GpuUnavailableError, RuntimeError)
    assert fastpersist.gds_handle is fastpersist.GdsHandle
    assert issubclass(fastpersist.GdsHandle, fastpersist.AioHandle)


def test_gds_info_names_each_library_or_why_not():
    info = fastpersist.gds_info()
    assert info.cuda_available == bool(info.cuda_library)
    assert info.cufile_available == bool(info.cufile_library)
    if not info.cufile_available:
        assert "libcufile" in info.cufile_reason or "disabled" in info.cufile_reason
    assert info.mode.startswith(("GPUDirect Storage", "compatibility mode"))
    assert info.compat_mode == info.mode.startswith("compatibility mode")
    reason = info.unavailable_reason()
    assert bool(reason) == (not (info.cuda_available and info.cufile_available))


@without_cuda
def test_aio_handle_refuses_device_memory_without_cuda_and_changes_nothing(tmp_path):
    old = _old_file(tmp_path)
    dev = FakeCudaBuffer(3 * 4096 + 7)
    with fastpersist.AioHandle() as h:
        calls = [
            lambda: h.sync_pwrite(dev, str(tmp_path / "new.bin")),
            lambda: h.async_pwrite(dev, str(tmp_path / "new.bin"), 4095),
            lambda: h.sync_pwrite(dev, str(old), truncate=True),
            lambda: h.pwrite(dev, str(old), False, True, 1, truncate=True),
            lambda: h.sync_pread(dev, str(old)),
            lambda: h.async_pread(dev, str(old), 3),
            lambda: h.pread(dev, str(old), False, False),
        ]
        with open(old, "r+b") as f:
            calls += [lambda: h.async_pwrite(dev, fd=f.fileno()),
                      lambda: h.sync_pread(dev, fd=f.fileno())]
            for call in calls:
                with pytest.raises(fastpersist.GpuUnavailableError, match="CUDA"):
                    call()
        # validate needs host memory, whatever the machine: a ValueError first.
        with pytest.raises(ValueError, match="validate"):
            h.pwrite(dev, str(tmp_path / "new.bin"), True, False)
        assert h.wait() == 0
    _assert_unchanged(tmp_path, old)


@without_gds
def test_gds_handle_refuses_every_gpu_call_without_gds_and_changes_nothing(tmp_path):
    old = _old_file(tmp_path)
    dev = FakeCudaBuffer(4096 + 1)
    missing = ("CUDA runtime" if not GDS.cuda_available else
               "cuFile" if not GDS.cufile_available else "CUDA device")
    with fastpersist.GdsHandle(intra_op_parallelism=2) as h:
        if GDS.unavailable_reason():
            assert h.mode.startswith("unavailable: GPUDirect Storage is not available"), h.mode
        calls = [
            lambda: h.sync_pwrite(dev, str(tmp_path / "new.bin")),
            lambda: h.async_pwrite(dev, str(old), truncate=True),
            lambda: h.sync_pread(dev, str(old), 5),
            lambda: h.async_pread(dev, str(old)),
            lambda: h.new_pinned_device_tensor(1024, torch.empty(0, dtype=torch.float16)),
            lambda: h.free_pinned_device_tensor(torch.empty(3)),
            lambda: h.pin_device_tensor(dev),
            lambda: h.unpin_device_tensor(dev),
            lambda: h.pin_device_tensor(torch.empty(3)),  # the missing GPU is named first
        ]
        for call in calls:
            with pytest.raises(fastpersist.GpuUnavailableError, match=missing):
                call()
        assert not h.is_device_pinned(dev)
        assert h.wait() == 0
    _assert_unchanged(tmp_path, old)


def test_gds_handle_moves_host_memory_like_aio_handle(tmp_path):
    data = numpy.random.default_rng(1).integers(0, 255, 3 * 4096 + 5, dtype=numpy.uint8)
    path = str(tmp_path / "h.bin")
    with fastpersist.gds_handle(block_size=1 << 20, queue_depth=8, intra_op_parallelism=2) as h:
        assert h.get_intra_op_parallelism() == 2 and h.backend
        assert h.async_pwrite(data, path, 4097) == 0
        assert h.wait() == 1
        back = numpy.zeros_like(data)
        assert h.pread(back, path, True, False, 4097) == 1
        locked = h.new_cpu_locked_tensor(100, torch.empty(0, dtype=torch.int32))
        assert h.is_pinned(locked)
    assert numpy.array_equal(back, data)
    assert repr(h) == "<fastpersist.GdsHandle closed>"


# ------------------------------------------------------------------------------ with a GPU
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]
if hasattr(torch, "float8_e4m3fn"):
    DTYPES.append(torch.float8_e4m3fn)


def _random(n, dtype, device):  # pragma: no cover - needs a GPU
    g = torch.Generator(device="cpu").manual_seed(n)
    raw = torch.randint(0, 256, (n * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    return raw.view(dtype).to(device)


def _handles():  # pragma: no cover - needs a GPU
    yield "aio", fastpersist.AioHandle(block_size=1 << 20, queue_depth=16, intra_op_parallelism=3)
    if not GDS.unavailable_reason():
        yield "gds", fastpersist.GdsHandle(block_size=1 << 20, queue_depth=16,
                                           intra_op_parallelism=3)


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_device_round_trip_every_dtype_odd_size_and_offset(tmp_path, dtype):  # pragma: no cover
    for name, h in _handles():
        with h:
            for n, offset in [(1, 0), (4095, 1), (1 << 20, 4096 * 3 + 17), (5_000_003, 12345),
                              (3 * (1 << 20) + 1, 0)]:
                src = _random(n, dtype, "cuda:0")
                path = str(tmp_path / f"{name}-{n}.bin")
                assert h.sync_pwrite(src, path, offset, truncate=True) == 1
                assert os.path.getsize(path) == offset + src.numel() * src.element_size()
                on_disk = numpy.fromfile(path, dtype=numpy.uint8)[offset:]
                assert on_disk.tobytes() == src.view(torch.uint8).cpu().numpy().tobytes(), name
                back = torch.empty_like(src)
                assert h.async_pread(back, path, offset) == 0
                assert h.wait() == 1
                assert torch.equal(back.view(torch.uint8), src.view(torch.uint8)), (name, n)


@needs_cuda
def test_device_write_waits_for_work_on_the_current_stream(tmp_path):  # pragma: no cover
    with fastpersist.AioHandle() as h:
        src = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
        torch.cuda._sleep(100_000_000)  # a long kernel ahead of the fill on the same stream
        src.fill_(7)
        h.sync_pwrite(src, str(tmp_path / "s.bin"), truncate=True)
    assert set(numpy.unique(numpy.fromfile(tmp_path / "s.bin", dtype=numpy.uint8))) == {7}


@needs_cuda
def test_device_read_past_the_end_changes_no_device_byte(tmp_path):  # pragma: no cover
    path = tmp_path / "short.bin"
    path.write_bytes(b"x" * 5000)
    for name, h in _handles():
        with h:
            dst = torch.full((8192,), 3, dtype=torch.uint8, device="cuda")
            with pytest.raises(ValueError, match="past the end"):
                h.sync_pread(dst, str(path))
            assert bool((dst == 3).all()), name


@needs_gds
def test_pinned_device_tensors(tmp_path):  # pragma: no cover
    with fastpersist.GdsHandle(intra_op_parallelism=2) as h:
        assert not h.mode.startswith("unavailable"), h.mode
        t = h.new_pinned_device_tensor(3 << 20, torch.empty(0, dtype=torch.float32, device="cuda"))
        assert t.is_cuda and t.dtype == torch.float32 and h.is_device_pinned(t)
        assert h.is_device_pinned(t[1000:2000])  # a view inside the registered range
        t.copy_(torch.randn(3 << 20, device="cuda"))
        path = str(tmp_path / "p.bin")
        assert h.sync_pwrite(t[7:], path, 4099, truncate=True) == 1
        back = h.new_pinned_device_tensor(t.numel() - 7, t)
        assert h.sync_pread(back, path, 4099) == 1
        assert torch.equal(back, t[7:])
        assert h.free_pinned_device_tensor(back) is True
        assert h.free_pinned_device_tensor(back) is False
        plain = torch.randn(12345, device="cuda")
        h.pin_device_tensor(plain)
        with pytest.raises(ValueError, match="overlaps"):
            h.pin_device_tensor(plain[10:])
        assert h.unpin_device_tensor(plain) is True
        assert h.unpin_device_tensor(plain) is False
        with pytest.raises(ValueError, match="host memory"):
            h.pin_device_tensor(torch.empty(10))


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
def test_no_context_on_a_device_the_caller_did_not_use(tmp_path):  # pragma: no cover
    # A fresh process that uses only cuda:1 through both handles must leave cuda:0 without a
    # context (a context costs hundreds of MiB on the device and shows in nvidia-smi).
    code = f"""
import ctypes, torch, fastpersist
t = torch.arange(1 << 20, device="cuda:1", dtype=torch.float32)
handles = [fastpersist.AioHandle()]
if not fastpersist.gds_info().unavailable_reason():
    handles.append(fastpersist.GdsHandle())
for i, h in enumerate(handles):
    h.sync_pwrite(t, r"{tmp_path}/c%d.bin" % i, truncate=True)
    back = torch.empty_like(t)
    h.sync_pread(back, r"{tmp_path}/c%d.bin" % i)
    assert torch.equal(back, t)
    h.close()
cuda = ctypes.CDLL("libcuda.so.1")
dev = ctypes.c_int()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
flags, active = ctypes.c_uint(), ctypes.c_int()
assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
print("device0-active", active.value)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "device0-active 0" in out.stdout, out.stdout


def test_private_core_names():
    # The façade's classes are built on these; a rename would break them silently.
    assert hasattr(_core, "GdsHandle") and hasattr(_core, "gds_info")


# ------------------------------------------------------------------------------ fake GPU
FAKE_GPU = os.path.join(os.path.dirname(__file__), "..", "..", "build", "tests", "cpp",
                        "libfastpersist_fake_gpu.so")


@pytest.mark.skipif(not os.path.exists(FAKE_GPU),
                    reason="needs the C++ build's fake CUDA + cuFile library (make build)")
def test_both_handles_move_device_memory_through_the_bindings_on_a_fake_gpu(tmp_path):
    # The façade and the bindings with "device memory" of tests/cpp/gpu_fake's library (host
    # memory it polices; loaded in a fresh process before fastpersist's first CUDA use):
    # sync and async calls, their counts, odd sizes and offsets, the four GDS calls.
    code = f"""
import ctypes, os
import numpy, fastpersist
from _fake_cuda import FakeCudaBuffer
lib = ctypes.CDLL({os.path.abspath(FAKE_GPU)!r})
lib.fake_cuda_malloc.restype = ctypes.c_void_p
lib.fake_cuda_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
def device(n, seed):
    p = lib.fake_cuda_malloc(n, 1)
    view = numpy.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(p))
    view[:] = numpy.random.default_rng(seed).integers(0, 256, n, dtype=numpy.uint8)
    return FakeCudaBuffer(n, device=1, address=p), view
for make in (fastpersist.AioHandle, fastpersist.GdsHandle):
    with make(intra_op_parallelism=2) as h:
        for n, off in [(1, 0), (4097, 4095), ((5 << 20) + 3, 12345)]:
            src, src_view = device(n, n)
            path = r"{tmp_path}" + "/%s-%d" % (make.__name__, n)
            assert h.sync_pwrite(src, path, off, truncate=True) == 1
            assert os.path.getsize(path) == off + n
            dst, dst_view = device(n, 0)
            assert h.async_pread(dst, path, off) == 0
            assert h.wait() == 1
            assert numpy.array_equal(src_view, dst_view), (make.__name__, n)
    if make is fastpersist.GdsHandle:
        with make() as g:
            buf, _ = device(1 << 20, 3)
            g.pin_device_tensor(buf)
            assert g.is_device_pinned(buf)
            assert g.unpin_device_tensor(buf) is True and g.unpin_device_tensor(buf) is False
            assert "compatibility mode" in g.mode, g.mode
print("fake-gpu-ok")
"""
    env = dict(os.environ, FASTPERSIST_CUDA_RUNTIME_LIBRARY=os.path.abspath(FAKE_GPU),
               FASTPERSIST_CUFILE_LIBRARY=os.path.abspath(FAKE_GPU))
    env.pop("FASTPERSIST_DISABLE_CUDA", None)
    env.pop("CUFILE_FORCE_COMPAT_MODE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env, cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fake-gpu-ok" in out.stdout
