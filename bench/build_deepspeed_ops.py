#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Builds DeepSpeed's async_io op (the peer the save benchmarks compare with) ahead of the tests.

DeepSpeed compiles its C++ ops the first time they load (torch's JIT extension build). On this
machine async_io takes about 7 minutes, which is more than a benchmark smoke test's time limit, so
`make venv` builds it once, into $TORCH_EXTENSIONS_DIR (the Makefile points it into the venv).
Without deepspeed, or where the op cannot build here (no libaio), it says so and succeeds: the
benchmarks then print a skip line for DeepSpeed, as they always have.
"""
from __future__ import annotations

import sys
import time


def main() -> int:
    try:
        from deepspeed.accelerator import get_accelerator  # type: ignore[import-not-found, import-untyped]
    except ImportError:
        print("build_deepspeed_ops: deepspeed is not installed; nothing to build")
        return 0
    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None or not builder.is_compatible(verbose=False):
        print("build_deepspeed_ops: DeepSpeed's async_io op cannot build here (is libaio-dev "
              "installed?); the benchmarks will skip DeepSpeed")
        return 0
    start = time.perf_counter()
    builder.load(verbose=False)
    print(f"build_deepspeed_ops: async_io ready ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
