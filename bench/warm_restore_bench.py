#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Warm restore (issue 13): ``resume(optimizer="background")`` against a full resume, on a real
training loop, side by side in one run.

A checkpoint of a model (GPT-2 large by default, built from its config, nothing downloaded) and
its AdamW state after --train-steps real training steps is saved once. Then each round runs
both cases, in rotated order, each in a fresh process with the page cache dropped before it:

- ``full``: ``mgr.resume(into={"model": ...})`` then ``optimizer.load_state_dict(...)``: the
  first forward pass starts when everything is loaded;
- ``warm``: ``mgr.hook_optimizer(opt)``, ``mgr.resume(into=..., optimizer="background")``: the
  first forward pass starts once the model is loaded, and the optimizer's first ``step()`` waits
  for its state.

Each process then trains --steps steps and prints its times (from the manager's creation) and a
digest of its final parameters and optimizer state: the two cases must train to the same bytes,
or the run fails.

    .venv/bin/python bench/warm_restore_bench.py --folder bench-data --rounds 3

Prints a table of medians and the warm/full ratios; ``--json PATH`` writes every measurement.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

import fastpersist
from fastpersist.bench import models
from fastpersist.bench.loaders import drop_all_caches
from fastpersist.bench.table import markdown, rotated

CASES = ("full", "warm")
# resume_s (when resume() returned) is also recorded: the first forward pass starts right then.
COLUMNS = (("first_forward_s", "first forward starts"), ("first_step_s", "first step done"),
           ("last_step_s", "all steps done"))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)



def train_step(model: Any, opt: torch.optim.Optimizer, batch: Dict[str, Any]) -> None:
    out = model(**batch, labels=batch["input_ids"])
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def digest(model: Any, opt: torch.optim.Optimizer) -> str:
    h = hashlib.blake2b(digest_size=16)
    for t in model.state_dict().values():
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    for per_param in opt.state_dict()["state"].values():
        for v in per_param.values():
            if isinstance(v, torch.Tensor):
                h.update(v.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def prepare(root: Path, model_name: str, train_steps: int) -> int:
    """Saves the checkpoint both cases resume from; returns its tensor bytes."""
    model = models.build(model_name)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = models.sample_input(model)
    for _ in range(train_steps):
        train_step(model, opt, batch)
    shutil.rmtree(root, ignore_errors=True)
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.save(train_steps, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                               "step": train_steps})
        return mgr.checkpoints()[-1].tensor_bytes


def child(mode: str, root: Path, model_name: str, steps: int) -> Dict[str, Any]:
    """One resume and `steps` training steps; times are from the manager's creation."""
    model = models.build(model_name, seed=1)  # other weights: the resume must replace them
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = models.sample_input(model)
    began = time.perf_counter()
    mgr = fastpersist.CheckpointManager(root)
    if mode == "warm":
        mgr.hook_optimizer(opt)
        _, state = mgr.resume(into={"model": model.state_dict()}, strict=False,
                              optimizer="background")
    else:
        _, state = mgr.resume(into={"model": model.state_dict()}, strict=False)
        opt.load_state_dict(state["optimizer"])
    times: Dict[str, Any] = {"resume_s": time.perf_counter() - began}
    times["first_forward_s"] = time.perf_counter() - began
    step_ends: List[float] = []
    for _ in range(steps):
        train_step(model, opt, batch)
        step_ends.append(time.perf_counter() - began)
    mgr.close()
    times.update(first_step_s=step_ends[0], last_step_s=step_ends[-1], digest=digest(model, opt))
    return times


def run_child(mode: str, root: Path, model_name: str, steps: int) -> Dict[str, Any]:
    drop_all_caches()
    proc = subprocess.run([sys.executable, __file__, "--child", mode, "--root", str(root),
                           "--model", model_name, "--steps", str(steps)],
                          stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=Path("bench-data"))
    ap.add_argument("--model", default="gpt2-large",  # causal language models
                    choices=sorted(m for m in models.MODELS if m != "tiny-t5"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="training steps after the resume")
    ap.add_argument("--train-steps", type=int, default=2, help="training steps before the save")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.root, args.model, args.steps)))
        return 0
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be at least 1")

    root = args.folder / "warm-restore"
    log(f"saving {args.model} + AdamW after {args.train_steps} training steps into {root}")
    size = prepare(root, args.model, args.train_steps)
    runs: Dict[str, List[Dict[str, Any]]] = {c: [] for c in CASES}
    for r in range(args.rounds):
        for case in rotated(CASES, r):
            runs[case].append(run_child(case, root, args.model, args.steps))
            log(f"round {r + 1} {case}: " + ", ".join(
                f"{k} {runs[case][-1][k]:.2f}" for k, _ in COLUMNS))
    digests = {run["digest"] for case in CASES for run in runs[case]}
    if len(digests) != 1:
        log(f"FAIL: the runs trained to different states: {sorted(digests)}")
        return 1

    med = {c: {k: statistics.median(run[k] for run in runs[c]) for k, _ in COLUMNS} for c in CASES}
    print(f"\n{args.model}: checkpoint {size / 1e9:.2f} GB of tensors (model + AdamW), "
          f"{args.steps} training steps after the resume, {args.rounds} rounds, medians "
          "(seconds from the manager's creation)\n")
    rows = [[c, *(f"{med[c][k]:.2f}" for k, _ in COLUMNS)] for c in CASES]
    rows.append(["warm / full", *(f"{med['warm'][k] / med['full'][k]:.2f}" for k, _ in COLUMNS)])
    print(markdown(["case", *(title for _, title in COLUMNS)], rows))
    print("\nBoth cases trained to the same bytes (parameters and optimizer state).")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "tensor_bytes": size, "runs": runs,
                                         "medians": med}, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
