#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPU benchmarks of issue 16, for a machine with a CUDA device (bench/gpu_check.sh runs it):

1. GPU <-> file GB/s of AioHandle (staged through pinned memory) and GdsHandle (cuFile) against
   fio's O_DIRECT limit on the same folder (target: >= 90% of fio);
2. a GPU checkpoint (gpt2-large or llama3-1B, weights on cuda:0) saved and loaded by
   CheckpointManager against torch.save / torch.load (map_location="cuda");
3. how long the async snapshot of that GPU state blocks a training step: save_async's return
   plus the hooked optimizer's wait, against the synchronous save (target: <= 5%).

Prints a table and the command that reproduces it; --json writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any, Callable, Dict, List

import torch

import fastpersist
from fastpersist.bench import fio as fio_mod

GB = 1e9


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _best(fn: Callable[[], float], loops: int) -> float:
    return min(fn() for _ in range(loops))


def handle_rates(folder: str, size: int, loops: int, log: Callable[[str], None]) -> List[Dict[str, Any]]:
    src = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda:0")
    back = torch.empty_like(src)
    rows: List[Dict[str, Any]] = []
    makers: List[Any] = [("aio_handle", fastpersist.AioHandle)]
    why = fastpersist.gds_info().unavailable_reason()
    if why:
        log(f"gds_handle skipped: {why}")
    else:
        makers.append(("gds_handle", fastpersist.GdsHandle))
    for name, make in makers:
        h = make(block_size=8 << 20, queue_depth=32, intra_op_parallelism=4)
        path = os.path.join(folder, f"gpu-{name}.bin")

        def write() -> float:
            t0 = time.perf_counter()
            h.sync_pwrite(src, path, truncate=True)
            _fsync(path)
            return time.perf_counter() - t0

        def read() -> float:
            t0 = time.perf_counter()
            h.sync_pread(back, path)
            return time.perf_counter() - t0

        w = _best(write, loops)
        r = _best(read, loops)
        ok = bool(torch.equal(back, src))
        mode = h.mode if isinstance(h, fastpersist.GdsHandle) else "staged through pinned memory"
        h.close()
        os.unlink(path)
        rows.append({"what": name, "write_gbps": size / w / GB, "read_gbps": size / r / GB,
                     "verified": ok, "mode": mode})
        log(f"{name}: write {size / w / GB:.2f} GB/s, read {size / r / GB:.2f} GB/s, "
            f"verified={ok} ({mode})")
    return rows


def fio_rates(folder: str, size: int, log: Callable[[str], None]) -> Dict[str, Any]:
    fio = fio_mod.find()
    if fio is None:
        log("fio not installed: no limit to compare with")
        return {}
    path = os.path.join(folder, "fio-limit.bin")
    best_w, best_r = fio_mod.best(fio, path, size, fio_mod.candidates(), log=log)
    w = fio_mod.run(fio, "write", path, size, best_w)
    r = fio_mod.run(fio, "read", path, size, best_r)
    os.unlink(path)
    return {"write_gbps": w.nbytes / w.seconds / GB, "read_gbps": r.nbytes / r.seconds / GB,
            "write_setting": best_w.label(), "read_setting": best_r.label()}


def checkpoint_rates(folder: str, model_name: str, log: Callable[[str], None]) -> Dict[str, Any]:
    from fastpersist.bench import models

    model = models.build(model_name, gpu=True)
    state = {"model": model.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in state["model"].values())
    out: Dict[str, Any] = {"model": model_name, "bytes": nbytes}

    path = os.path.join(folder, "torch-save.pt")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.save(state, path)
    _fsync(path)
    out["torch_save_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = torch.load(path, map_location="cuda", weights_only=True)
    torch.cuda.synchronize()
    out["torch_load_s"] = time.perf_counter() - t0
    del loaded
    os.unlink(path)

    root = os.path.join(folder, "gpu-ckpt")
    with fastpersist.CheckpointManager(root, keep_last=1) as mgr:
        mgr.save(0, state)  # untimed warm-up: staging memory allocated and registered once
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mgr.save(1, state)
        out["fastpersist_save_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = mgr.load(map_location="cuda")
        torch.cuda.synchronize()
        out["fastpersist_load_s"] = time.perf_counter() - t0
        same = all(torch.equal(back["model"][k], v) for k, v in state["model"].items())
        out["verified"] = bool(same)
        del back

        # The async snapshot: what a training step waits for.
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        mgr.hook_optimizer(opt)
        loss = sum(p.float().sum() for p in model.parameters())
        loss.backward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        handle = mgr.save_async(2, state)
        returned = time.perf_counter() - t0
        t1 = time.perf_counter()
        opt.step()  # waits only until the snapshot of the weights it changes is done
        torch.cuda.synchronize()
        step_wait = time.perf_counter() - t1
        handle.wait()
        out["async_blocking_s"] = returned + step_wait
        out["async_blocking_fraction"] = out["async_blocking_s"] / out["fastpersist_save_s"]
    log(json.dumps(out))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", required=True)
    p.add_argument("--size-gib", type=float, default=4.0)
    p.add_argument("--loops", type=int, default=3)
    p.add_argument("--model", default="gpt2-large")
    p.add_argument("--skip-checkpoint", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device (torch.cuda.is_available() is False)")
        return 2
    os.makedirs(a.folder, exist_ok=True)
    size = int(a.size_gib * (1 << 30))

    def log(line: str) -> None:
        print(line, flush=True)

    print("command: " + shlex.join([sys.executable] + sys.argv))
    print(f"device: {torch.cuda.get_device_name(0)}; gds: {fastpersist.gds_info().mode}")
    result: Dict[str, Any] = {"size_bytes": size, "fio": fio_rates(a.folder, size, log),
                              "handles": handle_rates(a.folder, size, a.loops, log)}
    limit = result["fio"]
    for row in result["handles"]:
        if limit:
            row["write_vs_fio"] = row["write_gbps"] / limit["write_gbps"]
            row["read_vs_fio"] = row["read_gbps"] / limit["read_gbps"]
    if not a.skip_checkpoint:
        try:
            result["checkpoint"] = checkpoint_rates(a.folder, a.model, log)
        except Exception as e:  # noqa: BLE001 - report what failed, keep the handle numbers
            result["checkpoint"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"checkpoint benchmark failed: {e!r}")
    print("\n| what | write GB/s | read GB/s | vs fio (w / r) |")
    print("|---|---|---|---|")
    if limit:
        print(f"| fio ({limit['write_setting']} / {limit['read_setting']}) | "
              f"{limit['write_gbps']:.2f} | {limit['read_gbps']:.2f} | 1.00 / 1.00 |")
    for row in result["handles"]:
        ratio = (f"{row['write_vs_fio']:.2f} / {row['read_vs_fio']:.2f}" if limit else "n/a")
        print(f"| {row['what']} (GPU memory) | {row['write_gbps']:.2f} | {row['read_gbps']:.2f} "
              f"| {ratio} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
