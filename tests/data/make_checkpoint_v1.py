# SPDX-License-Identifier: Apache-2.0
"""Writes tests/data/checkpoint-v1/: a real format-v1 checkpoint root, kept forever as a fixture.

It was generated ONCE with fastpersist 0.1.0 (manifest format 1) built from commit 02e2401
("save_job, manifest tests: fill the v2 manifest fields by name"), the last commit whose
CheckpointManager writes format 1:

    git checkout 02e2401 && make python
    .venv/bin/python tests/data/make_checkpoint_v1.py tests/data/checkpoint-v1

Tests never run this script: they read the committed bytes and recompute the expected values
from the formulas below (tests/python/test_checkpoint_v1_fixture.py and
tests/cpp/checkpoint/v1_fixture_test.cc), so that every later fastpersist keeps loading and
verifying what 0.1.0 wrote. Running it with a newer fastpersist would write a newer format:
never regenerate the fixture, add a new one next to it instead.

Every value is exact in its dtype (small integers and multiples of 1/8), so the expected
tensors are recomputed bit for bit.
"""
import os
import sys

import torch

import fastpersist


def model_state(step: int) -> dict:
    embed = torch.arange(48, dtype=torch.float32).reshape(12, 4) / 8 + step
    return {
        "embed.weight": embed,
        "lm_head.weight": embed,  # tied weights: stored once, an alias in the manifest
        "layer0.weight": (torch.arange(24, dtype=torch.float32).reshape(4, 6) / 4 - 3 + step)
        .to(torch.bfloat16),
        "layer0.bias": (torch.arange(6, dtype=torch.float32) / 2 - step).to(torch.float16),
        "position_ids": torch.arange(10, dtype=torch.int64) * step - 7,
        "mask": torch.arange(8) % 3 == 0,
        "token_bytes": (torch.arange(16) * 7 + step).to(torch.uint8),
        "scale": torch.tensor(2.5 * step, dtype=torch.float64),  # a scalar
        "empty": torch.zeros(0, 3, dtype=torch.float32),  # no bytes at all
    }


def training_state(step: int) -> dict:
    return {
        "model": model_state(step),
        "step": step,
        "history": [1, 2, step],
        "name": "fixture-v1",
        "config": {"lr": 0.5, "betas": [0.9, 0.95], "schedule": {"kind": "cosine", "warmup": 3}},
    }


def main(root: str) -> None:
    if os.path.exists(root) and os.listdir(root):
        raise SystemExit(f"{root} is not empty: the v1 fixture is never regenerated in place")
    with fastpersist.CheckpointManager(root) as mgr:
        for step in (10, 20):
            mgr.save(step, training_state(step),
                     metadata={"run": "fixture-v1", "step": step, "tags": ["a", "b"]})
    os.remove(os.path.join(root, ".lock"))  # the manager's lock file is not part of the fixture


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                            "checkpoint-v1"))
