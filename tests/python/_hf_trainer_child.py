# SPDX-License-Identifier: Apache-2.0
"""A tiny GPT-2 (built from its config, nothing downloaded) trained on bytes of this repository's
docs with FastPersistTrainer or the stock Trainer: ``python _hf_trainer_child.py MODE OUT [STEPS]``.
The learning rate is constant, so that a run of 4 steps resumed to 8 matches 8 steps straight
(a decaying schedule is built from max_steps).
Writes OUT/result-MODE.pt: the final weights and optimizer state. Mode ``kill`` stops (SIGKILL
from the parent) in the middle of the second save: it prints "saving" and waits there."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def dataset(n: int = 64, length: int = 32):
    text = b"".join(p.read_bytes() for p in sorted((ROOT / "docs").glob("*.md")))
    ids = torch.tensor(list(text[: n * length]), dtype=torch.long).view(n, length)
    return [{"input_ids": row, "labels": row} for row in ids]


def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=2))


def args(out: str, steps: int, **extra):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=8,
                             learning_rate=1e-3, lr_scheduler_type="constant",
                             save_strategy="steps", save_steps=2,
                             logging_steps=1000, report_to=[], seed=7, data_seed=7,
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, **extra)


def main(mode: str, out: str, steps: int) -> None:
    from transformers import Trainer

    from fastpersist.hf import FastPersistTrainer

    cls = Trainer if mode.startswith("stock") else FastPersistTrainer
    if mode == "kill":
        class Killed(FastPersistTrainer):
            def _save_rng_state(self, output_dir):  # fault injection: stop inside a save
                super()._save_rng_state(output_dir)
                if self.state.global_step == 4:
                    print("saving", flush=True)
                    time.sleep(3600)

        cls = Killed
    resume = True if "resume" in mode else None
    extra = {"save_total_limit": 2} if mode == "rotate" else {}
    trainer = cls(model=model(), args=args(out, steps, **extra), train_dataset=dataset())
    trainer.train(resume_from_checkpoint=resume)
    state = {f"model.{k}": v.detach().clone() for k, v in trainer.model.state_dict().items()}
    for i, s in trainer.optimizer.state_dict()["state"].items():
        for k, v in s.items():
            state[f"optim.{i}.{k}"] = v.clone() if isinstance(v, torch.Tensor) else v
    torch.save({"state": state, "step": trainer.state.global_step},
               os.path.join(out, f"result-{mode}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)
