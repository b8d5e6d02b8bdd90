# SPDX-License-Identifier: Apache-2.0
"""The helpers the side-by-side benchmark scripts share (fastpersist.bench.table)."""

from __future__ import annotations

from fastpersist.bench.table import aligned, markdown, medians, rotated


def test_rotated_starts_each_round_one_case_later() -> None:
    cases = ("a", "b", "c")
    assert [rotated(cases, r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert rotated((), 3) == []


def test_medians_per_key() -> None:
    runs = [{"s": 3.0, "gb": 1.0}, {"s": 1.0, "gb": 2.0}, {"s": 2.0, "gb": 9.0}]
    assert medians(runs) == {"s": 2.0, "gb": 2.0}


def test_tables() -> None:
    assert aligned(["case", "GB/s"], [["raw", "1.25"], ["zstd-long", "0.5"]]).splitlines() == [
        "     case  GB/s", "      raw  1.25", "zstd-long   0.5"]
    assert markdown(["case", "s"], [["full", "1.00"]]) == "| case | s |\n|---|---|\n| full | 1.00 |"
