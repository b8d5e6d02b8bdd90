# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures for the Python API tests: one handle per available backend; an S3 server."""

from __future__ import annotations

import itertools
import os
from typing import Tuple

import pytest

import fastpersist

BACKENDS = {b.name: b for b in fastpersist.backends()}


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend this build knows; one this machine lacks is skipped with the reason."""
    info = BACKENDS[request.param]
    if not info.available:
        fix = f" (fix: {info.fix})" if info.fix else ""
        pytest.skip(f"backend {info.name} unavailable here: {info.reason}{fix}")
    return info.name


@pytest.fixture
def handle(backend: str):
    with fastpersist.AioHandle(backend=backend) as h:
        yield h


# ---------------------------------------------------------------- S3 (object-store tiers)

@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """A SeaweedFS server with S3 on loopback for the whole session (fastpersist.bench.seaweedfs;
    any credentials work), or a skip saying why not (weed or boto3 not installed, the server did
    not start). A test may stop() and restart() it (same ports and data)."""
    from _seaweedfs import SeaweedFS, SeaweedFSUnavailable

    try:
        server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    except SeaweedFSUnavailable as e:
        pytest.skip(f"no S3 server for the object-store tests: {e}")
    try:
        yield server
    finally:
        server.close()


_bucket_serial = itertools.count()


@pytest.fixture
def s3_bucket(s3_server) -> Tuple[str, str]:
    """``(endpoint, bucket)``: a new, empty bucket on the session's S3 server for each test."""
    name = f"fastpersist-test-{os.getpid()}-{next(_bucket_serial)}"
    s3_server.make_bucket(name)
    return s3_server.endpoint, name
