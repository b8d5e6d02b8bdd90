# SPDX-License-Identifier: Apache-2.0
"""fastpersist.object_store.S3Store against a real S3 server (SeaweedFS on loopback, the
``s3_server`` / ``s3_bucket`` fixtures in conftest.py); skipped, saying why, without weed or
boto3. No mocks: botocore's event hooks only count and look at the requests that go out."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import pytest

from fastpersist.object_store import S3Store, open_object_store, parse_url

MiB = 1 << 20


def _store(server: Any, bucket: str, prefix: str = "run1", **client_config: Any) -> S3Store:
    url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    return S3Store(url, client=server.client(**client_config))


def _count_requests(client: Any, operation: str) -> List[Dict[str, Any]]:
    """Every request of ``operation`` the client sends from now on (its parameters)."""
    seen: List[Dict[str, Any]] = []
    client.meta.events.register(f"before-parameter-build.s3.{operation}",
                                lambda params, **_: seen.append(params))
    return seen


def _pattern(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


# ---------------------------------------------------------------- URLs and keys (no server)

@pytest.mark.parametrize("url, bucket, prefix", [
    ("s3://bucket", "bucket", ""),
    ("s3://bucket/", "bucket", ""),
    ("s3://bucket/a", "bucket", "a"),
    ("s3://bucket/a/b/", "bucket", "a/b"),
    ("s3://my.bucket-1/run 1/x", "my.bucket-1", "run 1/x"),
])
def test_parse_url(url, bucket, prefix):
    assert parse_url(url) == (bucket, prefix)


@pytest.mark.parametrize("url, needle", [
    ("/local/dir", "not an S3 URL"),
    ("gs://bucket/x", "not an S3 URL"),
    ("S3://bucket", "not an S3 URL"),
    ("s3://", "names no bucket"),
    ("s3:///prefix", "names no bucket"),
    ("s3://bucket//", "empty path segments"),
    ("s3://bucket/a//b", "'..' path segments"),
    ("s3://bucket/a/../b", "'..' path segments"),
    ("s3://bucket/..", "'..' path segments"),
    ("s3://bucket/./a", "'..' path segments"),
    ("s3://buc ket/a", "bucket 'buc ket'"),
])
def test_bad_urls_are_refused_before_any_import(url, needle):
    with pytest.raises(ValueError, match=needle):
        S3Store(url)


def test_importing_the_module_needs_no_boto3():
    # fastpersist works without boto3: the module imports it only when a store is made.
    code = ("import sys, fastpersist.object_store, fastpersist.bench.s3_baseline; "
            "assert not {'boto3', 'botocore'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_missing_boto3_says_pip_install_boto3(monkeypatch):
    for name in ("boto3", "boto3.session", "botocore", "botocore.config", "botocore.exceptions"):
        monkeypatch.setitem(sys.modules, name, None)  # "import boto3" now raises ImportError
    with pytest.raises(ImportError, match="pip install boto3"):
        S3Store("s3://bucket/prefix")


@pytest.fixture
def offline_store() -> S3Store:
    """A store whose client never gets to send anything (argument checks come first)."""
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install boto3)")
    return S3Store("s3://bucket/prefix", endpoint_url="http://127.0.0.1:9", region="us-east-1")


@pytest.mark.parametrize("key", ["/abs", "..", "a/../b", "a/..", "./a", "a//b", "a/", "", "a\nb"])
def test_bad_keys_are_refused(offline_store, key):
    with pytest.raises(ValueError, match="object key|relative"):
        offline_store.put(key, b"x")
    with pytest.raises(ValueError, match="object key|relative"):
        offline_store.get_into(key, 0, bytearray(1))
    with pytest.raises(ValueError, match="object key|relative"):
        offline_store.begin_upload(key)
    with pytest.raises(ValueError, match="object key|relative"):
        offline_store.remove(["fine", key])


@pytest.mark.parametrize("prefix", ["/abs", "../x", "a//", "a/../"])
def test_bad_prefixes_are_refused(offline_store, prefix):
    with pytest.raises(ValueError, match="key prefix"):
        offline_store.list(prefix)
    with pytest.raises(ValueError, match="key prefix"):
        offline_store.abort_uploads(prefix)


def test_url_is_normalized(offline_store):
    assert offline_store.url == "s3://bucket/prefix"
    assert S3Store("s3://bucket/a/b/", client=offline_store.client).url == "s3://bucket/a/b"
    assert S3Store("s3://bucket/", client=offline_store.client).url == "s3://bucket"


def test_open_object_store(offline_store):
    store = open_object_store("s3://bucket/run/")
    assert isinstance(store, S3Store) and store.url == "s3://bucket/run"
    for not_a_store in ("/mnt/tier", "file:///mnt/tier", "gs://bucket"):
        with pytest.raises(ValueError, match="unsupported object store"):
            open_object_store(not_a_store)


def test_zero_length_read_sends_no_request(offline_store):
    offline_store.get_into("nothing/here", 123, bytearray(0))  # the endpoint is unreachable


# ---------------------------------------------------------------- round trips

def test_put_then_ranged_reads(s3_server, s3_bucket):
    _, bucket = s3_bucket
    store = _store(s3_server, bucket)
    data = _pattern(100_000)
    backing = bytearray(b"\0" * 7 + data + b"\0" * 5)
    store.put("ckpt/data.bin", memoryview(backing)[7:7 + len(data)])  # a view inside a buffer
    for offset, length in [(0, len(data)), (0, 1), (len(data) - 1, 1), (4096, 8192),
                           (12_345, 54_321), (len(data), 0), (0, 0)]:
        out = bytearray(length)
        store.get_into("ckpt/data.bin", offset, memoryview(out))
        assert out == data[offset:offset + length], (offset, length)
    # Into the middle of a larger buffer, as C++ hands in a window of a pinned buffer.
    target = bytearray(b"\xff" * 300)
    store.get_into("ckpt/data.bin", 1000, memoryview(target)[100:200])
    assert target[100:200] == data[1000:1100] and target[:100] == b"\xff" * 100
    assert target[200:] == b"\xff" * 100
    assert store.list("") == [("ckpt/data.bin", len(data))]


def test_empty_object(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    store.put("empty", memoryview(b""))
    assert store.list("") == [("empty", 0)]
    store.get_into("empty", 0, bytearray(0))
    with pytest.raises(EOFError, match="'empty'"):
        store.get_into("empty", 0, bytearray(1))


def test_put_replaces_an_object(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    store.put("k", b"first version")
    store.put("k", b"second")
    out = bytearray(6)
    store.get_into("k", 0, out)
    assert out == b"second" and store.list("") == [("k", 6)]


def test_put_sends_content_length_from_the_view_without_copying_it_first(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    sent: List[Any] = []
    store.client.meta.events.register(
        "before-send.s3.PutObject",
        lambda request, **_: sent.append((dict(request.headers), type(request.body).__name__)))
    store.put("k", memoryview(bytearray(3 * MiB)))
    headers, body_type = sent[-1]
    assert headers["Content-Length"] == str(3 * MiB)
    assert "Transfer-Encoding" not in headers
    assert body_type == "_MemoryViewReader"  # streamed from the view, not a bytes copy


def test_keys_are_relative_to_the_store_prefix(s3_server, s3_bucket):
    _, bucket = s3_bucket
    run = _store(s3_server, bucket, "jobs/run1")
    sibling = _store(s3_server, bucket, "jobs/run10")
    whole = _store(s3_server, bucket, "")
    run.put("step-1/manifest.json", b"{}")
    run.put("step-10/manifest.json", b"{}")
    sibling.put("step-1/manifest.json", b"{}")
    assert sorted(run.list("")) == [("step-1/manifest.json", 2), ("step-10/manifest.json", 2)]
    assert run.list("step-1/") == [("step-1/manifest.json", 2)]
    assert sorted(run.list("step-1")) == sorted(run.list(""))  # a string prefix, as S3's
    assert sibling.list("") == [("step-1/manifest.json", 2)]
    assert sorted(k for k, _ in whole.list("jobs/")) == [
        "jobs/run1/step-1/manifest.json", "jobs/run1/step-10/manifest.json",
        "jobs/run10/step-1/manifest.json"]
    raw = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="jobs/run1/")
    assert sorted(o["Key"] for o in raw["Contents"]) == [
        "jobs/run1/step-1/manifest.json", "jobs/run1/step-10/manifest.json"]
    assert run.list("nothing/") == []


def test_list_pages_through_every_key(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    keys = [f"d/{i:03d}" for i in range(50)]
    for key in keys:
        store.put(key, key.encode())
    requests = _count_requests(store.client, "ListObjectsV2")
    assert sorted(store.list("d/", page_size=7)) == [(k, 5) for k in keys]
    assert len(requests) == 8  # ceil(50 / 7): the server honoured MaxKeys
    assert all(r["MaxKeys"] == 7 for r in requests)


def test_more_than_1000_keys_list_and_remove_in_batches(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    keys = [f"many/{i:04d}" for i in range(1100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, b"x"), keys))
    lists = _count_requests(store.client, "ListObjectsV2")
    assert sorted(store.list("")) == [(k, 1) for k in keys]
    assert len(lists) == 2  # 1000 + 100
    deletes = _count_requests(store.client, "DeleteObjects")
    store.remove(keys)
    assert [len(d["Delete"]["Objects"]) for d in deletes] == [1000, 100]
    assert store.list("") == []


# ---------------------------------------------------------------- multipart uploads

def test_multipart_upload_then_reads_across_part_boundaries(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    sizes = [5 * MiB, 5 * MiB + 1, MiB + 3]  # S3's minimum part is 5 MiB, but for the last
    data = _pattern(sum(sizes), seed=1)
    view = memoryview(data)
    upload_id = store.begin_upload("ckpt/big.bin")
    bounds = [0, sizes[0], sizes[0] + sizes[1], len(data)]
    # Parts go up concurrently and out of order, as the C++ drain sends them.
    with ThreadPoolExecutor(3) as pool:
        etags = list(pool.map(
            lambda n: store.upload_part("ckpt/big.bin", upload_id, n,
                                        view[bounds[n - 1]:bounds[n]]), [3, 1, 2]))
    etags = [etags[1], etags[2], etags[0]]
    assert all(isinstance(e, str) and e for e in etags)
    assert store.list("") == []  # nothing visible before complete
    store.complete_upload("ckpt/big.bin", upload_id, etags)
    assert store.list("") == [("ckpt/big.bin", len(data))]
    for offset, length in [(bounds[1] - 10, 20), (bounds[2] - 1, 2), (bounds[1] - 1, sizes[1] + 2),
                           (0, len(data)), (len(data) - 1, 1)]:
        out = bytearray(length)
        store.get_into("ckpt/big.bin", offset, out)
        assert out == data[offset:offset + length], (offset, length)
    assert store.abort_uploads("") == 0  # a completed upload is no longer listed


def test_an_undersized_part_fails_the_completion(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    upload_id = store.begin_upload("k")
    etags = [store.upload_part("k", upload_id, n, b"x" * 100) for n in (1, 2)]
    with pytest.raises(OSError, match="EntityTooSmall.*'k'|'k'.*EntityTooSmall"):
        store.complete_upload("k", upload_id, etags)
    assert store.abort_uploads("") == 1


def test_abort_upload(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    upload_id = store.begin_upload("ckpt/a.bin")
    store.upload_part("ckpt/a.bin", upload_id, 1, b"part one")
    store.abort_upload("ckpt/a.bin", upload_id)
    store.abort_upload("ckpt/a.bin", upload_id)  # already gone: fine
    with pytest.raises(FileNotFoundError, match="no such object"):
        store.get_into("ckpt/a.bin", 0, bytearray(1))
    with pytest.raises(FileNotFoundError, match="no such upload"):
        store.upload_part("ckpt/a.bin", upload_id, 2, b"late")
    with pytest.raises(FileNotFoundError, match="no such upload"):
        store.complete_upload("ckpt/a.bin", upload_id, ['"etag"'])
    assert store.list("") == []


def test_abort_uploads_under_a_prefix(s3_server, s3_bucket):
    _, bucket = s3_bucket
    store = _store(s3_server, bucket)
    other_store = _store(s3_server, bucket, "run2")
    for key in ("step-1/a", "step-1/b", "step-2/a"):
        upload_id = store.begin_upload(key)
        store.upload_part(key, upload_id, 1, b"x")
    other_store.begin_upload("step-1/a")  # another prefix of the bucket: not touched
    assert store.abort_uploads("step-1/") == 2
    assert store.abort_uploads("step-1/") == 0
    assert store.abort_uploads("") == 1
    remaining = s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in remaining] == ["run2/step-1/a"]
    assert store.list("") == []


def test_complete_upload_needs_a_part(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    with pytest.raises(ValueError, match="at least one part"):
        store.complete_upload("k", "id", [])
    with pytest.raises(ValueError, match="part number"):
        store.upload_part("k", "id", 0, b"x")


# ---------------------------------------------------------------- remove

def test_remove_present_and_missing_keys(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    for key in ("a", "b/c", "b/d"):
        store.put(key, b"1")
    store.remove(["a", "b/c", "never/was"])
    assert store.list("") == [("b/d", 1)]
    store.remove(["a"])  # again: fine
    requests = _count_requests(store.client, "DeleteObjects")
    store.remove([])
    assert requests == []


# ---------------------------------------------------------------- errors

def test_missing_key(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    with pytest.raises(FileNotFoundError) as info:
        store.get_into("ckpt/nope.bin", 0, bytearray(4))
    assert store.url in str(info.value) and "'ckpt/nope.bin'" in str(info.value)


def test_missing_bucket(s3_server):
    store = _store(s3_server, "fastpersist-no-such-bucket")
    for call in (lambda: store.get_into("k", 0, bytearray(1)), lambda: store.list(""),
                 lambda: store.put("k", b"x"), lambda: store.begin_upload("k")):
        with pytest.raises(FileNotFoundError, match="bucket 'fastpersist-no-such-bucket' does "
                                                    "not exist") as info:
            call()
        assert "s3://fastpersist-no-such-bucket/run1" in str(info.value)


def test_short_reads_name_key_offset_and_length(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    store.put("ckpt/t.bin", b"0123456789")
    with pytest.raises(EOFError, match=r"'ckpt/t.bin'.*4 bytes at offset 8, got 2.*of 10"):
        store.get_into("ckpt/t.bin", 8, bytearray(4))
    with pytest.raises(EOFError, match=r"'ckpt/t.bin'.*1 bytes at offset 10, got 0"):
        store.get_into("ckpt/t.bin", 10, bytearray(1))
    with pytest.raises(EOFError, match=r"1 bytes at offset 1000, got 0"):
        store.get_into("ckpt/t.bin", 1000, bytearray(1))


@pytest.fixture(scope="module")
def private_s3_server(tmp_path_factory):
    """A server of this module's own, with identities (others' credentials are refused), that
    a test may stop without disturbing the session's."""
    from _seaweedfs import SeaweedFS, SeaweedFSUnavailable

    try:
        server = SeaweedFS(tmp_path_factory.mktemp("private-seaweedfs"), identities=True).start()
    except SeaweedFSUnavailable as e:
        pytest.skip(f"no S3 server: {e}")
    with server:
        yield server


def test_refused_credentials_are_permission_errors(private_s3_server):
    from _seaweedfs import READER_ACCESS_KEY, READER_SECRET_KEY

    server = private_s3_server
    bucket = server.make_bucket("fastpersist-credentials")
    _store(server, bucket).put("k", b"data")
    reader = _store(server, bucket, access_key=READER_ACCESS_KEY,
                    secret_key=READER_SECRET_KEY)
    out = bytearray(4)
    reader.get_into("k", 0, out)
    assert out == b"data" and reader.list("") == [("k", 4)]
    for call in (lambda: reader.put("k2", b"x"), lambda: reader.begin_upload("k2"),
                 lambda: reader.remove(["k"])):
        with pytest.raises(PermissionError, match="AccessDenied") as info:
            call()
        assert reader.url in str(info.value)
    for credentials in ({"secret_key": "wrong"}, {"access_key": "nobody"}):
        stranger = _store(server, bucket, **credentials)
        with pytest.raises(PermissionError, match="SignatureDoesNotMatch|InvalidAccessKeyId"):
            stranger.list("")


def test_nothing_listening_is_a_connection_error(monkeypatch, tmp_path):
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install boto3)")
    from _seaweedfs import free_ports

    # The default client: credentials from the environment, nothing from ~/.aws.
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    endpoint = f"http://127.0.0.1:{free_ports(1)[0]}"
    store = S3Store("s3://bucket/p", endpoint_url=endpoint, region="us-east-1")
    started = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        store.get_into("ckpt/x", 0, bytearray(1))
    assert endpoint in str(info.value) and "'ckpt/x'" in str(info.value)
    assert time.monotonic() - started < 30  # three attempts, then the error


def test_default_client_reads_the_environment(s3_server, s3_bucket, monkeypatch, tmp_path):
    from _seaweedfs import ACCESS_KEY, SECRET_KEY

    endpoint, bucket = s3_bucket
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    store = S3Store(f"s3://{bucket}/env")
    assert store.endpoint == endpoint
    store.put("k", b"through AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    explicit = S3Store(f"s3://{bucket}/env", endpoint_url=endpoint)
    out = bytearray(24)
    explicit.get_into("k", 0, out)
    assert out == b"through AWS_ENDPOINT_URL"


def test_server_stopped_then_back(private_s3_server):
    server = private_s3_server
    try:
        server.make_bucket("fastpersist-restart")
        # One attempt a call: the retries would only add their back-off to the test.
        store = _store(server, "fastpersist-restart", retries={"max_attempts": 1})
        store.put("ckpt/manifest.json", b"{}")
        server.stop()
        for call in (lambda: store.get_into("ckpt/manifest.json", 0, bytearray(2)),
                     lambda: store.put("ckpt/x", b"x"), lambda: store.list("ckpt/"),
                     lambda: store.remove(["ckpt/x"]), lambda: store.abort_uploads("")):
            with pytest.raises(ConnectionError) as info:
                call()
            assert server.endpoint in str(info.value) and store.url in str(info.value)
        server.restart()
        out = bytearray(2)
        store.get_into("ckpt/manifest.json", 0, out)  # the same store works again
        assert out == b"{}" and store.list("") == [("ckpt/manifest.json", 2)]
    finally:
        if not server.running:
            server.restart()
    assert server.running


# ---------------------------------------------------------------- threads

def test_threads_put_and_get_distinct_keys_at_once(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket[1])
    threads, rounds = 8, 6
    start = threading.Barrier(threads)

    def worker(t: int) -> int:
        start.wait()
        checked = 0
        for r in range(rounds):
            data = _pattern(1 + (t * 7919 + r * 104729) % (256 * 1024), seed=t * 100 + r)
            key = f"t{t}/r{r}"
            store.put(key, memoryview(data))
            out = bytearray(len(data))
            store.get_into(key, 0, memoryview(out))
            assert out == data, key
            half = bytearray(len(data) // 2)
            store.get_into(key, len(data) - len(half), half)
            assert half == data[len(data) - len(half):], key
            checked += 1
        return checked

    with ThreadPoolExecutor(threads) as pool:
        assert sum(pool.map(worker, range(threads))) == threads * rounds
    assert len(store.list("")) == threads * rounds


# ---------------------------------------------------------------- the benchmark baseline

def test_single_stream_baseline_round_trip(s3_server, s3_bucket, tmp_path):
    from fastpersist.bench.s3_baseline import (download_file_single_stream,
                                               upload_file_single_stream)

    _, bucket = s3_bucket
    client = s3_server.client()
    source = tmp_path / "source.bin"
    source.write_bytes(_pattern(9 * MiB, seed=3))  # past boto3's 8 MiB multipart threshold
    uploads = _count_requests(client, "UploadPart")
    upload_file_single_stream(client, bucket, "base/x.bin", source)
    assert len(uploads) == 2
    target = tmp_path / "target.bin"
    download_file_single_stream(client, bucket, "base/x.bin", target)
    assert target.read_bytes() == source.read_bytes()
    assert os.path.getsize(target) == 9 * MiB
