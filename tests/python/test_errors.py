# SPDX-License-Identifier: Apache-2.0
"""Errors surface as Python exceptions (never a crash): OSError subclasses with errno and
filename for I/O failures, ValueError for bad arguments and reads past the end of a file."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch

import fastpersist
from fastpersist import _core


def test_missing_directory_is_file_not_found(handle, tmp_path):
    path = str(tmp_path / "no" / "such" / "dir" / "x.bin")
    t = torch.ones(100)
    for call in (handle.sync_pwrite, handle.async_pwrite, handle.sync_pread, handle.async_pread):
        with pytest.raises(FileNotFoundError) as info:
            call(t, path)
            handle.wait()
        assert info.value.errno == errno.ENOENT
        assert info.value.filename == path
    assert handle.wait() == 0


def test_directory_as_file_is_is_a_directory_error(handle, tmp_path):
    with pytest.raises(IsADirectoryError) as info:
        handle.sync_pwrite(b"abc", tmp_path)
    assert info.value.filename == str(tmp_path)


def test_permission_denied_is_permission_error(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"x" * 100)
    os.chmod(secret, 0o600)
    if os.geteuid() != 0:
        os.chmod(secret, 0)
        with fastpersist.AioHandle() as h, pytest.raises(PermissionError):
            h.sync_pread(bytearray(100), secret)
        return
    # As root, check in a child that drops to an unprivileged user.
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            with fastpersist.AioHandle(backend="threads") as h:
                try:
                    h.sync_pread(bytearray(100), secret)
                except PermissionError as e:
                    code = 0 if e.errno == errno.EACCES and e.filename == str(secret) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_read_past_end_of_file_is_value_error(handle, tmp_path):
    path = tmp_path / "short.bin"
    handle.sync_pwrite(torch.ones(1000), path)  # 4000 bytes
    with pytest.raises(ValueError, match="past the end"):
        handle.sync_pread(torch.empty(1001), path)
    with pytest.raises(ValueError, match="past the end"):
        handle.sync_pread(torch.empty(1000), path, file_offset=1)
    with pytest.raises(ValueError, match="past the end"):
        handle.async_pread(torch.empty(2000), path)
        handle.wait()
    # The handle is still fine afterwards.
    out = torch.empty(1000)
    assert handle.sync_pread(out, path) == 1
    assert torch.equal(out, torch.ones(1000))


def test_non_contiguous_tensor_is_value_error(handle, tmp_path):
    t = torch.arange(100.0).reshape(10, 10).t()
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(t, tmp_path / "x.bin")
    with pytest.raises(ValueError, match="contiguous"):
        handle.async_pread(t, tmp_path / "x.bin")
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(torch.arange(10.0)[::2], tmp_path / "x.bin")


def test_non_contiguous_numpy_and_memoryview_are_value_errors(handle, tmp_path):
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(np.zeros((10, 10)).T, tmp_path / "x.bin")
    with pytest.raises(ValueError, match="contiguous"):
        handle.sync_pwrite(memoryview(bytearray(100))[::2], tmp_path / "x.bin")


def test_reading_into_read_only_memory_is_value_error(handle, tmp_path):
    path = tmp_path / "r.bin"
    handle.sync_pwrite(b"0123456789", path)
    with pytest.raises(ValueError, match="read-only"):
        handle.sync_pread(b"0123456789", path)
    with pytest.raises(ValueError, match="read-only"):
        handle.async_pread(memoryview(b"0123456789"), path)
    frozen = np.zeros(10, dtype=np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        handle.sync_pread(frozen, path)


def test_non_cpu_tensor_is_value_error(handle, tmp_path):
    t = torch.empty(10, device="meta")
    with pytest.raises(ValueError, match="device"):
        handle.sync_pwrite(t, tmp_path / "x.bin")


def test_not_a_buffer_is_type_error(handle, tmp_path):
    for bad in ("text", 3, 1.5, None, object()):
        with pytest.raises(TypeError):
            handle.sync_pwrite(bad, tmp_path / "x.bin")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"queue_depth": 0},
        {"block_size": 0},
        {"intra_op_parallelism": 0},
        {"queue_depth": -1},
        {"block_size": 1 << 40},
        {"backend": "floppy"},
    ],
)
def test_bad_options_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        fastpersist.AioHandle(**kwargs)


def test_bad_environment_is_value_error(monkeypatch):
    monkeypatch.setenv("FASTPERSIST_QUEUE_DEPTH", "lots")
    with pytest.raises(ValueError, match="FASTPERSIST_QUEUE_DEPTH"):
        fastpersist.AioHandle()


def test_explicit_arguments_win_over_environment(monkeypatch):
    monkeypatch.setenv("FASTPERSIST_BACKEND", "threads")
    monkeypatch.setenv("FASTPERSIST_BLOCK_SIZE", "64KiB")
    with fastpersist.AioHandle(block_size=1 << 20) as h:
        assert h.backend == "threads"  # backend=None: taken from the environment
        assert h.get_block_size() == 1 << 20


def test_bad_call_arguments(handle, tmp_path):
    t = torch.ones(10)
    with pytest.raises(TypeError):
        handle.pwrite(t, tmp_path / "x.bin", False, False, 0, bogus=1)
    with pytest.raises(TypeError):
        handle.pwrite(t, tmp_path / "x.bin", False, True, **{"async": True})
    with pytest.raises(TypeError):
        handle.sync_pwrite(t)
    with pytest.raises(TypeError):
        handle.async_pwrite(t, tmp_path / "x.bin", fd=1)
    with pytest.raises(ValueError):
        handle.sync_pwrite(t, tmp_path / "x.bin", file_offset=-1)
    with pytest.raises(ValueError):
        handle.async_pwrite(t, fd=-5)
    with pytest.raises(ValueError):
        handle.pwrite(t, 1, True, False)  # validate needs a path


def test_bad_file_descriptor_is_os_error(handle, tmp_path):
    fd = os.open(tmp_path / "closed.bin", os.O_RDWR | os.O_CREAT)
    os.close(fd)
    with pytest.raises(OSError) as info:
        handle.async_pwrite(b"abc" * 1000, fd=fd)
        handle.wait()
    assert info.value.errno == errno.EBADF
    handle.wait()


# ------------------------------------------------------------------------ the mapping table
CODES = _core._status_codes


@pytest.mark.parametrize(
    "code,err,expected",
    [
        ("io_error", errno.ENOENT, FileNotFoundError),
        ("not_found", errno.ENOENT, FileNotFoundError),
        ("not_found", 0, FileNotFoundError),
        ("io_error", errno.EACCES, PermissionError),
        ("io_error", errno.EPERM, PermissionError),
        ("io_error", errno.EEXIST, FileExistsError),
        ("io_error", errno.EISDIR, IsADirectoryError),
        ("io_error", errno.ENOSPC, OSError),
        ("io_error", errno.EIO, OSError),
        ("io_error", 0, OSError),
        ("invalid_argument", 0, ValueError),
        ("invalid_argument", errno.EINVAL, ValueError),
        ("out_of_range", 0, ValueError),
        ("unavailable", 0, RuntimeError),
        ("unavailable", errno.ENOSYS, RuntimeError),
        ("internal", 0, RuntimeError),
    ],
)
def test_status_to_exception_table(code, err, expected):
    with pytest.raises(expected) as info:
        _core._raise_status(CODES[code], err, "the message", "/some/file", 4096, 512)
    e = info.value
    assert type(e) is expected
    assert "the message" in str(e)
    assert "offset 4096" in str(e) and "length 512" in str(e)
    if isinstance(e, OSError) and err:
        assert e.errno == err
        assert e.filename == "/some/file"
    if not isinstance(e, OSError):
        assert "/some/file" in str(e)


def test_os_error_without_path_or_range():
    with pytest.raises(OSError) as info:
        _core._raise_status(CODES["io_error"], errno.ENOSPC, "short write")
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename is None
    assert "No space left on device" in str(info.value)
