#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two builds' CheckpointManager loads, as a resume does them: each run is a new process that
opens the root, drops the page cache, loads the checkpoint into new memory (`fresh`), then,
with the cache dropped again, into those tensors (`into`, in place), then `fastpersist.load`s
a torch.save file of the same tensors (written by fastpersist.save). Runs alternate A B B A ...
between a baseline and a candidate interpreter (each with its own fastpersist installed) on
one checkpoint, saved once by the candidate. With --hold each process first allocates and
fills as many bytes as the checkpoint, as a training script that built its model does.
Standard library in the driver; medians printed.

    python3 bench/fresh_load_ab.py --baseline /work/baseline-python --candidate .venv/bin/python \\
        --folder bench-data --size-gib 4 --pairs 3 --hold
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import fastpersist
from fastpersist.bench.loaders import drop_all_caches
root, mode = sys.argv[1], sys.argv[2]
if mode == "save":
    import torch
    g = torch.Generator().manual_seed(0)
    n = int(sys.argv[3])
    state = {f"t{i}": torch.randn(16 << 20, generator=g) for i in range(max(1, n // (64 << 20)))}
    with fastpersist.CheckpointManager(root) as m:
        m.save("a", state)
    fastpersist.save(state, root + ".pt")
    sys.exit()
m = fastpersist.CheckpointManager(root)
if sys.argv[3] != "0":  # hold as much memory as a built model of the checkpoint's size
    import torch
    held = torch.ones(int(sys.argv[3]), dtype=torch.uint8)
drop_all_caches()
t0 = time.perf_counter(); x = m.load("a"); fresh = time.perf_counter() - t0
n = sum(t.numel() * t.element_size() for t in x.values())
drop_all_caches()
t0 = time.perf_counter(); m.load("a", into=x); into = time.perf_counter() - t0
del x
drop_all_caches()
t0 = time.perf_counter(); y = fastpersist.load(root + ".pt"); single = time.perf_counter() - t0
print(json.dumps({"fresh": n / 1e9 / fresh, "into": n / 1e9 / into, "fastpersist.load": n / 1e9 / single}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True)
    p.add_argument("--candidate", required=True)
    p.add_argument("--folder", default="bench-data")
    p.add_argument("--size-gib", type=float, default=4.0)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--hold", action="store_true",
                   help="each process first allocates and fills as many bytes as the checkpoint "
                        "(a built model), as a resume does")
    a = p.parse_args()
    root = os.path.join(os.path.abspath(a.folder), "fresh-load-ab")
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run([a.candidate, "-c", CHILD, root, "save", str(int(a.size_gib * 2**30))], check=True)
    runs = {"baseline": [], "candidate": []}
    order = []
    for i in range(a.pairs):
        order += ["baseline", "candidate"] if i % 2 == 0 else ["candidate", "baseline"]
    for build in order:
        exe = a.baseline if build == "baseline" else a.candidate
        hold = str(int(a.size_gib * 2**30)) if a.hold else "0"
        out = subprocess.run([exe, "-c", CHILD, root, "load", hold], check=True, stdout=subprocess.PIPE,
                             text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        runs[build].append(r)
        print(f"{build:9s} fresh {r['fresh']:.2f} GB/s, into {r['into']:.2f} GB/s, "
              f"fastpersist.load {r['fastpersist.load']:.2f} GB/s", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    os.unlink(root + ".pt")
    print("\n| load | baseline GB/s | candidate GB/s | candidate / baseline |\n|---|---:|---:|---:|")
    for k in ("fresh", "into", "fastpersist.load"):
        b = statistics.median(r[k] for r in runs["baseline"])
        c = statistics.median(r[k] for r in runs["candidate"])
        print(f"| {k} | {b:.2f} | {c:.2f} | {c / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
