# SPDX-License-Identifier: Apache-2.0
"""Child side of tests/python/test_convert_dcp.py and test_convert_deepspeed.py: writes foreign
checkpoints with the real tools, in real processes (torch.multiprocessing, gloo on the CPU).

- ``python _foreign_writers.py dcp OUT WORLD``: WORLD ranks save :func:`dcp_rank_state` with
  ``dcp.save`` into two directories, ``OUT/default`` (``FileSystemWriter`` as ``checkpoint_id``
  picks it: one file per rank) and ``OUT/per-item`` (``single_file_per_rank=False``). Every
  tensor of the full state, :func:`dcp_full_state`, is sharded over a CPU DeviceMesh as a
  DTensor (rows, columns, or replicated), except two plain tensors.
- ``python _foreign_writers.py deepspeed OUT STAGE WORLD BF16``: WORLD ranks train
  :class:`TiedNet` for three steps with DeepSpeed ZeRO stage STAGE (bf16 when BF16 is 1) and
  ``engine.save_checkpoint(OUT)``; rank 0 then saves the module's full state as DeepSpeed holds
  it after the last step (gathered at stage 3) to ``OUT/reference.pt``.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, Dict

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- DCP
def dcp_full_state() -> Dict[str, Any]:
    """The state every test expects back: odd shapes (uneven shards), several dtypes, bit
    patterns that value comparisons miss (NaN, -0.0, inf), non-tensor values."""
    g = torch.Generator().manual_seed(1234)
    weird = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-45])
    return {
        "model": {
            "embed.weight": torch.randn(9, 6, generator=g),
            "proj.weight": torch.randn(6, 7, generator=g).to(torch.bfloat16),
            "proj.bias": torch.randn(7, generator=g, dtype=torch.float64),
            "weird": weird,
            "mask": torch.rand(5, generator=g) > 0.5,
        },
        "optim": {
            "state": {0: {"exp_avg": torch.randn(9, 6, generator=g),
                          "step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0]}],
        },
        "rng": torch.randint(0, 256, (17,), generator=g, dtype=torch.uint8),
        "step": 42,
        "name": "run-7",
    }


def dcp_rank_state(mesh: Any) -> Dict[str, Any]:
    """This rank's view of :func:`dcp_full_state`: DTensors sharded over ``mesh``."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = dcp_full_state()
    model, optim = full["model"], full["optim"]
    model["embed.weight"] = distribute_tensor(model["embed.weight"], mesh, [Shard(0)])
    model["proj.weight"] = distribute_tensor(model["proj.weight"], mesh, [Shard(1)])
    model["proj.bias"] = distribute_tensor(model["proj.bias"], mesh, [Replicate()])
    model["weird"] = distribute_tensor(model["weird"], mesh, [Shard(0)])
    exp_avg = optim["state"][0]["exp_avg"]
    optim["state"][0]["exp_avg"] = distribute_tensor(exp_avg, mesh, [Shard(0)])
    return full


def _dcp_rank(rank: int, world: int, out: str, port: int) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        state = dcp_rank_state(init_device_mesh("cpu", (world,)))
        dcp.save(state, checkpoint_id=os.path.join(out, "default"))
        dcp.save(state, storage_writer=dcp.FileSystemWriter(os.path.join(out, "per-item"),
                                                            single_file_per_rank=False))
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- DeepSpeed
class TiedNet(torch.nn.Module):
    """Tied input and output embeddings, a frozen layer, two buffers (one integer)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.frozen = torch.nn.Linear(6, 6)
        self.hidden = torch.nn.Linear(6, 5)
        self.out = torch.nn.Linear(6, 11, bias=False)
        self.out.weight = self.emb.weight
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))
        self.register_buffer("counter", torch.arange(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.frozen(self.emb(x))
        return self.out(h).sum() + self.hidden(h).sum()


def _deepspeed_rank(rank: int, world: int, stage: int, bf16: bool, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world),
                      DS_ACCELERATOR="cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TiedNet()
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in trained if "bias" not in n], "weight_decay": 0.1},
              {"params": [p for n, p in trained if "bias" in n], "weight_decay": 0.0}]
    config = {"train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
              "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        loss = engine(torch.randint(0, 11, (2, 4), generator=g))
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(out)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()),
                                           enabled=stage == 3):
        reference = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    if rank == 0:
        torch.save(reference, os.path.join(out, "reference.pt"))


def main(argv: list) -> None:
    if argv[0] == "dcp":
        out, world = argv[1], int(argv[2])
        mp.spawn(_dcp_rank, args=(world, out, _free_port()), nprocs=world)
    elif argv[0] == "deepspeed":
        out, stage, world, bf16 = argv[1], int(argv[2]), int(argv[3]), argv[4] == "1"
        mp.spawn(_deepspeed_rank, args=(world, stage, bf16, out, _free_port()), nprocs=world)
    else:
        raise SystemExit(f"unknown writer {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
