# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the CheckpointManager tests: a tiny real GPT-2 with its AdamW optimizer,
LR scheduler and RNG states, tensors of every storable dtype, and exact comparisons."""

from __future__ import annotations

import json
import os
import random
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import torch

from fastpersist.checkpoint_state import DTYPE_TO_SAFETENSORS

VOCAB = 128


def gpt2_config() -> Any:
    transformers = pytest.importorskip("transformers")
    # No dropout, so that two identical models take bitwise identical training steps.
    return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64,
                                   bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                   attn_pdrop=0.0)


def tiny_gpt2(seed: int = 0) -> Any:
    """GPT2LMHeadModel built from a config (no download), weights from `seed`."""
    transformers = pytest.importorskip("transformers")
    config = gpt2_config()
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config)
    model.eval()
    return model


def batch(seed: int = 0, size: Tuple[int, int] = (2, 16)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, size, generator=g)


def train_step(model: Any, optimizer: torch.optim.Optimizer, ids: torch.Tensor,
               scheduler: Any = None) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()


def make_optimizer(model: Any) -> Tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=10)
    return optimizer, scheduler


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def trained_gpt2(seed: int = 0) -> Tuple[Any, torch.optim.Optimizer, Any]:
    """A tiny GPT-2 after one AdamW step: its optimizer has exp_avg/exp_avg_sq/step state."""
    model = tiny_gpt2(seed)
    optimizer, scheduler = make_optimizer(model)
    train_step(model, optimizer, batch(seed), scheduler)
    return model, optimizer, scheduler


def numpy_safe_globals() -> List[Any]:
    """The globals numpy values pickle as (arrays, scalars, dtypes, ``np.random.get_state()``).
    ``weights_only=True`` loads them only once registered, for fastpersist as for torch.load:
    ``with torch.serialization.safe_globals(numpy_safe_globals()): ...``."""
    multiarray = (getattr(np, "_core", None) or np.core).multiarray
    out: List[Any] = [np.ndarray, np.dtype]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out += [(multiarray._reconstruct, f"{module}._reconstruct"),
                (multiarray.scalar, f"{module}.scalar")]
    out += [v for v in vars(np.dtypes).values() if isinstance(v, type) and issubclass(v, np.dtype)]
    return out


@pytest.fixture
def numpy_rng_state_allowed() -> Any:
    """training_state() holds numpy's RNG state: let weights_only=True loads take it."""
    with torch.serialization.safe_globals(numpy_safe_globals()):
        yield


def training_state(model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                   step: int = 1) -> Dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": np.random.get_state()},
        "step": step,
        "run": "tiny-gpt2",
        "history": [1.5, 2.5, None, ("a", 3)],
    }


def random_bytes_tensor(shape: Tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random bit patterns (NaNs included for floats): compare such tensors byte for byte."""
    g = torch.Generator().manual_seed(seed)
    numel = 1
    for d in shape:
        numel *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def every_dtype_state(seed: int = 0) -> Dict[str, torch.Tensor]:
    """One tensor of every storable dtype, in several shapes, plus scalars, empties and views."""
    out: Dict[str, torch.Tensor] = {}
    for i, dtype in enumerate(DTYPE_TO_SAFETENSORS):
        name = str(dtype).replace("torch.", "")
        out[f"{name}.odd"] = random_bytes_tensor((3, 5), dtype, seed + i)
        out[f"{name}.scalar"] = random_bytes_tensor((), dtype, seed + 100 + i)
        out[f"{name}.empty"] = torch.empty((0, 4), dtype=dtype)
        base = random_bytes_tensor((6, 7), dtype, seed + 200 + i)
        out[f"{name}.transposed"] = base.t()
        out[f"{name}.strided"] = base[1:, ::3]
        out[f"{name}.offset_view"] = base[2:4]
    out["expanded"] = torch.arange(5, dtype=torch.int32).expand(3, 5)
    return out


def as_bytes(t: torch.Tensor) -> bytes:
    c = t.detach().cpu().contiguous()
    if c.numel() == 0:
        return b""
    return c.reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_tensor_equal(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    assert isinstance(actual, torch.Tensor), f"{what}: {type(actual)} is not a tensor"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.device.type == "cpu", what
    assert as_bytes(actual) == as_bytes(expected), f"{what}: values differ"


def assert_state_equal(actual: Any, expected: Any, path: str = "state") -> None:
    """Same structure (container types, keys and order), exact tensor bytes, equal objects."""
    if isinstance(expected, torch.Tensor):
        assert_tensor_equal(actual, expected, path)
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_state_equal(actual[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_state_equal(a, e, f"{path}[{i}]")
    elif isinstance(expected, np.ndarray):
        assert np.array_equal(actual, expected), path
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def clone_state(state: Any) -> Any:
    """A deep copy whose tensors own their memory (what the state held at this instant)."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return type(state)((k, clone_state(v)) for k, v in state.items())
    if isinstance(state, list):
        return [clone_state(v) for v in state]
    if isinstance(state, tuple):
        return tuple(clone_state(v) for v in state)
    return state


def manifest(ckpt_dir: str) -> Dict[str, Any]:
    with open(os.path.join(ckpt_dir, "manifest.json")) as f:
        return json.load(f)


def data_files(ckpt_dir: str) -> List[str]:
    return sorted(n for n in os.listdir(ckpt_dir) if n.startswith("tensors-"))
