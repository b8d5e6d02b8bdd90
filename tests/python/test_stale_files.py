# SPDX-License-Identifier: Apache-2.0
"""Temporaries left by killed writers (``.<name>.fp-tmp-XXXXXX``): the next save to the same
path removes them, ``fastpersist.clean_stale_temp_files`` and ``fastpersist clean DIR`` remove
those of every target, and a living writer's temporary is never touched (it holds a lock).

Writers are real processes killed with SIGKILL while their temporary is growing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest
import torch

import fastpersist
from _test_support import find_cli

_SLOW_WRITER = textwrap.dedent("""
    import sys, time, torch, fastpersist
    target = sys.argv[1]
    data = torch.full((8 << 20,), 7, dtype=torch.uint8)
    with fastpersist.FastFileWriter(target, io_buffer_mb=1) as f:
        for i in range(1000):
            f.write(memoryview(data.numpy()))
            if i == 2:
                print("writing", flush=True)
            time.sleep(0.05)
""")


def _temps(folder: Path, target: str = "") -> List[str]:
    return sorted(n for n in os.listdir(folder)
                  if ".fp-tmp-" in n and (not target or n.startswith(f".{target}.fp-tmp-")))


def _kill_a_writer(target: Path) -> str:
    """Starts a process writing `target`, kills it with SIGKILL mid-write; returns the name of
    the temporary it left."""
    before = set(_temps(target.parent, target.name))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(target)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line == "writing\n", f"writer failed: {line!r} {proc.stderr.read()}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    new = sorted(set(_temps(target.parent, target.name)) - before)
    assert len(new) == 1, new
    assert os.path.getsize(target.parent / new[0]) > 0
    return new[0]


def test_the_next_save_of_a_path_removes_a_killed_writers_temporary(tmp_path):
    target = tmp_path / "model.pt"
    _kill_a_writer(target)
    other = _kill_a_writer(tmp_path / "other.pt")
    assert not target.exists()
    obj = {"w": torch.arange(1000, dtype=torch.float32)}
    fastpersist.save(obj, target)
    assert _temps(tmp_path, "model.pt") == []
    assert _temps(tmp_path) == [other], "other targets' debris is left to their writers / clean"
    assert torch.equal(torch.load(target, weights_only=True)["w"], obj["w"])


def test_clean_removes_dead_writers_temporaries_and_keeps_living_ones(tmp_path):
    dead = [_kill_a_writer(tmp_path / "a.pt"), _kill_a_writer(tmp_path / "b.pt")]
    (tmp_path / "keep.pt").write_bytes(b"not a temporary")
    with fastpersist.FastFileWriter(tmp_path / "live.pt") as live:
        live.write(b"x" * 4096)
        live_temp = _temps(tmp_path, "live.pt")
        assert len(live_temp) == 1

        dry = fastpersist.clean_stale_temp_files(tmp_path, dry_run=True)
        assert sorted(os.path.basename(p) for p in dry.removed) == sorted(dead)
        assert len(_temps(tmp_path)) == 3, "a dry run removes nothing"

        report = fastpersist.clean_stale_temp_files(tmp_path)
        assert sorted(os.path.basename(p) for p in report.removed) == sorted(dead)
        assert [os.path.basename(p) for p in report.in_use] == live_temp
        assert report.failed == []
        assert report.removed_bytes > 0
        assert _temps(tmp_path) == live_temp
    assert (tmp_path / "live.pt").read_bytes() == b"x" * 4096
    assert sorted(os.listdir(tmp_path)) == ["keep.pt", "live.pt"]


def test_clean_of_a_missing_folder_raises(tmp_path):
    with pytest.raises(OSError, match="nope"):
        fastpersist.clean_stale_temp_files(tmp_path / "nope")


def test_cli_clean(tmp_path):
    cli = find_cli()
    if cli is None:
        pytest.skip("the fastpersist CLI is not built")
    dead = _kill_a_writer(tmp_path / "ckpt.pt")
    r = subprocess.run([cli, "clean", str(tmp_path), "--dry-run"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert f"would remove {tmp_path / dead}" in r.stdout
    assert "nothing was changed (dry run)" in r.stdout
    assert _temps(tmp_path) == [dead]

    r = subprocess.run([cli, "clean", str(tmp_path), "--json"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["dirs"][0]["removed"] == [str(tmp_path / dead)]
    assert out["dirs"][0]["removed_bytes"] > 0
    assert _temps(tmp_path) == []

    r = subprocess.run([cli, "clean", str(tmp_path / "missing")], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 2
    assert "does not exist" in r.stderr

    (tmp_path / "f.pt").write_bytes(b"1")
    r = subprocess.run([cli, "clean", str(tmp_path / "f.pt")], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 2
    assert "give the directory" in r.stderr


def test_clean_removes_an_abandoned_parallel_set_once_old_enough(tmp_path):
    """Two of three parallel writers close (no commit timeout), the third never comes: the
    shared temporary and its records stay. clean keeps them while young, removes them with
    --parallel-min-age 0 (CLI) / parallel_min_age=0 (Python)."""
    path = tmp_path / "p.pt"
    for rank in range(2):
        with fastpersist.FastFileWriter(path, num_parallel_writers=3, writer_rank=rank,
                                        stripe_mb=0.25) as f:
            f.write(b"y" * (3 << 20))
        assert not f.file_committed
    leftovers = sorted(os.listdir(tmp_path))
    assert leftovers == [".p.pt.fp-partial", ".p.pt.fp-partial.done", ".p.pt.fp-partial.lock"]

    kept = fastpersist.clean_stale_temp_files(tmp_path)
    assert [os.path.basename(p) for p in kept.too_recent] == [".p.pt.fp-partial"]
    assert sorted(os.listdir(tmp_path)) == leftovers
    with pytest.raises(ValueError, match="parallel_min_age"):
        fastpersist.clean_stale_temp_files(tmp_path, parallel_min_age=-1)

    cli = find_cli()
    if cli is not None:
        r = subprocess.run([cli, "clean", str(tmp_path)], capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
        assert "written recently" in r.stdout and sorted(os.listdir(tmp_path)) == leftovers
        r = subprocess.run([cli, "clean", str(tmp_path), "--parallel-min-age", "0"],
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
        assert f"removed {tmp_path / '.p.pt.fp-partial'}" in r.stdout
    else:
        removed = fastpersist.clean_stale_temp_files(tmp_path, parallel_min_age=0)
        assert [os.path.basename(p) for p in removed.removed] == [".p.pt.fp-partial"]
    assert os.listdir(tmp_path) == []


def test_recursive_clean_reaches_subfolders(tmp_path):
    sub = tmp_path / "rank1" / "ckpt"
    sub.mkdir(parents=True)
    dead = _kill_a_writer(sub / "model.pt")
    assert fastpersist.clean_stale_temp_files(tmp_path).removed == [], "not recursive by default"
    cli = find_cli()
    if cli is not None:
        r = subprocess.run([cli, "clean", "-r", str(tmp_path), "--dry-run"], capture_output=True,
                           text=True, check=False)
        assert r.returncode == 0, r.stderr
        assert f"would remove {sub / dead}" in r.stdout
    report = fastpersist.clean_stale_temp_files(tmp_path, recursive=True)
    assert report.removed == [str(sub / dead)]
    assert os.listdir(sub) == []
