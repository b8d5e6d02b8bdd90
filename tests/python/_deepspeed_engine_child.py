# SPDX-License-Identifier: Apache-2.0
"""Child side of tests/python/test_deepspeed_engine.py: real DeepSpeed engines, trained on the
CPU with gloo in WORLD real processes (torch.multiprocessing), saving and loading through
fastpersist.deepspeed.

``python _deepspeed_engine_child.py SCENARIO OUT STAGE WORLD [ARGS...]``; each rank writes
``OUT/ok-<scenario>-<rank>`` when every check of its scenario passed (a failed check raises, and
the spawn fails). Scenarios:

- ``roundtrip BF16 ASYNC``: train, save tag t1 (async: training goes on, the next step commits),
  load it into a fresh engine through fastpersist (bit-identical module, optimizer, scheduler,
  client state, step), into a fresh engine with DeepSpeed's own load (module), and through
  ``zero_to_fp32`` (stage >= 1, fp32).
- ``kill RANK POINT``: saves t1, then during the save of t2 rank RANK kills itself (SIGKILL) at
  POINT: ``file`` (after its first file is written), ``commit`` (all its files written, before
  the commit gathers) or ``after`` (t2 committed). Before t2, rank 0 saves the expected state
  of each tag to OUT/expected-<tag>-<rank>.pt.
- ``resume``: loads ``latest`` (validated) into a fresh engine and checks it against
  OUT/expected-<tag>-<rank>.pt.
- ``exit`` (1 rank): an async save left pending when the process exits normally; the exit
  commits it.
- ``features``: retention (keep_last), a stock TorchCheckpointEngine tag loaded through ours,
  a flipped byte refused by a validated load, bad options and tags refused with nothing written,
  keys/dtype filtered loads.
"""

from __future__ import annotations

import glob
import os
import signal
import socket
import sys
import warnings
from typing import Any, Dict, List

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Net(torch.nn.Module):
    """Big enough that the engine borrows the storages (over 64 KiB each), with buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(64, 256)
        self.mid = torch.nn.Linear(256, 256)
        self.out = torch.nn.Linear(256, 8)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))
        # 256 KiB that any codec shrinks (trained weights barely compress)
        self.register_buffer("mask", torch.ones(256, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mid(torch.relu(self.inp(x))))).float().pow(2).mean()


def make_engine(seed: int, stage: int, bf16: bool, **extra: Any) -> Any:
    import deepspeed

    torch.manual_seed(seed)
    model = Net()
    config: Dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                     "warmup_num_steps": 10}},
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": bf16},
    }
    config.update(extra)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    return engine


def train(engine: Any, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed * 1000 + engine.global_rank)
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    for _ in range(steps):
        loss = engine(torch.randn(4, 64, generator=g).to(dtype))
        engine.backward(loss)
        engine.step()


def module_state(engine: Any) -> Dict[str, torch.Tensor]:
    import deepspeed

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.zero_optimization_stage() == 3):
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def tensors_of(obj: Any, prefix: str = "") -> Dict[str, Any]:
    """Every tensor and plain number of a nested state, by path (objects are skipped)."""
    out: Dict[str, Any] = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().clone()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(tensors_of(v, f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(tensors_of(v, f"{prefix}/{i}"))
    elif isinstance(obj, bool) or obj is None:
        out[prefix] = obj
    elif isinstance(obj, (int, float, str)):  # an IntEnum (ZeroStageEnum) as its plain value
        plain = next(t for t in (int, float, str) if isinstance(obj, t))
        out[prefix] = plain(obj)
    return out


def snapshot(engine: Any) -> Dict[str, Any]:
    return {"module": module_state(engine), "optimizer": tensors_of(engine.optimizer.state_dict()),
            "scheduler": tensors_of(engine.lr_scheduler.state_dict()),
            "steps": engine.global_steps}


def same(a: Any, b: Any, what: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{what}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            same(a[k], b[k], f"{what}/{k}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, what
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), what
    elif isinstance(a, float) and a != a:
        assert b != b, what
    else:
        assert a == b, f"{what}: {a!r} != {b!r}"


def done(out: str, scenario: str, rank: int) -> None:
    with open(os.path.join(out, f"ok-{scenario}-{rank}"), "w") as f:
        f.write("ok\n")


# ----------------------------------------------------------------------------- scenarios
def roundtrip(rank: int, out: str, stage: int, bf16: bool, async_save: bool) -> None:
    import fastpersist.deepspeed as fds
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    root = os.path.join(out, "ckpt")
    a = fds.install(make_engine(0, stage, bf16), async_save=async_save)
    train(a, 3, seed=0)
    ref = snapshot(a)
    from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO

    if rank == 0:
        torch.save(ref["module"], os.path.join(out, "reference-module.pt"))
    # universal_checkpoint_info: what ds_to_universal needs from the client (the test runs it)
    a.save_checkpoint(root, tag="t1", client_state={"epoch": 7, "note": "x",
                                                    UNIVERSAL_CHECKPOINT_INFO: {}})
    if async_save:
        assert fds.installed(a).pending() == "t1"
        assert not os.path.exists(os.path.join(root, "t1"))  # not committed before a step
        train(a, 1, seed=1)  # the step commits t1 first, then changes the weights
        assert fds.installed(a).pending() is None
        assert os.path.isfile(os.path.join(root, "t1", "manifest.json"))
        train(a, 2, seed=2)
        a.save_checkpoint(root, tag="t2")
        fds.wait(a)  # nothing trains after it: the explicit wait commits
        assert os.path.isfile(os.path.join(root, "t2", "manifest.json"))
    with open(os.path.join(root, "latest")) as f:
        latest = f.read()
    assert latest == ("t2\n" if async_save else "t1\n"), latest

    b = fds.install(make_engine(1, stage, bf16))
    path, client = fds.load_checkpoint(b, root, "t1")
    assert path is not None and client["epoch"] == 7 and client["note"] == "x", client
    got = snapshot(b)
    same(ref, got, "fastpersist load")

    c = make_engine(2, stage, bf16)  # DeepSpeed's own engine reads our tag
    c.load_checkpoint(root, "t1")
    same(ref["module"], module_state(c), "stock load")

    if stage >= 1 and not bf16 and rank == 0:
        fp32 = get_fp32_state_dict_from_zero_checkpoint(root, "t1")
        for name, value in fp32.items():
            same(ref["module"][name], value, f"zero_to_fp32 {name}")
    done(out, "roundtrip", rank)


class _Killer:
    """Kills this process (SIGKILL) at one point of the engine's save of tag t2."""

    def __init__(self, engine: Any, point: str) -> None:
        self.point = point
        ours = engine.checkpoint_engine
        cls = type(ours)
        save, commit = cls.save, cls.commit

        def killing_save(this: Any, state_dict: Any, path: str) -> None:
            save(this, state_dict, path)
            if this.pending() == "t2" and point == "file":
                os.kill(os.getpid(), signal.SIGKILL)

        def killing_commit(this: Any, info: Any) -> bool:
            if str(info.tag) == "t2" and point == "commit":
                os.kill(os.getpid(), signal.SIGKILL)
            result = commit(this, info)
            if str(info.tag) == "t2" and point == "after":
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        ours.save = killing_save.__get__(ours)
        ours.commit = killing_commit.__get__(ours)


def kill(rank: int, out: str, stage: int, kill_rank: int, point: str) -> None:
    import fastpersist.deepspeed as fds

    root = os.path.join(out, "ckpt")
    a = fds.install(make_engine(0, stage, False), timeout=60)
    for tag in ("t1", "t2"):
        train(a, 2, seed=len(tag))
        torch.save(snapshot(a), os.path.join(out, f"expected-{tag}-{rank}.pt"))
        if tag == "t2" and rank == kill_rank:
            _Killer(a, point)
        a.save_checkpoint(root, tag=tag)
    done(out, "kill", rank)


def resume(rank: int, out: str, stage: int) -> None:
    import fastpersist.deepspeed as fds

    root = os.path.join(out, "ckpt")
    with open(os.path.join(root, "latest")) as f:
        tag = f.read().strip()
    b = fds.install(make_engine(5, stage, False))
    path, _ = fds.load_checkpoint(b, root)  # latest, validated
    assert path is not None
    expected = torch.load(os.path.join(out, f"expected-{tag}-{rank}.pt"), weights_only=True)
    same(expected, snapshot(b), f"resume of {tag}")
    with open(os.path.join(out, f"resumed-{rank}"), "w") as f:
        f.write(tag)
    done(out, "resume", rank)


def features(rank: int, out: str, stage: int) -> None:
    import fastpersist
    import fastpersist.deepspeed as fds

    root = os.path.join(out, "ckpt")
    # A tag of DeepSpeed's own engine, then ours next to it; ours loads both. DeepSpeed's config
    # parser keeps the "fastpersist" section it does not know; install() reads it.
    a = make_engine(0, stage, False, fastpersist={"keep_last": 2})
    train(a, 2, seed=0)
    ref_stock = snapshot(a)
    a.save_checkpoint(root, tag="stock")
    fds.install(a)  # keep_last=2 from the config's "fastpersist" section (make_engine above)
    for i in range(4):
        train(a, 1, seed=10 + i)
        a.save_checkpoint(root, tag=f"r{i}")
    ref_r3 = snapshot(a)
    if rank == 0:
        tags = sorted(t for t in os.listdir(root) if os.path.isdir(os.path.join(root, t))
                      and not t.startswith("."))
        assert tags == ["r2", "r3", "stock"], tags  # ours keep 2; the stock tag is not ours to remove
        with open(os.path.join(root, "latest")) as f:
            assert f.read() == "r3\n"
    # Refused before anything is written: a tag that exists, a bad tag.
    for bad, error in (("r3", FileExistsError), ("../up", ValueError), ("a/b", ValueError),
                       ("..", ValueError)):
        try:
            a.save_checkpoint(root, tag=bad)
        except error:
            pass
        else:
            raise AssertionError(f"tag {bad!r} was accepted")
    assert not os.path.exists(os.path.join(out, "up")) and not os.path.exists(os.path.join(root, "a"))

    b = fds.install(make_engine(1, stage, False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fds.load_checkpoint(b, root, "stock")
    assert any("cannot be verified" in str(w.message) for w in caught), [str(w.message) for w in caught]
    same(ref_stock, snapshot(b), "stock tag through fastpersist")
    fds.load_checkpoint(b, root)  # latest: r3
    same(ref_r3, snapshot(b), "latest")

    # keys/dtype: only "mid.*" is loaded, as bfloat16 on the way (copied into fp32 weights).
    if stage < 3:
        c = fds.install(make_engine(2, stage, False))
        before = module_state(c)
        fds.load_checkpoint(c, root, "r3", keys=["mid.*"], dtype=torch.bfloat16,
                            load_optimizer_states=False)
        after = module_state(c)
        for name in before:
            if name.startswith("mid."):
                want = ref_r3["module"][name].to(torch.bfloat16).float()
                same(want, after[name], f"filtered {name}")
            else:
                same(before[name], after[name], f"kept {name}")

    # A pointer file is untrusted: a `latest` naming a path outside the folder is refused by
    # both loads before anything is read.
    import torch.distributed as dist

    if rank == 0:
        with open(os.path.join(root, "latest"), "w") as f:
            f.write("../../etc")
    dist.barrier()
    for load in (lambda: fds.load_checkpoint(b, root), lambda: b.load_checkpoint(root),
                 lambda: fds.load_checkpoint(b, root, "../ckpt/r3")):
        try:
            load()
        except ValueError as e:
            assert "is not a tag name" in str(e), str(e)
        else:
            raise AssertionError("a tag leading out of the folder was loaded")
    dist.barrier()
    if rank == 0:
        with open(os.path.join(root, "latest"), "w") as f:
            f.write("r3\n")
    dist.barrier()

    # A flipped byte: a validated load names the file, on every rank.
    if rank == 0:
        victim = sorted(glob.glob(os.path.join(root, "r2", "*optim_states.pt")))[-1]
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))
    dist.barrier()
    try:
        fds.load_checkpoint(b, root, "r2")
    except fastpersist.CheckpointCorruptError as e:
        assert "optim_states.pt" in str(e), str(e)
    else:
        raise AssertionError("a damaged tag was loaded")
    done(out, "features", rank)


def split(rank: int, out: str, stage: int, compression: str, async_save: bool) -> None:
    """Compressed and incremental tags: s1 full (the base), s2 unchanged (its storages stored
    as references to s1), s3 after training (full again); each loads bit-identical in a fresh
    engine, validated; DeepSpeed's own engine cannot read them (the test converts s3 back)."""
    import fastpersist.deepspeed as fds
    from fastpersist import _core

    root = os.path.join(out, "ckpt")
    a = fds.install(make_engine(0, stage, False), incremental=True, full_every=5,
                    compression=None if compression == "none" else compression,
                    async_save=async_save)
    train(a, 3, seed=0)
    ref1 = snapshot(a)
    refs = {}
    for tag in ("s1", "s2"):
        a.save_checkpoint(root, tag=tag)
        fds.wait(a)
        refs[tag] = dict(fds.installed(a).save_stats)
    assert refs["s1"].get("referenced_bytes") == 0, refs
    assert refs["s2"].get("referenced_bytes", 0) > 0, refs  # nothing changed: all referenced
    train(a, 2, seed=1)
    ref3 = snapshot(a)
    a.save_checkpoint(root, tag="s3")
    fds.wait(a)
    assert fds.installed(a).save_stats["referenced_bytes"] == 0  # all changed: full
    if rank == 0:
        torch.save(ref3["module"], os.path.join(out, "reference-module.pt"))
        m2 = _core.CheckpointReader(os.path.join(root, "s2"), _core.EngineOptions()).manifest
        assert any(f.name.startswith("s1/") for f in m2.files), [f.name for f in m2.files]
        if compression != "none":
            m1 = _core.CheckpointReader(os.path.join(root, "s1"), _core.EngineOptions()).manifest
            assert any(t.encoding != "raw" for t in m1.tensors), [t.encoding for t in m1.tensors]
        name = os.path.join(root, "s1", "mp_rank_00_model_states.pt")
        try:
            torch.load(name, weights_only=False)
        except Exception:  # noqa: BLE001 (a skeleton is no zip archive)
            pass
        else:
            raise AssertionError("torch.load read a split file")
    for tag, ref in (("s2", ref1), ("s3", ref3), ("s1", ref1)):
        b = fds.install(make_engine(1, stage, False))
        path, _client = fds.load_checkpoint(b, root, tag)
        assert path is not None
        same(ref, snapshot(b), f"split load {tag}")
    done(out, "split", rank)


def damaged(rank: int, out: str, stage: int) -> None:
    """A flipped byte in s3's data: a validated load, and one that is not (each piece is still
    checked as the file is reassembled), raise CheckpointCorruptError."""
    import fastpersist
    import fastpersist.deepspeed as fds

    root = os.path.join(out, "ckpt")
    for validate in (True, False):
        b = fds.install(make_engine(1, stage, False))
        try:
            fds.load_checkpoint(b, root, "s3", validate=validate)
        except fastpersist.CheckpointCorruptError as e:
            assert "s3" in str(e), str(e)
        else:
            raise AssertionError(f"a damaged tag was loaded (validate={validate})")
    done(out, "damaged", rank)


def stock(rank: int, out: str, stage: int, folder: str) -> None:
    """DeepSpeed's own engine, and zero_to_fp32, read the tag `folder` (converted from split)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    reference = torch.load(os.path.join(out, "reference-module.pt"), weights_only=True)
    c = make_engine(2, stage, False)
    root, tag = os.path.split(folder)
    c.load_checkpoint(root, tag)
    same(reference, module_state(c), "stock load of the converted tag")
    if stage >= 1 and rank == 0:
        fp32 = get_fp32_state_dict_from_zero_checkpoint(root, tag)
        for name, value in fp32.items():
            same(reference[name], value, f"zero_to_fp32 {name}")
    done(out, "stock", rank)


def exit_pending(rank: int, out: str, stage: int) -> None:
    """An async save that nothing committed: the interpreter's exit commits it."""
    import fastpersist.deepspeed as fds

    a = fds.install(make_engine(0, stage, False), async_save=True)
    train(a, 2, seed=0)
    torch.save(snapshot(a), os.path.join(out, f"expected-t1-{rank}.pt"))
    a.save_checkpoint(os.path.join(out, "ckpt"), tag="t1")
    assert fds.installed(a).pending() == "t1"
    done(out, "exit", rank)
    # returns: the process exits normally (no os._exit), and atexit commits t1


def _rank(rank: int, world: int, port: int, fn: Any, *args: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world),
                      DS_ACCELERATOR="cpu")
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    fn(rank, *args)
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    if fn is exit_pending:
        return  # a normal exit: atexit handlers run (one rank: no gloo threads to outlive it)
    os._exit(0)  # see _foreign_writers._rank: gloo threads can outlive finalization


def main(argv: List[str]) -> None:
    scenario, out, stage, world = argv[0], argv[1], int(argv[2]), int(argv[3])
    rest = argv[4:]
    port = _free_port()
    fns = {"roundtrip": (roundtrip, lambda: (rest[0] == "1", rest[1] == "1")),
           "kill": (kill, lambda: (int(rest[0]), rest[1])),
           "resume": (resume, lambda: ()),
           "features": (features, lambda: ()),
           "exit": (exit_pending, lambda: ()),
           "split": (split, lambda: (rest[0], rest[1] == "1")),
           "stock": (stock, lambda: (rest[0],)),
           "damaged": (damaged, lambda: ())}
    fn, extra = fns[scenario]
    try:
        mp.spawn(_rank, args=(world, port, fn, out, stage, *extra()), nprocs=world)
    finally:
        for path in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
            os.unlink(path)


if __name__ == "__main__":
    main(sys.argv[1:])
