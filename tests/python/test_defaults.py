# SPDX-License-Identifier: Apache-2.0
"""Defaults live in C++: a Python parameter for a C++ setting defaults to None and takes the C++
value (CheckpointOptions, EngineOptions, FastFileWriterOptions, StaleFileOptions), so no default
is written twice."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Dict, List

import pytest
import torch

import fastpersist
from fastpersist import _core
from fastpersist._engine_options import engine_options
from fastpersist.checkpoint import CheckpointManager

# C++ field -> the Python parameter for it, where the names differ: Python takes sizes as
# bytes or strings ("64MiB"), so its names drop the `_bytes` suffix.
PYTHON_NAMES = {"staging_budget_bytes": "staging_budget",
                "staging_window_bytes": "staging_window",
                "target_file_bytes": "target_file_size",
                "min_file_bytes": "min_file_size",
                "parallel_set_min_age_seconds": "parallel_min_age"}
# Modules whose parameters are per-call behaviour rather than settings of an options struct.
NOT_YET = {"fastpersist.checkpoint_loading"}
# Parameters named like a C++ setting that no C++ object reads: PyFileWriter is the plain-Python
# baseline (`open(path, "wb")`, like torch.save), whose durable=False is what it compares with.
NOT_CPP = {"PyFileWriter.__init__(durable=False)"}


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
    assert [o for o in offenders if o not in NOT_CPP] == []


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


ENGINE_FIELDS = ["block_size", "queue_depth", "single_submit", "overlap_events",
                 "intra_op_parallelism", "direct_io", "direct_io_min_bytes"]
WRITER_FIELDS = ["io_buffer_bytes", "single_io_buffer", "zero_copy", "zero_copy_min_bytes",
                 "durable", "num_writers", "writer_rank", "stripe_bytes",
                 "commit_timeout_seconds", "preallocate_max_bytes"]
# Façade parameters that are per-call behaviour, not settings of an options struct.
NOT_SETTINGS = {"self", "path", "show_statistics", "progress"}


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("FASTPERSIST_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("function", [fastpersist.AioHandle.__init__,
                                      fastpersist.FastFileWriter.__init__, engine_options])
def test_every_setting_parameter_defaults_to_none(function):
    for name, p in inspect.signature(function).parameters.items():
        if name in NOT_SETTINGS or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        assert p.default is None, f"{function.__qualname__}({name}={p.default!r})"


def test_engine_options_default_to_the_cpp_struct():
    ours, cpp = engine_options(), _core.EngineOptions()
    for field in ENGINE_FIELDS + ["backend"]:
        assert getattr(ours, field) == getattr(cpp, field), field


def test_aio_handle_defaults_are_the_cpp_defaults(monkeypatch):
    cpp = _core.EngineOptions()
    # DeepNVMe's five knobs are not tuned by the environment: C++'s default wins over it.
    monkeypatch.setenv("FASTPERSIST_BLOCK_SIZE", "64KiB")
    monkeypatch.setenv("FASTPERSIST_QUEUE_DEPTH", "3")
    with fastpersist.AioHandle() as h:
        assert h.get_block_size() == cpp.block_size
        assert h.get_queue_depth() == cpp.queue_depth
        assert h.get_single_submit() == cpp.single_submit
        assert h.get_overlap_events() == cpp.overlap_events
        assert h.get_intra_op_parallelism() == cpp.intra_op_parallelism
        options = h._h.options()
        assert options.direct_io == cpp.direct_io
        assert options.direct_io_min_bytes == cpp.direct_io_min_bytes


def test_aio_handle_keeps_deepnvme_positional_arguments():
    with fastpersist.aio_handle(1 << 16, 8, True, True, 2) as h:
        assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
                h.get_overlap_events(), h.get_intra_op_parallelism()) == (1 << 16, 8, True, True, 2)


def test_fast_file_writer_defaults_are_the_cpp_defaults(tmp_path):
    cpp = _core.FastFileWriterOptions()
    w = fastpersist.FastFileWriter(tmp_path / "f.bin")
    try:
        for field in WRITER_FIELDS:
            assert getattr(w._w.options, field) == getattr(cpp, field), field
    finally:
        w.abort()


def test_fast_file_writer_arguments_reach_cpp(tmp_path):
    w = fastpersist.FastFileWriter(tmp_path / "f.bin", io_buffer_mb=2, single_io_buffer=True,
                                   zero_copy=False, durable=False, num_parallel_writers=2,
                                   writer_rank=1, stripe_mb=1, commit_timeout=1.5)
    try:
        o = w._w.options
        assert (o.io_buffer_bytes, o.single_io_buffer, o.zero_copy, o.durable, o.num_writers,
                o.writer_rank, o.stripe_bytes, o.commit_timeout_seconds) == (
                    2 << 20, True, False, False, 2, 1, 1 << 20, 1.5)
    finally:
        w.abort()


def test_checkpoint_settings_table_names_every_bound_option_field():
    """_core.CHECKPOINT_SETTINGS (C++'s kCheckpointSettings) is the one list the option builder
    goes by: each field it names is a CheckpointOptions attribute, and every attribute is in it
    except those given as arguments of their own."""
    from fastpersist._checkpoint_options import SETTINGS, checkpoint_options

    fields = {s.field for s in _core.CHECKPOINT_SETTINGS}
    bound = {name for name in dir(_core.CheckpointOptions())
             if not name.startswith("_") and not callable(getattr(_core.CheckpointOptions(), name))}
    assert fields == bound - {"engine", "keep_last", "keep_every", "tiers", "pin_until_drained"}
    kinds = {s.kind for s in _core.CHECKPOINT_SETTINGS}
    assert kinds == {"bytes", "count", "flag", "codec", "level", "seconds"}
    assert set(SETTINGS) >= {s.name for s in _core.CHECKPOINT_SETTINGS}
    # Each named setting reaches its field.
    given = {"staging_budget": "8MiB", "max_in_flight": 3, "durable": False,
             "compression": "zstd", "compression_level": 5, "save_every_seconds": 30}
    o = checkpoint_options(given)
    assert (o.staging_budget_bytes, o.max_in_flight, o.durable) == (8 << 20, 3, False)
    assert (o.compression, o.compression_level, o.save_every_seconds) == ("zstd", 5, 30.0)
    with pytest.raises(TypeError, match="save_every_seconds must be a number"):
        checkpoint_options({"save_every_seconds": "30"})
