#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 16's checks on a machine with an NVIDIA GPU, in one go, each step bounded in time so a
# report always comes back: build fastpersist there, run the GPU tests (C++ and Python) and the
# GPU benchmarks, and write the results under $OUT (at most 8 files):
#
#   summary.md     what ran, pass/fail per step, the benchmark table
#   report.txt     `fastpersist report` (CUDA, cuFile, nvidia-fs, GDS mode) and --json
#   ctest.txt      C++ tests of the GPU paths (handle layer, cuFile lookup, memory kinds)
#   pytest.txt     tests/python/test_gpu_handles.py, test_gpu_snapshot.py, test_gpu_checkpoint.py
#   bench.txt      bench/gpu_bench.py: aio_handle / gds_handle GPU<->file vs fio, checkpoint
#                  save/load vs torch, async snapshot blocking; and the model tags with --gpu
#   bench.json     the same numbers
#   log.txt        everything else (build output)
#
# Needs: python3 with torch (CUDA), cmake, ninja, nanobind, scikit-build-core, pytest. Where the
# machine reaches no package registry, run bench/gpu_deps.sh on a machine with apt first and
# carry .gpu-deps (the -dev packages the build needs); pip is tried for missing Python packages
# and its failure tolerated. Usage (repository root): OUT=/some/dir bench/gpu_check.sh
# Time: at most BUDGET seconds (default 540). BENCH_GIB (default 4) sizes the transfers.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
SUMMARY=$OUT/summary.md
BENCH_GIB=${BENCH_GIB:-4}
JOBS=$(nproc 2>/dev/null || echo 8)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
: > "$LOG"
echo "# gpu_check $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')" > "$SUMMARY"

status() { echo "- $1: $2" | tee -a "$SUMMARY"; }
# The whole script ends within BUDGET seconds (default 540: a device call may run 600), so
# its report always comes back; each step gets its own limit, cut to what is left.
DEADLINE=$((SECONDS + ${BUDGET:-540}))
# step NAME SECONDS COMMAND...: runs it with a time limit, output to the log.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS - 15))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    status "$name" "SKIPPED (out of time)"
    return 124
  fi
  local t0=$SECONDS
  echo "=== $name: $*" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  status "$name" "$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc)") in $((SECONDS - t0)) s"
  return $rc
}

{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv; uname -r;
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())";
  ls /proc/driver/nvidia-fs 2>&1; df -h "$ROOT" /tmp; } >> "$LOG" 2>&1
echo "- machine: $(nvidia-smi -L 2>/dev/null | head -1); $($PY -c 'import torch; print("torch", torch.__version__)' 2>&1)" >> "$SUMMARY"

# ---- build prerequisites: carried .deb files unpacked into a private prefix, nothing system-wide
DEPS=/tmp/fastpersist-deps
if ls .gpu-deps/*.deb >/dev/null 2>&1; then
  mkdir -p "$DEPS"
  for f in .gpu-deps/*.deb; do dpkg -x "$f" "$DEPS"; done
  export CMAKE_PREFIX_PATH="$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_SYSROOT_DIR="$DEPS"
  export PKG_CONFIG_LIBDIR="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
  export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  command -v pkg-config >/dev/null || ln -sf "$DEPS/usr/bin/pkgconf" "$DEPS/usr/bin/pkg-config"
  export PATH="$PATH:$DEPS/usr/bin"
  status "deps" "unpacked $(ls .gpu-deps/*.deb | wc -l) carried packages into $DEPS"
fi
for mod in nanobind scikit_build_core pytest numpy transformers; do
  $PY -c "import $mod" 2>/dev/null && continue
  timeout 60 $PY -m pip install -q --retries 0 --timeout 5 "${mod//_/-}" >> "$LOG" 2>&1 \
    && status "pip $mod" "installed" || status "pip $mod" "missing and not installable (continuing)"
done
# PyPI's cuFile (nvidia-cufile): the Python package finds it itself; the CLI and C++ tests here
# are told where it is.
CUFILE_DIR=$($PY -c "import os, nvidia.cufile as c; print(os.path.join(list(c.__path__)[0], 'lib'))" 2>/dev/null || true)
if [ -n "$CUFILE_DIR" ] && [ -z "${FASTPERSIST_CUFILE_LIBRARY:-}" ]; then
  export FASTPERSIST_CUFILE_LIBRARY=$CUFILE_DIR
fi
echo "- cuFile lookup: FASTPERSIST_CUFILE_LIBRARY=${FASTPERSIST_CUFILE_LIBRARY:-unset}" >> "$SUMMARY"

# ---- C++: the library, CLI and the GPU-relevant test binaries only (the rest ran in CI)
BUILD=/tmp/fastpersist-build
step "cmake configure" 60 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFASTPERSIST_WERROR=ON -DFASTPERSIST_BUILD_TESTS=ON -DFASTPERSIST_BUILD_TOOLS=ON \
  -DFASTPERSIST_INSTALL=OFF \
  && step "cmake build" 180 cmake --build "$BUILD" -j "$JOBS" --target fastpersist_cli \
       fastpersist_handle_tests fastpersist_io_tests \
  && { step "ctest (GPU paths)" 60 ctest --test-dir "$BUILD" --output-on-failure -j 4 \
         -R '^handle\.|MemoryKind|CuFile|GdsDriver'
       grep -E 'tests passed|Failed|Skipped|\*\*\*' "$LOG" | tail -20 > "$OUT/ctest.txt"
       { "$BUILD/tools/fastpersist" report --folder /tmp; echo;
         "$BUILD/tools/fastpersist" report --folder /tmp --json; } > "$OUT/report.txt" 2>&1; }

# ---- Python package, then its GPU tests
step "pip install ." 240 env CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" $PY -m pip install -q \
  --no-build-isolation --no-deps --config-settings=cmake.define.FASTPERSIST_WERROR=ON \
  --config-settings=build-dir=/tmp/fastpersist-pybuild . || true
# The copy in the working tree would shadow the installed one: tests import from site-packages.
step "pytest (GPU)" 150 bash -c "cd tests/python && $PY -m pytest -q -rs -p no:cacheprovider \
  test_gpu_handles.py test_gpu_snapshot.py test_gpu_checkpoint.py > '$OUT/pytest.txt' 2>&1"

# ---- benchmarks
# On the machine's disk, not /tmp (which may be tmpfs, where O_DIRECT and fio's direct=1 fail).
BENCH_DIR=${BENCH_DIR:-$ROOT/bench-data/gpu-check}
mkdir -p "$BENCH_DIR"
{
  step "gpu_bench" 200 $PY bench/gpu_bench.py --folder "$BENCH_DIR" --size-gib "$BENCH_GIB" \
    --model gpt2-large --json "$OUT/bench.json"
  sed -n '/^command:/,$p' "$LOG" | grep -v '^===' | tail -40
  echo
  echo "## model tags with --gpu (DeepSpeedExamples' torch_save_utils)"
  step "bench model --gpu" 120 $PY -m fastpersist.bench model --model gpt2-large \
    --folder "$BENCH_DIR" --gpu --only test_save test_ds_aio_fast_save test_ds_gds_fast_save
  grep -E ' -- |skipped' "$LOG" | tail -12
} > "$OUT/bench.txt" 2>&1
rm -rf "$BENCH_DIR"

{ echo; echo '## benchmark table'; grep -E '^\|' "$OUT/bench.txt" || echo "(no table)"; } >> "$SUMMARY"
echo "done in $SECONDS s" >> "$SUMMARY"
cat "$SUMMARY"
