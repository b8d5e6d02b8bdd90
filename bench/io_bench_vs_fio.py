#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fastpersist io-bench versus fio on the same folder, in the same run.

For each op (write, read) it runs fio (io_uring, O_DIRECT, --end_fsync=1 for writes) and then
`fastpersist io-bench` once per available backend with the same block size and queue depth,
interleaved so that a noisy neighbour slows both sides alike, and prints a markdown table of the
best-of-N rates (GB = 1e9 bytes). Exits non-zero only when something fails to run; a ratio below
--target is reported in the table, not treated as an error.

Python standard library only; runs from a source checkout:
    python3 bench/io_bench_vs_fio.py --folder /mnt/nvme --size 4GiB
"""
import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

BACKENDS = ("io_uring", "libaio", "threads")
OPS = ("write", "read")
GB = 1e9


class BenchError(Exception):
    pass


def parse_size(text):
    """Same rules as fastpersist's parse_size: K/M/G/T (with or without "iB") are powers of 1024."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m or (m.group(3) and m.group(3).lower() == "ib" and not m.group(2)):
        raise argparse.ArgumentTypeError(f"cannot parse size '{text}' (examples: 64MiB, 8M, 4GiB)")
    return int(m.group(1)) << (10 * " kmgt".index(m.group(2).lower() or " "))


def human(n):
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def default_cli():
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "..", "build", "tools", "fastpersist"),
                      os.path.join("build", "tools", "fastpersist")):
        if os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    return shutil.which("fastpersist") or "build/tools/fastpersist"


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise BenchError(f"command failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
                         f"{proc.stderr.strip()}\n{proc.stdout.strip()[-2000:]}")
    return proc.stdout


def parse_json(text, what):
    # fio may print notes before its JSON document.
    start = text.find("{")
    try:
        return json.loads(text[start:])
    except (ValueError, TypeError) as e:
        raise BenchError(f"cannot parse JSON from {what}: {e}\n{text[:2000]}") from e


def evict(path):
    """Writes back and drops the file's pages, so a read comes from storage, not memory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fio_command(args, op, path):
    # Sizes go to fio in bytes: with fio's default kb_base=1024, "4GiB" means 4e9 bytes.
    cmd = [args.fio, f"--name={op[0]}", f"--filename={path}", f"--rw={op}", "--direct=1",
           "--ioengine=io_uring", f"--bs={args.block_size}", f"--iodepth={args.queue_depth}",
           f"--size={args.size}"]
    if op == "write":
        cmd.append("--end_fsync=1")
    return cmd + ["--output-format=json"]


def fio_once(args, op, path):
    if op == "write":
        remove(path)  # a new file each time, as io-bench does
    else:
        if not os.path.exists(path) or os.path.getsize(path) < args.size:
            remove(path)
            run(fio_command(args, "write", path))  # lay the file out; not measured
        evict(path)
    job = parse_json(run(fio_command(args, op, path)), "fio")["jobs"][0]
    stats = job[op]
    if job.get("error"):
        raise BenchError(f"fio reported error {job['error']}")
    if stats["io_bytes"] != args.size:
        raise BenchError(f"fio moved {stats['io_bytes']} bytes instead of {args.size}")
    # runtime is in ms and, for writes, includes the final fsync.
    return stats["io_bytes"] / GB / (stats["runtime"] / 1000.0)


def fastpersist_command(args, op, backend):
    return [args.cli, "io-bench", "--folder", args.folder, "--size", str(args.size), f"--{op}",
            "--backend", backend, "--block-size", str(args.block_size), "--queue-depth",
            str(args.queue_depth), "--loops", "1", "--json"]


def fastpersist_once(args, op, backend):
    result = parse_json(run(fastpersist_command(args, op, backend)), "fastpersist io-bench")
    if result["backend"] != backend:
        raise BenchError(f"io-bench ran {result['backend']} instead of {backend}")
    return [loop["gb_per_s"] for loop in result["loops"]], result


def available_backends(args):
    report = parse_json(run([args.cli, "report", "--json", "--folder", args.folder]), "report")
    found = {b["name"]: b for b in report["backends"]}
    chosen = []
    for name in args.backends:
        if found.get(name, {}).get("available"):
            chosen.append(name)
        else:
            print(f"note: skipping backend {name}: {found.get(name, {}).get('reason', 'unknown')}",
                  file=sys.stderr)
    if not report["folder"].get("direct_io"):
        why = report["folder"].get("fallback_reason") or report["folder"].get("error")
        print(f"note: the folder refuses O_DIRECT ({why}); fio --direct=1 will fail",
              file=sys.stderr)
    return chosen, report


def measure(args, backends):
    """Each repetition runs every tool once per op, in a rotating order, so that drift on a shared
    machine (a neighbour's burst, host cache pressure) cannot favour one side."""
    fio_path = os.path.join(args.folder, "fio.dat")
    fio = {op: [] for op in args.ops}
    fp = {(b, op): [] for b in backends for op in args.ops}
    tools = ["fio"] + backends
    try:
        for rep in range(args.loops):
            order = tools[rep % len(tools):] + tools[:rep % len(tools)]
            for op in args.ops:
                for tool in order:
                    if tool == "fio":
                        rate = fio_once(args, op, fio_path)
                        fio[op].append(rate)
                        remove(fio_path)  # reads lay out a fresh file, as io-bench does
                    else:
                        rates, _ = fastpersist_once(args, op, tool)
                        rate = rates[0]
                        fp[(tool, op)].append(rate)
                    name = tool if tool == "fio" else "fastpersist " + tool
                    print(f"loop {rep + 1} {op:5s} {name}: {rate:.2f} GB/s",
                          file=sys.stderr, flush=True)
    finally:
        remove(fio_path)
    return fio, fp


def print_table(args, backends, fio, fp):
    print(f"| backend | op | fastpersist GB/s | fio GB/s | ratio | pass (>= {args.target:.2f}) |")
    print("|---|---|---:|---:|---:|---|")
    rows = []
    for b in backends:
        for op in args.ops:
            ours, theirs = max(fp[(b, op)]), max(fio[op])
            ratio = ours / theirs if theirs > 0 else float("inf")
            ok = ratio >= args.target
            rows.append({"backend": b, "op": op, "fastpersist_gb_per_s": ours,
                         "fio_gb_per_s": theirs, "ratio": ratio, "pass": ok,
                         "fastpersist_loops": fp[(b, op)], "fio_loops": fio[op]})
            verdict = "yes" if ok else "NO"
            print(f"| {b} | {op} | {ours:.2f} | {theirs:.2f} | {ratio:.3f} | {verdict} |")
    print()
    print("All loops (GB/s), best first; median in brackets:")
    print()
    for op in args.ops:
        series = [("fio io_uring", fio[op])] + [(f"fastpersist {b}", fp[(b, op)]) for b in backends]
        for name, values in series:
            ordered = " ".join(f"{v:.2f}" for v in sorted(values, reverse=True))
            print(f"- {op} {name}: {ordered} [{statistics.median(values):.2f}]")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", required=True, help="folder on the storage to test")
    p.add_argument("--size", type=parse_size, default=parse_size("4GiB"),
                   help="bytes per run (default 4GiB, the issue's figure)")
    p.add_argument("--cli", default=default_cli(), help="the fastpersist executable")
    p.add_argument("--fio", default="fio", help="the fio executable")
    p.add_argument("--block-size", type=parse_size, default=parse_size("8M"))
    p.add_argument("--queue-depth", type=int, default=32)
    p.add_argument("--loops", type=int, default=5, help="timed runs per tool and op (best-of)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset")
    p.add_argument("--ops", default=",".join(OPS), help="write, read or both")
    p.add_argument("--target", type=float, default=0.90, help="pass when ratio >= this")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = p.parse_args()

    args.folder = os.path.abspath(args.folder)
    args.backends = [b for b in args.backends.split(",") if b]
    args.ops = [o for o in args.ops.split(",") if o]
    for b in args.backends:
        if b not in BACKENDS:
            p.error(f"unknown backend '{b}' (expected {', '.join(BACKENDS)})")
    for o in args.ops:
        if o not in OPS:
            p.error(f"unknown op '{o}' (expected write, read)")
    if not os.path.isdir(args.folder):
        p.error(f"--folder {args.folder}: no such directory")
    if args.size == 0 or args.size % args.block_size != 0:
        p.error("--size must be a positive multiple of --block-size "
                "(fio drops a partial last block)")
    if args.loops < 1 or args.queue_depth < 1:
        p.error("--loops and --queue-depth must be at least 1")
    if shutil.which(args.fio) is None:
        p.error(f"fio not found ('{args.fio}'); apt-get install fio")
    cli_ok = os.path.isfile(args.cli) and os.access(args.cli, os.X_OK)
    if not cli_ok and shutil.which(args.cli) is None:
        p.error(f"fastpersist CLI not found ('{args.cli}'); build it or pass --cli")

    try:
        backends, report = available_backends(args)
        fio_version = run([args.fio, "--version"]).strip()
        print(f"reproduce: {shlex.join([sys.executable, *sys.argv])}")
        fio_line = shlex.join(fio_command(args, "write", os.path.join(args.folder, "fio.dat")))
        print(f"fio:         {fio_line}")
        print("             (and --rw=read without --end_fsync, after evicting the file from the "
              "page cache)")
        fp_line = shlex.join(fastpersist_command(args, "write", "<backend>"))
        print(f"fastpersist: {fp_line} (and --read)")
        print("each loop runs every tool once per op, in rotating order; "
              "a read first writes a fresh file")
        print(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {fio_version}, "
              f"fastpersist {report['version']}, folder {args.folder}, size {human(args.size)}, "
              f"block size {human(args.block_size)}, "
              f"queue depth {args.queue_depth}, best of {args.loops}, GB = 1e9 bytes")
        print()
        if not backends:
            raise BenchError("no fastpersist backend to test")
        fio, fp = measure(args, backends)
        rows = print_table(args, backends, fio, fp)
    except BenchError as e:
        print(f"io_bench_vs_fio: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "block_size": args.block_size,
                       "queue_depth": args.queue_depth, "folder": args.folder, "rows": rows},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
