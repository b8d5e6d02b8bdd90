# SPDX-License-Identifier: Apache-2.0
"""Hugging Face interop: a checkpoint's model weights as a ``from_pretrained`` folder.

The folder holds ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` shards plus
``model.safetensors.index.json`` when larger than ``max_shard_size``) and ``config.json`` from
the given config. Tied weights (stored once in the checkpoint) are written once, under the name
the model's own ``save_pretrained`` would keep; ``from_pretrained`` ties them again.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING, Any, Dict, List, Union

import torch

from . import _core
from ._engine_options import check_uint
from .safetensors_io import save_safetensors

if TYPE_CHECKING:
    from .checkpoint import CheckpointManager

PathLike = Union[str, "os.PathLike[str]"]


def __getattr__(name: str) -> Any:
    # The Trainer subclass needs transformers (and accelerate): imported on first use.
    if name in ("FastPersistTrainer", "last_sealed_checkpoint"):
        from . import hf_trainer

        return getattr(hf_trainer, name)
    raise AttributeError(f"module 'fastpersist.hf' has no attribute {name!r}")


def _write_config(config: Any, out_dir: str) -> None:
    if config is None:
        return
    if hasattr(config, "save_pretrained"):
        config.save_pretrained(out_dir)
    elif isinstance(config, dict):
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    elif isinstance(config, (str, os.PathLike)):
        src = os.fspath(config)
        if os.path.isdir(src):
            src = os.path.join(src, "config.json")
        shutil.copyfile(src, os.path.join(out_dir, "config.json"))
    else:
        raise TypeError("config must be a transformers config, a dict, or a path to config.json")


def export_hf(manager: "CheckpointManager", tag: str, out_dir: PathLike, *, config: Any = None,
              prefix: str = "model.", max_shard_size: Union[int, str] = "5GB") -> List[str]:
    """Writes the tensors under `prefix` of checkpoint `tag` to `out_dir`; returns the files."""
    out = os.fspath(out_dir)
    os.makedirs(out, exist_ok=True)
    state = manager.load(tag, keys=lambda n: n.startswith(prefix))
    model_state = state
    for part in [p for p in prefix.split(".") if p]:
        if not isinstance(model_state, dict) or part not in model_state:
            raise KeyError(f"checkpoint {tag} has no tensors under {prefix!r}")
        model_state = model_state[part]
    if not isinstance(model_state, dict) or not model_state:
        raise KeyError(f"checkpoint {tag} has no tensors under {prefix!r}")
    # Tied weights come back as one tensor object under two names: keep the first name.
    tensors: Dict[str, torch.Tensor] = {}
    seen: Dict[int, str] = {}
    for name, t in model_state.items():
        if not isinstance(t, torch.Tensor):
            continue
        if id(t) in seen:
            continue
        seen[id(t)] = name
        tensors[name] = t
    # As Hugging Face means it: "5GB" is 5 * 10**9 bytes (fastpersist's own sizes are binary).
    limit = (_core.parse_hf_size(max_shard_size) if isinstance(max_shard_size, str)
             else check_uint("max_shard_size", max_shard_size, (1 << 64) - 1))
    names = list(tensors)
    plan = _core.plan_hf_export([(n, tensors[n].numel() * tensors[n].element_size()) for n in names],
                                limit)
    shards: List[Dict[str, torch.Tensor]] = [{} for _ in plan.files]
    for name, k in zip(names, plan.file_of):
        shards[k][name] = tensors[name]
    for shard, fname in zip(shards, plan.files):  # one file at a time, each by the C++ writer
        save_safetensors(shard, os.path.join(out, fname))
    files: List[str] = list(plan.files)
    if plan.index_json:
        with open(os.path.join(out, _core.HF_INDEX_FILE_NAME), "w") as f:
            f.write(plan.index_json)
        files.append(_core.HF_INDEX_FILE_NAME)
    _write_config(config, out)
    return files
