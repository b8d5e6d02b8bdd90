# SPDX-License-Identifier: Apache-2.0
"""The peer benchmark's outputs: the table (plain and Markdown), the targets, the machine it ran
on, JSON, and a bar chart (matplotlib, optional)."""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from .peers import CaseResult
from .table import aligned, markdown

GB = 1e9


@dataclass
class Row:
    """One case's medians over the rounds (None where it did not run)."""

    result: CaseResult
    rate: Optional[float] = None  # GB/s
    seconds: Optional[float] = None
    blocking: Optional[float] = None
    cpu_per_gb: Optional[float] = None
    peak_bytes: Optional[int] = None
    vs_peer: Optional[float] = None
    of_limit: Optional[float] = None

    @property
    def case(self) -> Any:
        return self.result.case


def _summarize(r: CaseResult) -> Row:
    row = Row(r)
    if not r.samples or r.nbytes == 0:
        return row
    row.seconds = statistics.median(x.seconds for x in r.samples)
    row.rate = statistics.median(r.nbytes / GB / x.seconds for x in r.samples)
    row.cpu_per_gb = statistics.median(x.cpu_seconds for x in r.samples) / (r.nbytes / GB)
    blocking = [x.blocking_seconds for x in r.samples if x.blocking_seconds is not None]
    row.blocking = statistics.median(blocking) if blocking else None
    peaks = [x.peak_bytes for x in r.samples if x.peak_bytes is not None]
    row.peak_bytes = max(peaks) if peaks else None
    return row


def _is_peer(row: Row) -> bool:
    c = row.case
    return not c.ours and not c.limit and c.durable and row.rate is not None


def summarize(results: Sequence[CaseResult]) -> Dict[str, List[Row]]:
    """Rows by kind ("save", "load"), each with its ratio to the fastest peer of its kind
    (durable saves only: a save that leaves the data in the page cache does not compete) and
    its share of fio's rate of that kind."""
    out: Dict[str, List[Row]] = {"save": [], "load": []}
    for r in results:
        out[r.case.kind].append(_summarize(r))
    for rows in out.values():
        peers = [row.rate for row in rows if _is_peer(row) and row.rate]
        limits = [row.rate for row in rows if row.case.limit and row.rate]
        for row in rows:
            if row.rate is None:
                continue
            if peers and not row.case.limit:
                row.vs_peer = row.rate / max(peers)
            if limits:
                row.of_limit = row.rate / limits[0]
    return out


def _f(x: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "—" if x is None else f"{x:.{digits}f}{suffix}"


def _cells(row: Row, kind: str) -> List[str]:
    c = row.case
    name = c.name + (" [ours]" if c.ours else "")
    if row.rate is None:
        return [name] + [c.skipped or "did not run"] + [""] * (6 if kind == "save" else 5)
    mem = "—" if row.peak_bytes is None else f"{row.peak_bytes / 2**20:.0f}"
    cells = [name, _f(row.rate), _f(row.seconds)]
    if kind == "save":
        cells.append(_f(row.blocking if row.blocking is not None else row.seconds))
    cells += [_f(row.vs_peer, suffix="x"), "—" if row.of_limit is None else f"{row.of_limit:.0%}",
              _f(row.cpu_per_gb), mem]
    return cells


def headers(kind: str) -> List[str]:
    h = [kind, "GB/s", "s"]
    if kind == "save":
        h.append("blocks s")
    return h + ["vs fastest peer", "of limit", "CPU s/GB", "peak MiB"]


def tables(rows: Dict[str, List[Row]], fmt: str = "text") -> str:
    make = aligned if fmt == "text" else markdown
    parts = []
    for kind in ("save", "load"):
        if rows[kind]:
            parts.append(make(headers(kind), [_cells(r, kind) for r in rows[kind]]))
    return "\n\n".join(parts)


# ------------------------------------------------------------------ targets
def _get(rows: List[Row], key: str) -> Optional[Row]:
    for r in rows:
        if r.case.key == key and r.rate is not None:
            return r
    return None


def _best(rows: List[Row], pred: Any) -> Optional[Row]:
    chosen = [r for r in rows if r.rate is not None and pred(r)]
    return max(chosen, key=lambda r: r.rate or 0.0) if chosen else None


def targets(rows: Dict[str, List[Row]]) -> List[List[str]]:
    """[what, ours, reference, ratio, wanted, verdict] for the issue's targets that this run
    measured."""
    out: List[List[str]] = []

    def add(what: str, ours: Optional[Row], ref: Optional[Row], wanted: float,
            value: Any = None, higher: bool = True) -> None:
        if ours is None or ref is None:
            return
        a, b = (ours.rate, ref.rate) if value is None else (value(ours), value(ref))
        if a is None or b is None or b == 0:
            return
        ratio = a / b
        ok = ratio >= wanted if higher else ratio <= wanted
        out.append([what, ours.case.key, ref.case.key, f"{ratio:.2f}",
                    ("≥ " if higher else "≤ ") + f"{wanted:g}", "pass" if ok else "FAIL"])

    saves, loads = rows["save"], rows["load"]
    best_save = _best(saves, lambda r: r.case.ours)
    best_load = _best(loads, lambda r: r.case.ours)
    add("best save / fio's best O_DIRECT write", best_save, _best(saves, lambda r: r.case.limit), 0.95)
    add("best load / fio's best O_DIRECT read", best_load, _best(loads, lambda r: r.case.limit), 0.90)
    add("best save / DeepSpeed FastFileWriter", best_save, _get(saves, "deepspeed_save"), 1.3)
    add("best save / fastest durable peer save", best_save, _best(saves, _is_peer), 1.0)
    add("best load into new memory / fastest peer", _best(loads, lambda r: r.case.ours and not r.case.in_place),
        _best(loads, lambda r: _is_peer(r) and not r.case.in_place), 1.0)
    add("load in place / DCP in place", _get(loads, "manager_load_into"), _get(loads, "dcp_load"), 1.0)
    add("CPU s/GB: fastpersist.save / DeepSpeed", _get(saves, "fastpersist_save"),
        _get(saves, "deepspeed_save"), 1.0, value=lambda r: r.cpu_per_gb, higher=False)
    return out


def targets_table(rows: List[List[str]]) -> str:
    return aligned(["target", "ours", "reference", "ratio", "wanted", ""], rows)


# ------------------------------------------------------------------ the machine
def _first(path: str, prefix: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _mount_of(folder: str) -> str:
    best, found = "", "unknown"
    real = os.path.realpath(folder)
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, found = mnt, f"{fstype} on {dev} (mounted at {mnt})"
    except OSError:
        pass
    return found


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return str(getattr(mod, "__version__", "installed"))
    except Exception:  # noqa: BLE001 - a missing or broken package has no version
        return "not installed"


def machine(folder: str) -> Dict[str, str]:
    mem_kib = _first("/proc/meminfo", "MemTotal").split()[0]
    mem = f"{int(mem_kib) / 2**20:.1f} GiB" if mem_kib.isdigit() else "unknown"
    return {
        "cpu": f"{_first('/proc/cpuinfo', 'model name')}, {os.cpu_count()} cores",
        "memory": mem,
        "kernel": platform.release(),
        "folder": f"{os.path.abspath(folder)}: {_mount_of(folder)}",
        "python": sys.version.split()[0],
        "versions": ", ".join(f"{m} {_version(m)}" for m in ("torch", "safetensors", "deepspeed", "fastpersist")),
    }


# ------------------------------------------------------------------ files
def to_json(command: str, workload: str, nbytes: int, rounds: int, info: Dict[str, str],
            rows: Dict[str, List[Row]], target_rows: List[List[str]]) -> Dict[str, Any]:
    cases = []
    for kind in ("save", "load"):
        for row in rows[kind]:
            c = row.case
            cases.append({
                "key": c.key, "name": c.name, "kind": kind, "ours": c.ours, "limit": c.limit,
                "durable": c.durable, "skipped": c.skipped or None, "bytes": row.result.nbytes,
                "gb_per_s": row.rate, "seconds": row.seconds, "blocking_seconds": row.blocking,
                "cpu_seconds_per_gb": row.cpu_per_gb, "peak_rss_growth_bytes": row.peak_bytes,
                "vs_fastest_peer": row.vs_peer, "of_limit": row.of_limit,
                "samples": [vars(x) for x in row.result.samples],
            })
    return {"benchmark": "peers", "command": command, "workload": workload, "bytes": nbytes,
            "rounds": rounds, "machine": info, "cases": cases,
            "targets": [dict(zip(["target", "ours", "reference", "ratio", "wanted", "verdict"], t))
                        for t in target_rows]}


def markdown_section(command: str, workload: str, nbytes: int, rounds: int,
                     info: Dict[str, str], rows: Dict[str, List[Row]]) -> str:
    lines = [f"{time.strftime('%Y-%m-%d')}. Workload: {workload}, {nbytes / GB:.2f} GB; {rounds} "
             f"rounds, medians. Command: `{command}`", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += ["", tables(rows, fmt="markdown"), ""]
    return "\n".join(lines)


def write_markdown(path: str, key: str, section: str) -> None:
    """Writes `section` between ``<!-- peers:KEY:begin -->`` and its end marker in `path`: in
    place of what was there, or appended (the file is created when absent)."""
    begin, end = f"<!-- peers:{key}:begin -->", f"<!-- peers:{key}:end -->"
    block = f"{begin}\n{section.rstrip()}\n{end}"
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text, count=1)
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block + "\n"
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, doc: Dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def plot(path: str, title: str, rows: Dict[str, List[Row]]) -> None:
    """A bar chart of GB/s per case, saves and loads side by side; ours in one colour, peers in
    another, fio's limit as a dashed line. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    for ax, kind in zip(axes, ("save", "load")):
        shown = [r for r in rows[kind] if r.rate is not None and not r.case.limit]
        limit = next((r for r in rows[kind] if r.case.limit and r.rate is not None), None)
        names = [r.case.name for r in shown]
        colours = ["tab:orange" if r.case.ours else "tab:blue" for r in shown]
        ax.barh(range(len(shown)), [r.rate for r in shown], color=colours)
        ax.set_yticks(range(len(shown)), names, fontsize=8)
        ax.invert_yaxis()
        if limit is not None:
            ax.axvline(limit.rate, color="black", linestyle="--", label=f"fio limit {limit.rate:.2f} GB/s")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xlabel("GB/s (median)")
        ax.set_title(f"{kind}s")
    fig.suptitle(title + "  (orange: fastpersist)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
