#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Each framework's own checkpointing against fastpersist's plug-in, on the same model, side by
side in one run (issue 32). Today: Lightning.

The model is a Lightning MLP (--width, --layers; Adam, so a checkpoint holds the weights and two
moments each) trained one step. Each round runs every case in rotated order:

- ``lightning``: Lightning's default ``TorchCheckpointIO`` (torch.save; not durable: no fsync);
- ``lightning-async``: Lightning's ``AsyncCheckpointIO`` over it (clones every tensor on the
  training thread, then writes on a thread);
- ``fastpersist``: ``FastPersistCheckpointIO()`` (durable: fdatasync, atomic rename);
- ``fastpersist-async``: ``FastPersistCheckpointIO(async_save=True)`` (durable).

Each case first saves once untimed (a run saves again and again through one plug-in: buffers,
pinned memory and threads are set up by the first save). Then, for the timed save:
``save_s``, the time ``trainer.save_checkpoint`` blocks the training loop; ``written_s``, the
time until the file is complete (async cases run --steps training steps meanwhile);
``load_s``, the plug-in's ``load_checkpoint`` with the page cache
dropped first (root; otherwise the file's pages are evicted); and for async cases
``steps_slowdown``, the time of --steps training steps started right after the save returned,
over the same steps with no save in flight (measured in the same round).

    .venv/bin/python bench/integrations_bench.py --folder bench-data --rounds 3

Prints a table of medians; ``--json PATH`` writes every measurement.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch

import lightning as L  # noqa: E402
from lightning.pytorch.plugins.io import (AsyncCheckpointIO,  # noqa: E402
                                           TorchCheckpointIO)

from fastpersist.bench.loaders import drop_all_caches, evict  # noqa: E402
from fastpersist.bench.table import medians, report, run_rounds  # noqa: E402
from fastpersist.lightning import FastPersistCheckpointIO  # noqa: E402

CASES: Dict[str, Callable[[], Any]] = {
    "lightning": TorchCheckpointIO,
    "lightning-async": lambda: AsyncCheckpointIO(TorchCheckpointIO()),
    "fastpersist": FastPersistCheckpointIO,
    "fastpersist-async": lambda: FastPersistCheckpointIO(async_save=True),
}
DURABLE = {"lightning": "no", "lightning-async": "no", "fastpersist": "yes",
           "fastpersist-async": "yes"}


class Mlp(L.LightningModule):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).square().mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


def _steps(model: Mlp, optimizer: torch.optim.Optimizer, batch: torch.Tensor, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        model.training_step((batch,), 0).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def wait_written(io: Any) -> None:
    """Returns once every save so far is complete."""
    if isinstance(io, AsyncCheckpointIO):
        io._executor.submit(lambda: None).result()  # its one thread runs the saves in order
    elif isinstance(io, FastPersistCheckpointIO):
        io.wait()


def run_case(name: str, args: argparse.Namespace, folder: Path) -> Dict[str, float]:
    torch.manual_seed(0)
    model = Mlp(args.width, args.layers)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, args.width)),
                                       batch_size=8)
    io = CASES[name]()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[io])
    trainer.fit(model, data)  # one step: the optimizer has its moments; teardown ran
    optimizer = trainer.optimizers[0]
    batch = torch.randn(8, args.width)
    baseline = _steps(model, optimizer, batch, args.steps)
    # A run saves again and again through one plug-in: the first save (buffers, pinned memory,
    # threads) is a warm-up, not timed.
    trainer.save_checkpoint(folder / "warm-up.ckpt")
    wait_written(io)
    os.remove(folder / "warm-up.ckpt")
    path = folder / f"{name}.ckpt"
    t0 = time.perf_counter()
    trainer.save_checkpoint(path)
    saved = time.perf_counter() - t0
    result = {"save_s": saved}
    if name.endswith("-async"):
        result["steps_slowdown"] = _steps(model, optimizer, batch, args.steps) / baseline
    wait_written(io)
    result["written_s"] = time.perf_counter() - t0
    io.teardown()
    result["GB"] = os.path.getsize(path) / 1e9
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        evict(str(path))
    drop_all_caches()
    t0 = time.perf_counter()
    loaded = io.load_checkpoint(path)
    result["load_s"] = time.perf_counter() - t0
    want = model.state_dict()["net.0.weight"]
    if not name.endswith("-async") and not torch.equal(loaded["state_dict"]["net.0.weight"], want):
        raise SystemExit(f"{name}: the loaded weights differ from the saved ones")
    del loaded
    os.remove(path)
    return result


def table(results: Dict[str, List[Dict[str, float]]]) -> List[List[Any]]:
    med = {name: medians(runs) for name, runs in results.items()}
    ref = med["lightning"]
    rows = []
    for name, m in med.items():
        rows.append([name, DURABLE[name], f"{m['GB']:.2f}", f"{m['save_s']:.3f}",
                     f"{ref['save_s'] / m['save_s']:.2f}x", f"{m['written_s']:.3f}",
                     f"{m['load_s']:.3f}", f"{ref['load_s'] / m['load_s']:.2f}x",
                     f"{m['steps_slowdown']:.2f}x" if "steps_slowdown" in m else "-"])
    return rows


HEADER = ["case", "durable", "GB", "save blocks s", "vs lightning", "written s", "cold load s",
          "load vs lightning", "steps during save"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--folder", default="bench-data")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3, help="Linear(width, width) layers")
    p.add_argument("--steps", type=int, default=5, help="training steps timed during a save")
    p.add_argument("--json", help="write every measurement here")
    args = p.parse_args()
    folder = Path(args.folder) / "integrations"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    results = run_rounds(CASES, args.rounds, lambda name: run_case(name, args, folder))
    report(HEADER, table(results), args.json, {"args": vars(args), "results": results})
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
