#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CheckpointManager's performance targets (issue 4), measured side by side in one run.

For a model's state (default: gpt2-large built from its config, about 3.1 GB fp32) on one
folder, every round measures, in this order:

- fio's O_DIRECT write and read of the same number of bytes (io_uring, bs 8M, iodepth 32,
  end_fsync for the write): the storage's reference bandwidth in this run;
- a synchronous ``CheckpointManager.save`` (durable, checksummed, committed), its bandwidth
  against fio's write, and the CPU time its checksums took against the save's time;
- ``save_async``: the time the call blocks the caller against the synchronous save;
- a cold ``CheckpointManager.load`` (files evicted from the page cache, checksums verified)
  against fio's O_DIRECT read of the same checkpoint's data files (in alternating order; a
  freshly written fio file reads faster on this VM, reported as fio_read_new for reference),
  the same load ``into=`` the state's own tensors (in place, as a resume into a built model),
  a cold ``CheckpointManager.verify`` of the checkpoint (every byte read and hashed), a cold
  ``safetensors.torch.load_file`` of the same tensors in one file, and a cold ``torch.load`` of
  a ``torch.save`` file. fio, the two loads and the verify go in an order that rotates every
  round. Last, as a diagnostic, the speed at which the process gets new memory
  (``fresh_memory``: allocate and write as many bytes as the state).

Then, once: training steps (forward, backward, SGD step) without and with a ``save_async`` at
the start of every step, the optimizer hooked with ``hook_optimizer`` so step() waits for the
snapshot only. Ratios are of the medians over the rounds (best-of in brackets). Run with the
package installed in .venv:

    .venv/bin/python bench/checkpoint_manager_bench.py --folder bench-data --rounds 3

``--gpu`` puts the state and the training steps on CUDA (the snapshot then copies device
memory into pinned staging; the step-overlap target is meant for that setting).
``--no-references`` leaves out what only the targets compare against (safetensors, torch.load,
the save without checksums, the fresh-memory diagnostic) and keeps fio and fastpersist's own
measurements; ``--json PATH`` also writes every measurement, per round, as JSON
(bench/compare_builds.py reads it to compare two builds).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

import fastpersist
from fastpersist.bench import models
from fastpersist.bench.loaders import evict

GB = 1e9
MiB = 1 << 20

# What each measurement is, for the JSON output: unit, whether higher is better, description.
METRICS: Dict[str, tuple] = {
    "fio_write": ("GB/s", True, "fio O_DIRECT write of the state's size"),
    "fio_read_new": ("GB/s", True, "fio O_DIRECT read of the file it just wrote"),
    "fio_read": ("GB/s", True, "fio O_DIRECT read of the checkpoint's data files (cold)"),
    "save": ("GB/s", True, "CheckpointManager.save, durable and checksummed"),
    "save_nock": ("GB/s", True, "CheckpointManager.save with checksums=False"),
    "save_async_block": ("s", False, "time save_async blocks its caller"),
    "save_block": ("ratio", False, "time save_async blocks / sync save time"),
    "checksum_frac": ("ratio", False, "checksum CPU time / save time"),
    "load": ("GB/s", True, "CheckpointManager.load into new memory (cold, verified)"),
    "load_into": ("GB/s", True, "CheckpointManager.load into= the state's tensors (cold)"),
    "verify": ("GB/s", True, "CheckpointManager.verify (cold, every byte hashed)"),
    "st_load": ("GB/s", True, "safetensors.torch.load_file (cold), every page touched"),
    "torch_load": ("GB/s", True, "torch.load(weights_only=True) of a torch.save file (cold)"),
    "fresh_memory": ("GB/s", True, "allocate and write as many bytes as the state"),
    "step_plain": ("s", False, "training step without a checkpoint"),
    "step_ckpt": ("s", False, "training step starting with save_async (optimizer hooked)"),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fio_run(args: argparse.Namespace, rw: str, path: str, size: Optional[int] = None):
    """(bytes, seconds) of one fio O_DIRECT job; without `size` it reads the whole file (in
    whole blocks: fio leaves out a partial last one)."""
    bs = 8 * MiB
    if size is None:
        # fio refuses a block larger than the file (small models' data files).
        bs = min(bs, max(4096, os.path.getsize(path) // 4096 * 4096))
    cmd = [args.fio, "--name=ref", f"--filename={path}", f"--rw={rw}", "--direct=1",
           "--ioengine=io_uring", f"--bs={bs}", "--iodepth=32", "--output-format=json"]
    if size is not None:
        cmd.append(f"--size={size}")
    if rw == "write":
        cmd.append("--end_fsync=1")
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    job = json.loads(out[out.find("{"):])["jobs"][0]
    part = job["write" if rw == "write" else "read"]
    if job.get("error") or (size is not None and part["io_bytes"] != size):
        raise RuntimeError(f"fio {rw} failed: {shlex.join(cmd)}")
    # runtime (ms) includes the end fsync; a job under fio's 1 ms resolution counts as 1 ms.
    return part["io_bytes"], max(part["runtime"], 1) / 1000.0


def fio(args: argparse.Namespace, rw: str, path: str, size: int) -> float:
    n, secs = fio_run(args, rw, path, size)
    return n / GB / secs


def fio_read_files(args: argparse.Namespace, paths: List[str]) -> float:
    """fio's O_DIRECT read of existing files, one after the other: GB/s over all of them."""
    runs = [fio_run(args, "read", p) for p in paths]
    return sum(n for n, _ in runs) / GB / sum(t for _, t in runs)


def evict_dir(path: str) -> None:
    for name in os.listdir(path):
        evict(os.path.join(path, name), drop_caches=False)


def unique_tensors(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    seen, out = set(), {}
    for k, v in state.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if key not in seen:
            seen.add(key)
            out[k] = v
    return out


def touch(obj) -> None:
    """Reads one byte per page of every tensor (lazy mmap loaders pay their I/O here)."""
    tensors = obj.values() if isinstance(obj, dict) else [obj]
    for t in tensors:
        if isinstance(t, dict):
            touch(t)
        elif isinstance(t, torch.Tensor) and t.numel():
            t.view(-1).view(torch.uint8)[::4096].sum()


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def med(xs: List[float]) -> float:
    return statistics.median(xs)


def row(rows: List[list], what: str, ours: List[float], ref: List[float], target: float,
        higher_is_better: bool = True) -> None:
    r = med(ours) / med(ref)
    best = (max(ours) / min(ref)) if higher_is_better else (min(ours) / max(ref))
    ok = r >= target if higher_is_better else r <= target
    rows.append([what, f"{r:.2f}", f"{best:.2f}", ("≥ " if higher_is_better else "≤ ") + f"{target:g}",
                 "pass" if ok else "FAIL"])


def overlap(args: argparse.Namespace, root: str) -> Dict[str, List[float]]:
    """Step times without and with a save_async per step (optimizer hooked)."""
    torch.manual_seed(0)
    model = models.build(args.model, gpu=args.gpu)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq))
    if args.gpu:
        ids = ids.cuda()

    def step() -> None:
        loss = model(input_ids=ids).logits.float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if args.gpu:
            torch.cuda.synchronize()  # a step is over when the device finished it

    for _ in range(2):
        step()  # warm-up: gradients allocated, allocator and kernels settled
    plain: List[float] = []
    with_ckpt: List[float] = []
    with fastpersist.CheckpointManager(root, keep_last=1) as mgr:
        mgr.hook_optimizer(opt)
        mgr.save(0, model.state_dict())  # warm-up: allocates the staging memory
        # Plain and checkpointing steps alternate, so drifts of this shared machine hit both.
        for i in range(args.steps):
            plain.append(timed(step))

            def ckpt_step() -> None:
                mgr.save_async(i + 1, model.state_dict())
                step()
            with_ckpt.append(timed(ckpt_step))
            mgr.wait()  # the rest of the write finishes outside the timed steps
    gc.collect()  # the model and optimizer go with this frame
    return {"plain": plain, "ckpt": with_ckpt}


def write_json(args: argparse.Namespace, m: Dict[str, List[float]], size: int,
               rows: List[list]) -> None:
    """Every measurement with its unit and direction, so that tools compare runs by name."""
    metrics = {k: {"unit": METRICS[k][0], "higher_is_better": METRICS[k][1],
                   "description": METRICS[k][2], "values": v}
               for k, v in m.items() if v}
    out = {
        "benchmark": "checkpoint_manager_bench",
        "command": shlex.join([os.path.basename(sys.executable)] + sys.argv),
        "model": args.model, "bytes": size, "rounds": args.rounds, "gpu": args.gpu,
        "folder": os.path.abspath(args.folder),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "fastpersist": getattr(fastpersist, "__version__", "unknown"),
                     "fastpersist_path": os.path.dirname(fastpersist.__file__)},
        "metrics": metrics,
        "targets": [dict(zip(["target", "ratio_median", "best_of", "wanted", "verdict"], r))
                    for r in rows],
    }
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", default="bench-data")
    p.add_argument("--model", default="gpt2-large", choices=sorted(models.MODELS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="training steps per variant (overlap)")
    p.add_argument("--seq", type=int, default=64, help="sequence length of a training step")
    p.add_argument("--fio", default=shutil.which("fio") or "fio")
    p.add_argument("--skip-overlap", action="store_true")
    p.add_argument("--gpu", action="store_true",
                   help="the state and the training steps on CUDA: snapshots copy device memory "
                        "into pinned staging (loads still go to the CPU, except load_into)")
    p.add_argument("--no-references", action="store_true",
                   help="skip safetensors, torch.load, the save without checksums and the "
                        "fresh-memory diagnostic (fio and fastpersist's own measurements stay)")
    p.add_argument("--json", metavar="PATH", help="also write every measurement as JSON")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--no-verdicts", action="store_true",
                   help="print the ratios only, without the issue targets and pass/FAIL (what "
                        "`make demo` shows: the targets are checked here, with --check)")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    refs = not args.no_references
    print("command: " + shlex.join([os.path.basename(sys.executable)] + sys.argv), flush=True)

    folder = os.path.abspath(args.folder)
    root = os.path.join(folder, "ckpt-root")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(folder, exist_ok=True)
    fio_path = os.path.join(folder, "fio-ref.dat")
    st_path = os.path.join(folder, "ref.safetensors")
    pt_path = os.path.join(folder, "ref.pt")

    if args.gpu and not torch.cuda.is_available():
        sys.exit("error: --gpu needs CUDA, but torch.cuda.is_available() is False")
    torch.manual_seed(0)
    model = models.build(args.model, gpu=args.gpu)
    state = model.state_dict()
    del model
    size = sum(t.numel() * t.element_size() for t in unique_tensors(state).values())
    fio_size = max(1, size // (8 * MiB)) * 8 * MiB
    log(f"{args.model}: {size / GB:.2f} GB of tensors")

    from safetensors.torch import load_file, save_file
    if refs:
        save_file(unique_tensors(state), st_path)
        torch.save(state, pt_path)

    m: Dict[str, List[float]] = {k: [] for k in METRICS if not k.startswith("step_")}
    mgr = fastpersist.CheckpointManager(root)
    mgr.save("warmup", state)  # the first save allocates (and pins) the staging memory
    mgr.remove("warmup")
    nock_root = os.path.join(folder, "ckpt-root-nochecksums")
    shutil.rmtree(nock_root, ignore_errors=True)
    nock = None
    if refs:
        nock = fastpersist.CheckpointManager(nock_root, checksums=False)
        nock.save("warmup", state)
        nock.remove("warmup")
    for r in range(args.rounds):
        log(f"round {r + 1}/{args.rounds}")
        m["fio_write"].append(fio(args, "write", fio_path, fio_size))
        m["fio_read_new"].append(fio(args, "read", fio_path, fio_size))
        os.sync()

        h = None

        def sync_save() -> None:
            nonlocal h
            h = mgr.save_async(f"sync-{r}", state)
            h.wait()
        t = timed(sync_save)
        m["save"].append(size / GB / t)
        m["checksum_frac"].append(h.checksum_seconds / t)
        os.sync()

        if nock is not None:
            t_nock = timed(lambda: nock.save(f"nock-{r}", state))
            m["save_nock"].append(size / GB / t_nock)
            nock.remove(f"nock-{r}")
            os.sync()

        t0 = time.perf_counter()
        h2 = mgr.save_async(f"async-{r}", state)
        block = time.perf_counter() - t0
        h2.wait()
        m["save_async_block"].append(block)
        m["save_block"].append(block / t)
        mgr.remove(f"async-{r}")
        os.sync()

        # The reference read is fio reading the checkpoint's own data files (same bytes, same
        # place on the device, same age in the host's caches), before or after the load in
        # alternate rounds so neither side always gets the warmer device.
        ckpt_dir = mgr.path(f"sync-{r}")
        data_files = sorted(os.path.join(ckpt_dir, n) for n in os.listdir(ckpt_dir)
                            if n.endswith(".safetensors"))

        def our_load() -> None:
            evict_dir(ckpt_dir)
            t = timed(lambda: mgr.load(f"sync-{r}"))
            m["load"].append(size / GB / t)

        def fio_load() -> None:
            evict_dir(ckpt_dir)
            m["fio_read"].append(fio_read_files(args, data_files))

        def our_load_into() -> None:
            # In place, into the state's own (warm) tensors, as a resume into a built model does.
            evict_dir(ckpt_dir)
            t = timed(lambda: mgr.load(f"sync-{r}", into=state))
            m["load_into"].append(size / GB / t)

        def our_verify() -> None:
            evict_dir(ckpt_dir)
            problems: List[str] = []

            def run() -> None:
                problems.extend(mgr.verify(f"sync-{r}"))
            t = timed(run)
            if problems:
                raise RuntimeError(f"verify of an intact checkpoint found problems: {problems}")
            m["verify"].append(size / GB / t)

        loaders = [fio_load, our_load, our_load_into, our_verify]
        turn = r % len(loaders)
        for fn in loaders[turn:] + loaders[:turn]:
            fn()
        mgr.remove(f"sync-{r}")
        gc.collect()

        if refs:
            evict(st_path)
            t = timed(lambda: touch(load_file(st_path)))
            m["st_load"].append(size / GB / t)
            gc.collect()
            evict(pt_path)
            t = timed(lambda: touch(torch.load(pt_path, weights_only=True)))
            m["torch_load"].append(size / GB / t)
            gc.collect()
            # Diagnostic: how fast this process gets `size` bytes of new memory right now
            # (allocate and write once). A fresh load must fault in as much; fio reuses one
            # buffer. Measured last in the round, since it also warms the memory for whatever
            # allocates next.
            t = timed(lambda: torch.empty(size, dtype=torch.uint8).fill_(1))
            m["fresh_memory"].append(size / GB / t)
            gc.collect()
    mgr.close()
    if nock is not None:
        nock.close()
    shutil.rmtree(nock_root, ignore_errors=True)
    for path in (fio_path, st_path, pt_path):
        if os.path.exists(path):
            os.unlink(path)

    steps = None if args.skip_overlap else overlap(args, root)
    shutil.rmtree(root, ignore_errors=True)

    print(f"\n{args.model}: {size / GB:.2f} GB, {args.rounds} rounds, folder {folder}\n")
    print("| measure | median GB/s per round |")
    print("|---|---|")
    for k in ["fio_write", "save", "save_nock", "fio_read_new", "fio_read", "load", "load_into",
              "verify", "st_load", "torch_load", "fresh_memory"]:
        if m[k]:
            print(f"| {k} | {' '.join(f'{x:.2f}' for x in m[k])} |")
    print(f"| save_async blocks / sync save | {' '.join(f'{x:.3f}' for x in m['save_block'])} |")
    print(f"| checksum CPU time / save time | {' '.join(f'{x:.3f}' for x in m['checksum_frac'])} |")
    if steps:
        print(f"| step s (plain) | {' '.join(f'{x:.2f}' for x in steps['plain'])} |")
        print(f"| step s (with save_async) | {' '.join(f'{x:.2f}' for x in steps['ckpt'])} |")

    rows: List[list] = []
    row(rows, "save vs fio write", m["save"], m["fio_write"], 0.9)
    one = [1.0] * args.rounds
    row(rows, "save_async blocking / sync save", m["save_block"], one, 0.10, higher_is_better=False)
    if refs:
        # Checksum cost: how much longer a save with checksums takes than one without (wall time).
        row(rows, "save time with / without checksums", m["save_nock"], m["save"], 1.10,
            higher_is_better=False)
    row(rows, "load (cold, verified) vs fio read of its files", m["load"], m["fio_read"], 0.9)
    row(rows, "load into= existing tensors vs fio read of its files", m["load_into"], m["fio_read"], 0.9)
    if refs:
        row(rows, "load vs safetensors.load_file (cold)", m["load"], m["st_load"], 2.5)
        row(rows, "load vs torch.load (cold)", m["load"], m["torch_load"], 2.5)
    if steps:
        row(rows, "step with save_async / plain step", steps["ckpt"], steps["plain"], 1.10,
            higher_is_better=False)
    if args.no_verdicts:
        print("\n| comparison | ratio (median) | best-of |")
        print("|---|---|---|")
        for r in rows:
            print("| " + " | ".join(r[:3]) + " |")
    else:
        print("\n| target | ratio (median) | best-of | wanted | |")
        print("|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    if args.json:
        if steps:
            m["step_plain"], m["step_ckpt"] = steps["plain"], steps["ckpt"]
        write_json(args, m, size, rows)
    return 1 if args.check and any(r[-1] != "pass" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
