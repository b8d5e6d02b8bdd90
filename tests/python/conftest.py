# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures for the Python API tests: one handle per available backend."""

from __future__ import annotations

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
