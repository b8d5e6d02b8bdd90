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
from .safetensors_io import save_safetensors

if TYPE_CHECKING:
    from .checkpoint import CheckpointManager

PathLike = Union[str, "os.PathLike[str]"]


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
    limit = (max_shard_size if isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool)
             else _core.parse_hf_size(str(max_shard_size)))
    shards: List[Dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > limit:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    files: List[str] = []
    if len(shards) == 1:
        files.append("model.safetensors")
        save_safetensors(shards[0], os.path.join(out, files[0]))
    else:
        weight_map: Dict[str, str] = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_safetensors(shard, os.path.join(out, fname))
            files.append(fname)
            weight_map.update({name: fname for name in shard})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
        files.append("model.safetensors.index.json")
    _write_config(config, out)
    return files
