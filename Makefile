# SPDX-License-Identifier: Apache-2.0
# `make demo` and `make test` work on a fresh Debian 12 machine as root: they install what they
# need (apt packages, a .venv), build, and are quick no-ops when nothing changed.
#
#   make deps      apt packages (skipped when all are installed)
#   make venv      .venv with requirements-dev.txt (torch, numpy, pytest, nanobind, ...) and
#                  DeepSpeed's async_io op built once (bench/build_deepspeed_ops.py)
#   make build     C++ library, CLI and GoogleTest suite in build/ (-Werror)
#   make python    `pip install .` into .venv, only when a source file changed
#   make test      ctest + pytest
#   make lint      clang-format (.clang-format) over the C++ code, ruff ([tool.ruff] in
#                  pyproject.toml) over the Python code, lizard: no C++ function over
#                  MAX_FUNCTION_LINES (100) lines, and clang-tidy (.clang-tidy: a small set of
#                  bug-finding checks) over src/, tools/ and python/bindings/, with the compile
#                  commands of a configure-only build-tidy/; any finding fails it; run by .ci/run
#   make example   install build/ into a prefix, build examples/cpp against it out of tree, run it
#   make sanitize  ctest under ASan+UBSan (build-asan/) and TSan (build-tsan/); not part of `test`,
#                  run by .ci/run after it
#   make sanitize-python  pytest against an ASan+UBSan build of the extension (build-pyasan/)
#   make fuzz      every libFuzzer target (tests/fuzz/) for FUZZ_SECONDS each, clang in build-fuzz/
#   make soak      SOAK_MINUTES of saves under SIGKILL, ENOSPC and fsync EIO, checked (tests/soak/)
#   make demo      `fastpersist report`, the gpt2-large checkpoint benchmark and round trip on $(BENCH_DIR)
#   make clean     remove build/, build-asan/, build-tsan/, build-pyasan/, build-fuzz/, build-tidy/
#                  (keeps .venv)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON     ?= python3
VENV       ?= .venv
BUILD_DIR  ?= build
BENCH_DIR  ?= bench-data
DEMO_SIZE  ?= 1GiB
CMAKE      ?= cmake
CTEST      ?= ctest
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CTEST_ARGS ?=
MAX_FUNCTION_LINES ?= 100
PYTEST_ARGS ?= -q

VENV_PY    := $(VENV)/bin/python
# DeepSpeed's JIT-built ops (bench/build_deepspeed_ops.py) live with the venv that built them.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch-extensions
CLI        := $(BUILD_DIR)/tools/fastpersist
STAMPS     := $(VENV)/.fastpersist-stamps

# Configure, build and test presets of these names in CMakePresets.json, built in build-<name>/.
SANITIZERS := asan tsan

APT_PACKAGES := build-essential cmake ninja-build pkg-config python3 python3-venv python3-dev \
  liburing-dev libaio-dev libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev \
  libxxhash-dev libzstd-dev liblz4-dev fio e2fsprogs xfsprogs ccache

# Everything `pip install .` builds from; the package is reinstalled when one of these changes.
PY_SOURCES := pyproject.toml CMakeLists.txt \
  $(shell find cmake include src tools python -type f \
      \( -name '*.cc' -o -name '*.h' -o -name '*.py' -o -name '*.txt' -o -name '*.cmake' \
         -o -name '*.typed' -o -name '*.pat' \) -not -path '*/__pycache__/*' 2>/dev/null)

.PHONY: all deps venv build python test test-cpp test-python lint example demo bench clean distclean \
  sanitize $(SANITIZERS:%=sanitize-%) sanitize-python fuzz fuzz-deps soak

all: test

# ---------------------------------------------------------------------------- apt packages
# dpkg answers in milliseconds; apt-get runs only when something is missing.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' "$$p" 2>/dev/null | grep -q '^install ok installed$$' || echo "$$p"; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing" $$missing; \
	  if [ "$$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get update -q; \
	  $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

# ---------------------------------------------------------------------------- Python venv
venv: $(STAMPS)/requirements $(STAMPS)/deepspeed-ops

$(STAMPS)/requirements: requirements-dev.txt | deps
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install -q -r requirements-dev.txt
	@mkdir -p $(STAMPS) && touch $@

# DeepSpeed compiles its async_io op on first use (about 7 minutes here): once, ahead of the
# benchmark tests, whose time limits it would otherwise eat.
$(STAMPS)/deepspeed-ops: $(STAMPS)/requirements bench/build_deepspeed_ops.py
	$(VENV_PY) bench/build_deepspeed_ops.py
	@touch $@

# ---------------------------------------------------------------------------- C++ build
$(BUILD_DIR)/build.ninja: | deps
	$(CMAKE) -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DFASTPERSIST_WERROR=ON -DFASTPERSIST_BUILD_TESTS=ON -DFASTPERSIST_BUILD_TOOLS=ON

# ninja decides what is stale (and re-runs cmake when a CMakeLists.txt changed).
build: $(BUILD_DIR)/build.ninja
	$(CMAKE) --build $(BUILD_DIR) -j $(JOBS)

# ---------------------------------------------------------------------------- Python package
python: $(STAMPS)/installed

# --no-build-isolation: use the venv's nanobind / scikit-build-core / cmake / ninja, so the
# persistent build dir (build/python/<tag>) stays valid and rebuilds are incremental.
$(STAMPS)/installed: $(STAMPS)/requirements $(PY_SOURCES)
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(VENV_PY) -m pip install -q --no-build-isolation --no-deps \
	  --config-settings=cmake.define.FASTPERSIST_WERROR=ON .
	@touch $@

# ---------------------------------------------------------------------------- sanitizers
# The C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer,
# one build folder each (build-asan/, build-tsan/). The test presets set ASAN_OPTIONS,
# UBSAN_OPTIONS and TSAN_OPTIONS (halt on the first report) and TSan's suppressions file.
# `make -k sanitize` runs the TSan tests even when an ASan test failed.
sanitize: $(SANITIZERS:%=sanitize-%)

# Configured once; a changed preset reconfigures, ninja re-runs cmake when a CMakeLists changed.
$(SANITIZERS:%=build-%/build.ninja): build-%/build.ninja: CMakePresets.json | deps
	$(CMAKE) --preset $*
	@touch $@

$(SANITIZERS:%=sanitize-%): sanitize-%: build-%/build.ninja
	$(CMAKE) --build --preset $* -j $(JOBS)
	$(CTEST) --preset $* --output-on-failure $(CTEST_ARGS)

# The Python tests against the extension built with ASan+UBSan, libasan preloaded into the
# interpreter (tests/sanitizers/python_asan.sh); CI runs it last, when its time allows.
sanitize-python: python
	tests/sanitizers/python_asan.sh $(PYTEST_ARGS)

# ---------------------------------------------------------------------------- fuzzing
# libFuzzer needs clang (Debian's `clang` package, installed here on first use); the targets and
# the library they drive get ASan, UBSan and coverage instrumentation. `make test` replays the
# committed corpus with the normal build instead (ctest -L fuzz).
FUZZ_SECONDS ?= 60

# clang and its runtime libraries (libFuzzer, ASan): checked on every `make fuzz` (dpkg answers
# in milliseconds), so a build directory configured before they were complete still links.
# atheris (libFuzzer for Python) fuzzes the Python readers of untrusted pickles (py_targets.py).
fuzz-deps: | deps
	@$(MAKE) --no-print-directory deps APT_PACKAGES="clang libclang-rt-dev"
	@$(MAKE) --no-print-directory python
	@$(VENV_PY) -c "import atheris" 2>/dev/null || $(VENV_PY) -m pip install -q atheris

build-fuzz/build.ninja: | fuzz-deps
	CC=clang CXX=clang++ $(CMAKE) -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
	  -DFASTPERSIST_FUZZ=ON -DFASTPERSIST_SANITIZE=address,undefined \
	  -DFASTPERSIST_BUILD_TESTS=OFF -DFASTPERSIST_BUILD_TOOLS=OFF -DFASTPERSIST_INSTALL=OFF

fuzz: fuzz-deps build-fuzz/build.ninja
	$(CMAKE) --build build-fuzz -j $(JOBS)
	PYTHON=$(VENV_PY) tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

# ---------------------------------------------------------------------------- soak
# On demand (root: it loop-mounts an ext4 image); prints its totals and writes soak-report.json.
SOAK_MINUTES ?= 60
SOAK_ARGS ?=

soak: python build
	FASTPERSIST_CLI=$(CURDIR)/$(CLI) $(VENV_PY) tests/soak/soak.py --minutes $(SOAK_MINUTES) \
	  --cli $(CURDIR)/$(CLI) --report soak-report.json $(SOAK_ARGS)

# ---------------------------------------------------------------------------- test / demo
test: test-cpp test-python

# Every C++ source and header of the tree (what clang-format checks).
CXX_SOURCES = $(shell find include src tools python/bindings tests bench examples -type f \
  \( -name '*.cc' -o -name '*.h' \) -not -path '*/corpus/*' 2>/dev/null | sort)

# What clang-tidy checks: every source file of the library, the CLI and the extension, and through
# them our headers (.clang-tidy: HeaderFilterRegex). Not the tests: 65 more files, each with
# GoogleTest's headers, would add about 60 % to its time, and CI's 90 minutes have no room for it.
TIDY_DIR ?= build-tidy
TIDY_SOURCES = $(shell find src tools python/bindings -type f -name '*.cc' 2>/dev/null | sort)

# The compile commands clang-tidy reads: configured, never built (every header it needs is in the
# tree). Debug, so that assert() keeps its argument for the checks to see; the extension on, with
# the venv's nanobind. Configured once; `cmake --build $(TIDY_DIR) --target build.ninja` in
# `lint` then re-runs cmake only when a CMakeLists.txt or cmake/ file changed (0.3 s otherwise).
# The compile commands are GCC's: clang-tidy (clang 14) is told to ignore the warning options it
# lacks, and the grep drops its per-file count of the compiler warnings it did not show.
$(TIDY_DIR)/build.ninja: | deps $(STAMPS)/requirements
	$(CMAKE) -S . -B $(TIDY_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
	  -DFASTPERSIST_BUILD_TESTS=OFF -DFASTPERSIST_BUILD_TOOLS=ON -DFASTPERSIST_BUILD_PYTHON=ON \
	  -DFASTPERSIST_INSTALL=OFF -DPython_EXECUTABLE=$(abspath $(VENV_PY)) > /dev/null

lint: $(STAMPS)/requirements $(TIDY_DIR)/build.ninja
	@$(MAKE) --no-print-directory deps APT_PACKAGES="clang-format clang-tidy"
	@echo "clang-format --dry-run -Werror ($(words $(CXX_SOURCES)) C++ files)"
	@clang-format --dry-run -Werror $(CXX_SOURCES)
	$(VENV)/bin/ruff check python tests bench
	@echo "lizard: no function over $(MAX_FUNCTION_LINES) lines in src/ tools/ python/bindings/"
	@$(VENV)/bin/lizard --length $(MAX_FUNCTION_LINES) --CCN 100000 --arguments 100 \
	  --Threshold nloc=100000 --warnings_only src tools python/bindings
	@$(CMAKE) --build $(TIDY_DIR) --target build.ninja > /dev/null
	@echo "clang-tidy ($(words $(TIDY_SOURCES)) files in src/ tools/ python/bindings/, $(JOBS) at a time)"
	@printf '%s\n' $(TIDY_SOURCES) | xargs -P $(JOBS) -n 1 clang-tidy -p $(TIDY_DIR) --quiet \
	  --extra-arg=-Wno-unknown-warning-option 2>&1 | { grep -v '^[0-9]* warnings\? generated\.$$' || true; }

test-cpp: build
	$(CTEST) --test-dir $(BUILD_DIR) --output-on-failure $(CTEST_ARGS)

test-python: python build $(STAMPS)/deepspeed-ops
	FASTPERSIST_CLI=$(CURDIR)/$(CLI) $(VENV)/bin/pytest tests/python $(PYTEST_ARGS)

# ctest runs the same script (example.cpp_consumer), so `make test` covers it.
example: build
	CMAKE=$(CMAKE) examples/cpp/build_and_run.sh $(BUILD_DIR)

# The main job: the environment report, DeepSpeedExamples' deepnvme/model_checkpoint benchmark
# for a Hugging Face model built from its config (one `<tag> -- GB, secs, GB/s` line per save
# mechanism; deepspeed is optional, its line says why it is skipped), a save / load round trip
# that checks the model's outputs, then the peer table: every checkpoint library here and
# fastpersist on the same tensors, against fio's limit (python -m fastpersist.bench peers; its
# targets are checked by `make bench` / `peers --check`, not here).
DEMO_MODEL ?= gpt2-large
demo: build python $(STAMPS)/deepspeed-ops
	@mkdir -p $(BENCH_DIR)
	$(CLI) report --folder $(BENCH_DIR)
	$(VENV_PY) -m fastpersist.bench model --model $(DEMO_MODEL) --folder $(BENCH_DIR)
	$(VENV_PY) -m fastpersist.bench roundtrip --model $(DEMO_MODEL) --folder $(BENCH_DIR)
	$(VENV_PY) -m fastpersist.bench peers --folder $(BENCH_DIR) --size $(PEERS_SIZE) --rounds 2 \
	  --no-verdicts

# The peer benchmark in full: PEERS_WORKLOAD=flat (PEERS_SIZE bytes) or a model name (with its
# Adam state), PEERS_ROUNDS rounds, the targets with pass/FAIL, a bar chart in BENCH_DIR.
PEERS_WORKLOAD ?= flat
PEERS_SIZE     ?= 4GiB
PEERS_ROUNDS   ?= 3
bench: build python $(STAMPS)/deepspeed-ops
	@mkdir -p $(BENCH_DIR)
	$(VENV_PY) -m fastpersist.bench peers --folder $(BENCH_DIR) --workload $(PEERS_WORKLOAD) \
	  --size $(PEERS_SIZE) --rounds $(PEERS_ROUNDS) --plot $(BENCH_DIR)/peers.png \
	  --json $(BENCH_DIR)/peers.json

clean:
	rm -rf $(BUILD_DIR) $(SANITIZERS:%=build-%) build-pyasan build-fuzz $(TIDY_DIR)
	rm -f $(STAMPS)/installed

distclean: clean
	rm -rf $(VENV) $(BENCH_DIR)
