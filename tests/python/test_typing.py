# SPDX-License-Identifier: Apache-2.0
"""The installed package type-checks: mypy over fastpersist as pip installed it, with the
``_core.pyi`` stubs that nanobind's stubgen generated from the built extension (installed next
to ``py.typed``). Runs mypy in a subprocess; skips when mypy is not installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastpersist

PACKAGE = Path(fastpersist.__file__).resolve().parent


def test_core_stubs_are_installed_next_to_py_typed():
    assert (PACKAGE / "py.typed").is_file()
    stub = PACKAGE / "_core.pyi"
    assert stub.is_file(), f"{stub} missing: the build generates it (python/CMakeLists.txt)"
    text = stub.read_text()
    # Generated from the module itself: its classes and functions, with signatures.
    for needle in ("class CheckpointOptions", "class ProgressBar", "def classify_path(",
                   "class PathKind"):
        assert needle in text, needle


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (pip install mypy; requirements-dev.txt has it)")
def test_mypy_is_clean_over_the_installed_package(tmp_path):
    # From an empty folder, so mypy finds the package where Python does (site-packages, through
    # py.typed), not the source tree. A package named with -p is checked even there; what it
    # imports (torch, numpy) is not.
    cmd = [sys.executable, "-m", "mypy", "-p", "fastpersist", "--cache-dir",
           str(tmp_path / "cache"), "--python-executable", sys.executable]
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every module of the package was checked: "Success: no issues found in N source files".
    modules = len({(f.parent, f.stem) for pattern in ("*.py", "*.pyi")  # _core.pyi included
                   for f in PACKAGE.rglob(pattern)})
    assert f"Success: no issues found in {modules} source files" in proc.stdout, proc.stdout
