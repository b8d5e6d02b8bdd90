#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 3's checkpoint targets, measured in one run on one folder.

For each workload (a Hugging Face model's checkpoint, `python -m fastpersist.bench model`, and
one big tensor, `... tensor`), every round runs fio's O_DIRECT write of the same number of bytes
and then one `python -m fastpersist.bench` run of the save mechanisms, their order rotating from
round to round. Then `python -m fastpersist.bench load` times torch.load, fastpersist.load (and
safetensors) on the cold file. It prints a markdown table per workload with each target's ratio
(ratio of the medians over the rounds; best-of in brackets) and pass/fail:

- test_ds_aio_fast_save >= 0.90 x fio write (io_uring, O_DIRECT, bs 8M, iodepth 32, end_fsync);
- test_ds_aio_fast_save >= 4 x test_save_fsync;
- test_ds_aio_fast_save >= 1.2 x deepspeed_fast_save (skipped when deepspeed is not importable);
- the writer's pinned memory equals the configured buffer, whatever the checkpoint size, and the
  save's peak RSS growth stays near it;
- fastpersist.load >= 2.5 x torch.load on a file evicted from the page cache.

Python standard library only; run from a source checkout with the package installed in .venv:
    python3 bench/checkpoint_vs_fio.py --folder bench-data --rounds 3
"""
import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

GB = 1e9
MiB = 1 << 20
RESULT = re.compile(r"^(\w+) -- (\d+\.\d+) GB, (\d+\.\d+) secs, (\d+\.\d+) GB/s$")
SKIPPED = re.compile(r"^(\w+) -- skipped: (.*)$")
STATS = re.compile(r"^\s*fastpersist stats = \{(.*)\}$")
SAVE_TAGS = ["test_save_fsync", "test_ds_aio_fast_save", "deepspeed_fast_save"]


class BenchError(Exception):
    pass


def run(cmd, timeout=3600):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise BenchError(f"command failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
                         f"{proc.stderr.strip()[-3000:]}\n{proc.stdout.strip()[-3000:]}")
    return proc.stdout


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def default_python():
    here = os.path.dirname(os.path.abspath(__file__))
    venv = os.path.normpath(os.path.join(here, "..", ".venv", "bin", "python"))
    return venv if os.access(venv, os.X_OK) else sys.executable


# ------------------------------------------------------------------ fio
def fio_command(args, path, size):
    return [args.fio, "--name=w", f"--filename={path}", "--rw=write", "--direct=1",
            "--ioengine=io_uring", "--bs=8M", "--iodepth=32", "--end_fsync=1", f"--size={size}",
            "--output-format=json"]


def fio_write(args, size):
    path = os.path.join(args.folder, "fio.dat")
    remove(path)
    out = run(fio_command(args, path, size))
    remove(path)
    os.sync()  # the deleted file's blocks are discarded at the journal commit: not in the next timing
    job = json.loads(out[out.find("{"):])["jobs"][0]
    if job.get("error"):
        raise BenchError(f"fio reported error {job['error']}")
    w = job["write"]
    if w["io_bytes"] != size:
        raise BenchError(f"fio wrote {w['io_bytes']} bytes instead of {size}")
    return w["io_bytes"] / GB / (w["runtime"] / 1000.0)  # runtime (ms) includes the fsync


# ------------------------------------------------------------------ fastpersist.bench
def bench_command(args, workload, extra):
    return [args.python, "-m", "fastpersist.bench", *workload, "--folder", args.folder, *extra]


def parse_bench(text):
    rates, sizes, skipped, stats = {}, {}, {}, []
    for line in text.splitlines():
        m = RESULT.match(line)
        if m:
            tag, gb, secs = m.group(1), float(m.group(2)), float(m.group(3))
            # A size that prints as 0.00 GB (a tiny model) falls back to the printed rate.
            rate = gb / secs if secs > 0 and gb > 0 else float(m.group(4))
            rates.setdefault(tag, []).append(rate)
            sizes[tag] = gb
            continue
        m = SKIPPED.match(line)
        if m:
            skipped[m.group(1)] = m.group(2)
            continue
        m = STATS.match(line)
        if m:
            fields = {}
            for item in m.group(1).split(", "):
                k, _, v = item.partition(": ")
                fields[k] = float(v) if "." in v else int(v)
            stats.append(fields)
    return rates, sizes, skipped, stats


def fio_size_for(gb):
    """fio --size in bytes: the checkpoint's size rounded to whole 8 MiB blocks (fio drops a
    partial last block)."""
    return max(1, round(gb * GB / (8 * MiB))) * 8 * MiB


def measure_workload(args, name, workload):
    save = {tag: [] for tag in SAVE_TAGS}
    fio, skipped, stats, size_gb = [], {}, [], None
    tags = SAVE_TAGS if not args.all_tags else []
    for r in range(args.rounds):
        extra = ["--rotate", str(r)] + (["--only", *tags] if tags else [])
        if size_gb is not None and r % 2 == 1:  # alternate which goes first
            fio.append(fio_write(args, fio_size_for(size_gb)))
            log(f"{name} round {r + 1}: fio write {fio[-1]:.2f} GB/s")
        out = run(bench_command(args, workload, extra))
        rates, sizes, sk, st = parse_bench(out)
        for line in out.splitlines():
            if RESULT.match(line) or SKIPPED.match(line):
                log(f"{name} round {r + 1}: {line}")
        for tag, values in rates.items():
            save.setdefault(tag, []).extend(values)
        skipped.update(sk)
        stats.extend(st)
        if size_gb is None:
            size_gb = sizes.get("test_ds_aio_fast_save")
            if size_gb is None:
                raise BenchError(f"no test_ds_aio_fast_save line in:\n{out}")
        if r % 2 == 0:
            fio.append(fio_write(args, fio_size_for(size_gb)))
            log(f"{name} round {r + 1}: fio write {fio[-1]:.2f} GB/s")
    load_out = run(bench_command(args, ["load", *workload[1:]], ["--loops", str(args.load_loops)]))
    load_rates, _, load_skipped, _ = parse_bench(load_out)
    for line in load_out.splitlines():
        if RESULT.match(line) or SKIPPED.match(line) or line.startswith("# warning"):
            log(f"{name} load: {line}")
    return {"name": name, "size_gb": size_gb, "fio_size": fio_size_for(size_gb), "fio": fio,
            "save": save, "skipped": {**skipped, **load_skipped}, "stats": stats,
            "load": load_rates}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ report
def med(values):
    return statistics.median(values) if values else None


def ratio_row(label, ours, theirs, target, rows):
    if not ours or not theirs or not med(theirs):
        return f"| {label} | — | ≥ {target:g} | not measured |"
    r_med = med(ours) / med(theirs)
    r_best = max(ours) / max(theirs)
    ok = r_med >= target
    rows.append({"target": label, "ratio_median": r_med, "ratio_best": r_best, "pass": ok})
    return (f"| {label} | {med(ours):.2f} / {med(theirs):.2f} GB/s | {r_med:.2f} ({r_best:.2f}) | "
            f"≥ {target:g} | {'yes' if ok else 'NO'} |")


def report(args, results):
    summary = []
    sizes = []
    for res in results:
        rows = []
        aio = res["save"].get("test_ds_aio_fast_save", [])
        print(f"### {res['name']}: {res['size_gb']:.2f} GB checkpoint "
              f"(fio --size={res['fio_size']})")
        print()
        print("| target | medians (ours / theirs) | ratio median (best) | required | pass |")
        print("|---|---:|---:|---:|---|")
        print(ratio_row("test_ds_aio_fast_save / fio write", aio, res["fio"], 0.90, rows))
        print(ratio_row("test_ds_aio_fast_save / test_save_fsync", aio,
                        res["save"].get("test_save_fsync"), 4.0, rows))
        if res["save"].get("deepspeed_fast_save"):
            print(ratio_row("test_ds_aio_fast_save / deepspeed_fast_save", aio,
                            res["save"]["deepspeed_fast_save"], 1.2, rows))
        else:
            why = res["skipped"].get("deepspeed_fast_save", "not run")
            print(f"| test_ds_aio_fast_save / deepspeed_fast_save | — | — | ≥ 1.2 | skipped: {why} |")
        pinned = sorted({s.get("pinned_bytes", -1) for s in res["stats"]})
        growth = [s["peak_rss_growth_bytes"] for s in res["stats"] if "peak_rss_growth_bytes" in s]
        configured = args.io_buffer_mb * MiB
        pin_ok = pinned == [configured]
        sizes.append((res["size_gb"], pinned, max(growth) if growth else None))
        grow_txt = f"; peak RSS growth {max(growth) / MiB:.0f} MiB" if growth else ""
        print(f"| pinned staging memory | {', '.join(str(p // MiB) for p in pinned)} MiB{grow_txt} "
              f"| — | = {args.io_buffer_mb} MiB | {'yes' if pin_ok else 'NO'} |")
        rows.append({"target": "pinned", "pinned_bytes": pinned, "peak_rss_growth_bytes": growth,
                     "pass": pin_ok})
        print(ratio_row("fastpersist_load / torch_load (cold)", res["load"].get("fastpersist_load"),
                        res["load"].get("torch_load"), 2.5, rows))
        print()
        print("All runs (GB/s), in run order; median in brackets:")
        print()
        series = [("fio write", res["fio"])] + [(t, v) for t, v in res["save"].items() if v] + \
                 [(t, v) for t, v in res["load"].items()]
        for label, values in series:
            print(f"- {label}: {' '.join(f'{v:.2f}' for v in values)} [{med(values):.2f}]")
        if res["skipped"]:
            for tag, why in res["skipped"].items():
                print(f"- {tag}: skipped ({why})")
        print()
        summary.append({"workload": res["name"], "rows": rows, **res})
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", required=True, help="folder on the storage to test")
    p.add_argument("--model", default="gpt2-large", help="model workload (default gpt2-large)")
    p.add_argument("--mb_size", type=int, default=4096, help="tensor workload in MiB (default 4096)")
    p.add_argument("--workloads", default="model,tensor", help="model, tensor or both")
    p.add_argument("--rounds", type=int, default=3, help="save rounds per workload (default 3)")
    p.add_argument("--load_loops", type=int, default=3, help="cold loads per loader (default 3)")
    p.add_argument("--all_tags", action="store_true",
                   help="run every save mechanism, not only the three the targets compare")
    p.add_argument("--io_buffer_mb", type=int, default=64, help="must match the bench's default")
    p.add_argument("--python", default=default_python(), help="interpreter with fastpersist")
    p.add_argument("--fio", default="fio")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args()
    args.folder = os.path.abspath(args.folder)
    if not os.path.isdir(args.folder):
        p.error(f"--folder {args.folder}: no such directory")
    if shutil.which(args.fio) is None:
        p.error(f"fio not found ('{args.fio}'); apt-get install fio")
    if args.rounds < 1 or args.load_loops < 1:
        p.error("--rounds and --load_loops must be at least 1")
    workloads = []
    for w in [w for w in args.workloads.split(",") if w]:
        if w == "model":
            workloads.append((args.model, ["model", "--model", args.model]))
        elif w == "tensor":
            workloads.append((f"{args.mb_size} MiB tensor", ["tensor", "--mb_size", str(args.mb_size)]))
        else:
            p.error(f"unknown workload {w!r} (model, tensor)")

    try:
        out = run([args.python, "-c", "import torch, fastpersist\n"
                   "try:\n import deepspeed; ds = deepspeed.__version__\n"
                   "except Exception: ds = 'not importable'\n"
                   "print('VERSIONS', torch.__version__, fastpersist.__version__, ds)"])
        versions = next(line.split()[1:] for line in out.splitlines()
                        if line.startswith("VERSIONS "))
        fio_version = run([args.fio, "--version"]).strip()
        print(f"reproduce: {shlex.join(['python3', *sys.argv])}")
        print(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {platform.node()}, "
              f"{os.cpu_count()} CPUs, Linux {platform.release()}; {fio_version}, torch "
              f"{versions[0]}, fastpersist {versions[1]}, deepspeed {' '.join(versions[2:])}; "
              f"folder {args.folder}; GB = 1e9 bytes")
        print(f"fio: {shlex.join(fio_command(args, os.path.join(args.folder, 'fio.dat'), '<bytes>'))}")
        for name, w in workloads:
            print(f"save: {shlex.join(bench_command(args, w, ['--rotate', '<round>', '--only', *SAVE_TAGS]))}")
            print(f"load: {shlex.join(bench_command(args, ['load', *w[1:]], ['--loops', str(args.load_loops)]))}")
        print(f"{args.rounds} rounds per workload (fio and one bench run each, alternating which "
              "goes first; the bench rotates its mechanisms' order); verdicts on the ratio of the "
              "medians")
        print()
        results = [measure_workload(args, name, w) for name, w in workloads]
        summary = report(args, results)
    except (BenchError, subprocess.TimeoutExpired) as e:
        print(f"checkpoint_vs_fio: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
