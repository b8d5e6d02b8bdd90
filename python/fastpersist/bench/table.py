# SPDX-License-Identifier: Apache-2.0
"""What the side-by-side benchmark scripts (bench/*_bench.py) share: the rotated order of their
cases, medians of their rounds, and their tables."""

from __future__ import annotations

import statistics
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar

T = TypeVar("T")


def rotated(cases: Sequence[T], round_index: int) -> List[T]:
    """The cases in the order round `round_index` runs them: each round starts one later, so no
    case always runs first (cold) or last."""
    k = round_index % len(cases) if cases else 0
    return list(cases[k:]) + list(cases[:k])


def medians(runs: Sequence[Dict[str, float]]) -> Dict[str, float]:
    """Per key, the median over the rounds (every run has the keys of the first)."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def aligned(header: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, every column right-aligned to its widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(str(cell).rjust(w) for cell, w in zip(row, widths))
                     for row in [header, *rows])


def markdown(header: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (what docs/benchmarks.md records)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def run_rounds(cases: Sequence[str], rounds: int,
               run: Callable[[str], Dict[str, float]]) -> Dict[str, List[Dict[str, float]]]:
    """Every case once per round, in rotated order; each round's result is logged to stderr."""
    results: Dict[str, List[Dict[str, float]]] = {name: [] for name in cases}
    for r in range(rounds):
        for name in rotated(list(cases), r):
            results[name].append(run(name))
            print(f"round {r + 1}/{rounds} {name}: {results[name][-1]}", file=sys.stderr,
                  flush=True)
    return results


def report(header: Sequence[object], rows: Sequence[Sequence[object]], json_path: Optional[str],
           record: Dict[str, Any]) -> None:
    """Prints the plain and the Markdown table; writes `record` as JSON to `json_path` if set."""
    print(aligned(header, rows))
    print()
    print(markdown(header, rows))
    if json_path:
        Path(json_path).write_text(json.dumps(record, indent=1))

