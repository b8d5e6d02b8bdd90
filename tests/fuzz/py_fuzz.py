# SPDX-License-Identifier: Apache-2.0
"""Fuzzes one Python target of py_targets.py with atheris (libFuzzer for Python), starting from
its committed corpus; `tests/fuzz/run.sh` runs every target this way in ``make fuzz``.

    python tests/fuzz/py_fuzz.py TARGET SECONDS WORK_DIR

New inputs go to WORK_DIR/corpus/TARGET/, a failing input to WORK_DIR/crashes/TARGET/: copy it
into tests/fuzz/corpus/TARGET/ once it is fixed, and ``make test`` replays it from then on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["fastpersist"]):
    import py_targets


def main() -> None:
    target, seconds, work = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    if target not in py_targets.TARGETS:
        raise SystemExit(f"unknown target {target!r}; the targets: {', '.join(py_targets.TARGETS)}")
    corpus, crashes = work / "corpus" / target, work / "crashes" / target
    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    seeds = Path(__file__).resolve().parent / "corpus" / target
    args = [sys.argv[0], f"-max_total_time={seconds}", "-timeout=20", "-rss_limit_mb=4096",
            "-print_final_stats=1", f"-artifact_prefix={crashes}{os.sep}", str(corpus), str(seeds)]
    atheris.Setup(args, lambda data: py_targets.run_one(target, data))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
