# SPDX-License-Identifier: Apache-2.0
"""fastpersist.checkpoint_state: a training state split into named tensors plus a pickled
sidecar (flatten_state) and put back together (unflatten_state), with real torch objects: nested
containers, every dtype, tied weights, a GPT-2 model with its AdamW and LR scheduler state and
the RNG states, partial loads, the weights_only allowlist and the naming errors."""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import pickle
import random
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np
import pytest
import torch

from _checkpoint_models import numpy_safe_globals

try:
    from fastpersist import checkpoint_state as cs
except ImportError:  # the installed package predates the module: load it from the source tree
    _SRC = Path(__file__).resolve().parents[2] / "python" / "fastpersist" / "checkpoint_state.py"
    _spec = importlib.util.spec_from_file_location("_fastpersist_checkpoint_state_src", _SRC)
    assert _spec is not None and _spec.loader is not None
    cs = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = cs
    _spec.loader.exec_module(cs)


# --------------------------------------------------------------------------------------------
# Helpers


def fake_storage(flat: Any) -> Dict[str, torch.Tensor]:
    """What a checkpoint file would hold: a copy of each stored tensor (not the same object)."""
    names = [n for n, _ in flat.tensors]
    assert len(names) == len(set(names))
    return {name: t.detach().clone() for name, t in flat.tensors}


def lookup_for(flat: Any, storage: Dict[str, torch.Tensor],
               select: Callable[[str], bool] = lambda name: True) -> Callable[[str], Optional[torch.Tensor]]:
    """A loader's lookup: aliases resolve to the stored tensor's (single) loaded object."""
    def lookup(name: str) -> Optional[torch.Tensor]:
        if not select(name):
            return None
        return storage[flat.aliases.get(name, name)]
    return lookup


def round_trip(state: Any, *, weights_only: bool = True) -> Any:
    flat = cs.flatten_state(state)
    return cs.unflatten_state(flat.objects, lookup_for(flat, fake_storage(flat)), weights_only=weights_only)


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (works for every dtype, NaNs and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """Recursive equality with exact container types; tensors compared bitwise."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert same_tensor(a, b), f"{path}: tensors differ"
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{path}: arrays differ"
    elif isinstance(a, float) and a != a:
        assert b != b, f"{path}: NaN != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@dataclasses.dataclass
class CustomConfig:
    """Not on any allowlist: needs weights_only=False or add_safe_globals."""
    name: str
    hidden: int


class HoldsTensor:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def torch_load_accepts(value: Any) -> bool:
    """Whether torch.load(weights_only=True) loads what torch.save wrote of {"v": value}."""
    import io
    import warnings

    buf = io.BytesIO()
    torch.save({"v": value}, buf)
    buf.seek(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(buf, weights_only=True)
        return True
    except pickle.UnpicklingError:
        return False


# --------------------------------------------------------------------------------------------
# dtype tables

EXPECTED_CODES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16",
    "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
SUPPORTED = [getattr(torch, n) for n in EXPECTED_CODES if hasattr(torch, n)]


def test_dtype_tables_are_the_safetensors_names_and_inverse():
    assert {str(d).removeprefix("torch."): c for d, c in cs.DTYPE_TO_SAFETENSORS.items()} == {
        n: c for n, c in EXPECTED_CODES.items() if hasattr(torch, n)}
    assert cs.SAFETENSORS_TO_DTYPE == {c: d for d, c in cs.DTYPE_TO_SAFETENSORS.items()}
    st = pytest.importorskip("safetensors.torch")
    types = getattr(st, "_TYPES", None)
    if types is not None:  # the codes are the ones safetensors itself writes
        for dtype, code in cs.DTYPE_TO_SAFETENSORS.items():
            assert types[code] == dtype


def _sample(dtype: torch.dtype, shape: Any, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", SUPPORTED, ids=str)
def test_every_supported_dtype_round_trips_including_scalars_and_empty(dtype):
    state = {"full": _sample(dtype, (3, 5)), "scalar": _sample(dtype, ()), "empty": _sample(dtype, (0, 4)),
             "strided": _sample(dtype, (4, 6), seed=1)[:, ::2]}
    flat = cs.flatten_state(state)
    assert [n for n, _ in flat.tensors] == ["full", "scalar", "empty", "strided"]
    assert flat.aliases == {}
    # the caller's tensors themselves: no copy, no .contiguous()
    assert all(t is state[n] for n, t in flat.tensors)
    assert not dict(flat.tensors)["strided"].is_contiguous()
    assert_same(cs.unflatten_state(flat.objects, lookup_for(flat, fake_storage(flat))), state)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_complex_dtype_is_a_value_error_naming_the_tensor(dtype):
    with pytest.raises(ValueError, match=r"'opt\.state\.0\.z'.*complex"):
        cs.flatten_state({"opt": {"state": {0: {"z": torch.zeros(2, dtype=dtype)}}}})


def test_sparse_tensor_is_a_value_error():
    with pytest.raises(ValueError, match=r"'s'.*layout"):
        cs.flatten_state({"s": torch.eye(3).to_sparse()})


# --------------------------------------------------------------------------------------------
# Containers and names


def test_nested_containers_round_trip_with_types_keys_and_order():
    t = lambda *s: torch.arange(int(np.prod(s)) if s else 1, dtype=torch.float32).reshape(s)  # noqa: E731
    state = {
        "z_first": 1,
        "model": collections.OrderedDict([("b.weight", t(2, 2)), ("a.bias", t(2))]),
        "groups": [{"params": [0, 1], "lr": 0.1, "betas": (0.9, 0.999), "nesterov": False, "fused": None},
                   {"params": [2], "lr": 1e-3}],
        "pair": (t(3), "label", [t(1), 2.5]),
        7: {"int-keyed": t(4)},
        "empty": {}, "empty_list": [], "empty_tuple": (),
        "misc": {"s": {1, 2}, "fs": frozenset({"a"}), "c": 1 + 2j, "b": b"\x00\x01", "ba": bytearray(b"x"),
                 "cnt": collections.Counter("aab"), "nan": float("nan"), "big": 2 ** 80},
    }
    flat = cs.flatten_state(state)
    assert flat.names() == ["model.b.weight", "model.a.bias", "pair.0", "pair.2.0", "7.int-keyed"]
    assert cs.tensor_names(state) == flat.names()
    loaded = round_trip(state)
    assert_same(loaded, state)
    assert list(loaded)[0] == "z_first" and 7 in loaded  # order and int keys kept


def test_bare_tensor_and_top_level_sequences():
    t = torch.ones(3)
    flat = cs.flatten_state(t)
    assert [n for n, _ in flat.tensors] == [cs.BARE_TENSOR_NAME] == ["_"]
    assert_same(round_trip(t), t)
    flat = cs.flatten_state([t, (torch.zeros(2), 5)])
    assert [n for n, _ in flat.tensors] == ["0", "1.0"]
    assert_same(round_trip([t, (torch.zeros(2), 5)]), [t, (torch.zeros(2), 5)])
    assert round_trip({"x": 1, "y": [None, "s"]}) == {"x": 1, "y": [None, "s"]}


def test_duplicate_names_are_a_value_error_naming_both_paths():
    with pytest.raises(ValueError) as info:
        cs.flatten_state({"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}})
    msg = str(info.value)
    assert "'a.b'" in msg and "state['a.b']" in msg and "state['a']['b']" in msg
    with pytest.raises(ValueError, match=r"state\[0\].*state\['0'\]"):
        cs.flatten_state({0: torch.ones(1), "0": torch.ones(1)})


def test_tensor_under_tuple_key_is_a_value_error_but_tensor_free_subtree_is_kept():
    with pytest.raises(ValueError, match=r"state\['x'\]\[\(1, 2\)\].*tuple.*str or int"):
        cs.flatten_state({"x": {(1, 2): {"deep": [torch.ones(1)]}}})
    state = {"x": {(1, 2): {"deep": [1, 2]}, 1.5: "float key", True: None}, "w": torch.ones(2)}
    flat = cs.flatten_state(state)
    assert [n for n, _ in flat.tensors] == ["w"]
    assert_same(round_trip(state), state)


def test_empty_name_and_reference_cycle_are_value_errors():
    with pytest.raises(ValueError, match="empty name"):
        cs.flatten_state({"": torch.ones(1)})
    loop: list = [torch.ones(1)]
    loop.append(loop)
    with pytest.raises(ValueError, match="cycle"):
        cs.flatten_state({"loop": loop})


def test_tensors_inside_other_objects_are_pickled_in_the_sidecar():
    inner = torch.arange(4.0)
    state = {"holder": HoldsTensor(inner), "set": {1, 2}, "w": torch.ones(2)}
    flat = cs.flatten_state(state)
    assert flat.names() == ["w"]
    loaded = round_trip(state, weights_only=False)
    assert same_tensor(loaded["holder"].t, inner) and loaded["holder"].t is not inner
    with pytest.raises(cs.UnsafeCheckpointObjectError):
        round_trip(state)


# --------------------------------------------------------------------------------------------
# Aliases (tied weights)


def test_same_view_is_an_alias_and_load_restores_identity():
    w = torch.randn(4, 3)
    state = {"emb": {"weight": w}, "head": {"weight": w.detach()}, "same": w,
             "row": w[1], "transposed": w.t(), "copy": w.clone(), "reshaped": w.view(3, 4)}
    flat = cs.flatten_state(state)
    assert flat.aliases == {"head.weight": "emb.weight", "same": "emb.weight"}
    assert [n for n, _ in flat.tensors] == ["emb.weight", "row", "transposed", "copy", "reshaped"]
    loaded = round_trip(state)
    assert_same(loaded, state)
    assert loaded["head"]["weight"] is loaded["emb"]["weight"] is loaded["same"]
    assert loaded["row"] is not loaded["emb"]["weight"]


def test_shared_container_is_named_once_per_path():
    d = {"w": torch.ones(2)}
    flat = cs.flatten_state({"a": d, "b": d})
    assert [n for n, _ in flat.tensors] == ["a.w"] and flat.aliases == {"b.w": "a.w"}
    loaded = round_trip({"a": d, "b": d})
    assert loaded["a"]["w"] is loaded["b"]["w"]


def test_empty_tensors_are_not_aliases():
    state = {"a": torch.empty(0), "b": torch.empty(0)}
    assert cs.flatten_state(state).aliases == {}


# --------------------------------------------------------------------------------------------
# A real training state


def _gpt2_training_state(seed: int = 0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=10)
    return model, opt, sched


def _train_step(model, opt, sched, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (2, 8), generator=g)
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def test_gpt2_adamw_scheduler_and_rng_state_round_trip_with_weights_only():
    model, opt, sched = _gpt2_training_state()
    _train_step(model, opt, sched, seed=1)
    random.seed(3)
    np.random.seed(4)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                "numpy_generator": np.random.default_rng(5).bit_generator.state,
                "torch": torch.get_rng_state()},
        "step": 1, "tokens_seen": np.int64(16), "loss_scale": np.float32(2.0),
        "meta": {"dtype": torch.bfloat16, "device": torch.device("cpu"), "shape": torch.Size([2, 8])},
    }
    flat = cs.flatten_state(state)
    names = flat.names()
    sd_keys = list(model.state_dict())
    assert [n for n in names if n.startswith("model.")] == [f"model.{k}" for k in sd_keys]
    assert flat.aliases == {"model.lm_head.weight": "model.transformer.wte.weight"}
    assert "model.transformer.h.0.attn.c_attn.weight" in names
    assert {f"optimizer.state.0.{k}" for k in ("exp_avg", "exp_avg_sq", "step")} <= set(names)
    assert "rng.torch" in names
    sidecar_only = ("optimizer.param_groups", "scheduler", "rng.python", "rng.numpy")
    assert not any(n.startswith(sidecar_only) for n in names)
    assert len(flat.objects) < 32_000  # no tensor data: mostly the python and numpy RNG states

    storage = fake_storage(flat)
    # numpy's RNG state and scalars need registering, as torch.load(weights_only=True) needs.
    with pytest.raises(cs.UnsafeCheckpointObjectError, match="numpy"):
        cs.unflatten_state(flat.objects, lookup_for(flat, storage), weights_only=True)
    with torch.serialization.safe_globals(numpy_safe_globals()):
        loaded = cs.unflatten_state(flat.objects, lookup_for(flat, storage), weights_only=True)
    assert_same(loaded, state)
    assert loaded["model"]["lm_head.weight"] is loaded["model"]["transformer.wte.weight"]

    # a fresh model/optimizer/scheduler restored from it continues exactly like the original
    model2, opt2, sched2 = _gpt2_training_state(seed=99)
    model2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["optimizer"])
    sched2.load_state_dict(loaded["scheduler"])
    random.setstate(loaded["rng"]["python"])
    np.random.set_state(loaded["rng"]["numpy"])
    torch.set_rng_state(loaded["rng"]["torch"])
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    assert a == (random.random(), np.random.rand(), torch.rand(1).item())
    torch.set_rng_state(state["rng"]["torch"])  # dropout draws from the global generator
    _train_step(model, opt, sched, seed=2)
    torch.set_rng_state(loaded["rng"]["torch"])
    _train_step(model2, opt2, sched2, seed=2)
    for (k, p), (k2, p2) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert k == k2 and torch.equal(p, p2), k
    assert sched.get_last_lr() == sched2.get_last_lr()


def test_flatten_into_names_match_the_saved_names_and_fill_in_place():
    model, opt, sched = _gpt2_training_state()
    _train_step(model, opt, sched, seed=1)
    flat = cs.flatten_state({"model": model.state_dict(), "optimizer": opt.state_dict()})
    storage = fake_storage(flat)
    lookup = lookup_for(flat, storage)

    model2, opt2, _ = _gpt2_training_state(seed=7)
    # a module is named by its state_dict keys, sharing memory with its parameters
    by_module = cs.flatten_into(model2)
    assert list(by_module) == list(model2.state_dict())
    assert by_module["transformer.wte.weight"].data_ptr() == model2.transformer.wte.weight.data_ptr()
    into = cs.flatten_into({"model": model2.state_dict()})
    assert list(into) == [n for n in flat.names() if n.startswith("model.")]
    with torch.no_grad():
        for name, dst in into.items():
            dst.copy_(lookup(name))
    for k, v in model.state_dict().items():
        assert torch.equal(model2.state_dict()[k], v), k
    assert cs.flatten_into(torch.ones(2)).keys() == {"_"}
    with pytest.raises(ValueError, match="both be named"):
        cs.flatten_into({"a.b": torch.ones(1), "a": {"b": torch.ones(1)}})


SCHEDULERS = {
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10),
    "lambda": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.9 ** e),
    "plateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o),
    "sequential": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.LinearLR(o, 0.1), torch.optim.lr_scheduler.ExponentialLR(o, 0.9)],
        milestones=[3]),
}
OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=0.1, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.1),
}


@pytest.mark.parametrize("sched_name", list(SCHEDULERS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_typical_optimizer_and_scheduler_states_load_with_weights_only(opt_name, sched_name):
    lin = torch.nn.Linear(3, 2)
    opt = OPTIMIZERS[opt_name](lin.parameters())
    sched = SCHEDULERS[sched_name](opt)
    for _ in range(2):
        lin(torch.ones(1, 3)).sum().backward()
        opt.step()
        sched.step(1.0) if sched_name == "plateau" else sched.step()
    state = {"model": lin.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
    assert_same(round_trip(state, weights_only=True), state)


# --------------------------------------------------------------------------------------------
# Partial loads


def test_unselected_tensors_are_dropped_from_dicts_and_none_in_sequences():
    state = {
        "model": {"w": torch.ones(2), "b": torch.zeros(1)},
        "optimizer": {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.ones(2)}},
                      "param_groups": [{"params": [0], "lr": 0.1}]},
        "list": [torch.ones(1), "keep", (torch.ones(1), 3)],
        "rng": torch.get_rng_state(),
        "step": 5,
    }
    flat = cs.flatten_state(state)
    storage = fake_storage(flat)
    loaded = cs.unflatten_state(flat.objects, lookup_for(flat, storage, lambda n: n.startswith("model.")))
    assert_same(loaded, {
        "model": state["model"],
        "optimizer": {"state": {0: {}}, "param_groups": [{"params": [0], "lr": 0.1}]},
        "list": [None, "keep", (None, 3)],
        "step": 5,
    })
    loaded = cs.unflatten_state(flat.objects, lambda n: None)
    assert loaded["model"] == {} and "rng" not in loaded
    assert cs.unflatten_state(cs.flatten_state(torch.ones(1)).objects, lambda n: None) is None

    asked = []
    cs.unflatten_state(flat.objects, lambda n: asked.append(n))
    assert asked == flat.names()  # each name asked once, in traversal order (no aliases here)


def test_ordered_dict_entries_are_dropped_in_order():
    state = collections.OrderedDict([("a", torch.ones(1)), ("b", 1), ("c", torch.ones(1)), ("d", 2)])
    flat = cs.flatten_state(state)
    loaded = cs.unflatten_state(flat.objects, lookup_for(flat, fake_storage(flat), lambda n: n == "c"))
    assert type(loaded) is collections.OrderedDict
    assert list(loaded) == ["b", "c", "d"] and loaded["d"] == 2


# --------------------------------------------------------------------------------------------
# weights_only


def test_weights_only_rejects_a_custom_class_with_the_documented_message():
    state = {"config": CustomConfig("gpt", 64), "w": torch.ones(2)}
    flat = cs.flatten_state(state)
    lookup = lookup_for(flat, fake_storage(flat))
    qualified = f"{CustomConfig.__module__}.{CustomConfig.__qualname__}"
    with pytest.raises(pickle.UnpicklingError) as info:
        cs.unflatten_state(flat.objects, lookup)
    assert isinstance(info.value, cs.UnsafeCheckpointObjectError)
    assert str(info.value) == (
        f"checkpoint object sidecar needs {qualified}, which is not allowed with weights_only=True; "
        "pass weights_only=False if you trust this checkpoint, or register it with "
        "torch.serialization.add_safe_globals")
    loaded = cs.unflatten_state(flat.objects, lookup, weights_only=False)
    assert loaded["config"] == CustomConfig("gpt", 64) and torch.equal(loaded["w"], torch.ones(2))
    with torch.serialization.safe_globals([CustomConfig]):
        loaded = cs.unflatten_state(flat.objects, lookup, weights_only=True)
    assert loaded["config"] == CustomConfig("gpt", 64)


def test_weights_only_rejects_code_execution_globals():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    data = pickle.dumps({"x": Evil()}, protocol=4)
    with pytest.raises(cs.UnsafeCheckpointObjectError, match=r"builtins\.print"):
        cs.unflatten_state(data, lambda n: None)
    for name in (b"getattr", b"eval", b"__import__"):
        data = b"\x80\x04c" + b"builtins\n" + name + b"\n)R."
        with pytest.raises(cs.UnsafeCheckpointObjectError):
            cs.unflatten_state(data, lambda n: None)
    with pytest.raises(cs.UnsafeCheckpointObjectError, match=r"collections\.defaultdict"):
        round_trip({"d": collections.defaultdict(list)})


def test_weights_only_allows_exactly_what_torch_load_allows():
    # Each value alone: loads with weights_only=True exactly when torch.load's does.
    values = {"dtype": torch.bfloat16, "size": torch.Size([1, 2]), "device": torch.device("cpu"),
              "layout": torch.strided, "od": collections.OrderedDict(a=1), "set": {1, 2},
              "complex": 1 + 2j, "bytearray": bytearray(b"x"), "counter": collections.Counter("ab"),
              "range": range(3), "slice": slice(1, 5, 2), "np_int": np.int64(3),
              "np_array": np.arange(6, dtype=np.float32).reshape(2, 3), "np_dtype": np.dtype("u4"),
              "np_state": np.random.RandomState(0).get_state(),
              "defaultdict": collections.defaultdict(list), "custom": CustomConfig("x", 1)}
    answers = {}
    for name, value in values.items():
        try:
            assert_same(round_trip({"v": value}, weights_only=True), {"v": value})
            answers[name] = True
        except cs.UnsafeCheckpointObjectError:
            answers[name] = False
    assert answers == {name: torch_load_accepts(v) for name, v in values.items()}
    # Both ways are exercised: torch allows its metadata, refuses numpy and custom classes.
    assert answers["dtype"] and answers["size"] and answers["device"] and answers["counter"]
    assert not answers["np_state"] and not answers["custom"] and not answers["defaultdict"]


def test_weights_only_allows_a_global_registered_with_add_safe_globals():
    state = {"config": CustomConfig("gpt", 64), "np": np.random.RandomState(0).get_state()}
    with pytest.raises(cs.UnsafeCheckpointObjectError):
        round_trip(state)
    torch.serialization.add_safe_globals([CustomConfig, *numpy_safe_globals()])
    try:
        assert_same(round_trip(state), state)
    finally:
        torch.serialization.clear_safe_globals()
    with pytest.raises(cs.UnsafeCheckpointObjectError):
        round_trip(state)  # registered no more


def test_weights_only_refuses_blocked_modules_even_when_registered():
    # torch never allows os/sys/posix globals, whatever was registered; neither does fastpersist.
    import os

    data = b"\x80\x04cos\nsystem\n(S'true'\ntR."
    with torch.serialization.safe_globals([(os.system, "os.system")]):
        with pytest.raises(cs.UnsafeCheckpointObjectError, match=r"os\.system"):
            cs.unflatten_state(data, lambda n: None)


def test_unknown_persistent_id_is_an_unpickling_error():
    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return ("something.else", "x") if obj == "marker" else None

    import io
    buf = io.BytesIO()
    P(buf, protocol=4).dump({"k": "marker"})
    for weights_only in (True, False):
        with pytest.raises(pickle.UnpicklingError, match="persistent id"):
            cs.unflatten_state(buf.getvalue(), lambda n: None, weights_only=weights_only)
