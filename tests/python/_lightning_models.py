# SPDX-License-Identifier: Apache-2.0
"""A small real Lightning model for the Lightning tests and the integrations benchmark, and the
child process the SIGKILL test kills mid-save (``python _lightning_models.py DIR MODE``)."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class TinyNet(L.LightningModule):
    """Linear -> BatchNorm -> ReLU -> Linear, trained with Adam: weights, BatchNorm buffers
    (changed in place by forward) and optimizer moments all end up in a checkpoint."""

    def __init__(self, width: int = 64, inputs: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(inputs, width), torch.nn.BatchNorm1d(width),
                                       torch.nn.ReLU(), torch.nn.Linear(width, 4))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def loader(samples: int = 64, inputs: int = 32, batch: int = 16) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, inputs, generator=g)
    y = torch.randint(0, 4, (samples,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=False)


def trainer(max_steps: int, callbacks: Optional[List[Any]] = None,
            plugins: Optional[List[Any]] = None, devices: int = 1, **kwargs: Any) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=devices, max_steps=max_steps, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     callbacks=callbacks or [], plugins=plugins or [],
                     enable_checkpointing=any(isinstance(c, L.pytorch.callbacks.ModelCheckpoint)
                                              for c in callbacks or []), **kwargs)


def weights_and_moments(module: L.LightningModule, optimizer: Any) -> Dict[str, Any]:
    """Copies of what a resumed run must reproduce exactly."""
    state = {f"model.{k}": v.detach().clone() for k, v in module.state_dict().items()}
    for i, s in optimizer.state_dict()["state"].items():
        for k, v in s.items():
            state[f"optim.{i}.{k}"] = v.clone() if isinstance(v, torch.Tensor) else v
    return state


def _child(directory: str, mode: str) -> None:
    """Trains one step, then saves last.ckpt again and again through the plugin, each time with
    every weight set to the save's number, until it is killed. Prints 'saved N' after each
    save has returned (sync: the file is whole at that point)."""
    from fastpersist.lightning import FastPersistCheckpointIO

    torch.manual_seed(0)
    model = TinyNet(width=2048, inputs=2048)  # ~50 MB of weights and moments
    io = FastPersistCheckpointIO(async_save=(mode == "async"))
    t = trainer(1, plugins=[io], default_root_dir=directory)
    t.fit(model, loader(inputs=2048))
    path = os.path.join(directory, "last.ckpt")
    for n in range(1, 100000):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(n))
        t.save_checkpoint(path)
        if mode == "async":
            io.wait()
        print(f"saved {n}", flush=True)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
