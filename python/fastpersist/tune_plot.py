# SPDX-License-Identifier: Apache-2.0
"""``fastpersist tune --plot sweep.png``: throughput against block size and queue depth, per
backend and direction, from the measurements tune made (the C++ command hands its JSON report
over). matplotlib is an optional dependency: without it this says so and exits 1."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

PROG = "fastpersist tune --plot"


def _series(rows: List[Dict[str, Any]], knob: str) -> Dict[str, List[Tuple[float, float]]]:
    """(knob value, best GB/s at it) per backend."""
    best: Dict[str, Dict[float, float]] = defaultdict(dict)
    for row in rows:
        at = best[row["backend"]]
        x = float(row[knob])
        at[x] = max(at.get(x, 0.0), float(row["gb_per_s"]))
    return {b: sorted(points.items()) for b, points in best.items()}


def plot(report: Dict[str, Any], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = [(name, p) for name, p in report["phases"].items() if name in ("write", "read")]
    fig, axes = plt.subplots(len(phases), 2, figsize=(11, 4 * len(phases)), squeeze=False)
    for row, (name, phase) in enumerate(phases):
        for col, (knob, label) in enumerate((("block_size", "block size (bytes)"),
                                             ("queue_depth", "queue depth"))):
            ax = axes[row][col]
            for backend, points in sorted(_series(phase["ranked"], knob).items()):
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=backend)
            ax.set_xscale("log", base=2)
            ax.set_xlabel(label)
            ax.set_ylabel("GB/s (best measured)")
            ax.set_title(f"{name}: GB/s against {label.split(' (')[0]}")
            ax.grid(True, alpha=0.3)
            ax.legend()
    best = report["best"]
    fig.suptitle(f"fastpersist tune {report.get('folder', '')}: best {best['backend']}, "
                 f"block {best['block_size']}, queue depth {best['queue_depth']}, "
                 f"parallelism {best['intra_op_parallelism']}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write(f"{PROG}: error: expected REPORT_JSON OUT.png\n")
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.stderr.write(f"{PROG}: error: plotting needs matplotlib in {sys.executable} "
                         "(pip install matplotlib); the tuning results above are complete\n")
        return 1
    try:
        plot(json.loads(args[0]), args[1])
    except OSError as e:
        sys.stderr.write(f"{PROG}: error: cannot write {args[1]}: {e.strerror or e}\n")
        return 1
    sys.stderr.write(f"wrote {args[1]}\n")  # stdout may be tune's JSON
    return 0
