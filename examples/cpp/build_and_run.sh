#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs fastpersist from a build folder into a prefix, builds this example against the
# installed package only (out of tree, find_package + CMAKE_PREFIX_PATH), and runs it on a
# temporary folder. ctest runs it as example.cpp_consumer; `make example` too.
#
# Usage: examples/cpp/build_and_run.sh [BUILD_DIR [WORK_DIR]]
#   BUILD_DIR  a built fastpersist build folder (default: build)
#   WORK_DIR   where the prefix and the example's build go (default: BUILD_DIR/example-consumer);
#              kept between runs, so a rerun only rebuilds what changed
# Environment: CMAKE (default cmake), CMAKE_GENERATOR and CXX are honoured.
set -euo pipefail

example_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build_dir=$(cd "${1:-build}" && pwd)
work_dir=${2:-$build_dir/example-consumer}
cmake=${CMAKE:-cmake}
prefix=$work_dir/prefix

# A fresh prefix each time: a stale file from an earlier install must not hide a missing install
# rule. (Installed files keep the build's timestamps, so the example does not rebuild for it.)
rm -rf "$prefix"
"$cmake" --install "$build_dir" --prefix "$prefix" >/dev/null

# Only the public headers are installed: include/fastpersist/*.h, nothing from src/.
stray=$(cd "$prefix" && find include -type f ! -path 'include/fastpersist/*.h')
if [[ -n $stray ]]; then
  echo "build_and_run.sh: installed files that are not public headers:" $stray >&2
  exit 1
fi

"$cmake" -S "$example_dir" -B "$work_dir/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DFASTPERSIST_EXAMPLE_WERROR=ON \
  ${CXX:+-DCMAKE_CXX_COMPILER="$CXX"} >/dev/null
# The package must come from the prefix just installed, not from the system.
found=$(sed -n 's/^fastpersist_DIR:PATH=//p' "$work_dir/build/CMakeCache.txt")
if [[ $found != "$prefix"/* ]]; then
  echo "build_and_run.sh: found fastpersist in '$found', not under $prefix" >&2
  exit 1
fi
"$cmake" --build "$work_dir/build"

data_dir=$(mktemp -d "${TMPDIR:-/tmp}/fastpersist-example.XXXXXX")
trap 'rm -rf "$data_dir"' EXIT
"$work_dir/build/fastpersist_example" "$data_dir/run"
