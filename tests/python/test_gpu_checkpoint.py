# SPDX-License-Identifier: Apache-2.0
"""Checkpoints of GPU state (docs/gpu.md): a model on cuda:0 saved and loaded back onto the GPU
with ``map_location``, raw tensors through the read's pinned slots and async copies, compressed
ones and dtype conversions through host memory. Each test needs a CUDA device and says so when
skipped; the C++ side of the device loads also runs on the fake GPU
(tests/cpp/gpu_fake/fake_gpu_load_test.cc)."""

from __future__ import annotations

import pytest
import torch

import fastpersist

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (torch.cuda.is_available() is False)")


def _model() -> torch.nn.Module:  # pragma: no cover - needs a GPU
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1000, 4097), torch.nn.GELU(),
                               torch.nn.Linear(4097, 333)).to("cuda:0")


@needs_cuda
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_model_on_cuda_round_trips_onto_the_gpu(tmp_path, compression):  # pragma: no cover
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 1000, device="cuda")).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 3}
    with fastpersist.CheckpointManager(tmp_path / "r", compression=compression) as mgr:
        mgr.save(3, state)
        back = mgr.load(map_location="cuda:0")
    for k, v in state["model"].items():
        assert back["model"][k].device == torch.device("cuda:0"), k
        assert torch.equal(back["model"][k], v), k
    for k, v in state["optim"]["state"][0].items():
        assert torch.equal(back["optim"]["state"][0][k].cpu(), v.cpu()), k
    assert back["step"] == 3


@needs_cuda
def test_selected_and_converted_tensors_onto_the_gpu(tmp_path):  # pragma: no cover
    model = _model()
    sd = model.state_dict()
    with fastpersist.CheckpointManager(tmp_path / "r") as mgr:
        mgr.save(1, {"model": sd})
        some = mgr.load(map_location="cuda", keys=["model.0.weight"])
        assert list(some["model"]) == ["0.weight"]
        assert torch.equal(some["model"]["0.weight"], sd["0.weight"])
        half = mgr.load(map_location="cuda", dtype=torch.float16)  # the host path
        assert half["model"]["2.bias"].dtype == torch.float16
        assert half["model"]["2.bias"].is_cuda
        assert torch.equal(half["model"]["2.bias"], sd["2.bias"].half())


@needs_cuda
def test_load_into_gpu_tensors_that_queued_kernels_still_use(tmp_path):  # pragma: no cover
    # The fresh device tensors may reuse memory of tensors freed with kernels still queued:
    # the load waits for the current stream before writing from its own.
    sd = {"w": torch.randn(1 << 22, device="cuda")}
    with fastpersist.CheckpointManager(tmp_path / "r") as mgr:
        mgr.save(1, sd)
        for _ in range(3):
            scratch = torch.empty(1 << 22, device="cuda")
            torch.cuda._sleep(50_000_000)
            scratch.fill_(5)
            del scratch  # its memory goes back to the cache with the fill still queued
            back = mgr.load(map_location="cuda")
            assert torch.equal(back["w"], sd["w"])
