# SPDX-License-Identifier: Apache-2.0
"""Writes the seeds of the object_listing fuzz target (tests/fuzz/object_listing_fuzz.cc) into
tests/fuzz/corpus/object_listing/: real checkpoints that fastpersist saved, laid out as an
object tier lays them out ("TAG/<file>", "TAG/manifest.json", "latest"), in the target's record
format "<key> <claimed size> <body length>\\n<body>".

Run it with the built package installed (``make python``), from the repository root:
``.venv/bin/python tests/fuzz/make_object_listing_seeds.py``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

import torch

import fastpersist

OUT = Path(__file__).resolve().parent / "corpus" / "object_listing"


def state(step: int) -> Dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(64, 8, generator=g), "b": torch.zeros(300),
            "ids": torch.arange(40, dtype=torch.int64), "step": step}


def chain_state(step: int) -> Dict[str, object]:
    """A frozen tensor (referenced by incremental saves), one that changes in a few elements
    (an XOR delta: float, at least 64 KiB) and a small one that changes."""
    slow = torch.arange(16384, dtype=torch.float32) / 64
    slow[:step] += 1
    return {"frozen": torch.zeros(40000), "slow": slow, "bias": torch.full((50,), float(step)),
            "step": step}


def objects(root: Path, lie: Dict[str, int]) -> List[Tuple[str, int, bytes]]:
    """Every file under `root` as (key, claimed size, bytes); `lie` overrides claimed sizes."""
    out = []
    for path in sorted(root.rglob("*")):
        key = path.relative_to(root).as_posix()
        if path.is_file() and not key.startswith(".") and "/." not in key:
            body = path.read_bytes()
            out.append((key, lie.get(key, len(body)), body))
    return out


def write_seed(name: str, records: List[Tuple[str, int, bytes]]) -> None:
    data = b"".join(f"{key} {claimed} {len(body)}\n".encode() + body for key, claimed, body in records)
    (OUT / name).write_bytes(data)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp, "plain")
        with fastpersist.CheckpointManager(str(plain), durable=False) as m:
            m.save("s1", state(1))
        (plain / "latest").write_text("s1")
        write_seed("seed-plain", objects(plain, {}))
        # What broke: a listing that claims a 1.3 GiB manifest for an object of a few hundred bytes.
        write_seed("regression-manifest-size-lie", objects(plain, {"s1/manifest.json": 1_300_000_000}))

        chain = Path(tmp, "chain")
        with fastpersist.CheckpointManager(str(chain), durable=False, compression="zstd",
                                           incremental=True, xor_deltas=True) as m:
            for step in (1, 2, 3):
                m.save(f"s{step}", chain_state(step))
        write_seed("seed-incremental-zstd-delta", objects(chain, {}))
        shrunk = objects(chain, {})
        write_seed("seed-missing-base", [r for r in shrunk if not r[0].startswith("s1/")])
    print(f"wrote {len(os.listdir(OUT))} seeds into {OUT}")


if __name__ == "__main__":
    main()
