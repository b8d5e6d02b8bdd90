# SPDX-License-Identifier: Apache-2.0
"""Checkpoint roots made by an attacker, one class of defect each (issue 15): input that recurses,
special files under a checkpoint's names, sizes that would drive allocations, symbolic links
planted in a root, counters that would overflow, well-formed values the reader does not expect,
bytes that are not UTF-8, CLI numbers that are not numbers, and a checkpoint removed while it is
verified. Every reader must answer with a clear error or skip the checkpoint: never hang, crash,
allocate what a size field says, or touch a file outside the root.

The CLI and the managers that could crash run in child processes, with timeouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import List

import pytest
import torch

import fastpersist
from _test_support import find_cli

TAG1, TAG2 = "step-00000001", "step-00000002"
CLI = find_cli()
needs_cli = pytest.mark.skipif(CLI is None, reason="the fastpersist CLI is not built")


def two_checkpoints(root: Path, **options: object) -> None:
    with fastpersist.CheckpointManager(root, **options) as mgr:
        mgr.save(1, {"w": torch.arange(20, dtype=torch.float32), "step": 1})
        mgr.save(2, {"w": torch.arange(20, dtype=torch.float32) * 2, "step": 2})


def manifest(root: Path, tag: str = TAG2) -> Path:
    return root / tag / "manifest.json"


def edit_manifest(root: Path, edit, tag: str = TAG2) -> None:
    path = manifest(root, tag)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    assert CLI is not None
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (a crash there fails the test instead of ending pytest)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, check=False)


def assert_clean_exit(r: subprocess.CompletedProcess, codes=(0, 1)) -> None:
    """A normal exit with one of `codes`: no signal, no abort, no stack trace."""
    assert r.returncode in codes, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr, r.stderr


def assert_only_step1_listed(root: Path) -> None:
    r = python(f"""
        import warnings, fastpersist
        warnings.simplefilter("ignore")
        with fastpersist.CheckpointManager({str(root)!r}) as m:
            print(m.list())
            tag, state = m.resume()
            print(tag, state["step"])
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [f"['{TAG1}']", f"{TAG1} 1"], r.stdout + r.stderr


# ------------------------------------------------------------------ recursion on input
@needs_cli
def test_metadata_nested_200000_levels_is_damage_not_a_crash(tmp_path: Path) -> None:
    root = tmp_path / "root"
    two_checkpoints(root)
    text = manifest(root).read_text()
    deep = "[" * 200_000 + "]" * 200_000
    manifest(root).write_text(text.replace('"metadata": {}', f'"metadata": {{"x": {deep}}}', 1))
    assert deep in manifest(root).read_text()
    for args in (["list", str(root)], ["list", str(root), "--json"], ["verify", str(root)],
                 ["inspect", str(root / TAG2)]):
        r = cli(*args)
        assert_clean_exit(r)
    assert "nested deeper than 256 levels" in cli("verify", str(root)).stdout
    assert_only_step1_listed(root)


def test_metadata_too_deep_to_read_back_is_refused_at_save(tmp_path: Path) -> None:
    deep: object = 0
    for _ in range(300):
        deep = [deep]
    with fastpersist.CheckpointManager(tmp_path / "root") as mgr:
        with pytest.raises(ValueError, match="nested deeper than 255 levels"):
            mgr.save(1, {"w": torch.zeros(2)}, metadata={"deep": deep})
        assert mgr.list() == []


# ------------------------------------------------------------------ special files
@needs_cli
@pytest.mark.parametrize("name", ["manifest.json", "latest"])
def test_a_fifo_under_a_checkpoint_name_does_not_hang_readers(tmp_path: Path, name: str) -> None:
    root = tmp_path / "root"
    two_checkpoints(root)
    target = manifest(root) if name == "manifest.json" else root / "latest"
    target.unlink()
    os.mkfifo(target)
    for args in (["list", str(root)], ["verify", str(root)], ["inspect", str(root / TAG2)],
                 ["prune", str(root), "--keep-last", "5", "--dry-run"]):
        assert_clean_exit(cli(*args, timeout=30))  # TimeoutExpired if it hangs
    if name == "manifest.json":
        assert "FIFO" in cli("verify", str(root), timeout=30).stdout
        assert_only_step1_listed(root)
    else:
        r = python(f"""
            import fastpersist
            with fastpersist.CheckpointManager({str(root)!r}) as m:
                print(m.latest())
        """, timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == TAG2, r.stdout + r.stderr
        assert (root / "latest").is_file(), "the manager replaced the FIFO with the pointer"


# ------------------------------------------------------------------ sizes that drive allocations
@needs_cli
def test_a_one_tib_sparse_manifest_is_damage_not_an_allocation(tmp_path: Path) -> None:
    root = tmp_path / "root"
    two_checkpoints(root)
    with open(manifest(root), "r+b") as f:
        f.truncate(1 << 40)
    for args in (["list", str(root)], ["verify", str(root)], ["inspect", str(root / TAG2)]):
        assert_clean_exit(cli(*args))
    assert "more than any manifest holds" in cli("verify", str(root)).stdout
    assert_only_step1_listed(root)


def test_a_huge_checksum_range_is_hashed_in_pieces(tmp_path: Path) -> None:
    """A data file made sparse to 1 GiB with its manifest agreeing (size and checksum_bytes):
    the load hashes the 1 GiB in pieces and refuses it; it never allocates 1 GiB."""
    root = tmp_path / "root"
    two_checkpoints(root)
    doc = json.loads(manifest(root).read_text())
    data = next(f for f in doc["files"] if f["role"] == "tensors")
    with open(root / TAG2 / data["name"], "r+b") as f:
        f.truncate(1 << 30)
    data["size"] = data["checksum_bytes"] = 1 << 30
    manifest(root).write_text(json.dumps(doc))
    r = python(f"""
        import fastpersist
        with fastpersist.CheckpointManager({str(root)!r}) as m:
            try:
                m.load("{TAG2}")
            except fastpersist.CheckpointCorruptError as e:
                print("refused:", "fails its checksum" in str(e))
        # VmHWM: this process's own peak (ru_maxrss would count the parent's RSS at fork too).
        print(next(int(line.split()[1]) for line in open("/proc/self/status")
                   if line.startswith("VmHWM:")) // 1024)
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    refused, peak_mib = r.stdout.splitlines()
    assert refused == "refused: True"
    assert int(peak_mib) < 700, f"peak RSS {peak_mib} MiB: the checksum range was allocated"


# ------------------------------------------------------------------ symbolic links planted in a root
@needs_cli
def test_a_lock_linked_to_another_file_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    root = tmp_path / "root"
    two_checkpoints(root)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (root / ".lock").unlink()
    (root / ".lock").symlink_to(victim)
    with pytest.raises(fastpersist.CheckpointCorruptError, match="symbolic link"):
        fastpersist.CheckpointManager(root)
    r = cli("prune", str(root), "--keep-last", "1")
    assert_clean_exit(r, codes=(1,))
    assert "symbolic link" in r.stderr + r.stdout
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step")) == [TAG1, TAG2]


@needs_cli
def test_clean_dry_run_creates_nothing_through_a_linked_writers_lock(tmp_path: Path) -> None:
    folder, outside = tmp_path / "models", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    partial = folder / ".model.bin.fp-partial"
    partial.write_bytes(b"\0" * 4096)
    os.utime(partial, (0, 0))  # abandoned long ago
    (folder / ".model.bin.fp-partial.lock").symlink_to(outside / "created")
    for dry in (["--dry-run"], []):
        r = cli("clean", str(folder), *dry)
        assert_clean_exit(r)
        assert not (outside / "created").exists(), "a file was created outside the folder"
    assert partial.exists(), "nothing is removed while its lock is a planted link"


def test_a_tag_linked_to_a_directory_outside_the_root_is_not_read(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    two_checkpoints(root)
    two_checkpoints(elsewhere)
    (root / "step-00000009").symlink_to(elsewhere / TAG2, target_is_directory=True)
    with fastpersist.CheckpointManager(root) as mgr:
        assert mgr.list() == [TAG1, TAG2]
        mgr.prune(keep_last=1)
        assert (elsewhere / TAG2 / "manifest.json").exists(), "retention followed the link"


@needs_cli
def test_a_data_file_linked_out_of_the_root_is_not_read(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    two_checkpoints(root)
    outside.mkdir()
    doc = json.loads(manifest(root).read_text())
    name = next(f["name"] for f in doc["files"] if f["role"] == "tensors")
    (root / TAG2 / name).rename(outside / name)
    (root / TAG2 / name).symlink_to(outside / name)
    r = cli("verify", str(root / TAG2))
    assert_clean_exit(r, codes=(1,))
    assert "symbolic link" in r.stdout
    assert_only_step1_listed(root)


# ------------------------------------------------------------------ counters that overflow
def test_a_sequence_at_the_top_of_uint64_does_not_wrap_later_saves(tmp_path: Path) -> None:
    root = tmp_path / "root"
    two_checkpoints(root)
    edit_manifest(root, lambda d: d.update(sequence=2**64 - 1))
    with fastpersist.CheckpointManager(root, keep_last=2) as mgr:
        assert mgr.list() == [TAG1]  # the altered one is damage now
        tag = mgr.save(3, {"w": torch.ones(3)})
        assert mgr.latest() == tag and tag in mgr.list()
        tag4 = mgr.save(4, {"w": torch.ones(3)})
        assert mgr.list()[-2:] == [tag, tag4], "retention kept the new saves"


# ------------------------------------------------------------------ unexpected, well-formed values
def test_a_dtype_torch_has_no_counterpart_for_is_skipped_by_resume(tmp_path: Path) -> None:
    """C64 is a safetensors dtype with no torch counterpart in our table: the checkpoint
    (consistent: manifest and data file agree, saved without checksums) is unsupported, and
    resume() falls back to the older one."""
    root = tmp_path / "root"
    two_checkpoints(root, checksums=False)
    doc = json.loads(manifest(root).read_text())
    entry = next(t for t in doc["tensors"] if t["name"] == "w")
    entry.update(dtype="C64", shape=[10])
    manifest(root).write_text(json.dumps(doc))
    data = root / TAG2 / entry["file"]
    raw = data.read_bytes()
    old = b'"w":{"dtype":"F32","shape":[20]'
    assert old in raw
    data.write_bytes(raw.replace(old, b'"w":{"dtype":"C64","shape":[10]'))
    with fastpersist.CheckpointManager(root) as mgr:
        with pytest.raises(fastpersist.CheckpointUnsupportedError, match="'w' is stored as C64"):
            mgr.load(TAG2)
        with pytest.warns(UserWarning, match="cannot load"):
            tag, state = mgr.resume()
        assert tag == TAG1 and torch.equal(state["w"], torch.arange(20, dtype=torch.float32))


@needs_cli
def test_checksums_switched_off_in_the_manifest_is_damage_everywhere(tmp_path: Path) -> None:
    root = tmp_path / "root"
    two_checkpoints(root)
    edit_manifest(root, lambda d: d.update(checksum_algorithm="none"))
    r = cli("verify", str(root / TAG2))
    assert_clean_exit(r, codes=(1,))
    assert "the manifest was altered" in r.stdout
    with fastpersist.CheckpointManager(root) as mgr:
        assert mgr.list() == [TAG1]
        with pytest.raises(fastpersist.CheckpointCorruptError, match="the manifest was altered"):
            mgr.load(TAG2)


# ------------------------------------------------------------------ output encoding
@needs_cli
def test_list_json_of_a_root_whose_path_is_not_utf8(tmp_path: Path) -> None:
    two_checkpoints(tmp_path / "run")
    root = os.path.join(os.fsencode(tmp_path), b"run-\xff\xfe")
    os.rename(os.fsencode(tmp_path / "run"), root)
    r = subprocess.run([os.fsencode(CLI), b"list", root, b"--json"], capture_output=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout.decode("utf-8"))
    assert [c["tag"] for c in listed["checkpoints"]] == [TAG1, TAG2]
    assert listed["root"].endswith("run-\ufffd\ufffd")


# ------------------------------------------------------------------ CLI numbers
@needs_cli
@pytest.mark.parametrize("args,said", [
    (["clean", "{d}", "--parallel-min-age", "nan"], "'nan' is not a finite number"),
    (["clean", "{d}", "--parallel-min-age", "inf"], "'inf' is not a finite number"),
    (["clean", "{d}", "--parallel-min-age", "-1"], "not in"),
    (["prune", "{d}", "--keep-last", "1", "--keep-every", "99999999999999999999"], "not in"),
    (["prune", "{d}", "--keep-last", "1", "--keep-every", "0"], "not in"),
    (["prune", "{d}", "--keep-last", "1.5"], "not a whole number"),
])
def test_cli_numbers_out_of_range_are_usage_errors(tmp_path: Path, args: List[str],
                                                   said: str) -> None:
    two_checkpoints(tmp_path)
    r = cli(*[a.format(d=tmp_path) for a in args])
    assert r.returncode == 2, r.stdout + r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step")) == [TAG1, TAG2]


# ------------------------------------------------------------------ races
@needs_cli
def test_verify_of_a_root_does_not_call_a_pruned_checkpoint_damaged(tmp_path: Path) -> None:
    """Retention in another process removes checkpoints while `verify ROOT` checks them: a
    checkpoint that went is reported GONE, never DAMAGED."""
    root = tmp_path / "root"
    with fastpersist.CheckpointManager(root) as mgr:
        for step in range(1, 41):
            mgr.save(step, {"w": torch.full((4096,), float(step))})
    stop = threading.Event()

    def prune() -> None:
        with fastpersist.CheckpointManager(root) as mgr:
            for keep in range(39, 0, -1):
                if stop.is_set():
                    return
                mgr.prune(keep_last=keep)

    pruner = threading.Thread(target=prune)
    pruner.start()
    try:
        r = cli("verify", str(root))
    finally:
        stop.set()
        pruner.join()
    assert "DAMAGED" not in r.stdout, r.stdout
    assert_clean_exit(r)
