#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python tests against the extension module built with ASan + UBSan (`make sanitize-python`;
# CI runs it last, when its time allows: .ci/run, docs/reliability.md "Sanitizers").
# The interpreter is not instrumented, so libasan is preloaded; leak checking is off (CPython
# and torch keep memory to exit by design); any other report aborts the test process.
# The package runs from BUILD/pkg (python/fastpersist + the instrumented _core), ahead of the
# installed one on PYTHONPATH; subprocesses the tests start inherit both.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${BUILD:-build-pyasan}
venv=${VENV:-.venv}
# Configured every time (quick when nothing changed), so a build directory made with older
# settings follows these. The tools library is built for `_core.run_cli`: the `fastpersist`
# command of the tests runs the command line inside the instrumented module.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DFASTPERSIST_BUILD_PYTHON=ON -DFASTPERSIST_BUILD_TESTS=OFF -DFASTPERSIST_BUILD_TOOLS=ON \
  -DFASTPERSIST_INSTALL=OFF -DFASTPERSIST_SANITIZE=address,undefined \
  -DPython_EXECUTABLE="$PWD/$venv/bin/python" > /dev/null
cmake --build "$build" --target _core -j "${JOBS:-$(nproc)}"
pkg=$build/pkg
rm -rf "$pkg" && mkdir -p "$pkg"
cp -r python/fastpersist "$pkg/"
cp "$build"/python/_core*.so "$pkg/fastpersist/"
# The type stubs the installed package's build generated from the same sources (stubgen would
# have to import the instrumented module before libasan is preloaded).
installed=$("$venv/bin/python" -c "import fastpersist, os; print(os.path.dirname(fastpersist.__file__))")
cp "$installed/_core.pyi" "$pkg/fastpersist/"
# libstdc++ too: python does not link it, and ASan resolves __cxa_throw when it starts.
export LD_PRELOAD="$(${CXX:-g++} -print-file-name=libasan.so) $(${CXX:-g++} -print-file-name=libstdc++.so)"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONPATH="$PWD/$pkg${PYTHONPATH:+:$PYTHONPATH}"
"$venv/bin/python" -c "import fastpersist, fastpersist._core as c; assert '$pkg' in c.__file__, c.__file__; assert hasattr(c, 'run_cli')"
exec "$venv/bin/pytest" tests/python "$@"
