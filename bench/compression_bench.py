#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compressed checkpoints against raw ones (issue 12), side by side in one run.

For each model state and each codec (raw, zstd level 1, lz4), in an order that rotates every
round, on one folder:

- a durable ``CheckpointManager.save``: GB/s of raw tensor bytes, the ratio to raw's save in
  the same round, and the process's CPU seconds (all threads) per GB;
- the compression ratio (tensor bytes / stored bytes, from the manifest);
- ``save_async``: the time until the snapshot is taken (what a hooked optimizer waits for),
  against raw's;
- a cold ``CheckpointManager.load`` (files evicted from the page cache, checksums verified,
  every core decoding), GB/s and the ratio to raw's load, CPU seconds per GB.

States (built here, nothing downloaded; this VM reaches no model hub):
- ``gpt2-large-fp32`` / ``gpt2-large-bf16``: GPT2-large (774M parameters) from its config,
  with Hugging Face's own initialisation (normal, std 0.02), as fp32 and as bf16;
- ``adam``: a small GPT-2 (4 layers, 384 wide, byte vocabulary) trained with AdamW for
  --train-steps real steps on this repository's documentation, the model plus the optimizer's
  state (step, exp_avg, exp_avg_sq): what a resumable checkpoint of a run holds.

    .venv/bin/python bench/compression_bench.py --folder bench-data --rounds 2

Medians over the rounds; ``--json PATH`` writes every measurement.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

import fastpersist
from fastpersist.bench import models
from fastpersist.bench.loaders import evict
from fastpersist.bench.table import aligned, medians, rotated

GB = 1e9
CODECS = ("raw", "zstd", "lz4")
ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def tensor_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


def gpt2_large(dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = models.build("gpt2-large")
    return {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}


def trained_adam(steps: int) -> Dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    text = b"".join(p.read_bytes() for p in sorted((ROOT / "docs").glob("*.md")))
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.long)
    cfg = GPT2Config(n_embd=384, n_layer=4, n_head=6, n_positions=128, vocab_size=256)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(1)
    t0 = time.time()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 129, (16,), generator=g)
        batch = torch.stack([data[s:s + 128] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(f"# adam: {steps} AdamW steps on docs/*.md ({len(text)} bytes) in {time.time() - t0:.0f} s, "
          f"final loss {loss.item():.3f}", file=sys.stderr)
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


STATES: Dict[str, Callable[[argparse.Namespace], Any]] = {
    "gpt2-large-fp32": lambda a: gpt2_large(torch.float32),
    "gpt2-large-bf16": lambda a: gpt2_large(torch.bfloat16),
    "adam": lambda a: trained_adam(a.train_steps),
}


def checkpoint_files(path: str) -> List[str]:
    return [os.path.join(path, n) for n in os.listdir(path)]


def stored_ratio(path: str) -> float:
    """Raw tensor bytes / stored bytes, from the manifest (tied tensors count once)."""
    with open(os.path.join(path, "manifest.json")) as f:
        tensors = json.load(f)["tensors"]
    return sum(t["length"] for t in tensors) / max(1, sum(t["stored_length"] for t in tensors))


def measure(folder: Path, codec: str, state: Any, nbytes: int) -> Dict[str, float]:
    root = folder / codec
    shutil.rmtree(root, ignore_errors=True)
    compression = None if codec == "raw" else codec
    out: Dict[str, float] = {}
    with fastpersist.CheckpointManager(root, compression=compression) as mgr:
        gc.collect()
        c0, t0 = cpu_seconds(), time.perf_counter()
        mgr.save("sync", state)
        out["save_s"] = time.perf_counter() - t0
        out["save_cpu_s"] = cpu_seconds() - c0
        out["ratio"] = stored_ratio(mgr.path("sync"))
        t0 = time.perf_counter()
        handle = mgr.save_async("async", state)
        handle.wait_snapshot()
        out["async_block_s"] = time.perf_counter() - t0
        handle.wait()
        mgr.remove("async")
        for p in checkpoint_files(mgr.path("sync")):
            evict(p)
        gc.collect()
        c0, t0 = cpu_seconds(), time.perf_counter()
        loaded = mgr.load("sync")
        out["load_s"] = time.perf_counter() - t0
        out["load_cpu_s"] = cpu_seconds() - c0
        del loaded
    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", required=True, help="a folder on the storage to measure")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--states", default=",".join(STATES), help="comma-separated: " + ", ".join(STATES))
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--json", help="also write every measurement here")
    a = p.parse_args(argv)
    folder = Path(a.folder) / "compression-bench"
    folder.mkdir(parents=True, exist_ok=True)
    results: Dict[str, Dict[str, List[Dict[str, float]]]] = {}
    rows = []
    for name in a.states.split(","):
        state = STATES[name](a)
        nbytes = tensor_bytes(state)
        runs: Dict[str, List[Dict[str, float]]] = {c: [] for c in CODECS}
        for r in range(a.rounds):
            for codec in rotated(CODECS, r):
                runs[codec].append(measure(folder, codec, state, nbytes))
                print(f"# {name} round {r + 1} {codec}: {runs[codec][-1]}", file=sys.stderr)
        results[name] = runs
        med = {c: medians(runs[c]) for c in CODECS}
        raw = med["raw"]
        for codec in CODECS:
            m = med[codec]
            rows.append([name, codec, f"{nbytes / GB:.2f}", f"{m['ratio']:.3f}",
                         f"{nbytes / m['save_s'] / GB:.2f}", f"{raw['save_s'] / m['save_s']:.2f}",
                         f"{m['save_cpu_s'] / (nbytes / GB):.2f}",
                         f"{m['async_block_s']:.3f}", f"{m['async_block_s'] / raw['async_block_s']:.2f}",
                         f"{nbytes / m['load_s'] / GB:.2f}", f"{raw['load_s'] / m['load_s']:.2f}",
                         f"{m['load_cpu_s'] / (nbytes / GB):.2f}"])
        del state
        gc.collect()
    header = ["state", "codec", "GB", "ratio", "save GB/s", "vs raw", "save CPU s/GB",
              "async block s", "vs raw", "load GB/s", "vs raw", "load CPU s/GB"]
    print(f"cores: {os.cpu_count()}, rounds: {a.rounds} (medians); GB/s of raw tensor bytes; "
          "'vs raw' = speed relative to raw in the same round (>1 faster; async: blocking time ratio)")
    print(aligned(header, rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
