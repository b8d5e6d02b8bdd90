# SPDX-License-Identifier: Apache-2.0
"""One run of the sharded Lightning tests: ``python _lightning_sharded_child.py MODE DIR``.
Lightning starts the second rank itself (2 CPU processes, gloo, FSDP2 through
ModelParallelStrategy). Each rank writes DIR/out/MODE-rankR.pt: its local shards of the weights
and of the optimizer state after the run, and what the run reported."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict

import torch
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: E402

from _lightning_models import TinyNet, loader, trainer  # noqa: E402
from fastpersist.lightning import FastPersistModelParallelStrategy  # noqa: E402


class ShardedNet(TinyNet):
    """TinyNet without BatchNorm: its running statistics are per-rank buffers that DCP (any
    storage) saves from one rank only, so they could not come back bit for bit on rank 1."""

    def __init__(self, width: int) -> None:
        super().__init__(width=width)
        self.net[1] = torch.nn.Identity()

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        fully_shard(self.net)


def _local(t: Any) -> Any:
    return t.to_local().clone() if isinstance(t, DTensor) else (
        t.clone() if isinstance(t, torch.Tensor) else t)


def local_state(model: Any, optimizer: Any) -> Dict[str, Any]:
    state = {f"model.{k}": _local(v) for k, v in model.state_dict().items()}
    for i, s in optimizer.state_dict()["state"].items():
        for k, v in s.items():
            state[f"optim.{i}.{k}"] = _local(v)
    return state


# mode: (fastpersist's strategy?, steps, where new checkpoints go, what to resume from)
RUNS = {
    "stock": (False, 8, "stock-ref", None),            # the reference: 8 steps in one go
    "stock-first": (False, 4, "stock", None),          # Lightning's own sharded format
    "fp-first": (True, 4, "ckpt", None),
    "fp-resume": (True, 8, "ckpt", "last"),
    "fp-resume-stock": (True, 8, "ckpt2", "stock/last.ckpt"),
    "fp-rotate": (True, 4, "rotate", None),
}


def main(mode: str, directory: str) -> None:
    ours, steps, folder, resume = RUNS[mode]
    strategy = (FastPersistModelParallelStrategy if ours else ModelParallelStrategy)(
        data_parallel_size=2, tensor_parallel_size=1)
    if mode == "fp-rotate":
        cb = ModelCheckpoint(dirpath=os.path.join(directory, folder), every_n_train_steps=1,
                             save_top_k=2, monitor="step", mode="max", filename="{step}")
    else:
        cb = ModelCheckpoint(dirpath=os.path.join(directory, folder), every_n_train_steps=2,
                             save_last=True, filename="{step}")
    if resume not in (None, "last"):
        resume = os.path.join(directory, resume)
    torch.manual_seed(0)
    model = ShardedNet(width=256)
    t = trainer(steps, callbacks=[cb], plugins=[], strategy=strategy, devices=2)
    t.fit(model, loader(), ckpt_path=resume)
    out = os.path.join(directory, "out")
    os.makedirs(out, exist_ok=True)
    torch.save({"state": local_state(model, t.optimizers[0]), "global_step": t.global_step,
                "last": cb.last_model_path},
               os.path.join(out, f"{mode}-rank{t.global_rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
