# SPDX-License-Identifier: Apache-2.0
"""Defaults live in C++: the façade's parameters default to None and take the values of the
default-constructed C++ options structs, so no default is written twice."""

from __future__ import annotations

import inspect

import pytest

import fastpersist
from fastpersist import _core
from fastpersist._engine_options import engine_options

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
