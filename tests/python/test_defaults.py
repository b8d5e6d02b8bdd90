# SPDX-License-Identifier: Apache-2.0
"""Defaults live in C++: a Python parameter for a C++ setting defaults to None and takes the C++
value (CheckpointOptions, EngineOptions, StaleFileOptions), so no default is written twice."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Dict, List

import torch

import fastpersist
from fastpersist import _core
from fastpersist.checkpoint import CheckpointManager

# C++ field -> the Python parameter for it, where the names differ: Python takes sizes as
# bytes or strings ("64MiB"), so its names drop the `_bytes` suffix.
PYTHON_NAMES = {"staging_budget_bytes": "staging_budget",
                "staging_window_bytes": "staging_window",
                "target_file_bytes": "target_file_size",
                "min_file_bytes": "min_file_size",
                "parallel_set_min_age_seconds": "parallel_min_age"}
# Modules other helpers own for this rule (issue 10): checked once they are merged.
NOT_YET = {"fastpersist.aio_handle", "fastpersist.writer", "fastpersist._engine_options",
           "fastpersist.checkpoint_loading"}


def settings_of(obj: object) -> List[str]:
    return [n for n in dir(obj) if not n.startswith("_") and not callable(getattr(obj, n))]


def cpp_setting_names() -> Dict[str, str]:
    """Every Python parameter name that stands for a C++ setting, with the C++ field."""
    out: Dict[str, str] = {}
    for options in (_core.CheckpointOptions(), _core.EngineOptions(), _core.StaleFileOptions()):
        for field in settings_of(options):
            out[PYTHON_NAMES.get(field, field)] = field
    out.pop("engine")  # CheckpointOptions.engine: the EngineOptions object, not a setting
    return out


def test_checkpoint_manager_takes_every_default_from_cpp(tmp_path: Path):
    sig = inspect.signature(CheckpointManager.__init__)
    settings = [p for p in sig.parameters if p not in ("self", "root")]
    assert all(sig.parameters[p].default is None for p in settings), [
        (p, sig.parameters[p].default) for p in settings if sig.parameters[p].default is not None]
    with CheckpointManager(tmp_path / "run") as mgr:
        used = mgr._options
        assert mgr.save(1, {"w": torch.ones(4)}) == "step-00000001"
    cpp = _core.CheckpointOptions()
    for field in settings_of(cpp):
        if field != "engine":
            assert getattr(used, field) == getattr(cpp, field), field
    # Each CheckpointOptions field (but keep_* and the engine's) is a parameter of the manager.
    params = set(sig.parameters)
    missing = [f for f in settings_of(cpp) if f != "engine" and PYTHON_NAMES.get(f, f) not in params]
    assert missing == []


def test_given_values_reach_cpp(tmp_path: Path):
    with CheckpointManager(tmp_path / "run", staging_window="1MiB", min_file_size=4096,
                           max_parallel_files=2, durable=False, checksums=False,
                           max_in_flight=3) as mgr:
        o = mgr._options
    assert (o.staging_window_bytes, o.min_file_bytes, o.max_parallel_files, o.durable,
            o.checksums, o.max_in_flight) == (1 << 20, 4096, 2, False, False, 3)


def test_no_python_module_writes_a_cpp_default_again():
    names = cpp_setting_names()
    offenders = []
    package = Path(fastpersist.__file__).parent
    for info in pkgutil.walk_packages([str(package)], prefix="fastpersist."):
        if info.name in NOT_YET or info.name.startswith("fastpersist.bench"):
            continue
        module = importlib.import_module(info.name)
        for _, fn in inspect.getmembers(module, inspect.isfunction):
            offenders += bad_defaults(fn, names)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                for _, fn in inspect.getmembers(cls, inspect.isfunction):
                    offenders += bad_defaults(fn, names)
    assert offenders == []


def bad_defaults(fn: object, names: Dict[str, str]) -> List[str]:
    try:
        params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    return [f"{getattr(fn, '__qualname__', fn)}({p.name}={p.default!r})" for p in params
            if p.name in names and p.default is not inspect.Parameter.empty
            and p.default is not None]


def test_clean_stale_temp_files_takes_the_cpp_defaults(tmp_path: Path):
    sig = inspect.signature(fastpersist.clean_stale_temp_files)
    assert [sig.parameters[p].default for p in ("dry_run", "parallel_min_age", "recursive")] == [
        None, None, None]
    d = _core.StaleFileOptions()
    assert (d.dry_run, d.parallel_set_min_age_seconds, d.recursive) == (False, 3600.0, False)
    # A dead writer's temporary is removed with the defaults (not a dry run).
    stale = tmp_path / ".model.pt.fp-tmp-abcdef"
    stale.write_bytes(b"x")
    report = fastpersist.clean_stale_temp_files(tmp_path)
    assert report.removed == [str(stale)] and not stale.exists()


def test_resolve_backend_default_is_the_engine_default():
    assert fastpersist.resolve_backend() == fastpersist.resolve_backend(
        _core.EngineOptions().backend)
