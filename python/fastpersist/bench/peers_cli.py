# SPDX-License-Identifier: Apache-2.0
"""The ``peers`` subcommand of ``python -m fastpersist.bench`` (``make bench``): arguments, the
untimed set-up (workload, fio's limit, DCP's thread_count), the rounds, and the outputs."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from typing import Any, List

from .. import config
from .._system import parse_size
from . import fio as fio_limit
from . import models, peers, peers_report, workloads

SAVE_KEYS = ["torch_save", "torch_save_fsync", "safetensors_save", "dcp_save", "deepspeed_save",
             "fastpersist_save", "manager_save", "manager_save_async", "fio_write"]
LOAD_KEYS = ["torch_load", "torch_load_mmap", "safetensors_load", "dcp_load", "fastpersist_load",
             "manager_load", "manager_load_into", "fio_read"]
# What a load case reads is written by a save case of the same round.
_LOAD_NEEDS = {"torch_load": "torch_save_fsync", "torch_load_mmap": "torch_save_fsync",
               "fastpersist_load": "torch_save_fsync", "safetensors_load": "safetensors_save",
               "dcp_load": "dcp_save", "manager_load": "manager_save",
               "manager_load_into": "manager_save", "fio_read": "fio_write"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "peers", help="every checkpoint library here and fastpersist, saving and loading the "
        "same tensors, against fio's limit (GB/s, ratios, CPU s/GB, peak memory)",
        description=peers.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", required=True, help="I/O folder (e.g. an NVMe mount)")
    p.add_argument("--workload", default="flat",
                   help="flat (tensors of --size bytes in all) or a model name "
                        f"({', '.join(sorted(models.MODELS))}) with its Adam state (default flat)")
    p.add_argument("--size", default="4GiB", help="the flat workload's size (default 4GiB)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, medians reported (default 3)")
    p.add_argument("--only", nargs="+", metavar="CASE", choices=SAVE_KEYS + LOAD_KEYS,
                   help="run only these cases (a load also runs the save that writes its input)")
    p.add_argument("--dcp-threads", type=int, nargs="+", default=[1, 2, 4], metavar="N",
                   help="FileSystemWriter thread_count values tried; the fastest is measured "
                        "(default 1 2 4)")
    p.add_argument("--fio", default=fio_limit.find(), help="fio executable (default: on PATH)")
    p.add_argument("--json", metavar="PATH", help="also write every measurement as JSON")
    p.add_argument("--markdown", metavar="FILE",
                   help="write the table, the machine and the command into FILE between "
                        "<!-- peers:WORKLOAD:begin/end --> markers (appended when absent)")
    p.add_argument("--plot", metavar="PNG", help="a bar chart of the medians (needs matplotlib)")
    p.add_argument("--no-verdicts", action="store_true",
                   help="print the table only, without the targets and pass/FAIL")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _chosen(only: List[str]) -> List[str]:
    keys = list(only)
    for k in only:
        need = _LOAD_NEEDS.get(k)
        if need and need not in keys:
            keys.append(need)
    return keys


def _check_outputs(args: argparse.Namespace) -> None:
    for flag in ("json", "markdown", "plot"):
        path = getattr(args, flag)
        if path is None:
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path) or not os.path.isdir(parent):
            sys.exit(f"error: --{flag} {path!r}: " +
                     ("is a directory" if os.path.isdir(path) else f"no folder {parent!r}"))
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit("error: --plot needs matplotlib (pip install 'fastpersist[plot]')")


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.folder):
        sys.exit(f"error: --folder {args.folder!r} is not a directory")
    if args.rounds < 1:
        sys.exit("error: --rounds must be at least 1")
    if any(n < 1 for n in args.dcp_threads):
        sys.exit("error: --dcp-threads values must be at least 1")
    try:
        size = parse_size(args.size)
    except ValueError as e:
        sys.exit(f"error: --size: {e}")
    if args.workload != "flat" and args.workload not in models.MODELS:
        sys.exit(f"error: --workload {args.workload!r}: flat or one of {', '.join(sorted(models.MODELS))}")
    _check_outputs(args)
    command = shlex.join([os.path.basename(sys.executable), "-m", "fastpersist.bench"] + sys.argv[1:])
    only = _chosen(args.only) if args.only else None

    t0 = time.perf_counter()
    wl = workloads.build(args.workload, size)
    _log(f"workload {wl.name}: {len(wl.tensors)} tensors, {wl.nbytes / 1e9:.2f} GB, "
         f"built in {time.perf_counter() - t0:.1f}s")
    folder = os.path.abspath(args.folder)
    # Every file of the run lives in a folder of its own, removed at the end.
    work = tempfile.mkdtemp(prefix="fastpersist-peers-", dir=folder)
    s = peers.Setup(workload=wl, folder=work, fio=args.fio, log=_log)
    fio_path = s.path("peers-fio.dat")
    try:
        if args.fio and (only is None or {"fio_write", "fio_read"} & set(only)):
            active = config.active_config()
            tuned = fio_limit.from_engine(active["engine"]) if active["path"] else None
            options = fio_limit.candidates(tuned)
            step = max(o.numjobs * o.block_size for o in options)
            s.fio_bytes = max(step, wl.nbytes // step * step)
            _log(f"fio: the limit, trying {len(options)} settings on {s.fio_bytes / 1e9:.2f} GB"
                 + (f" (tune's from {active['path']} first)" if tuned else ""))
            s.fio_write, s.fio_read = fio_limit.best(args.fio, fio_path, s.fio_bytes, options, _log)
        elif not args.fio:
            _log("fio not found: no limit column (apt install fio)")
        if only is None or "dcp_save" in only:
            s.dcp_threads = peers.choose_dcp_threads(s, sorted(set(args.dcp_threads)))
        results = peers.run(s, args.rounds, only)
    finally:
        s.close()
        shutil.rmtree(work, ignore_errors=True)

    rows = peers_report.summarize(results)
    info = peers_report.machine(folder)
    print(f"\n{wl.name}: {wl.nbytes / 1e9:.2f} GB, {args.rounds} rounds (medians), folder {folder}")
    print(f"# {command}\n")
    print(peers_report.tables(rows))
    print("\nvs fastest peer: against the fastest durable peer of the same kind; of limit: of "
          "fio's best O_DIRECT rate; CPU s/GB: the process's CPU time (every thread); peak "
          "MiB: growth of its peak RSS.")
    target_rows = peers_report.targets(rows)
    if not args.no_verdicts and target_rows:
        print("\n" + peers_report.targets_table(target_rows))
    if args.json:
        peers_report.write_json(args.json, peers_report.to_json(command, wl.name, wl.nbytes,
                                                                args.rounds, info, rows, target_rows))
    if args.markdown:
        key = args.workload if args.workload != "flat" else f"flat-{args.size}"
        peers_report.write_markdown(args.markdown, key, peers_report.markdown_section(
            command, wl.name, wl.nbytes, args.rounds, info, rows))
    if args.plot:
        peers_report.plot(args.plot, f"{wl.name}, {wl.nbytes / 1e9:.2f} GB, {args.rounds} rounds", rows)
    return 1 if args.check and any(t[-1] != "pass" for t in target_rows) else 0
