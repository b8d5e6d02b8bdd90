# SPDX-License-Identifier: Apache-2.0
"""CheckpointManager.load / fastpersist.load_checkpoint with real models: selective loads,
dtype conversion, in-place loads into a model's own tensors, strict checks, bounded memory,
verification, the weights_only restriction and the not-found cases."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import fastpersist
from _checkpoint_models import (assert_state_equal, assert_tensor_equal, batch, clone_state,
                                every_dtype_state, logits, manifest, tiny_gpt2, trained_gpt2,
                                training_state)
from _checkpoint_models import numpy_rng_state_allowed  # noqa: F401 - a fixture

# training_state() holds numpy's RNG state, which weights_only=True loads once registered (as
# torch.load does).
pytestmark = pytest.mark.usefixtures("numpy_rng_state_allowed")


class Custom:
    """A class outside the weights_only allowlist."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Custom) and other.value == self.value


@pytest.fixture(scope="module")
def gpt2_ckpt(tmp_path_factory):
    """A committed checkpoint of a trained tiny GPT-2 with optimizer state; (root, model, state)."""
    root = tmp_path_factory.mktemp("gpt2")
    model, optimizer, scheduler = trained_gpt2(seed=0)
    state = training_state(model, optimizer, scheduler, step=1)
    state["counters"] = {"tokens": torch.tensor(12345, dtype=torch.int64),
                         "mask": torch.tensor([1, 0, 1], dtype=torch.uint8),
                         "flags": torch.tensor([True, False])}
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        mgr.save(1, state)
    return root, model, clone_state(state)


@pytest.fixture
def mgr(gpt2_ckpt):
    # A manager per test (the lock is per root, so tests take it in turn).
    with fastpersist.CheckpointManager(gpt2_ckpt[0], durable=False) as m:
        yield m


def _model_names(state):
    return list(state["model"])


# ------------------------------------------------------------------------------- keys
def test_keys_list_selects_tensors(mgr, gpt2_ckpt):
    _, _, expected = gpt2_ckpt
    wanted = ["model.lm_head.weight", "model.transformer.wpe.weight", "counters.tokens"]
    loaded = mgr.load(keys=wanted)
    # Saved order, only the selected tensors; every non-tensor object is still there.
    assert _model_names(loaded) == ["transformer.wpe.weight", "lm_head.weight"]
    assert_tensor_equal(loaded["model"]["lm_head.weight"], expected["model"]["lm_head.weight"])
    assert_tensor_equal(loaded["model"]["lm_head.weight"],
                        expected["model"]["transformer.wte.weight"])  # an alias of wte
    assert list(loaded["counters"]) == ["tokens"]
    assert loaded["step"] == 1 and loaded["run"] == "tiny-gpt2"
    assert loaded["optimizer"]["param_groups"] == expected["optimizer"]["param_groups"]
    assert all(s == {} for s in loaded["optimizer"]["state"].values())
    assert loaded["scheduler"] == expected["scheduler"]

    with pytest.raises(ValueError, match="model.nope"):
        mgr.load(keys=wanted + ["model.nope"])
    assert _model_names(mgr.load(keys=wanted + ["model.nope"], strict=False)) == [
        "transformer.wpe.weight", "lm_head.weight"]
    with pytest.raises(TypeError):
        mgr.load(keys="model.lm_head.weight")
    assert _model_names(mgr.load(keys=[])) == []


def test_predicate_skips_a_layer(mgr, gpt2_ckpt):
    _, model, expected = gpt2_ckpt
    skip = "model.transformer.h.1."
    loaded = mgr.load(keys=lambda n: not n.startswith(skip))
    names = _model_names(loaded)
    assert names == [n for n in expected["model"] if not n.startswith("transformer.h.1.")]
    assert len(names) < len(expected["model"])
    assert_state_equal(loaded["optimizer"], expected["optimizer"])
    fresh = tiny_gpt2(seed=7)
    result = fresh.load_state_dict(loaded["model"], strict=False)
    assert result.missing_keys
    assert all(k.startswith("transformer.h.1.") for k in result.missing_keys)
    for name, p in fresh.state_dict().items():
        if not name.startswith("transformer.h.1."):
            assert torch.equal(p, expected["model"][name]), name


# ------------------------------------------------------------------------------ dtype
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_blanket_dtype_converts_floats_only(mgr, gpt2_ckpt, dtype, tmp_path):
    _, _, expected = gpt2_ckpt
    loaded = mgr.load(dtype=dtype)
    for name, t in expected["model"].items():
        assert_tensor_equal(loaded["model"][name], t.to(dtype), name)
    assert loaded["model"]["lm_head.weight"] is loaded["model"]["transformer.wte.weight"]
    assert_tensor_equal(loaded["optimizer"]["state"][0]["exp_avg"],
                        expected["optimizer"]["state"][0]["exp_avg"].to(dtype))
    # Integer, bool and uint8 tensors keep their dtype (and the RNG state stays bytes).
    assert_state_equal(loaded["counters"], expected["counters"])
    assert_tensor_equal(loaded["rng"]["torch"], expected["rng"]["torch"])

    # Saved at the lower precision and loaded back as float32.
    with fastpersist.CheckpointManager(tmp_path, durable=False) as low:
        low.save("low", loaded)
        back = low.load("low", dtype=torch.float32)
    for name, t in expected["model"].items():
        assert_tensor_equal(back["model"][name], t.to(dtype).to(torch.float32), name)
    assert back["counters"]["tokens"].dtype == torch.int64


def test_dtype_per_name(mgr, gpt2_ckpt):
    _, _, expected = gpt2_ckpt
    loaded = mgr.load(dtype={"model.transformer.wpe.weight": torch.float16,
                             "counters.tokens": torch.int32,
                             "model.transformer.h.0.ln_1.bias": torch.float64})
    assert_tensor_equal(loaded["model"]["transformer.wpe.weight"],
                        expected["model"]["transformer.wpe.weight"].half())
    assert_tensor_equal(loaded["counters"]["tokens"], expected["counters"]["tokens"].int())
    assert_tensor_equal(loaded["model"]["transformer.h.0.ln_1.bias"],
                        expected["model"]["transformer.h.0.ln_1.bias"].double())
    assert loaded["model"]["transformer.h.0.ln_1.weight"].dtype == torch.float32


def test_dtype_per_name_with_unknown_names(mgr, gpt2_ckpt):
    # A typo in dtype= would silently load fp32: strict (the default) names it instead.
    with pytest.raises(ValueError, match=r"dtype= names tensors .* model\.transformer\.wpe\.weihgt"):
        mgr.load(dtype={"model.transformer.wpe.weihgt": torch.float16})
    _, _, expected = gpt2_ckpt
    loaded = mgr.load(dtype={"model.transformer.wpe.weihgt": torch.float16,
                             "model.transformer.wpe.weight": torch.float16}, strict=False)
    assert loaded["model"]["transformer.wpe.weight"].dtype == torch.float16


def test_dtype_per_name_of_tied_weights(mgr, gpt2_ckpt):
    # Either name of a tied pair converts the one shared tensor: the caller cannot know
    # which of the two names the checkpoint stored.
    _, _, expected = gpt2_ckpt
    want = expected["model"]["transformer.wte.weight"].to(torch.bfloat16)
    for name in ("model.lm_head.weight", "model.transformer.wte.weight"):
        sd = mgr.load(dtype={name: torch.bfloat16})["model"]
        assert sd["lm_head.weight"] is sd["transformer.wte.weight"]
        assert_tensor_equal(sd["lm_head.weight"], want, name)


def test_every_dtype_with_a_blanket_dtype(tmp_path):
    state = every_dtype_state(seed=3)
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(1, state)
        loaded = m.load(dtype=torch.float32)
    for name, t in state.items():
        if t.dtype.is_floating_point:
            assert loaded[name].dtype == torch.float32, name
            torch.testing.assert_close(loaded[name], t.float(), equal_nan=True, rtol=0, atol=0)
        else:
            assert_tensor_equal(loaded[name], t, name)


# ------------------------------------------------------------------------------- into
def test_into_a_state_dict_loads_in_place(mgr, gpt2_ckpt):
    _, model, expected = gpt2_ckpt
    fresh = tiny_gpt2(seed=11)
    dest = {"model": fresh.state_dict()}
    ptrs = {k: v.data_ptr() for k, v in dest["model"].items()}
    ids = batch(seed=2)
    assert not torch.equal(logits(fresh, ids), logits(model, ids))
    out = mgr.load(into=dest, keys=lambda n: n.startswith("model."))
    for k, v in dest["model"].items():
        assert out["model"][k] is v, k
        assert v.data_ptr() == ptrs[k], k
        assert_tensor_equal(v, expected["model"][k], k)
    assert torch.equal(logits(fresh, ids), logits(model, ids))
    assert fresh.lm_head.weight is fresh.transformer.wte.weight


@pytest.mark.parametrize("max_memory", [None, 1, "64KiB"])
def test_into_an_nn_module(tmp_path, max_memory):
    model = tiny_gpt2(seed=1)
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(1, model.state_dict())
        fresh = tiny_gpt2(seed=2)
        params = {k: p.data_ptr() for k, p in fresh.named_parameters()}
        out = m.load(into=fresh, max_memory=max_memory)
    assert {k: p.data_ptr() for k, p in fresh.named_parameters()} == params
    assert out["lm_head.weight"].data_ptr() == fresh.lm_head.weight.data_ptr()
    ids = batch(seed=3)
    assert torch.equal(logits(fresh, ids), logits(model, ids))
    assert fresh.lm_head.weight is fresh.transformer.wte.weight


def test_into_converts_to_the_destination_dtype(mgr, gpt2_ckpt):
    _, _, expected = gpt2_ckpt
    fresh = tiny_gpt2(seed=5).to(torch.bfloat16)
    dest = {"model": fresh.state_dict()}
    out = mgr.load(into=dest, keys=lambda n: n.startswith("model."), max_memory="16KiB")
    for k, v in dest["model"].items():
        assert out["model"][k] is v
        assert_tensor_equal(v, expected["model"][k].to(torch.bfloat16), k)


def test_into_non_contiguous_destination(tmp_path):
    src = {"w": torch.randn(8, 6), "b": torch.arange(10)}
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(1, src)
        w_base = torch.zeros(6, 8)
        dest = {"w": w_base.t(), "b": torch.zeros(20, dtype=torch.int64)[::2]}
        out = m.load(into=dest)
    assert out["w"] is dest["w"] and out["b"] is dest["b"]
    assert torch.equal(w_base.t(), src["w"])
    assert torch.equal(dest["b"], src["b"])


# ----------------------------------------------------------------------------- strict
def _strict_case(tmp_path):
    saved = {"model": {"a": torch.randn(2, 3), "b": torch.randn(4), "c": torch.randn(5)}, "n": 1}
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(1, saved)
    dest = {"model": {"a": torch.zeros(2, 3), "b": torch.zeros(7), "d": torch.zeros(1)}}
    return saved, dest


def test_strict_lists_every_mismatch_and_loads_nothing(tmp_path):
    saved, dest = _strict_case(tmp_path)
    before = clone_state(dest)
    with pytest.raises(ValueError) as info:
        fastpersist.load_checkpoint(tmp_path / "step-00000001", into=dest)
    msg = str(info.value)
    assert "model.d" in msg                       # missing from the checkpoint
    assert "model.c" in msg                       # in the checkpoint, not in into=
    assert "model.b" in msg and "(4,)" in msg and "(7,)" in msg  # shape mismatch
    assert "model.a" not in msg
    assert "strict=False" in msg
    assert_state_equal(dest, before)  # nothing was loaded


def test_non_strict_loads_what_matches(tmp_path):
    saved, dest = _strict_case(tmp_path)
    before = clone_state(dest)
    out = fastpersist.load_checkpoint(tmp_path / "step-00000001", into=dest, strict=False)
    assert out["model"]["a"] is dest["model"]["a"]
    assert_tensor_equal(dest["model"]["a"], saved["model"]["a"])
    # The mismatched and the unexpected come back as new tensors; the destination keeps its own.
    assert out["model"]["b"] is not dest["model"]["b"]
    assert_tensor_equal(out["model"]["b"], saved["model"]["b"])
    assert_tensor_equal(dest["model"]["b"], before["model"]["b"])
    assert_tensor_equal(out["model"]["c"], saved["model"]["c"])
    assert "d" not in out["model"]
    assert_tensor_equal(dest["model"]["d"], before["model"]["d"])
    assert out["n"] == 1


# --------------------------------------------------------------------- memory / device
@pytest.mark.parametrize("max_memory", [1, 4096, "64KiB", "1MiB", 10 ** 12])
def test_bounded_loads_give_identical_results(mgr, gpt2_ckpt, max_memory):
    _, _, expected = gpt2_ckpt
    loaded = mgr.load(max_memory=max_memory)
    assert_state_equal(loaded, expected)
    assert loaded["model"]["lm_head.weight"] is loaded["model"]["transformer.wte.weight"]


@pytest.mark.parametrize("max_memory", [1, 4096, "64KiB"])
def test_bounded_loads_with_dtype_conversion_give_identical_results(mgr, gpt2_ckpt, max_memory):
    # Tensors larger than the budget are converted piece by piece (read_pieces); the result must
    # be exactly the unbounded conversion, element for element, tied weights still tied.
    expected = mgr.load(dtype=torch.bfloat16)
    loaded = mgr.load(dtype=torch.bfloat16, max_memory=max_memory)
    assert_state_equal(loaded, expected)
    assert loaded["model"]["lm_head.weight"] is loaded["model"]["transformer.wte.weight"]
    assert loaded["model"]["lm_head.weight"].dtype == torch.bfloat16


def test_bounded_converting_load_detects_damage(tmp_path):
    w = torch.randn(1 << 18)  # 1 MiB, streamed in pieces of 32 KiB below
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(1, {"w": w})
        manifest = json.loads((tmp_path / "step-00000001" / "manifest.json").read_text())
        (entry,) = manifest["tensors"]
        path = tmp_path / "step-00000001" / entry["file"]
        with open(path, "r+b") as f:
            f.seek(entry["offset"] + entry["length"] - 3)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))
        dest = {"w": torch.zeros(1 << 18, dtype=torch.bfloat16)}
        with pytest.raises(fastpersist.CheckpointCorruptError, match="'w'"):
            m.load(into=dest, max_memory="64KiB")
        with pytest.raises(fastpersist.CheckpointCorruptError, match="'w'"):
            m.load(dtype=torch.float16, max_memory="64KiB")
        loaded = m.load(dtype=torch.float64, max_memory="64KiB", verify=False)
        assert (loaded["w"] != w.double()).sum().item() == 1


@pytest.mark.parametrize("where", ["cpu", torch.device("cpu"), None])
def test_map_location_cpu(mgr, gpt2_ckpt, where):
    loaded = mgr.load(map_location=where)
    assert_state_equal(loaded, gpt2_ckpt[2])


def test_map_location_must_be_a_device(mgr):
    with pytest.raises(TypeError):
        mgr.load(map_location={"cuda:0": "cpu"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_map_location_cuda(mgr, gpt2_ckpt):
    loaded = mgr.load(map_location="cuda")
    t = loaded["model"]["transformer.wpe.weight"]
    assert t.device.type == "cuda"
    assert torch.equal(t.cpu(), gpt2_ckpt[2]["model"]["transformer.wpe.weight"])
    assert loaded["model"]["lm_head.weight"] is loaded["model"]["transformer.wte.weight"]


def test_loaded_tensors_are_independent_writable_tensors(mgr, gpt2_ckpt):
    loaded = mgr.load()
    a = loaded["model"]["transformer.wpe.weight"]
    b = loaded["model"]["transformer.h.0.ln_1.weight"]
    # Each tensor has storage of its own, like torch.load gives.
    assert a.storage_offset() == 0 and b.storage_offset() == 0
    assert a.untyped_storage().nbytes() == a.numel() * a.element_size()
    a.add_(1.0)  # writable; the neighbours are unaffected
    assert_tensor_equal(b, gpt2_ckpt[2]["model"]["transformer.h.0.ln_1.weight"])
    torch.set_rng_state(loaded["rng"]["torch"])


# ---------------------------------------------------------------------------- verify
def test_verify_false_loads_the_same(mgr, gpt2_ckpt):
    assert_state_equal(mgr.load(verify=False), gpt2_ckpt[2])


def test_damaged_bytes_are_detected(tmp_path):
    state = {"w": torch.arange(1000, dtype=torch.float32), "v": torch.ones(10)}
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(1, {"w": torch.zeros(3)})
        m.save(2, state)
        tdir = m.path("step-00000002")
        entry = next(t for t in manifest(tdir)["tensors"] if t["name"] == "w")
        with open(os.path.join(tdir, entry["file"]), "r+b") as f:
            f.seek(entry["offset"] + 40)
            f.write(b"\xff")
        with pytest.raises(fastpersist.CheckpointCorruptError, match="tensor 'w'") as info:
            m.load(2)
        assert entry["file"] in str(info.value)
        assert isinstance(info.value, ValueError)
        damaged = m.load(2, verify=False)  # the bytes as they are
        assert not torch.equal(damaged["w"], state["w"])
        assert torch.equal(damaged["v"], state["v"])
        problems = m.verify(2)
        assert len(problems) == 1 and "'w'" in problems[0], problems
        assert m.verify(1) == []
        # Only the damaged tensor is read: others still load with verification.
        assert torch.equal(m.load(2, keys=["v"])["v"], state["v"])
        with pytest.warns(UserWarning, match="step-00000002"):
            tag, resumed = m.resume()
        assert tag == "step-00000001" and torch.equal(resumed["w"], torch.zeros(3))


def test_resume(tmp_path):
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        assert m.resume() == (None, None)
        m.save(1, {"x": torch.ones(2)})
        m.save(2, {"x": torch.full((2,), 2.0)})
        tag, state = m.resume(dtype=torch.float16)
    assert tag == "step-00000002"
    assert_tensor_equal(state["x"], torch.full((2,), 2.0, dtype=torch.float16))


# ------------------------------------------------------------------------ weights_only
def test_weights_only_refuses_custom_classes(tmp_path):
    state = {"obj": Custom(3), "w": torch.ones(2), "ok": {1, 2}}
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(1, state)
        with pytest.raises(pickle.UnpicklingError, match="Custom"):
            m.load(1)
        loaded = m.load(1, weights_only=False)
    assert loaded["obj"] == Custom(3) and loaded["ok"] == {1, 2}
    assert torch.equal(loaded["w"], torch.ones(2))
    with pytest.raises(pickle.UnpicklingError):
        fastpersist.load_checkpoint(tmp_path / "step-00000001")
    trusted = fastpersist.load_checkpoint(tmp_path / "step-00000001", weights_only=False)
    assert trusted["obj"] == Custom(3)


# ------------------------------------------------------------------------- not found
def test_not_found(tmp_path):
    with fastpersist.CheckpointManager(tmp_path / "root", durable=False) as m:
        with pytest.raises(FileNotFoundError):
            m.load()
        with pytest.raises(FileNotFoundError):
            m.load("latest", strict=False)
        m.save("a", {"x": torch.ones(1)})
        with pytest.raises(FileNotFoundError, match="'b'"):
            m.load("b")
        with pytest.raises(FileNotFoundError):
            m.load(7)
        with pytest.raises(ValueError):
            m.load("../a")
        assert torch.equal(m.load("a")["x"], torch.ones(1))
    with pytest.raises(FileNotFoundError):
        fastpersist.load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises((FileNotFoundError, fastpersist.CheckpointCorruptError)):
        fastpersist.load_checkpoint(tmp_path / "empty")


def test_load_checkpoint_without_a_manager(mgr, gpt2_ckpt):
    root, _, expected = gpt2_ckpt
    # The manager of the fixture holds the lock: reading needs none.
    path = root / "step-00000001"
    assert_state_equal(fastpersist.load_checkpoint(path), expected)
    assert_state_equal(fastpersist.load_checkpoint(str(path), max_memory="32KiB", verify=False),
                       expected)
    sub = fastpersist.load_checkpoint(path, keys=["model.transformer.wpe.weight"],
                                      dtype=torch.float16)
    assert list(sub["model"]) == ["transformer.wpe.weight"]
    assert sub["model"]["transformer.wpe.weight"].dtype == torch.float16


# ---------------------------------------------------------------------- peak memory
# The peak is the process's own VmHWM: ru_maxrss would also count the parent's RSS at fork,
# which Linux carries across exec. Writing "5" to clear_refs resets it where allowed.
_RSS_SCRIPT = textwrap.dedent(r"""
    import json, sys
    import torch
    import fastpersist

    path, rows, cols = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def peak():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def reset_peak():
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        return peak()

    dest = {"w": {str(i): torch.full((cols,), -1, dtype=torch.int32) for i in range(rows)}}
    fastpersist.load_checkpoint(path, keys=["w.0"], into={"w": {"0": dest["w"]["0"]}})  # warm up
    base = reset_peak()
    out = fastpersist.load_checkpoint(path, into=dest, max_memory="16MiB")
    in_place = peak() - base
    expected = torch.arange(rows * cols, dtype=torch.int32).view(rows, cols)
    ok = all(out["w"][str(i)] is dest["w"][str(i)] and torch.equal(dest["w"][str(i)], expected[i])
             for i in range(rows))
    del expected
    # Control: a load into new memory raises the peak by about the checkpoint's size.
    base = reset_peak()
    fresh = fastpersist.load_checkpoint(path)
    new_memory = peak() - base
    print(json.dumps({"in_place": in_place, "new_memory": new_memory, "ok": ok}))
""")


_CONVERT_RSS_SCRIPT = _RSS_SCRIPT[:_RSS_SCRIPT.index("\ndest = ") + 1] + textwrap.dedent(r"""
    n = rows * cols
    expected = torch.arange(n, dtype=torch.float32).to(torch.bfloat16)
    dest = torch.full((n,), -1, dtype=torch.bfloat16)
    fastpersist.load_checkpoint(path, into={"w": dest}, max_memory="4MiB")  # warm up
    dest.fill_(-1)
    base = reset_peak()
    fastpersist.load_checkpoint(path, into={"w": dest}, max_memory="4MiB")
    into_bounded = peak() - base
    ok = torch.equal(dest, expected)
    base = reset_peak()
    out = fastpersist.load_checkpoint(path, dtype=torch.bfloat16, max_memory="4MiB")
    new_bounded = peak() - base
    ok = ok and torch.equal(out["w"], expected)
    del out
    # Control: unbounded, the fp32 tensor is read whole before it is converted.
    base = reset_peak()
    fastpersist.load_checkpoint(path, into={"w": dest})
    into_unbounded = peak() - base
    print(json.dumps({"into_bounded": into_bounded, "new_bounded": new_bounded,
                      "into_unbounded": into_unbounded, "ok": ok}))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_bounded_converting_load_stays_within_its_budget(tmp_path):
    # One 64 MiB fp32 tensor loaded as bf16 with max_memory=4MiB: it streams in pieces, so the
    # peak stays near the budget, not the tensor (an in-place load) or tensor + result (new).
    n = 1 << 24
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(1, {"w": torch.arange(n, dtype=torch.float32)})
    script = tmp_path / "rss_convert.py"
    script.write_text(_CONVERT_RSS_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "step-00000001"), "1",
                           str(n)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"]
    mib = 1 << 20
    assert result["into_unbounded"] > 48 * mib, result  # the measurement sees a whole read
    assert result["into_bounded"] < 16 * mib, result
    assert result["new_bounded"] < (32 + 16) * mib, result  # the 32 MiB result + the budget


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_in_place_bounded_load_needs_little_memory(tmp_path):
    rows, cols = 50, 1 << 20  # 50 tensors of 4 MiB: 200 MiB
    size = rows * cols * 4
    values = torch.arange(rows * cols, dtype=torch.int32).view(rows, cols)
    with fastpersist.CheckpointManager(tmp_path, durable=False, staging_budget="16MiB",
                                       staging_window="4MiB") as m:
        m.save(1, {"w": {str(i): values[i] for i in range(rows)}})
    del values
    script = tmp_path / "rss.py"
    script.write_text(_RSS_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "step-00000001"),
                           str(rows), str(cols)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"]
    assert result["new_memory"] > 0.8 * size, result  # the measurement sees a full load
    assert result["in_place"] < 0.5 * size, result
