# SPDX-License-Identifier: Apache-2.0
"""Object-store tiers against a real S3 server (SeaweedFS's ``weed server -s3``, started by the
fixture in conftest.py; skipped with the reason when it cannot start): drain and restore round
trips, retention in the bucket, the command line on a URL (list, verify, prune, drain), a store
that goes away and comes back, SIGKILL in the middle of a drain, and damage in the bucket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch

import fastpersist
from _test_support import assert_same_state, tier_state

MiB = 1 << 20


def make_state(step: int, n: int = 3 << 20) -> Dict[str, Any]:
    """About 18 MiB: the weights go up in several 5 MiB parts."""
    return tier_state(step, n)


assert_same = assert_same_state


@pytest.fixture
def s3_env(s3_bucket: Tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Dict[str, str]]:
    """The environment a boto3 default client reads, pointing at the test server."""
    endpoint, _ = s3_bucket
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "fastpersist",
           "AWS_SECRET_ACCESS_KEY": "fastpersist", "AWS_DEFAULT_REGION": "us-east-1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    yield {**os.environ, **env}


def url_of(s3_bucket: Tuple[str, str], prefix: str = "run1") -> str:
    return f"s3://{s3_bucket[1]}/{prefix}"


def cli(*args: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    """The installed `fastpersist` executable: a URL hands it to `python -m fastpersist.cli`."""
    exe = Path(sys.executable).parent / "fastpersist"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=300)


def bucket_keys(s3_bucket: Tuple[str, str], prefix: str) -> List[str]:
    store = fastpersist.S3Store(url_of(s3_bucket, prefix), endpoint_url=s3_bucket[0])
    return sorted(k for k, _ in store.list(""))


def test_drain_and_restore_round_trip(tmp_path: Path, s3_bucket: Tuple[str, str], s3_env: Dict[str, str]) -> None:
    url = url_of(s3_bucket)
    local = tmp_path / "local"
    states = {s: make_state(s) for s in (10, 20, 30)}
    tier = fastpersist.Tier(url, keep_last=2, part_size="5MiB", transfers=4)
    with fastpersist.CheckpointManager(local, durable=False, tiers=[tier]) as mgr:
        for step, state in states.items():
            mgr.save(step, state)
        mgr.wait()
        status = mgr.tier_status()
        assert [t.path for t in status] == [url]
        assert status[0].last_error == "" and status[0].waiting == ()
        places = {p.tag: p for p in mgr.locations()}
        assert places["step-00000030"].roots == (str(local), url)
        assert places["step-00000010"].roots == (str(local),)  # the bucket keeps the last 2
    keys = bucket_keys(s3_bucket, "run1")
    assert "step-00000030/manifest.json" in keys and "latest" in keys
    assert not any(k.startswith("step-00000010/") for k in keys)

    # The local disk is lost: a new manager restores from the bucket, every byte checked.
    fresh = tmp_path / "fresh"
    with fastpersist.CheckpointManager(fresh, durable=False, tiers=[fastpersist.Tier(url)]) as mgr:
        tag, state = mgr.resume()
        assert tag == "step-00000030"
        assert_same(state, states[30])
        assert mgr.list() == ["step-00000030"]  # pulled back into the local root
        assert mgr.pull("step-00000020", tier=url) > 0
        assert_same(mgr.load("step-00000020"), states[20])


def test_the_command_line_on_a_bucket(tmp_path: Path, s3_bucket: Tuple[str, str], s3_env: Dict[str, str]) -> None:
    url = url_of(s3_bucket, "cli")
    local = tmp_path / "local"
    with fastpersist.CheckpointManager(local, durable=False) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, make_state(step, n=1 << 20))
    drained = cli("drain", str(local), url, "--part-size", "5MiB", "--transfers", "3", "--json", env=s3_env)
    assert drained.returncode == 0, drained.stderr
    report = json.loads(drained.stdout)
    assert report["drained"] == ["step-00000001", "step-00000002", "step-00000003"] and report["failures"] == []

    listed = cli("list", url, "--json", env=s3_env)
    assert listed.returncode == 0, listed.stderr
    j = json.loads(listed.stdout)
    assert [c["tag"] for c in j["checkpoints"]] == ["step-00000001", "step-00000002", "step-00000003"]
    assert j["latest"] == "step-00000003"

    with_tier = cli("list", str(local), "--tier", url, env=s3_env)
    assert with_tier.returncode == 0, with_tier.stderr
    assert url in with_tier.stdout

    verified = cli("verify", url, env=s3_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "all 3 checkpoints are intact" in verified.stdout

    # One flipped byte in the bucket: verify names the tensor and exits 1.
    store = fastpersist.S3Store(url, endpoint_url=s3_bucket[0])
    manifest = json.loads(bytes(_get(store, "step-00000002/manifest.json")))
    tensors_file = next(f["name"] for f in manifest["files"] if f["name"].endswith(".safetensors"))
    key = f"step-00000002/{tensors_file}"
    data = bytearray(_get(store, key))
    data[len(data) // 2] ^= 0x10
    store.put(key, memoryview(bytes(data)))
    damaged = cli("verify", url, "--json", env=s3_env)
    assert damaged.returncode == 1, damaged.stdout + damaged.stderr
    j = json.loads(damaged.stdout)
    assert not j["ok"] and any("step-00000002" in p and "checksum" in p for p in j["problems"]), j["problems"]

    dry = cli("prune", url, "--keep-last", "1", "--dry-run", env=s3_env)
    assert dry.returncode == 0, dry.stderr
    assert "would remove step-00000001" in dry.stdout
    pruned = cli("prune", url, "--keep-last", "1", "--json", env=s3_env)
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["kept"] == ["step-00000003"]
    assert all(k.startswith("step-00000003/") or k == "latest" for k in bucket_keys(s3_bucket, "cli"))

    bad = cli("drain", str(local), url, "--part-size", "1MiB", env=s3_env)
    assert bad.returncode == 2 and "part_bytes" in bad.stderr, bad.stderr


def _get(store: Any, key: str) -> bytes:
    size = dict(store.list(key))[key]
    out = bytearray(size)
    store.get_into(key, 0, memoryview(out))
    return bytes(out)


def test_a_stopped_server_never_fails_a_save_and_the_drain_is_retried(
        tmp_path: Path, s3_server: Any, s3_bucket: Tuple[str, str], s3_env: Dict[str, str]) -> None:
    url = url_of(s3_bucket, "outage")
    local = tmp_path / "local"
    mgr = fastpersist.CheckpointManager(local, durable=False, tiers=[fastpersist.Tier(url)])
    try:
        mgr.save(1, make_state(1, n=1 << 18))
        mgr.wait()
        s3_server.stop()
        try:
            mgr.save(2, make_state(2, n=1 << 18))  # commits locally
            with pytest.raises(OSError):
                mgr.wait(timeout=20)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                handle = mgr.save_async(3, make_state(3, n=1 << 18))
                handle.wait()
            assert handle.tier_errors, "the next save reports the failed drain"
            assert any(issubclass(w.category, fastpersist.TierWarning) for w in caught)
            assert mgr.list() == ["step-00000001", "step-00000002", "step-00000003"]
        finally:
            s3_server.restart()
        mgr.wait(timeout=120)  # retried once the server is back
        assert [p.tag for p in mgr.locations() if url in p.roots] == [
            "step-00000001", "step-00000002", "step-00000003"]
    finally:
        mgr.close()


_SLOW_DRAIN = textwrap.dedent("""
    import sys, torch, fastpersist
    local, url = sys.argv[1], sys.argv[2]
    mgr = fastpersist.CheckpointManager(local, durable=False,
                                        tiers=[fastpersist.Tier(url, bandwidth="2MiB", part_size="5MiB")])
    mgr.save(1, {"w": torch.arange(4 << 20, dtype=torch.float32)})  # 16 MiB: ~8 s to drain
    print("saved", flush=True)
    mgr.wait()
""")


def test_sigkill_during_a_drain_leaves_no_partial_checkpoint_and_the_drain_resumes(
        tmp_path: Path, s3_bucket: Tuple[str, str], s3_env: Dict[str, str]) -> None:
    url = url_of(s3_bucket, "killed")
    local = tmp_path / "local"
    child = subprocess.Popen([sys.executable, "-c", _SLOW_DRAIN, str(local), url],
                             stdout=subprocess.PIPE, text=True, env=s3_env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "saved"
        store = fastpersist.S3Store(url, endpoint_url=s3_bucket[0])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the upload is under way
            if store.list("") or _open_uploads(s3_bucket, "killed"):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the drain never started")
        time.sleep(1.0)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    keys = bucket_keys(s3_bucket, "killed")
    assert "step-00000001/manifest.json" not in keys  # never a committed partial checkpoint
    with fastpersist.CheckpointManager(tmp_path / "reader", tiers=[fastpersist.Tier(url)]) as reader:
        assert [p.tag for p in reader.locations()] == []
    with fastpersist.CheckpointManager(local, durable=False, tiers=[fastpersist.Tier(url)]) as mgr:
        mgr.wait()
    assert _open_uploads(s3_bucket, "killed") == []  # the dead drain's upload was aborted
    fresh = tmp_path / "fresh"
    with fastpersist.CheckpointManager(fresh, tiers=[fastpersist.Tier(url)]) as mgr:
        tag, state = mgr.resume()
        assert tag == "step-00000001"
        assert torch.equal(state["w"], torch.arange(4 << 20, dtype=torch.float32))


def _open_uploads(s3_bucket: Tuple[str, str], prefix: str) -> List[str]:
    import boto3
    client = boto3.client("s3", endpoint_url=s3_bucket[0], aws_access_key_id="x",
                          aws_secret_access_key="x", region_name="us-east-1")
    found = client.list_multipart_uploads(Bucket=s3_bucket[1], Prefix=prefix + "/")
    return [u["Key"] for u in found.get("Uploads", [])]


def test_bad_object_store_settings_are_refused_clearly(tmp_path: Path, s3_bucket: Tuple[str, str],
                                                       s3_env: Dict[str, str]) -> None:
    url = url_of(s3_bucket)
    with pytest.raises(ValueError, match="part_bytes"):
        fastpersist.Tier(url, part_size="1MiB")._options()
    with pytest.raises(ValueError, match="transfers"):
        fastpersist.Tier(url, transfers=0)._options()
    with pytest.raises(ValueError, match="object stores"):
        fastpersist.Tier(tmp_path / "dir", transfers=4)._options()
    with pytest.raises(ValueError, match="unsupported"):
        fastpersist.Tier("gs://bucket/x")._options()
    with pytest.raises(TypeError, match="an object store needs"):
        fastpersist.Tier(url, store=object())._options()
    with pytest.raises(ValueError, match="twice"):
        fastpersist.CheckpointManager(tmp_path / "l", tiers=[fastpersist.Tier(url), fastpersist.Tier(url)])
