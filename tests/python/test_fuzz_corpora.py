# SPDX-License-Identifier: Apache-2.0
"""Replays the corpus of every Python fuzz target (tests/fuzz/py_targets.py): the seeds real
writers made and every hostile input that ever broke a reader (issue 38: size bombs, stray
exception classes). Each input may only raise its reader's documented errors, within a memory
bound set by its size."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))
import py_targets  # noqa: E402

@pytest.fixture(scope="module", autouse=True)
def _scratch_removed() -> Iterator[None]:
    yield
    py_targets.remove_scratch()


CASES = [(target, path) for target in py_targets.TARGETS
         for path in sorted((FUZZ / "corpus" / target).iterdir())]


def test_every_target_has_seeds_and_a_regression_input() -> None:
    for target in py_targets.TARGETS:
        names = [p.name for t, p in CASES if t == target]
        assert any(n.startswith("seed-") for n in names), target
        assert any(n.startswith("regression-") for n in names), target


@pytest.mark.parametrize("target,path", CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_corpus_input(target: str, path: Path) -> None:
    py_targets.run_one(target, path.read_bytes())


def test_the_memory_property_catches_a_bomb() -> None:
    """The harness itself: an allocation of 50 MB from a 41-byte input breaks the bound."""
    def bomb(data: bytes) -> None:
        bytearray(50 << 20)

    py_targets.TARGETS["test_bomb"] = ((bomb,), (ValueError,))
    try:
        with pytest.raises(py_targets.FuzzFailure, match="allocated"):
            py_targets.run_one("test_bomb", b"x" * 41)
    finally:
        del py_targets.TARGETS["test_bomb"]


def test_the_error_property_catches_a_stray_class() -> None:
    def stray(data: bytes) -> None:
        raise TypeError("not documented")

    py_targets.TARGETS["test_stray"] = ((stray,), (ValueError,))
    try:
        with pytest.raises(py_targets.FuzzFailure, match="TypeError escaped"):
            py_targets.run_one("test_stray", b"")
    finally:
        del py_targets.TARGETS["test_stray"]
