#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Lightning with fastpersist: train a small model on the CPU, saving durable checkpoints in the
background, then resume from the last one.

    python examples/python/lightning_train.py [FOLDER]

The only fastpersist line is the plug-in in the Trainer's `plugins`.
"""
from __future__ import annotations

import sys
import tempfile
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from fastpersist.lightning import FastPersistCheckpointIO


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(folder: str, max_steps: int, ckpt_path=None) -> L.Trainer:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=8, save_top_k=2,
                                   monitor="step", mode="max", save_last=True)],
        plugins=[FastPersistCheckpointIO(async_save=True)])  # <- fastpersist
    trainer.fit(Regressor(), data, ckpt_path=ckpt_path)
    return trainer


def main() -> None:
    folder = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="fp-lightning-")
    t0 = time.perf_counter()
    first = fit(folder, 32)
    print(f"trained 32 steps in {time.perf_counter() - t0:.2f} s; checkpoints in {folder}: "
          f"last {first.checkpoint_callback.last_model_path}")
    resumed = fit(folder, 48, ckpt_path="last")
    print(f"resumed at step 32 and trained to step {resumed.global_step}; "
          f"kept: {sorted(resumed.checkpoint_callback.best_k_models)}")


if __name__ == "__main__":
    main()
