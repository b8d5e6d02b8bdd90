# SPDX-License-Identifier: Apache-2.0
"""CheckpointManager snapshots of GPU tensors: copied by the C++ snapshot thread, device to
pinned host staging, on a stream of its own (docs/checkpoint.md, "GPU tensors").

Most of these need a CUDA device; without one, only the readiness probe is checked (it must say
why GPU memory cannot be copied here, in words a user can act on).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import fastpersist
from fastpersist import _core
from fastpersist import checkpoint as checkpoint_module

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (torch.cuda.is_available() is False)")


def test_device_copy_probe_explains_why_not_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    why = _core.cuda_device_copy_status(0)
    assert why, "no GPU here, so device copies cannot be ready"
    assert "CUDA" in why
    runtime = _core.cuda_runtime_info()
    if runtime.available:  # libcudart without a usable device or driver: CUDA's own words
        assert "cudaError" in why and "device 0" in why, why
    else:
        assert "runtime is not available" in why, why


def test_negative_device_is_refused():
    assert "invalid CUDA device" in _core.cuda_device_copy_status(-1)


@needs_cuda
def test_gpu_state_round_trips_without_the_host_fallback(tmp_path):  # pragma: no cover
    torch.manual_seed(0)
    state = {
        "w": torch.randn(1024, 1024, device="cuda"),
        "t": torch.randn(64, 32, device="cuda").t(),           # not contiguous
        "h": torch.randn(4097, device="cuda", dtype=torch.bfloat16),
        "e": torch.empty(0, 3, device="cuda"),
        "cpu": torch.arange(10),
        "step": 7,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fallback would warn
        with fastpersist.CheckpointManager(tmp_path / "r",
                                           staging_budget="64MiB") as mgr:  # streams in windows
            mgr.save(7, state)
            loaded = mgr.load()
    assert checkpoint_module._device_copy_ready.get(torch.cuda.current_device()) is True
    for key in ("w", "t", "h", "e"):
        assert loaded[key].device.type == "cpu"
        assert torch.equal(loaded[key], state[key].cpu()), key
    assert torch.equal(loaded["cpu"], state["cpu"]) and loaded["step"] == 7


@needs_cuda
def test_snapshot_holds_the_values_of_save_time(tmp_path):  # pragma: no cover
    # A big model-like state; the optimizer step right after save_async is hooked and must not
    # change what the snapshot copies.
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(2048, 2048, device="cuda")) for _ in range(8)]
    opt = torch.optim.SGD(params, lr=1.0)
    for p in params:
        p.grad = torch.ones_like(p)
    before = [p.detach().cpu().clone() for p in params]
    with fastpersist.CheckpointManager(tmp_path / "r") as mgr:
        mgr.hook_optimizer(opt)
        handle = mgr.save_async(1, {f"p{i}": p for i, p in enumerate(params)})
        opt.step()  # waits for the snapshot, then changes every parameter
        handle.wait()
        loaded = mgr.load()
    for i, p in enumerate(params):
        assert torch.equal(loaded[f"p{i}"], before[i])
        assert not torch.equal(p.detach().cpu(), before[i])


@needs_cuda
def test_work_queued_before_save_async_is_in_the_snapshot(tmp_path):  # pragma: no cover
    # Kernels still queued on the current stream when save_async is called must land in the
    # checkpoint (save_async synchronizes the stream before the snapshot copies on its own).
    x = torch.zeros(1 << 24, device="cuda")
    for _ in range(20):
        x.add_(1)  # queued, likely not finished when save_async starts
    with fastpersist.CheckpointManager(tmp_path / "r") as mgr:
        mgr.save_async(0, {"x": x}).wait()
        loaded = mgr.load()
    assert torch.equal(loaded["x"], torch.full((1 << 24,), 20.0))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
def test_the_callers_current_device_is_left_alone(tmp_path):  # pragma: no cover
    # The first save of a device's tensors probes that device on the caller's thread; the
    # caller's current device (which torch ops without a device use) must not change.
    torch.cuda.set_device(0)
    x = torch.arange(1 << 20, device="cuda:1", dtype=torch.float32)
    with fastpersist.CheckpointManager(tmp_path / "r") as mgr:
        mgr.save(1, {"x": x})
        assert torch.cuda.current_device() == 0
        assert torch.equal(mgr.load()["x"], x.cpu())
