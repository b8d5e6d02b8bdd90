# SPDX-License-Identifier: Apache-2.0
"""The checkpoint subcommands of the `fastpersist` CLI: list, inspect, verify, prune, convert.

Runs the real executable (found like test_cli.py: $FASTPERSIST_CLI, else build/tools/fastpersist
in this checkout, else `fastpersist` on PATH) on checkpoints written by
fastpersist.CheckpointManager in temporary directories. `convert` runs Python; the tests point
it at this interpreter with FASTPERSIST_PYTHON, so fastpersist must be installed in it
(`make python`).
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from _test_support import find_cli
import torch

import fastpersist

ROOT = Path(__file__).resolve().parents[2]
TAGS = ["step-00000100", "step-00000200", "step-00000300"]
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


CLI = find_cli()
pytestmark = pytest.mark.skipif(
    CLI is None,
    reason="fastpersist CLI not built: set FASTPERSIST_CLI or build build/tools/fastpersist")


def run_cli(*args, env=None, cli=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    full_env.update(env or {})
    return subprocess.run([cli or CLI, *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300, env=full_env)


def run_convert(*args):
    return run_cli("convert", *args, env={"FASTPERSIST_PYTHON": sys.executable})


def run_cli_keeping_cr(*args, env=None):
    """run_cli, with stdout and stderr decoded as they are: text mode would turn the '\r' of a
    progress bar into '\n'."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    full_env.update(env or {})
    proc = subprocess.run([CLI, *map(str, args)], capture_output=True, timeout=300, env=full_env)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                       proc.stderr.decode())


def state_for(step):
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"embed.weight": torch.randn(32, 16, generator=g),
                  "layer.0.bias": torch.arange(16, dtype=torch.int64) + step,
                  "norm.scale": torch.randn(16, generator=g).to(torch.bfloat16)},
        "step": step,
        "lr": 0.001,
    }


@pytest.fixture
def root(tmp_path):
    """A root with three committed checkpoints: steps 100, 200, 300 (latest)."""
    path = tmp_path / "ckpts"
    with fastpersist.CheckpointManager(path, durable=False) as mgr:
        for step in (100, 200, 300):
            mgr.save(step, state_for(step), metadata={"run": "cli-test", "step": step})
    return path


def manifest(ckpt_dir):
    return json.loads((Path(ckpt_dir) / "manifest.json").read_text())


def flip_tensor_byte(ckpt_dir, name):
    """Flips one byte inside tensor `name`'s data (not its header): a silent bit flip."""
    t = next(t for t in manifest(ckpt_dir)["tensors"] if t["name"] == name)
    path = Path(ckpt_dir) / t["file"]
    data = bytearray(path.read_bytes())
    data[t["offset"] + t["length"] // 2] ^= 0x40
    path.write_bytes(bytes(data))


# --- list -------------------------------------------------------------------------------------

def test_list_text_oldest_to_newest_with_latest_marked(root):
    proc = run_cli("list", root)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rows = [line for line in lines[1:] if re.match(r"[* ] step-\d{8}", line)]
    assert [re.search(r"step-\d{8}", r).group(0) for r in rows] == TAGS
    assert rows[-1].startswith("* step-00000300"), proc.stdout
    assert not any(r.startswith("*") for r in rows[:-1])
    assert "3 checkpoints" in lines[0] and "latest step-00000300" in lines[0]
    for r in rows:
        assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r)  # created, ISO 8601 UTC
        assert re.search(r"\d+(\.\d+)? (B|KiB|MiB)", r)  # human-readable size
        assert re.search(r" 3 +-$", r.rstrip()), r  # tensors, and no base (full checkpoints)


def test_list_json(root):
    proc = run_cli("list", root, "--json")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    assert j["latest"] == "step-00000300"
    assert [c["tag"] for c in j["checkpoints"]] == TAGS
    assert [c["step"] for c in j["checkpoints"]] == [100, 200, 300]
    assert [c["latest"] for c in j["checkpoints"]] == [False, False, True]
    assert j["skipped"] == []
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        infos = {i.tag: i for i in mgr.checkpoints()}
    for c in j["checkpoints"]:
        assert ISO_UTC.match(c["created"])
        assert c["num_tensors"] == 3
        assert c["total_bytes"] == infos[c["tag"]].total_bytes
        assert c["tensor_bytes"] == infos[c["tag"]].tensor_bytes
        assert c["created_unix"] == pytest.approx(infos[c["tag"]].created_unix)


def test_list_shows_damaged_directories_with_the_reason(root):
    (root / "step-00000200" / "objects.pkl").unlink()
    proc = run_cli("list", root, "--json")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    assert [c["tag"] for c in j["checkpoints"]] == ["step-00000100", "step-00000300"]
    assert [s["tag"] for s in j["skipped"]] == ["step-00000200"]
    assert "objects.pkl" in j["skipped"][0]["reason"] and "missing" in j["skipped"][0]["reason"]
    text = run_cli("list", root).stdout
    assert "skipped 1 directory" in text and "step-00000200: " in text


def test_list_empty_root_and_bad_paths(tmp_path):
    proc = run_cli("list", tmp_path)
    assert proc.returncode == 0 and "no committed checkpoints" in proc.stdout
    assert json.loads(run_cli("list", tmp_path, "--json").stdout) == {
        "kind": "root", "root": str(tmp_path), "latest": None, "checkpoints": [], "skipped": [],
        "foreign_tags": []}
    missing = run_cli("list", tmp_path / "nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert not (tmp_path / "nope").exists()
    f = tmp_path / "file.txt"
    f.write_text("x")
    proc = run_cli("list", f)
    assert proc.returncode == 2 and "not a checkpoint root" in proc.stderr


def test_list_of_a_checkpoint_directory_points_at_inspect(root):
    proc = run_cli("list", root / "step-00000100")
    assert proc.returncode == 2
    assert "is a checkpoint directory" in proc.stderr and "inspect" in proc.stderr


# --- inspect ----------------------------------------------------------------------------------

def test_inspect_checkpoint_text(root):
    ckpt = root / "step-00000200"
    m = manifest(ckpt)
    proc = run_cli("inspect", ckpt)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in ("step-00000200", "200", m["fingerprint"], '"run":"cli-test"', "3 tensors",
                 "fastpersist-checkpoint v2", "xxh3-64", "torch " + torch.__version__,
                 "objects.pkl", "tensors-00000-of-00001.safetensors"):
        assert text in out, (text, out)
    assert "model.embed.weight" not in out  # tensors only with --tensors

    proc = run_cli("inspect", ckpt, "--tensors")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.strip().startswith("model.")}
    assert rows["model.embed.weight"][1:3] == ["F32", "[32,"]
    assert "[32, 16]" in proc.stdout and "BF16" in proc.stdout and "I64" in proc.stdout
    assert set(rows) == {"model.embed.weight", "model.layer.0.bias", "model.norm.scale"}


def test_inspect_checkpoint_json_matches_the_manifest(root):
    ckpt = root / "step-00000300"
    m = manifest(ckpt)
    proc = run_cli("inspect", ckpt, "--json", "--tensors")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    assert j["kind"] == "checkpoint"
    for key in ("tag", "step", "sequence", "fingerprint", "versions", "metadata", "aliases"):
        assert j[key] == m[key], key
    assert j["created_unix"] == pytest.approx(m["created_unix"])
    assert ISO_UTC.match(j["created"])
    assert j["num_tensors"] == 3
    assert j["tensor_bytes"] == sum(t["length"] for t in m["tensors"])
    assert j["total_bytes"] == sum(f["size"] for f in m["files"])
    assert [(f["name"], f["role"], f["size"]) for f in j["files"]] == [
        (f["name"], f["role"], f["size"]) for f in m["files"]]
    assert all(f["present"] and f["size_ok"] for f in j["files"]) and j["problems"] == []
    assert [(t["name"], t["dtype"], t["shape"], t["bytes"], t["file"], t["offset"])
            for t in j["tensors"]] == [
        (t["name"], t["dtype"], t["shape"], t["length"], t["file"], t["offset"])
        for t in m["tensors"]]
    assert "tensors" not in json.loads(run_cli("inspect", ckpt, "--json").stdout)


def test_inspect_manifest_file_means_its_directory(root):
    proc = run_cli("inspect", root / "step-00000100" / "manifest.json", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tag"] == "step-00000100"


def test_inspect_safetensors_file(tmp_path):
    path = tmp_path / "weights.safetensors"
    fastpersist.save_safetensors({"w": torch.ones(3, 4), "ids": torch.arange(5),
                                  "s": torch.tensor(2.0, dtype=torch.float16)}, path,
                                 metadata={"source": "test"})
    proc = run_cli("inspect", path, "--json", "--tensors")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    assert j["kind"] == "safetensors"
    assert j["data_start"] == 4096 and j["file_bytes"] == path.stat().st_size
    assert j["metadata"] == {"format": "pt", "source": "test"}
    assert j["num_tensors"] == 3 and j["dtypes"]["F32"] == {"tensors": 1, "bytes": 48}
    tensors = {t["name"]: t for t in j["tensors"]}
    assert tensors["w"]["dtype"] == "F32" and tensors["w"]["shape"] == [3, 4]
    assert tensors["ids"]["dtype"] == "I64" and tensors["ids"]["bytes"] == 40
    assert tensors["s"]["shape"] == [] and tensors["s"]["dtype"] == "F16"

    text = run_cli("inspect", path, "--tensors").stdout
    assert "data starts at offset 4096" in text and "source=test" in text
    assert re.search(r"^\s+w\s+F32\s+\[3, 4\]", text, re.MULTILINE), text
    assert re.search(r"^\s+s\s+F16\s+\[\]", text, re.MULTILINE), text


def test_inspect_root_lists_it(root):
    proc = run_cli("inspect", root, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [c["tag"] for c in json.loads(proc.stdout)["checkpoints"]] == TAGS


def test_inspect_bad_paths(tmp_path):
    proc = run_cli("inspect", tmp_path / "missing")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    proc = run_cli("inspect", junk)
    assert proc.returncode == 2
    assert "not a checkpoint directory, a checkpoint root or a safetensors file" in proc.stderr
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    proc = run_cli("inspect", bad)
    assert proc.returncode == 1 and "not a valid safetensors file" in proc.stderr
    assert proc.stdout == ""


def test_inspect_checkpoint_without_manifest(root):
    (root / "step-00000100" / "manifest.json").unlink()
    proc = run_cli("inspect", root / "step-00000100")
    assert proc.returncode == 1 and "no manifest.json" in proc.stderr


# --- verify -----------------------------------------------------------------------------------

def test_verify_intact_checkpoint_and_root(root):
    proc = run_cli("verify", root / "step-00000100")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK") and "intact" in proc.stdout
    proc = run_cli("verify", root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 3 and "all 3 checkpoints are intact" in proc.stdout
    j = json.loads(run_cli("verify", root, "--json").stdout)
    assert j["ok"] and j["kind"] == "root" and j["problems"] == []
    assert [c["tag"] for c in j["checkpoints"]] == TAGS
    total = sum(f["size"] for f in manifest(root / TAGS[0])["files"])
    assert j["checkpoints"][0]["bytes_checked"] == total


def test_verify_flipped_byte_names_the_tensor(root):
    ckpt = root / "step-00000200"
    flip_tensor_byte(ckpt, "model.embed.weight")
    proc = run_cli("verify", ckpt)
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout.startswith("DAMAGED")
    assert "tensor 'model.embed.weight'" in proc.stdout and "checksum" in proc.stdout
    assert "model.layer.0.bias" not in proc.stdout  # only the damaged one

    j = json.loads(run_cli("verify", ckpt, "--json").stdout)
    assert not j["ok"] and len(j["problems"]) == 1
    assert "model.embed.weight" in j["problems"][0]

    # A root: every checkpoint is checked, the damaged one named, exit 1.
    proc = run_cli("verify", root)
    assert proc.returncode == 1
    assert re.search(r"^OK\s+step-00000100", proc.stdout, re.MULTILINE)
    assert re.search(r"^DAMAGED\s+step-00000200", proc.stdout, re.MULTILINE)
    assert re.search(r"^OK\s+step-00000300", proc.stdout, re.MULTILINE)
    assert "1 of 3 checkpoints damaged" in proc.stdout
    j = json.loads(run_cli("verify", root, "--json").stdout)
    assert [c["ok"] for c in j["checkpoints"]] == [True, False, True]
    assert j["problems"][0].startswith("step-00000200: tensor 'model.embed.weight'")


def test_verify_root_counts_skipped_and_manifestless_checkpoints(root):
    (root / "step-00000100" / "objects.pkl").unlink()       # list() skips it
    (root / "step-00000300" / "manifest.json").unlink()     # list() ignores it
    proc = run_cli("verify", root, "--json")
    assert proc.returncode == 1
    j = json.loads(proc.stdout)
    by_tag = {c["tag"]: c for c in j["checkpoints"]}
    assert set(by_tag) == set(TAGS)
    assert by_tag["step-00000200"]["ok"]
    assert "objects.pkl" in by_tag["step-00000100"]["problems"][0]
    assert "manifest.json is missing" in by_tag["step-00000300"]["problems"][0]


def test_verify_truncated_file(root):
    ckpt = root / "step-00000300"
    f = next(f for f in manifest(ckpt)["files"] if f["role"] == "tensors")
    with open(ckpt / f["name"], "r+b") as fh:
        fh.truncate(f["size"] - 100)
    proc = run_cli("verify", ckpt)
    assert proc.returncode == 1 and "truncated" in proc.stdout


def test_verify_progress_bar_on_stderr(root):
    proc = run_cli("verify", root / "step-00000100", "--progress")
    assert proc.returncode == 0
    assert re.search(r"verify step-00000100  \S+ \S+ / \S+ \S+  \[=+\]", proc.stderr), proc.stderr
    quiet = run_cli("verify", root / "step-00000100")  # stderr is a pipe here: no bar
    assert quiet.stderr == ""


def test_verify_safetensors_checks_the_header_only(tmp_path):
    path = tmp_path / "w.safetensors"
    fastpersist.save_safetensors({"w": torch.ones(8)}, path)
    proc = run_cli("verify", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid safetensors header" in proc.stdout and "header only" in proc.stdout
    j = json.loads(run_cli("verify", path, "--json").stdout)
    assert j["ok"] and j["header_only"] and j["kind"] == "safetensors"
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 4)
    proc = run_cli("verify", path)
    assert proc.returncode == 1 and "DAMAGED" in proc.stdout


def test_verify_bad_paths(tmp_path):
    proc = run_cli("verify", tmp_path / "missing")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = run_cli("verify", tmp_path)  # an empty root: nothing to vouch for
    assert proc.returncode == 1 and "no checkpoints" in proc.stdout
    junk = tmp_path / "x.bin"
    junk.write_bytes(b"\0" * 10)
    assert run_cli("verify", junk).returncode == 2


# --- prune ------------------------------------------------------------------------------------

def test_prune_keep_last(root):
    proc = run_cli("prune", root, "--keep-last", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "would remove step-00000100" in proc.stdout
    assert "would remove step-00000200" in proc.stdout
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == TAGS

    proc = run_cli("prune", root, "--keep-last", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == ["removed step-00000100", "removed step-00000200"]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == [TAGS[-1]]
    j = json.loads(run_cli("list", root, "--json").stdout)
    assert [c["tag"] for c in j["checkpoints"]] == [TAGS[-1]] and j["latest"] == TAGS[-1]

    proc = run_cli("prune", root, "--keep-last", "1", "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {"root": str(root), "dry_run": False, "removed": [],
                                       "kept": [TAGS[-1]]}


def _rot_a_byte(ckpt):
    """Flips one byte in the middle of the checkpoint's first tensor: sizes stay right, so
    only a checksum check notices."""
    m = json.loads((ckpt / "manifest.json").read_text())
    t = m["tensors"][0]
    with open(ckpt / t["file"], "r+b") as f:
        f.seek(t["offset"] + t["length"] // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x20]))
    return t["name"]


def test_prune_verify_keeps_the_newest_intact_checkpoint(root):
    name = _rot_a_byte(root / TAGS[-1])
    dry = json.loads(run_cli("prune", root, "--keep-last", "1", "--verify", "--dry-run",
                             "--json").stdout)
    assert dry["removed"] == [TAGS[0]]
    assert len(dry["damaged"]) == 1 and dry["damaged"][0].startswith(TAGS[-1] + ": ")
    assert name in dry["damaged"][0]
    proc = run_cli("prune", root, "--keep-last", "1", "--verify")
    assert proc.returncode == 0, proc.stderr
    assert f"damaged (fails verification, does not count towards --keep-last): {TAGS[-1]}" \
        in proc.stdout
    assert "removed step-00000100" in proc.stdout and "removed step-00000200" not in proc.stdout
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == TAGS[1:]
    # Without --verify the cheap checks pass, and the last intact checkpoint would go.
    j = json.loads(run_cli("prune", root, "--keep-last", "1", "--dry-run", "--json").stdout)
    assert j["removed"] == [TAGS[1]] and "damaged" not in j


def test_prune_keep_every_keeps_milestones(root):
    proc = run_cli("prune", root, "--keep-last", "1", "--keep-every", "200", "--json")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    assert j["removed"] == ["step-00000100"]
    assert j["kept"] == ["step-00000200", "step-00000300"]


def test_prune_removes_a_damaged_checkpoint_once_enough_valid_ones_are_newer(root):
    """TAGS[0] loses its data file: with --keep-last 2 the two valid ones after it are enough
    for it to go (intact, it would have gone too); with --keep-last 3 it stays."""
    data = next((root / TAGS[0]).glob("tensors-*.safetensors"))
    data.unlink()
    j = json.loads(run_cli("prune", root, "--keep-last", "3", "--json").stdout)
    assert j["removed"] == [] and (root / TAGS[0]).is_dir()
    dry = run_cli("prune", root, "--keep-last", "2", "--dry-run")
    assert dry.returncode == 0 and f"would remove {TAGS[0]}" in dry.stdout
    assert (root / TAGS[0]).is_dir()
    j = json.loads(run_cli("prune", root, "--keep-last", "2", "--json").stdout)
    assert j["removed"] == [TAGS[0]] and j["kept"] == TAGS[1:]
    assert not (root / TAGS[0]).exists()


def test_prune_while_another_manager_holds_the_lock(root):
    mgr = fastpersist.CheckpointManager(root, durable=False)
    try:
        proc = run_cli("prune", root, "--keep-last", "1")
        assert proc.returncode == 1
        assert "in use by another CheckpointManager" in proc.stderr
        assert f"pid {os.getpid()}" in proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
        assert mgr.list() == TAGS  # nothing removed
        dry = run_cli("prune", root, "--keep-last", "1", "--dry-run")
        assert dry.returncode == 0 and "a real prune would fail now" in dry.stdout
    finally:
        mgr.close()
    assert run_cli("prune", root, "--keep-last", "2").returncode == 0


def test_prune_bad_arguments(root, tmp_path):
    proc = run_cli("prune", root, "--keep-last", "0")
    assert proc.returncode == 2 and "--keep-last" in proc.stderr
    proc = run_cli("prune", root)
    assert proc.returncode == 2 and "--keep-last" in proc.stderr
    proc = run_cli("prune", tmp_path / "typo", "--keep-last", "1")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert not (tmp_path / "typo").exists()  # a typo never creates a root
    proc = run_cli("prune", root / TAGS[0], "--keep-last", "1")
    assert proc.returncode == 2 and "checkpoint directory, not a root" in proc.stderr
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == TAGS


# --- convert ----------------------------------------------------------------------------------

def flat_model(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"layer.0.weight": torch.randn(8, 4, generator=g),
            "layer.0.bias": torch.randn(8, generator=g).to(torch.float16),
            "layer.1.weight": torch.randn(4, 8, generator=g).to(torch.bfloat16),
            "positions": torch.arange(10, dtype=torch.int32),
            "mask": torch.tensor([True, False, True]),
            "scalar": torch.tensor(3.5, dtype=torch.float64)}


def assert_same_tensors(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def test_convert_round_trip_pt_safetensors_checkpoint_pt(tmp_path):
    from safetensors.torch import load_file

    original = flat_model()
    src = tmp_path / "model.pt"
    torch.save(original, src)

    st = tmp_path / "model.safetensors"
    proc = run_convert(src, st)
    assert proc.returncode == 0, proc.stderr
    assert f"-> safetensors file {st}" in proc.stdout and "6 tensors" in proc.stdout
    assert_same_tensors(original, load_file(st))

    ckpt = tmp_path / "ckpts" / "imported"
    proc = run_convert(st, ckpt)
    assert proc.returncode == 0, proc.stderr
    assert "tag imported" in proc.stdout
    assert run_cli("verify", ckpt).returncode == 0
    assert_same_tensors(original, fastpersist.load_checkpoint(ckpt))
    info = json.loads(run_cli("inspect", ckpt, "--json").stdout)
    assert info["metadata"] == {"converted_from": str(st)}

    back = tmp_path / "back.pt"
    proc = run_convert(ckpt, back)
    assert proc.returncode == 0, proc.stderr
    restored = torch.load(back, weights_only=True)
    assert_same_tensors(original, restored)
    # Each tensor owns its bytes (no view of one big read buffer saved along with it).
    for t in restored.values():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


def test_convert_checkpoint_to_safetensors(root, tmp_path):
    from safetensors.torch import load_file

    ckpt = root / "step-00000200"
    out = tmp_path / "step-200.safetensors"
    proc = run_convert(ckpt, out, "--drop-non-tensors")
    assert proc.returncode == 0, proc.stderr
    assert f"converted checkpoint {ckpt} -> safetensors file {out}: 3 tensors" in proc.stdout
    assert "left out 2 non-tensor value(s)" in proc.stdout
    expected = {f"model.{k}": v for k, v in state_for(200)["model"].items()}
    assert_same_tensors(expected, load_file(out))

    model = tmp_path / "model.safetensors"
    proc = run_convert(ckpt, model, "--prefix", "model.", "--progress")
    assert proc.returncode == 0, proc.stderr
    assert_same_tensors(state_for(200)["model"], load_file(model))


def test_convert_safetensors_to_pt(tmp_path):
    from safetensors.torch import save_file

    original = flat_model(2)
    src = tmp_path / "hf.safetensors"
    save_file(original, src)  # the safetensors library's layout: tensors need not be aligned
    for out, flags in ((tmp_path / "a.pt", ()), (tmp_path / "b.pt", ("--progress",))):
        proc = run_convert(src, out, *flags)
        assert proc.returncode == 0, proc.stderr
        assert f"converted safetensors {src} -> torch file {out}: 6 tensors" in proc.stdout
        restored = torch.load(out, weights_only=True)
        assert_same_tensors(original, restored)
        for t in restored.values():
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


def bar_lines(stderr):
    """{label: final frame} of the bars on stderr, checking that each is well formed: redrawn
    with '\r', every frame `LABEL  DONE / TOTAL  [24 columns]`, ended by a newline."""
    assert stderr.endswith("\n"), repr(stderr)
    finals = {}
    for line in stderr[:-1].split("\n"):
        frames = line.split("\r")
        assert frames[0] == "" and len(frames) >= 2, repr(line)
        for frame in frames[1:]:
            m = re.fullmatch(r"(convert \S+ \S+)  \d+(\.\d)? [KMGTP]?i?B / \d+(\.\d)? [KMGTP]?i?B  "
                             r"\[[=> ]{24}\]( +\d+(\.\d)? [KMGTP]?i?B/s)? *", frame)
            assert m, repr(frame)
        finals[m.group(1)] = frames[-1].rstrip(" ")
    return finals


def test_convert_progress_bar_on_stderr(tmp_path):
    from fastpersist._core import format_bytes_short

    src = tmp_path / "model.pt"
    torch.save(flat_model(), src)
    dst = tmp_path / "ckpts" / "imported"
    proc = run_cli_keeping_cr("convert", src, dst, "--progress",
                              env={"FASTPERSIST_PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    assert "converted torch" in proc.stdout and "\r" not in proc.stdout
    finals = bar_lines(proc.stderr)
    assert list(finals) == [f"convert read {src}", f"convert write {dst}"]
    # Complete, and the measured sizes: the file read, the files of the new checkpoint.
    size = format_bytes_short(src.stat().st_size)
    assert finals[f"convert read {src}"].startswith(
        f"convert read {src}  {size} / {size}  [{'=' * 24}]")
    size = format_bytes_short(sum(f.stat().st_size for f in dst.iterdir()))
    assert finals[f"convert write {dst}"].startswith(
        f"convert write {dst}  {size} / {size}  [{'=' * 24}]")


def test_convert_progress_bar_only_when_asked_or_on_a_terminal(tmp_path):
    src = tmp_path / "model.pt"
    torch.save(flat_model(), src)
    proc = run_convert(src, tmp_path / "a.safetensors", "--no-progress")
    assert proc.returncode == 0 and proc.stderr == ""
    proc = run_convert(src, tmp_path / "b.safetensors")  # stderr is a pipe here: no bar
    assert proc.returncode == 0 and proc.stderr == ""

    # stderr a terminal: a bar by default, none with --no-progress.
    for out, flags in ((tmp_path / "c.safetensors", ()),
                       (tmp_path / "d.safetensors", ("--no-progress",))):
        master, slave = os.openpty()
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
            env["FASTPERSIST_PYTHON"] = sys.executable
            code = subprocess.run([CLI, "convert", str(src), str(out), *flags],
                                  stdout=subprocess.PIPE, stderr=slave, timeout=300,
                                  env=env).returncode
        finally:
            os.close(slave)
        tty = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the writer is gone and everything was read
                break
            if not chunk:
                break
            tty += chunk
        os.close(master)
        assert code == 0, tty
        text = tty.decode().replace("\r\n", "\n")  # the terminal turns "\n" into "\r\n"
        if flags:
            assert text == ""
        else:
            assert set(bar_lines(text)) == {f"convert read {src}", f"convert write {out}"}


def test_convert_progress_flags_exclude_each_other(tmp_path):
    src = tmp_path / "model.pt"
    torch.save(flat_model(), src)
    out = tmp_path / "o.safetensors"
    proc = run_convert(src, out, "--progress", "--no-progress")
    assert proc.returncode == 2 and "excludes" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "fastpersist.convert", str(src), str(out),
                           "--no-progress", "--progress"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "excludes" in proc.stderr  # the same parser as the CLI's
    assert not out.exists()


def without_rate(frame: str) -> str:
    """A bar's frame up to its closing ']': the rate and ETA depend on when it was drawn."""
    return frame[:frame.index("]") + 1] if "]" in frame else frame


def test_python_bar_draws_what_the_cli_draws_for_the_same_sequence(root):
    # One C++ bar (src/common/progress.h): the CLI's verify draws it on stderr, Python draws it
    # through _core.ProgressBar. Fed the progress that verify reported, both draw the same.
    import io

    from fastpersist._core import ProgressBar

    tag = "step-00000100"
    proc = run_cli_keeping_cr("verify", root / tag, "--progress", "--json")
    assert proc.returncode == 0, proc.stderr
    checked = json.loads(proc.stdout)["checkpoints"][0]["bytes_checked"]
    cli_frames = proc.stderr.split("\r")
    assert cli_frames[0] == "" and proc.stderr.endswith("\n")

    # The same checkpoint verified from Python, drawing every update (no throttle here).
    out = io.StringIO()
    bar = ProgressBar(f"verify {tag}", True, out, min_interval=0)
    sequence: List[Tuple[int, int]] = []

    def on_progress(done: int, total: int) -> None:
        sequence.append((done, total))
        bar.update(done, total)

    with fastpersist.CheckpointManager(root) as mgr:
        assert mgr.verify(tag, progress=on_progress) == []
    bar.finish()
    py_frames = out.getvalue().split("\r")
    assert sequence[-1] == (checked, checked)
    # The CLI throttles its redraws: its frames are a subsequence of Python's, and both end on
    # the same final line.
    py_lines = [without_rate(f.rstrip("\n")) for f in py_frames[1:]]
    cli_lines = [without_rate(f.rstrip("\n")) for f in cli_frames[1:]]
    assert cli_lines[-1] == py_lines[-1] == ProgressBar.render(f"verify {tag}", checked, checked, 0)
    it = iter(py_lines)
    assert all(line in it for line in cli_lines), (cli_lines, py_lines)


def test_convert_nested_state_with_tag_and_prefix(tmp_path):
    state = {"model": flat_model(1), "step": 7, "optim": {"param_groups": [{"lr": 0.1}]}}
    src = tmp_path / "train.pt"
    torch.save(state, src)

    # Non-tensor values cannot go into safetensors unless dropped.
    proc = run_convert(src, tmp_path / "x.safetensors")
    assert proc.returncode == 1
    assert "non-tensor" in proc.stderr and "step (int)" in proc.stderr
    assert "--drop-non-tensors" in proc.stderr
    assert not (tmp_path / "x.safetensors").exists()
    proc = run_convert(src, tmp_path / "x.safetensors", "--drop-non-tensors")
    assert proc.returncode == 0, proc.stderr
    assert "left out 2 non-tensor value(s)" in proc.stdout
    from safetensors.torch import load_file
    flat = load_file(tmp_path / "x.safetensors")
    assert set(flat) == {f"model.{k}" for k in state["model"]}

    # A checkpoint keeps everything; --tag makes DST the root.
    root = tmp_path / "run"
    proc = run_convert(src, root, "--tag", "step-7")
    assert proc.returncode == 0, proc.stderr
    loaded = fastpersist.load_checkpoint(root / "step-7")
    assert loaded["step"] == 7 and loaded["optim"] == state["optim"]
    assert_same_tensors(state["model"], loaded["model"])
    assert json.loads(run_cli("inspect", root / "step-7", "--json").stdout)["step"] == 7

    # --prefix model. turns the training checkpoint into the model's state_dict; a root as SRC
    # means its latest checkpoint.
    out = tmp_path / "model_only.pt"
    proc = run_convert(root, out, "--prefix", "model.")
    assert proc.returncode == 0, proc.stderr
    assert "latest checkpoint, step-7" in proc.stdout
    assert_same_tensors(state["model"], torch.load(out, weights_only=True))


def test_convert_errors(tmp_path):
    src = tmp_path / "m.pt"
    torch.save(flat_model(), src)
    proc = run_convert(tmp_path / "missing.pt", tmp_path / "o.safetensors")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    (tmp_path / "o.safetensors").write_bytes(b"old")
    proc = run_convert(src, tmp_path / "o.safetensors")
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    assert run_convert(src, tmp_path / "o.safetensors", "--overwrite").returncode == 0
    (tmp_path / "existing").mkdir()
    proc = run_convert(src, tmp_path / "existing")
    assert proc.returncode == 2 and "--tag" in proc.stderr
    proc = run_convert(src, tmp_path / "r", "--tag", "bad/tag")
    assert proc.returncode == 2 and "tag" in proc.stderr
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a torch file")
    proc = run_convert(garbage, tmp_path / "g.safetensors")
    assert proc.returncode == 1 and "garbage.pt" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("convert", src)
    assert proc.returncode == 2  # DST missing: a usage error from the CLI itself


def test_convert_refuses_unsafe_pickles_unless_asked(tmp_path):
    src = tmp_path / "obj.pt"
    torch.save({"w": torch.ones(2), "extra": _Custom()}, src)
    proc = run_convert(src, tmp_path / "ckpt")
    assert proc.returncode == 1
    assert "weights_only=True" in proc.stderr and "--unsafe-pickle" in proc.stderr


class _Custom:
    pass


def test_convert_python_lookup_and_missing_python(tmp_path):
    src = tmp_path / "m.pt"
    torch.save(flat_model(), src)
    # FASTPERSIST_PYTHON that does not exist: a clear error.
    proc = run_cli("convert", src, tmp_path / "o.safetensors",
                   env={"FASTPERSIST_PYTHON": str(tmp_path / "no-python")})
    assert proc.returncode == 1 and "cannot run FASTPERSIST_PYTHON" in proc.stderr

    # A Python without fastpersist: says so, and how to fix it.
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(bare.stat().st_mode | stat.S_IXUSR)
    proc = run_cli("convert", src, tmp_path / "o.safetensors",
                   env={"FASTPERSIST_PYTHON": str(bare)})
    assert proc.returncode == 1
    assert "cannot import fastpersist.convert" in proc.stderr
    assert "FASTPERSIST_PYTHON" in proc.stderr

    # Without FASTPERSIST_PYTHON: the python3 next to the executable (a venv's bin/), whose exit
    # status passes through.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cli_copy = bindir / "fastpersist"
    shutil.copy2(CLI, cli_copy)
    fake = bindir / "python3"
    fake.write_text("#!/bin/sh\necho \"fake python3 got: $*\" >&2\nexit 7\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    proc = run_cli("convert", src, tmp_path / "o.safetensors", cli=cli_copy)
    assert proc.returncode == 7
    assert "fake python3 got: -c" in proc.stderr
    assert f"-- {src} {tmp_path / 'o.safetensors'}" in proc.stderr
