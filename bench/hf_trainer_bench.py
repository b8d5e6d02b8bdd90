#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The stock ``transformers.Trainer`` checkpoint against ``FastPersistTrainer``'s, on the same
model, side by side in one run (issue 32).

A Hugging Face model built from its config (--model, e.g. gpt2-medium; nothing downloaded)
trained one step with AdamW. Each round runs every case in rotated order, each saving one
``checkpoint-N`` through the Trainer's own ``_save_checkpoint`` (what ``save_steps`` calls):

- ``trainer``: the stock Trainer (not durable: no fsync);
- ``trainer+fsync``: the stock Trainer, then every file and the folder fsynced (what durability
  costs it);
- ``fastpersist``: ``FastPersistTrainer`` (staging folder, optimizer through fastpersist, every
  file fdatasync'ed and checksummed, atomic rename).

Then the checkpoint is loaded back as a resume does (the weights, then the optimizer and
scheduler) with the page cache dropped first. Prints a table of medians; ``--json PATH`` writes
every measurement.

    .venv/bin/python bench/hf_trainer_bench.py --model gpt2-medium --folder /work/bench-data
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
from transformers import Trainer, TrainingArguments

from fastpersist.bench import models
from fastpersist.bench.loaders import drop_all_caches
from fastpersist.bench.table import medians, report, run_rounds
from fastpersist.hf import FastPersistTrainer

CASES = ("trainer", "trainer+fsync", "fastpersist")
DURABLE = {"trainer": "no", "trainer+fsync": "yes", "fastpersist": "yes"}


def _fsync_tree(folder: str) -> None:
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (8, 64), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def run_case(name: str, model: Any, folder: Path) -> Dict[str, float]:
    out = folder / name
    shutil.rmtree(out, ignore_errors=True)
    args = TrainingArguments(output_dir=str(out), max_steps=1, per_device_train_batch_size=2,
                             save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                             logging_steps=1000)
    cls = FastPersistTrainer if name == "fastpersist" else Trainer
    trainer = cls(model=model, args=args, train_dataset=_Tokens(model.config.vocab_size))
    trainer.train()
    drop_all_caches()
    t0 = time.perf_counter()
    trainer._save_checkpoint(trainer.model, None)
    ckpt = out / f"checkpoint-{trainer.state.global_step}"
    if name == "trainer+fsync":
        _fsync_tree(str(ckpt))
    saved = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in ckpt.iterdir())
    drop_all_caches()
    t0 = time.perf_counter()
    trainer._load_from_checkpoint(str(ckpt))
    trainer._load_optimizer_and_scheduler(str(ckpt))
    loaded = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return {"GB": size / 1e9, "save_s": saved, "load_s": loaded}


HEADER = ["case", "durable", "GB", "save s", "vs trainer+fsync", "vs trainer", "cold load s",
          "load vs trainer"]


def table(results: Dict[str, List[Dict[str, float]]]) -> List[List[Any]]:
    med = {name: medians(runs) for name, runs in results.items()}
    rows = []
    for name, m in med.items():
        rows.append([name, DURABLE[name], f"{m['GB']:.2f}", f"{m['save_s']:.2f}",
                     f"{med['trainer+fsync']['save_s'] / m['save_s']:.2f}x",
                     f"{med['trainer']['save_s'] / m['save_s']:.2f}x", f"{m['load_s']:.2f}",
                     f"{med['trainer']['load_s'] / m['load_s']:.2f}x"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="gpt2-medium", choices=sorted(models.MODELS))
    p.add_argument("--folder", default="bench-data")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write every measurement here")
    args = p.parse_args()
    folder = Path(args.folder) / "hf-trainer"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    model = models.build(args.model)
    results = run_rounds(CASES, args.rounds, lambda name: run_case(name, model, folder))
    report(HEADER, table(results), args.json, {"args": vars(args), "results": results})
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
