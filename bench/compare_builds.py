#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two builds of fastpersist side by side in one run: benchmark scripts, run in turns under a
baseline and a candidate interpreter (each with its own fastpersist installed), on one folder.

Rounds interleave as A B, B A, A B, ... so that a drift of the disk, of the host's caches or of
the neighbours' load hits both builds alike. Every run writes its measurements as JSON
(`--json`); the table gives each metric's median per build, candidate / baseline, and each
build's min-max over its runs. Standard library only; from the candidate's checkout:

    python3 bench/compare_builds.py bench/checkpoint_manager_bench.py \\
        --baseline /work/baseline/.venv/bin/python --candidate .venv/bin/python --rounds 3

With several scripts, each run of a build runs them one after the other, and metric names get
the script's name as a prefix.

Which script each interpreter runs (`--scripts`): `candidate` runs the candidate tree's script
under both, so both builds do exactly the same work; `own` runs each tree's own script; `auto`
(the default) first runs the candidate's script under the baseline on a tiny size and uses it
for both when that works, each tree's own script otherwise. The output says which, and why.
Known scripts get default arguments (PROFILES: one inner round per run, no reference loaders
where the script can leave them out), so that with gpt2-large and --rounds 3 each script takes
an estimated 5 to 7 minutes on a 2 GB/s disk. Arguments after `--` go to every script, after
those defaults, so they override them. Use --rounds 3 or more for a verdict: with 2, both of the
candidate's runs sit together in the middle of A B B A.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Dict, List, NamedTuple, Optional


class Profile(NamedTuple):
    run_args: List[str]    # "{model}" is replaced by --model
    probe_args: List[str]  # the smallest run that exercises the same API calls
    takes_python: bool     # the script runs `--python <interpreter> -m fastpersist.bench`


PROFILES = {
    "checkpoint_manager_bench.py": Profile(
        ["--model", "{model}", "--rounds", "1", "--skip-overlap", "--no-references"],
        ["--model", "tiny-t5", "--rounds", "1", "--skip-overlap", "--no-references"], False),
    "checkpoint_vs_fio.py": Profile(
        ["--workloads", "model", "--model", "{model}", "--rounds", "1", "--load_loops", "1"],
        ["--workloads", "tensor", "--mb_size", "8", "--rounds", "1", "--load_loops", "1"], True),
}
SIDES = ("baseline", "candidate")


class CompareError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tree_of(interpreter: str) -> Optional[str]:
    """The checkout whose `.venv/bin/python` this is (not resolved: venv pythons are links)."""
    parts = os.path.abspath(interpreter).split(os.sep)
    if len(parts) > 3 and parts[-3] == ".venv":
        return os.sep.join(parts[:-3])
    return None


def git_commit(tree: str) -> str:
    proc = subprocess.run(["git", "-C", tree, "describe", "--always", "--dirty", "--abbrev=12"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc.stdout.strip() or "not a git checkout"


def package_of(interpreter: str) -> str:
    code = ("import os, fastpersist; "
            "print(fastpersist.__version__, os.path.dirname(fastpersist.__file__))")
    proc = subprocess.run([interpreter, "-c", code],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise CompareError(f"{interpreter} cannot import fastpersist:\n"
                           f"{proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip()


def metrics_of(doc) -> Dict[str, dict]:
    """{name: {unit, higher_is_better, values}} from a benchmark's --json file."""
    if isinstance(doc, dict) and "metrics" in doc:
        return doc["metrics"]
    if isinstance(doc, list):  # checkpoint_vs_fio.py: one entry per workload, all in GB/s
        out = {}
        for w in doc:
            series = [("fio write", w.get("fio", []))] + list(w.get("save", {}).items()) + \
                list(w.get("load", {}).items())
            for tag, values in series:
                if values:
                    out[f"{w['name']}: {tag}"] = {"unit": "GB/s", "higher_is_better": True,
                                                  "values": values}
        return out
    raise CompareError("unrecognised --json output (neither a 'metrics' object nor a list of "
                       "workloads)")


class Runner:
    def __init__(self, args: argparse.Namespace, logs: str) -> None:
        self.args, self.logs, self.count = args, logs, 0

    def command(self, side: str, script: str, bench_args: List[str], folder: str,
                json_path: str) -> List[str]:
        interpreter = getattr(self.args, side)
        cmd = [interpreter, script, *bench_args, "--folder", folder, "--json", json_path]
        profile = PROFILES.get(os.path.basename(script))
        if profile and profile.takes_python:
            cmd += ["--python", interpreter]
        return cmd

    def run(self, side: str, script: str, bench_args: List[str], folder: str, label: str) -> dict:
        """One run of the script; returns its JSON. Its stdout and stderr stay in the logs."""
        self.count += 1
        stem = os.path.join(self.logs, f"{self.count:02d}-{label}-{side}")
        cmd = self.command(side, script, bench_args, folder, stem + ".json")
        log(f"{label} {side}: {shlex.join(cmd)}")
        t0 = time.perf_counter()
        with open(stem + ".out", "w") as out, open(stem + ".err", "w") as err:
            try:
                rc = subprocess.run(cmd, stdout=out, stderr=err,
                                    timeout=self.args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        secs = time.perf_counter() - t0
        if rc != 0:
            with open(stem + ".err") as f:
                tail = f.read()[-3000:]
            raise CompareError(f"{label} {side} failed (exit {rc}) after {secs:.0f} s: "
                               f"{shlex.join(cmd)}\n{tail}")
        with open(stem + ".json") as f:
            doc = json.load(f)
        log(f"{label} {side}: done in {secs:.0f} s")
        return {"command": cmd, "seconds": secs, "metrics": metrics_of(doc)}


def accepts_json(interpreter: str, script: str) -> bool:
    proc = subprocess.run([interpreter, script, "--help"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    return proc.returncode == 0 and "--json" in proc.stdout


def choose_scripts(args: argparse.Namespace, runner: Runner, rel: str, probe_args: List[str]):
    """({side: the script it runs}, the sentence that says which and why)."""
    cand = os.path.join(args.candidate_tree, rel)
    own = os.path.join(args.baseline_tree, rel) if args.baseline_tree else None
    if args.which == "candidate":
        return {s: cand for s in SIDES}, "both builds run the candidate's (--scripts candidate)"
    why = "--scripts own"
    if args.which == "auto":
        probe = os.path.join(args.folder, "compare-probe")
        os.makedirs(probe, exist_ok=True)
        try:
            runner.run("baseline", cand, probe_args, probe, "probe")
            return {s: cand for s in SIDES}, (
                "both builds run the candidate's: it ran under the baseline's package in a probe "
                f"({shlex.join(probe_args)})")
        except CompareError as e:
            last = str(e).strip().splitlines()[-1]
            why = (f"the candidate's script failed under the baseline's package in a probe: "
                   f"{last}; logs in {runner.logs}")
    if not own or not os.path.exists(own):
        raise CompareError(f"{why}\nand the baseline has no script of its own at {own} "
                           "(give --baseline-tree)")
    if not accepts_json(args.baseline, own):
        raise CompareError(f"{why}\nand the baseline's own {own} has no --json output, so its "
                           "results cannot be read; compare with a script that works for both")
    return {"baseline": own, "candidate": cand}, f"each build runs its own tree's ({why})"


def spread(values: List[float]) -> str:
    m = statistics.median(values)
    pct = f" ({(max(values) - min(values)) / m * 100:.0f}%)" if m else ""
    return f"{min(values):.3g}–{max(values):.3g}{pct}"


def table(results: Dict[str, Dict[str, dict]]) -> List[dict]:
    names = list(results["baseline"]) + [n for n in results["candidate"]
                                         if n not in results["baseline"]]
    rows = []
    for name in names:
        meta = results["baseline"].get(name) or results["candidate"][name]
        vals = {s: results[s].get(name, {}).get("values", []) for s in SIDES}
        row = {"metric": name, "unit": meta["unit"], "higher_is_better": meta["higher_is_better"],
               **{f"{s}_values": vals[s] for s in SIDES}}
        if all(vals.values()):
            b, c = (statistics.median(vals[s]) for s in SIDES)
            row.update(baseline_median=b, candidate_median=c, ratio=c / b if b else None)
            better = (c > b) == meta["higher_is_better"]
            overlap = min(vals["baseline"]) <= max(vals["candidate"]) and \
                min(vals["candidate"]) <= max(vals["baseline"])
            # Two builds that do not differ at all still give separate ranges this often.
            chance = 2 / math.comb(len(vals["baseline"]) + len(vals["candidate"]),
                                   len(vals["baseline"]))
            row["chance_apart"] = chance
            row["reading"] = "ranges overlap" if overlap else (
                f"{'better' if better else 'WORSE'}: ranges apart ({chance:.0%} by chance)")
        rows.append(row)
    return rows


def print_table(rows: List[dict]) -> None:
    print("| metric | unit | baseline median | candidate median | candidate / baseline "
          "| baseline min–max (spread) | candidate min–max (spread) | |")
    print("|---|---|---:|---:|---:|---|---|---|")
    for r in rows:
        unit = r["unit"] + ("" if r["higher_is_better"] else ", lower is better")
        if "ratio" not in r:
            side = "baseline" if r["baseline_values"] else "candidate"
            print(f"| {r['metric']} | {unit} | | | | | | only the {side} measured it |")
            continue
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "—"
        print(f"| {r['metric']} | {unit} | {r['baseline_median']:.3g} "
              f"| {r['candidate_median']:.3g} | {ratio} | {spread(r['baseline_values'])} "
              f"| {spread(r['candidate_values'])} | {r['reading']} |")


class Bench(NamedTuple):
    label: str                 # metric prefix ("" with one script)
    scripts: Dict[str, str]    # side -> the script it runs
    args: List[str]            # profile defaults, then the user's
    why: str                   # which scripts, and why


def prepare(args: argparse.Namespace, runner: Runner, paths: List[str], extra: List[str],
            p: argparse.ArgumentParser) -> List[Bench]:
    benches = []
    for path in paths:
        script = os.path.abspath(path if os.path.exists(path)
                                 else os.path.join(args.candidate_tree, path))
        rel = os.path.relpath(script, args.candidate_tree)
        if rel.startswith("..") or not os.path.exists(script):
            p.error(f"{script}: not a file inside the candidate tree {args.candidate_tree}")
        profile = PROFILES.get(os.path.basename(script))
        bench_args = [a.replace("{model}", args.model) for a in profile.run_args] if profile else []
        bench_args += extra
        probe_args = profile.probe_args if profile else bench_args
        scripts, why = choose_scripts(args, runner, rel, probe_args)
        label = os.path.splitext(os.path.basename(script))[0] + ": " if len(paths) > 1 else ""
        benches.append(Bench(label, scripts, bench_args, why))
    return benches


def measure(args: argparse.Namespace, runner: Runner, benches: List[Bench]):
    """Interleaved rounds: ({side: {metric: {..., values}}}, every run)."""
    results: Dict[str, Dict[str, dict]] = {s: {} for s in SIDES}
    runs = []
    for r in range(args.rounds):
        for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
            for b in benches:
                out = runner.run(side, b.scripts[side], b.args, args.folder, f"round{r + 1}")
                runs.append({"round": r + 1, "side": side, **out})
                for name, metric in out["metrics"].items():
                    entry = results[side].setdefault(b.label + name, {**metric, "values": []})
                    entry["values"] += metric["values"]
    return results, runs


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scripts", nargs="+", metavar="script",
                   help="benchmark script(s), e.g. bench/checkpoint_manager_bench.py")
    p.add_argument("--baseline", required=True, help="interpreter with the baseline's fastpersist")
    p.add_argument("--candidate", default=os.path.join(here, ".venv", "bin", "python"),
                   help="interpreter with the candidate's fastpersist (default: this tree's .venv)")
    p.add_argument("--rounds", type=int, default=3, help="runs per build (default 3)")
    p.add_argument("--folder", default="bench-data", help="data folder both builds use")
    p.add_argument("--model", default="gpt2-large", help="model of the known scripts' defaults")
    p.add_argument("--scripts", dest="which", choices=["auto", "candidate", "own"], default="auto",
                   help="whose benchmark script each build runs (default auto)")
    p.add_argument("--baseline-tree", help="baseline checkout (default: from --baseline's .venv)")
    p.add_argument("--candidate-tree", default=here, help="candidate checkout (default: this one)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run (default 1800)")
    p.add_argument("--json", metavar="PATH", help="also write the comparison as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    args.baseline_tree = args.baseline_tree or tree_of(args.baseline)
    args.candidate_tree = os.path.abspath(args.candidate_tree)
    args.folder = os.path.abspath(args.folder)
    os.makedirs(args.folder, exist_ok=True)
    logs = os.path.join(args.folder, "compare-builds-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(logs)
    runner = Runner(args, logs)
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    try:
        pkgs = {s: package_of(getattr(args, s)) for s in SIDES}
        benches = prepare(args, runner, args.scripts, extra, p)
        results, runs = measure(args, runner, benches)
    except (CompareError, OSError) as e:
        print(f"compare_builds: error: {e}\nlogs: {logs}", file=sys.stderr)
        return 1
    rows = table(results)
    print(f"reproduce (from {os.getcwd()}): {shlex.join([sys.executable] + sys.argv)}")
    print(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {platform.node()}, "
          f"{os.cpu_count()} CPUs, Linux {platform.release()}; load average {load0[0]:.1f} at the "
          f"start, {os.getloadavg()[0]:.1f} at the end; "
          f"{(time.perf_counter() - t0) / 60:.1f} minutes; folder {args.folder}; logs {logs}")
    trees = {"baseline": args.baseline_tree, "candidate": args.candidate_tree}
    for side in SIDES:
        tree = f"{trees[side]} at {git_commit(trees[side])}" if trees[side] else "unknown tree"
        print(f"{side}: {getattr(args, side)}, fastpersist {pkgs[side]}; {tree}")
    print(f"{args.rounds} runs per build, interleaved "
          f"{' '.join('AB' if r % 2 == 0 else 'BA' for r in range(args.rounds))} (A = baseline)")
    for b in benches:
        cmd = runner.command("candidate", b.scripts["candidate"], b.args, args.folder, "<json>")
        print(f"{b.label or 'script: '}{b.why}; a candidate run: {shlex.join(cmd)}")
    print("medians over every value of every run; 'ranges overlap': this run cannot tell the two "
          "builds apart on that metric; 'ranges apart (N% by chance)': how often two identical "
          "builds would give separate ranges with this many values")
    print()
    print_table(rows)
    print()
    print("All values in run order:")
    for r in rows:
        print(f"- {r['metric']}: " + "; ".join(
            f"{s} {' '.join(f'{v:.3g}' for v in r[f'{s}_values'])}" for s in SIDES))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benches": [b._asdict() for b in benches], "packages": pkgs,
                       "rounds": args.rounds, "rows": rows, "runs": runs}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
