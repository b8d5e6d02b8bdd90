# SPDX-License-Identifier: Apache-2.0
"""Misuse of the Python API and of every CLI subcommand: a clear exception or one clear error
line and a non-zero status, never a crash, a hang, a stack trace, or a change on disk.

The Python table names each misuse, the exception type and words of its message. The CLI part
runs every subcommand on missing paths, on paths of the wrong kind, on a damaged checkpoint and
with bad flags, and checks the exit status and that stderr is a short message, not a trace.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, List

import numpy as np
import pytest
import torch

import fastpersist
from _test_support import find_cli

CLI = find_cli()
needs_cli = pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built (set FASTPERSIST_CLI)")


def _tree(root: Path) -> List[str]:
    """Every path under root with its size: what a misuse must leave unchanged."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            out.append(f"{p.relative_to(root)}:{p.stat().st_size if p.is_file() else 'dir'}")
    return sorted(out)


@pytest.fixture
def env(tmp_path):
    """A file, an open handle and a manager with one committed checkpoint."""
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(4096))
    handle = fastpersist.AioHandle()
    mgr = fastpersist.CheckpointManager(tmp_path / "root", keep_last=3)
    mgr.save(1, {"w": torch.arange(8.0), "step": 1})
    yield {"tmp": tmp_path, "data": data, "handle": handle, "mgr": mgr}
    handle.close()
    mgr.close()


def _readonly_numpy() -> np.ndarray:
    a = np.zeros(16, dtype=np.float32)
    a.setflags(write=False)
    return a


def _closed_handle(e) -> Any:
    h = fastpersist.AioHandle()
    h.close()
    return h.sync_pwrite(torch.ones(4), e["data"])


def _closed_writer(e) -> Any:
    w = fastpersist.FastFileWriter(e["tmp"] / "w.pt")
    w.close()
    return w.write(b"abc")


def _closed_manager(call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def run(e) -> Any:
        m = fastpersist.CheckpointManager(e["tmp"] / "other")
        m.save(1, {"w": torch.ones(2)})
        m.close()
        m.close()  # a second close is a no-op
        return call(m)
    return run


MISUSES = [
    # wrong types
    ("write of an int", lambda e: e["handle"].sync_pwrite(123, e["data"]), TypeError, "buffer must be"),
    ("write of a str", lambda e: e["handle"].sync_pwrite("abc", e["data"]), TypeError, "buffer must be"),
    ("write without a path", lambda e: e["handle"].sync_pwrite(torch.ones(2), None), TypeError, "filename"),
    ("writer.write of an int", lambda e: fastpersist.FastFileWriter(e["tmp"] / "t.pt").write(12), TypeError, "data must be"),
    ("keep_last as a str", lambda e: fastpersist.CheckpointManager(e["tmp"] / "r1", keep_last="3"), TypeError, "keep_last must be an int"),
    ("keep_last as a float", lambda e: fastpersist.CheckpointManager(e["tmp"] / "r2", keep_last=2.5), TypeError, "keep_last must be an int"),
    ("durable as a str", lambda e: fastpersist.CheckpointManager(e["tmp"] / "r3", durable="false"), TypeError, "durable must be True or False"),
    ("checksums as an int", lambda e: fastpersist.CheckpointManager(e["tmp"] / "r4", checksums=0), TypeError, "checksums must be True or False"),
    ("single_submit as a str", lambda e: fastpersist.AioHandle(single_submit="yes"), TypeError, "single_submit must be True or False"),
    ("writer durable as a str", lambda e: fastpersist.FastFileWriter(e["tmp"] / "d.pt", durable="no"), TypeError, "durable must be True or False"),
    ("queue_depth as a float", lambda e: fastpersist.AioHandle(queue_depth=8.0), TypeError, "queue_depth must be an int"),
    ("unknown manager setting", lambda e: fastpersist.CheckpointManager(e["tmp"] / "r5", stagign_budget="1GiB"), TypeError, "stagign_budget"),
    # bad values
    ("unknown backend", lambda e: fastpersist.AioHandle(backend="nope"), ValueError, "unknown backend"),
    ("queue depth 0", lambda e: fastpersist.AioHandle(queue_depth=0), ValueError, "queue_depth"),
    ("keep_last 0", lambda e: fastpersist.CheckpointManager(e["tmp"] / "r6", keep_last=0), ValueError, "keep_last must be >= 1"),
    ("negative step", lambda e: e["mgr"].save(-1, {"w": torch.ones(2)}), ValueError, "step must be >= 0"),
    ("tag with a path", lambda e: e["mgr"].save("a/../b", {"w": torch.ones(2)}), ValueError, "character outside"),
    ("size that does not parse", lambda e: fastpersist.parse_size("lots"), ValueError, "cannot parse size"),
    # buffers
    ("non-contiguous tensor", lambda e: e["handle"].sync_pwrite(torch.ones(4, 4).t(), e["data"]), ValueError, "not contiguous"),
    ("meta tensor", lambda e: e["handle"].sync_pwrite(torch.ones(2, device="meta"), e["data"]), ValueError, "not a dense array"),
    ("read into bytes", lambda e: e["handle"].sync_pread(b"x" * 64, e["data"]), ValueError, "read-only"),
    ("read into a read-only memoryview", lambda e: e["handle"].sync_pread(memoryview(bytearray(64)).toreadonly(), e["data"]), ValueError, "read-only"),
    ("read into a read-only array", lambda e: e["handle"].sync_pread(_readonly_numpy(), e["data"]), ValueError, "read-only"),
    ("negative write offset", lambda e: e["handle"].sync_pwrite(torch.ones(2), e["data"], file_offset=-1), ValueError, "file_offset must be in"),
    ("negative read offset", lambda e: e["handle"].sync_pread(torch.empty(2), e["data"], file_offset=-4096), ValueError, "file_offset must be in"),
    ("offset past 2**63", lambda e: e["handle"].sync_pread(torch.empty(2), e["data"], file_offset=2**64), ValueError, "file_offset must be in"),
    ("read past the end", lambda e: e["handle"].sync_pread(torch.empty(2048), e["data"]), ValueError, "past the end"),
    ("load into a tensor of another shape", lambda e: e["mgr"].load(1, into={"w": torch.empty(9)}), ValueError, "w"),
    # closed objects
    ("closed AioHandle", _closed_handle, ValueError, "closed AioHandle"),
    ("closed FastFileWriter", _closed_writer, ValueError, "closed writer"),
    ("save on a closed manager", _closed_manager(lambda m: m.save(2, {"w": torch.ones(2)})), ValueError, "is closed"),
    ("save_async on a closed manager", _closed_manager(lambda m: m.save_async(2, {"w": torch.ones(2)})), ValueError, "is closed"),
    ("prune of a closed manager", _closed_manager(lambda m: m.prune(keep_last=1)), ValueError, "is closed"),
    ("remove on a closed manager", _closed_manager(lambda m: m.remove(1)), ValueError, "is closed"),
    # paths and the root
    ("second manager on a root", lambda e: fastpersist.CheckpointManager(e["tmp"] / "root"), fastpersist.CheckpointLockedError, "in use by another CheckpointManager"),
    ("manager on a file", lambda e: fastpersist.CheckpointManager(e["data"]), NotADirectoryError, "Not a directory"),
    ("save onto a directory", lambda e: fastpersist.save({"a": 1}, e["tmp"]), IsADirectoryError, "is a directory"),
    ("load of a missing file", lambda e: fastpersist.load(e["tmp"] / "nope.pt"), FileNotFoundError, "nope.pt"),
    ("load of a missing checkpoint", lambda e: e["mgr"].load(99), FileNotFoundError, "no checkpoint 'step-00000099'"),
    ("state that cannot be pickled", lambda e: e["mgr"].save(2, {"f": lambda x: x}), Exception, "pickle"),
]


def test_a_closed_manager_still_reads_like_the_cli(tmp_path):
    """close() releases the root's lock: saves and removals raise, reads go on (they take no
    lock, as `fastpersist list/verify` take none)."""
    m = fastpersist.CheckpointManager(tmp_path)
    m.save(1, {"w": torch.ones(2)})
    m.close()
    assert m.list() == ["step-00000001"] and m.latest() == "step-00000001"
    assert m.verify() == [] and torch.equal(m.load()["w"], torch.ones(2))
    assert m.resume()[0] == "step-00000001"


@pytest.mark.parametrize("name,call,exc,words", MISUSES, ids=[m[0] for m in MISUSES])
def test_python_misuse_is_a_clear_exception_and_changes_nothing(env, name, call, exc, words):
    before = _tree(env["tmp"] / "root")
    with pytest.raises(exc) as info:
        call(env)
    assert re.search(re.escape(words), str(info.value), re.IGNORECASE), f"{name}: {info.value!r}"
    assert _tree(env["tmp"] / "root") == before, f"{name} changed the root"
    # The handle and the manager still work afterwards.
    env["handle"].sync_pwrite(torch.ones(4), env["data"])
    assert env["mgr"].list() == ["step-00000001"]


def test_paths_without_permission_are_permission_errors(tmp_path):
    """As an unprivileged user (root drops privileges in a child): a root and a file it may not
    write or read give PermissionError naming the path."""
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "f.bin").write_bytes(bytes(100))
    os.chmod(locked / "f.bin", 0o600)
    os.chmod(locked, 0o755)
    os.chmod(tmp_path, 0o755)
    script = f"""
import os, sys, torch, fastpersist
if os.geteuid() == 0:
    os.setgid(65534); os.setuid(65534)
results = []
for what, fn in [
    ("manager", lambda: fastpersist.CheckpointManager({str(locked / 'root')!r})),
    ("save", lambda: fastpersist.save({{"a": torch.ones(2)}}, {str(locked / 'x.pt')!r})),
    ("read", lambda: fastpersist.AioHandle(backend="threads").sync_pread(bytearray(100), {str(locked / 'f.bin')!r})),
]:
    try:
        fn()
        results.append(what + ": no error")
    except PermissionError as e:
        results.append(what + ": PermissionError " + str(e.filename))
    except BaseException as e:
        results.append(what + ": " + type(e).__name__ + " " + str(e))
print("\\n".join(results))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"manager: PermissionError {locked / 'root'}", lines
    assert lines[1].startswith("save: PermissionError"), lines
    assert lines[2] == f"read: PermissionError {locked / 'f.bin'}", lines
    assert sorted(os.listdir(locked)) == ["f.bin"]


# ------------------------------------------------------------------ every CLI subcommand
def _cli(*args: Any, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, FASTPERSIST_PYTHON=sys.executable)
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


@pytest.fixture
def cli_env(tmp_path):
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint\n")
    (tmp_path / "empty").mkdir()
    root = tmp_path / "root"
    with fastpersist.CheckpointManager(root) as m:
        m.save(1, {"w": torch.arange(1000.0)})
        m.save(2, {"w": torch.arange(1000.0)})
    # Damage step 2: a byte of its data file and its manifest's JSON.
    data = next((root / "step-00000002").glob("*.safetensors"))
    raw = bytearray(data.read_bytes())
    raw[-10] ^= 0xFF
    data.write_bytes(bytes(raw))
    bad = tmp_path / "badmanifest"
    bad.mkdir()
    (bad / "step-00000001").mkdir()
    (bad / "step-00000001" / "manifest.json").write_text('{"format": "fastpersist-checkpoint", "tag": ')
    return tmp_path


SUBCOMMAND_MISUSE = [
    # (args, expected status); {p} is the test folder
    (["report", "--folder", "{p}/missing"], 2),
    (["report", "--folder", "{p}/junk.bin"], 2),
    (["report", "--bogus"], 2),
    (["io-bench", "--folder", "{p}/missing", "--size", "1MiB"], 2),
    (["io-bench", "--folder", "{p}", "--size", "lots"], 2),
    (["io-bench", "--folder", "{p}", "--size", "1MiB", "--queue-depth", "-3"], 2),
    (["list", "{p}/missing"], 2),
    (["list", "{p}/junk.bin"], 2),
    (["list"], 2),
    (["inspect", "{p}/missing"], 2),
    (["inspect", "{p}/junk.bin"], 2),
    (["inspect", "{p}/badmanifest/step-00000001"], 1),
    (["verify", "{p}/missing"], 2),
    (["verify", "{p}/junk.bin"], 2),
    (["verify", "{p}/empty"], 1),
    (["verify", "{p}/root"], 1),
    (["verify", "{p}/root/step-00000002"], 1),
    (["verify", "{p}/badmanifest"], 1),
    (["prune", "{p}/missing", "--keep-last", "1"], 2),
    (["prune", "{p}/junk.bin", "--keep-last", "1"], 2),
    (["prune", "{p}/root"], 2),
    (["prune", "{p}/root", "--keep-last", "nan"], 2),
    (["prune", "{p}/root", "--keep-last", "0"], 2),
    (["convert", "{p}/missing", "{p}/out.safetensors"], 2),
    (["convert", "{p}/junk.bin", "{p}/out.safetensors"], 1),
    (["convert", "{p}/root/step-00000002", "{p}/out.safetensors"], 1),
    (["convert", "{p}/badmanifest/step-00000001", "{p}/out.safetensors"], 1),
    (["clean", "{p}/missing"], 2),
    (["clean", "{p}/junk.bin"], 2),
    (["clean", "{p}", "--parallel-min-age", "inf"], 2),
    (["tune", "--folder", "{p}/missing"], 2),
    (["tune", "--folder", "{p}", "--budget", "soon"], 2),
    (["tune", "--folder", "{p}", "--size", "3"], 2),
    (["tune", "--folder", "{p}", "--read", "--write"], 2),
    (["tune", "--folder", "{p}", "--output", "{p}/missing/cfg.json"], 2),
    (["tune", "--folder", "{p}", "--plot", "{p}/empty"], 2),
    (["advise"], 2),
    (["advise", "--mtbf-hours", "nan", "--checkpoint-seconds", "1"], 2),
    (["advise", "--mtbf-hours", "10"], 2),
    (["advise", "--mtbf-hours", "10", "--measure", "{p}/missing"], 2),
    (["advise", "--mtbf-hours", "10", "--measure", "{p}/junk.bin"], 2),
    (["advise", "--mtbf-hours", "10", "--checkpoint-seconds", "1", "--step-seconds", "-1"], 2),
    (["drain", "{p}/missing", "{p}/tier"], 2),
    (["drain", "{p}/junk.bin", "{p}/tier"], 2),
    (["drain", "{p}/root", "{p}/junk.bin"], 1),
    (["drain", "{p}/root", "{p}/root"], 2),
    (["drain", "{p}/root", "{p}/tier", "--transfers", "0"], 2),
    (["drain", "{p}/root", "{p}/tier", "--bandwidth", "fast"], 2),
    (["drain", "{p}/root", "{p}/tier", "--part-size", "8MiB"], 2),
    (["drain", "{p}/root", "s3://bucket/prefix", "--part-size", "1KiB"], 2),
    (["drain", "{p}/root", "ftp://host/path"], 1),
    (["list", "s3://"], 1),
    (["verify", "s3://bucket/../x"], 1),
    (["prune", "s3://bucket/a//b", "--keep-last", "1"], 1),
    (["--config", "{p}/junk.bin", "list", "{p}/root"], 2),
    (["--config", "{p}/missing.json", "list", "{p}/root"], 2),
    (["nosuchcommand"], 2),
    (["--bogus"], 2),
]


@needs_cli
@pytest.mark.parametrize("args,status", SUBCOMMAND_MISUSE, ids=[" ".join(a) for a, _ in SUBCOMMAND_MISUSE])
def test_every_subcommand_refuses_bad_input_with_a_clear_message(cli_env, args, status):
    before = _tree(cli_env)
    r = _cli(*[a.format(p=cli_env) for a in args], cwd=cli_env)
    out = r.stdout + r.stderr
    assert r.returncode == status, f"status {r.returncode}, expected {status}:\n{out}"
    assert "Traceback" not in out and "terminate called" not in out and "Aborted" not in out, out
    if status == 2 or args[0] in ("convert", "inspect", "drain") or "://" in " ".join(args):
        # One message (CLI11 adds a "Run with --help" line to its own usage errors).
        lines = [line for line in r.stderr.splitlines() if line and not line.startswith("Run with --help")]
        assert 1 <= len(lines) <= 2, f"stderr is not a short message:\n{r.stderr}"
    after = _tree(cli_env)
    assert after == before, f"{args} changed files: {set(after) ^ set(before)}"
