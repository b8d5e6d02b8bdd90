#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every libFuzzer target in BUILD (default build-fuzz) for SECONDS (default 60) each,
# starting from its committed corpus (tests/fuzz/corpus/<target>/), then every Python target
# (py_targets.py) with atheris under $PYTHON. New inputs go to
# BUILD/corpus/<target>/, failing inputs to BUILD/crashes/<target>/: copy a failing input into
# tests/fuzz/corpus/<target>/ once it is fixed, and ctest replays it from then on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${1:-build-fuzz}
seconds=${2:-60}
failed=()
for exe in "$build"/tests/fuzz/fuzz_*; do
  target=${exe##*/fuzz_}
  mkdir -p "$build/corpus/$target" "$build/crashes/$target"
  echo "fuzz: $target for ${seconds}s"
  if ! "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/crashes/$target/" "$build/corpus/$target" \
      "tests/fuzz/corpus/$target" 2> "$build/$target.log"; then
    failed+=("$target")
    tail -40 "$build/$target.log"
  fi
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$build/$target.log" | sed "s/^/  $target /" || true
done
# The Python readers of untrusted pickles (py_targets.py), with atheris, when PYTHON has it.
python=${PYTHON:-python3}
if "$python" -c "import atheris, fastpersist" 2>/dev/null; then
  targets=$("$python" -c "import sys; sys.path.insert(0, 'tests/fuzz'); import py_targets; print(' '.join(py_targets.TARGETS))")
  for target in $targets; do
    echo "fuzz: $target for ${seconds}s"
    if ! "$python" tests/fuzz/py_fuzz.py "$target" "$seconds" "$build" 2> "$build/$target.log"; then
      failed+=("$target")
      tail -40 "$build/$target.log"
    fi
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$build/$target.log" | sed "s/^/  $target /" || true
  done
else
  echo "fuzz: the Python targets need atheris and fastpersist in $python (make fuzz installs them)"
fi
if (( ${#failed[@]} )); then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $build/crashes/)"
  exit 1
fi
echo "fuzz: every target ran ${seconds}s without a failure"
