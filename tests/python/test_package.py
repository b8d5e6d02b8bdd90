# SPDX-License-Identifier: Apache-2.0
"""Packaging: one version, no hard torch/numpy dependency, the CLI next to the interpreter."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys

import pytest

import fastpersist


def test_version_matches_package_metadata():
    assert fastpersist.__version__ == importlib.metadata.version("fastpersist")


def test_import_needs_neither_torch_nor_numpy():
    code = "import sys, fastpersist; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"]


def test_plain_buffers_work_without_torch_or_numpy(tmp_path):
    code = (
        "import sys, fastpersist\n"
        "h = fastpersist.AioHandle()\n"
        f"p = {str(tmp_path / 'x.bin')!r}\n"
        "h.sync_pwrite(b'hello world', p)\n"
        "b = bytearray(11); h.sync_pread(b, p); assert b == b'hello world'\n"
        "m = memoryview(h.new_cpu_locked_buffer(11)); h.sync_pread(m, p)\n"
        "assert m.tobytes() == b'hello world'\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_extension_does_not_link_libtorch():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) not installed")
    out = subprocess.run(
        [readelf, "-d", fastpersist._core.__file__], check=True, capture_output=True, text=True
    )
    needed = [line for line in out.stdout.splitlines() if "NEEDED" in line]
    assert needed, out.stdout
    assert not any("torch" in line or "c10" in line for line in needed), needed


def test_cli_is_installed_next_to_the_interpreter():
    scripts = os.path.dirname(sys.executable)
    cli = shutil.which("fastpersist", path=scripts)
    assert cli is not None, f"`fastpersist` not found in {scripts}"


def test_backends_report_every_backend():
    infos = fastpersist.backends()
    assert [b.name for b in infos] == ["io_uring", "libaio", "threads"]
    threads = infos[-1]
    assert threads.built_in and threads.available
    for b in infos:
        if not b.available:
            assert b.reason, f"{b.name} is unavailable without a reason"
    name, why = fastpersist.resolve_backend("auto")
    assert name in {b.name for b in infos if b.available} and why


def test_parse_size():
    assert fastpersist.parse_size("4096") == 4096
    assert fastpersist.parse_size("64KiB") == 64 << 10
    assert fastpersist.parse_size("8M") == 8 << 20
    assert fastpersist.parse_size("1GiB") == 1 << 30
    assert fastpersist.parse_size(123) == 123
    with pytest.raises(ValueError):
        fastpersist.parse_size("lots")


def test_probe_file_io(tmp_path):
    mode = fastpersist.probe_file_io(tmp_path)
    assert mode.offset_alignment >= 512 and mode.memory_alignment >= 1
    if not mode.direct:
        assert mode.fallback_reason


def test_python_defaults_agree_with_the_cpp_defaults_table():
    import inspect

    from fastpersist import _core

    cpp = _core.EngineOptions()
    params = inspect.signature(fastpersist.AioHandle).parameters
    for name in (
        "block_size",
        "queue_depth",
        "single_submit",
        "overlap_events",
        "intra_op_parallelism",
    ):
        # None: C++'s value (tests/python/test_defaults.py checks what the handle gets).
        assert params[name].default is None, name
    assert cpp.backend == "auto"
