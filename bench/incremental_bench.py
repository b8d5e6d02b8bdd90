#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Incremental checkpoints against full ones (issue 12), side by side in one run.

Two real training runs of GPT-2 models (built from their configs, trained here on this
repository's documentation as bytes; nothing downloaded):

- ``lora``: GPT-2 large (774M parameters; --lora-model), a fine-tune with the whole model frozen
  (embeddings included) and a LoRA-style
  adapter (rank --rank, on every block's attention projection) trained with AdamW; the
  checkpoint holds the model, the adapter and the optimizer's state;
- ``full``: GPT-2 (124M; --full-model), every parameter trained with AdamW; the checkpoint holds the model and the
  optimizer's state.

After a base checkpoint, each round trains --steps-per-save steps and then saves the same state
once per mode (--modes), in an order that rotates: ``full``, a plain ``CheckpointManager``;
``full-zstd``, the same compressed; ``incremental``, ``CheckpointManager(incremental=True)``
(unchanged tensors stored as references to the base); ``xor-deltas``, the same with
``xor_deltas=True`` (changed float tensors stored as zstd-compressed XORs with the base when
that is smaller).
Both are durable ``save_async`` calls on one folder, timed until the snapshot is taken (what a
hooked optimizer waits for) and until committed.

Printed per run and mode: the state's size, the bytes that changed since the base (what an
incremental checkpoint must write), the bytes written (all files: data, sidecar, manifest), the
ratio of the two, the save's time and its speed-up over the full save of the same round, the CPU
seconds per GB of state, and the snapshot (blocking) time against the full one's.

    .venv/bin/python bench/incremental_bench.py --folder bench-data --rounds 3

Medians over the rounds; ``--json PATH`` writes every measurement.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

import fastpersist
from fastpersist.bench.loaders import drop_all_caches
from fastpersist.bench.table import aligned, medians

GB = 1e9
MB = 1e6
ROOT = Path(__file__).resolve().parent.parent
# mode -> the manager's settings (besides the root).
MODES: Dict[str, Dict[str, Any]] = {
    "full": {},
    "full-zstd": {"compression": "zstd"},
    "incremental": {"incremental": True},
    "xor-deltas": {"incremental": True, "xor_deltas": True},
}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Run:
    """A GPT-2 training run whose state() is what a resumable checkpoint holds."""

    CONFIGS = {"gpt2": dict(n_embd=768, n_layer=12, n_head=12),
               "gpt2-large": dict(n_embd=1280, n_layer=36, n_head=20)}

    def __init__(self, kind: str, rank: int, model: str) -> None:
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        text = b"".join(p.read_bytes() for p in sorted((ROOT / "docs").glob("*.md")))
        self.data = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.long)
        self.model = GPT2LMHeadModel(GPT2Config(n_positions=256, **self.CONFIGS[model]))
        width = self.CONFIGS[model]["n_embd"]
        self.kind = kind
        self.lora: Dict[str, torch.nn.Parameter] = {}
        if kind == "lora":
            self.model.requires_grad_(False)
            for i, block in enumerate(self.model.transformer.h):
                proj = block.attn.c_attn  # Conv1D width -> 3 x width
                a = torch.nn.Parameter(torch.randn(width, rank) * 0.01)
                b = torch.nn.Parameter(torch.zeros(rank, proj.nf))
                self.lora[f"h.{i}.attn.lora_A"] = a
                self.lora[f"h.{i}.attn.lora_B"] = b
                proj.register_forward_hook(lambda _m, inp, out, a=a, b=b: out + (inp[0] @ a) @ b)
            params = list(self.lora.values())
        else:
            params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(params, lr=1e-4)
        self.g = torch.Generator().manual_seed(1)

    def train(self, steps: int) -> float:
        loss = torch.zeros(())
        for _ in range(steps):
            starts = torch.randint(0, len(self.data) - 65, (4,), generator=self.g)
            batch = torch.stack([self.data[s:s + 64] for s in starts])
            loss = self.model(input_ids=batch, labels=batch).loss
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        return float(loss)

    def state(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}
        if self.lora:
            out["lora"] = {k: v.detach() for k, v in self.lora.items()}
        return out


def save_once(mgr: fastpersist.CheckpointManager, tag: str, state: Any) -> Dict[str, float]:
    """One durable save_async: the time until the snapshot is taken (what a hooked optimizer
    waits for) and until it is committed."""
    gc.collect()
    c0, t0 = cpu_seconds(), time.perf_counter()
    handle = mgr.save_async(tag, state)
    handle.wait_snapshot()
    block = time.perf_counter() - t0
    handle.wait()
    out = {"save_s": time.perf_counter() - t0, "save_cpu_s": cpu_seconds() - c0, "block_s": block,
           "written": float(handle.bytes), "referenced": float(handle.referenced_bytes),
           "full": 0.0 if handle.base else 1.0}
    # From the manifest: tied tensors count once there (the state dict lists them twice).
    with open(os.path.join(mgr.path(tag), "manifest.json")) as f:
        tensors = json.load(f)["tensors"]
    out["state_bytes"] = float(sum(t["length"] for t in tensors))
    out["changed"] = float(sum(t["length"] for t in tensors if "/" not in t["file"]))
    return out


def load_once(mgr: fastpersist.CheckpointManager, tag: str, into: Any) -> float:
    """A load of every tensor into existing memory (`into`: warm, so page faults do not
    weigh), checksums verified, after dropping the whole page cache: what reading, decoding
    and (for XOR deltas) reading the base cost."""
    drop_all_caches()
    t0 = time.perf_counter()
    mgr.load(tag, into=into)
    return time.perf_counter() - t0


def measure_run(kind: str, a: argparse.Namespace, folder: Path, modes: List[str]) -> Dict[str, List[Dict[str, float]]]:
    run = Run(kind, a.rank, a.lora_model if kind == "lora" else a.full_model)
    roots = {m: folder / f"{kind}-{m}" for m in modes}
    for r in roots.values():
        shutil.rmtree(r, ignore_errors=True)
    managers = {}
    for m in modes:
        settings = dict(MODES[m])
        if settings.get("incremental"):
            settings["full_every"] = a.rounds + 2
        managers[m] = fastpersist.CheckpointManager(roots[m], **settings)
    results: Dict[str, List[Dict[str, float]]] = {m: [] for m in modes}
    try:
        run.train(1)
        state = run.state()
        for m in modes:
            managers[m].save("base", state)  # the incremental managers' base
        into = copy.deepcopy(state)  # where the loads go: the same structure, its own memory
        for r in range(a.rounds):
            t0 = time.perf_counter()
            loss = run.train(a.steps_per_save)
            state = run.state()
            print(f"# {kind} round {r + 1}: {a.steps_per_save} steps in {time.perf_counter() - t0:.1f} s, "
                  f"loss {loss:.3f}", file=sys.stderr)
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for m in order:
                out = save_once(managers[m], f"r{r}", state)
                results[m].append(out)
            for m in order:
                results[m][-1]["load_s"] = load_once(managers[m], f"r{r}", into)
                print(f"# {kind} round {r + 1} {m}: {results[m][-1]}", file=sys.stderr)
            # The rounds' checkpoints are not needed again; the bases stay (a full save of an
            # incremental manager is the base of the next ones).
            for m in modes:
                if not (MODES[m].get("incremental") and results[m][-1]["full"]):
                    managers[m].remove(f"r{r}")
    finally:
        for mgr in managers.values():
            mgr.close()
        for r in roots.values():
            shutil.rmtree(r, ignore_errors=True)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", required=True, help="a folder on the storage to measure")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", default="lora,full", help="comma-separated: lora, full")
    p.add_argument("--steps-per-save", type=int, default=2)
    p.add_argument("--rank", type=int, default=8, help="the LoRA adapter's rank")
    p.add_argument("--lora-model", default="gpt2-large", choices=sorted(Run.CONFIGS))
    p.add_argument("--full-model", default="gpt2", choices=sorted(Run.CONFIGS),
                   help="the full fine-tune's model (its AdamW state triples the checkpoint)")
    p.add_argument("--modes", default="full,incremental,xor-deltas",
                   help="comma-separated, the first is the reference: " + ", ".join(MODES))
    p.add_argument("--json", help="also write every measurement here")
    a = p.parse_args(argv)
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s): {', '.join(unknown)} (choose from {', '.join(MODES)})")
    folder = Path(a.folder) / "incremental-bench"
    folder.mkdir(parents=True, exist_ok=True)
    all_results: Dict[str, Any] = {}
    rows = []
    for kind in a.runs.split(","):
        results = measure_run(kind, a, folder, modes)
        all_results[kind] = results
        med = {m: medians(results[m]) for m in modes}
        for m in modes:  # bytes: the mean, since full and incremental saves may alternate
            med[m]["written"] = sum(x["written"] for x in results[m]) / len(results[m])
            med[m]["full_saves"] = sum(x["full"] for x in results[m])
        full = med[modes[0]]
        for m in modes:
            x = med[m]
            changed = x["changed"]
            rows.append([kind, m, f"{int(x['full_saves'])}/{len(results[m])}", f"{x['state_bytes'] / GB:.3f}",
                         f"{changed / MB:.1f}",
                         f"{x['written'] / MB:.1f}", f"{x['written'] / max(changed, 1):.3f}",
                         f"{x['save_s']:.3f}", f"{full['save_s'] / x['save_s']:.2f}",
                         f"{x['save_cpu_s'] / (x['state_bytes'] / GB):.2f}",
                         f"{x['block_s']:.3f}", f"{x['block_s'] / full['block_s']:.2f}",
                         f"{x['load_s']:.3f}", f"{x['load_s'] / full['load_s']:.2f}"])
        gc.collect()
    header = ["run", "mode", "full saves", "state GB", "changed MB", "written MB", "written/changed", "save s",
              "speed-up", "CPU s/GB", "snapshot s", "vs full", "load s", "load vs full"]
    print(f"cores: {os.cpu_count()}, rounds: {a.rounds} (medians), {a.steps_per_save} training "
          f"steps between saves; speed-up = {modes[0]} save time / this save time, same round; "
          f"'vs full' = snapshot (blocking) time / the {modes[0]} save's; loads into existing "
          "tensors after dropping the page cache; written MB: the mean over the rounds, the rest medians")
    print(aligned(header, rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(all_results, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
