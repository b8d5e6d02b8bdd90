#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checkpoint loads side by side: the installed fastpersist against another build of it
(``--baseline DIR``: a directory holding another ``fastpersist`` package, put first on
PYTHONPATH), in one run, rounds alternating between the two.

Each measurement runs in a fresh interpreter on the same checkpoint (written once by the
installed package, with its data files evicted from the page cache before every cold load):

- ``new``: ``load_checkpoint(path)`` into new memory (cold);
- ``into``: the same load ``into=`` preallocated tensors (cold, in place);
- ``bf16``: ``load_checkpoint(path, dtype=torch.bfloat16)`` (cold, converted);
- ``bf16_budget``: the same with ``max_memory="64MiB"`` (cold, streamed);
- ``many``: a warm load of a checkpoint of ``--many`` tiny tensors (planning and per-tensor
  overhead, not I/O).

Within a round the variant that goes first alternates, so the order cannot favour one.

    .venv/bin/python bench/checkpoint_load_bench.py --folder bench-data --size-mib 1024 \\
        --baseline /tmp/fastpersist-main --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

_CHILD = r"""
import json, os, sys, time
import torch
import fastpersist
from fastpersist.bench.loaders import evict

path, many_path, what = sys.argv[1], sys.argv[2], sys.argv[3]

def cold():
    for name in os.listdir(path):
        if name.startswith("tensors-"):
            evict(os.path.join(path, name))

def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

if what == "many":
    fastpersist.load_checkpoint(many_path)
    seconds = timed(lambda: fastpersist.load_checkpoint(many_path))
elif what == "into":
    dest = {k: torch.empty_like(v) for k, v in fastpersist.load_checkpoint(path).items()}
    cold()
    seconds = timed(lambda: fastpersist.load_checkpoint(path, into=dest))
else:
    kwargs = {"new": {}, "bf16": {"dtype": torch.bfloat16},
              "bf16_budget": {"dtype": torch.bfloat16, "max_memory": "64MiB"}}[what]
    cold()
    seconds = timed(lambda: fastpersist.load_checkpoint(path, **kwargs))
print(json.dumps({"seconds": seconds, "module": fastpersist.__file__}))
"""

WHAT = ["new", "into", "bf16", "bf16_budget", "many"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="bench-data")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--many", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", help="directory with another fastpersist package")
    args = ap.parse_args()

    import torch

    import fastpersist

    root = os.path.join(os.path.abspath(args.folder), "load-bench")
    path, many_path = os.path.join(root, "step-00000001"), os.path.join(root, "many", "step-00000001")
    if not os.path.isdir(path):
        n = args.size_mib << 18  # float32 elements
        tensors = 64
        state = {f"layer{i}.weight": torch.randn(n // tensors) for i in range(tensors)}
        with fastpersist.CheckpointManager(root) as mgr:
            mgr.save(1, state)
    if not os.path.isdir(many_path):
        with fastpersist.CheckpointManager(os.path.join(root, "many")) as mgr:
            mgr.save(1, {f"expert{i}.w": torch.full((4,), float(i)) for i in range(args.many)})

    variants = {"installed": None}
    if args.baseline:
        variants["baseline"] = os.path.abspath(args.baseline)
    results: dict = {v: {w: [] for w in WHAT} for v in variants}
    names = list(variants)
    for round_index in range(args.rounds):
        for what in WHAT:
            # Alternate which variant goes first: the storage may favour the second read.
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for variant in order:
                extra = variants[variant]
                env = dict(os.environ)
                if extra:
                    env["PYTHONPATH"] = extra + os.pathsep + env.get("PYTHONPATH", "")
                proc = subprocess.run([sys.executable, "-c", _CHILD, path, many_path, what], env=env,
                                      capture_output=True, text=True, check=True)
                results[variant][what].append(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])
    print("command:", " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    size_gb = args.size_mib / 1024 * 1.073741824
    print(f"{'load':<12}" + "".join(f"{v:>22}" for v in variants) + "   (median s, GB/s; best in brackets)")
    for what in WHAT:
        row = f"{what:<12}"
        for variant in variants:
            times = results[variant][what]
            med = statistics.median(times)
            rate = "" if what == "many" else f" {size_gb / med:5.2f}GB/s"
            row += f"{med:>10.3f}s [{min(times):.3f}]{rate:>0}".rjust(22)
        print(row)


if __name__ == "__main__":
    main()
