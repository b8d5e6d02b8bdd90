# SPDX-License-Identifier: Apache-2.0
"""The layout of a DeepSpeed checkpoint folder: which tag folder, which files.

``engine.save_checkpoint(DIR)`` writes ``DIR/<tag>/`` (``global_step1000``) and then ``DIR/latest``,
a text file naming the tag. A tag folder holds, for a data parallel world of N ranks (model
parallel rank 00; tensor or pipeline parallel checkpoints have further ``mp_rank_XX`` files):

- stages 1 and 2: ``mp_rank_00_model_states.pt``, and one
  ``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per rank r;
- stage 3: ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` and ``..._optim_states.pt`` per rank.

A folder without ZeRO has ``mp_rank_00_model_states.pt`` only, with the whole module in it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from .import_errors import ForeignCheckpointError, refuse_link

__all__ = ["LATEST_FILE", "ZeroFiles", "find_deepspeed_checkpoint", "zero_files"]

LATEST_FILE = "latest"
_MODEL_SUFFIX = "_model_states.pt"
_OPTIM_SUFFIX = "_optim_states.pt"
_ZERO_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(model|optim)_states\.pt$")
_MODEL_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_MAX_LATEST_BYTES = 4096


@dataclass
class ZeroFiles:
    """The files of one ZeRO checkpoint (one tag folder)."""

    folder: str
    model_file: Optional[str]  # mp_rank_00_model_states.pt (stages 1-2)
    rank_model_files: List[str]  # zero_pp_rank_<r>_mp_rank_00_model_states.pt (stage 3)
    optim_files: List[str]  # [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt, by rank


# ----------------------------------------------------------------------------- finding
def _has_model_states(folder: str) -> bool:
    try:
        return any(n.endswith(_MODEL_SUFFIX) for n in os.listdir(folder))
    except OSError:
        return False


def _read_latest(path: str) -> Optional[str]:
    """The tag a ``latest`` file names, if it is a plain folder name."""
    latest = os.path.join(path, LATEST_FILE)
    if not os.path.isfile(latest) or os.path.getsize(latest) > _MAX_LATEST_BYTES:
        return None
    try:
        with open(latest, encoding="utf-8") as f:
            tag = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not tag or "/" in tag or "\\" in tag or tag in (".", ".."):
        return None
    return tag


def find_deepspeed_checkpoint(path: str) -> Optional[str]:
    """The tag folder of the DeepSpeed checkpoint at ``path``, or None if it is not one.

    ``path`` is the folder ``zero_to_fp32`` takes (its ``latest`` file names the tag folder),
    or a tag folder itself (``DIR/global_step1000``).

    Raises:
        ForeignCheckpointError: a DeepSpeed folder whose tag cannot be told (no ``latest``, or
            one naming a folder that is missing).
    """
    if not os.path.isdir(path):
        return None
    if _has_model_states(path):
        return path
    tag = _read_latest(path)
    if tag is not None:
        folder = os.path.join(path, tag)
        if _has_model_states(folder):
            return refuse_link(folder)
        if not os.path.exists(folder) and any(
                _has_model_states(os.path.join(path, n)) for n in os.listdir(path)):
            raise ForeignCheckpointError(f"{path}/{LATEST_FILE} names {tag}, which does not "
                                         "exist: name a tag folder of it as SRC")
        return None
    tagged = sorted(n for n in os.listdir(path) if _has_model_states(os.path.join(path, n)))
    if tagged:
        raise ForeignCheckpointError(
            f"{path} looks like a DeepSpeed checkpoint folder but has no {LATEST_FILE} file to "
            f"name its tag: name a tag folder as SRC ({', '.join(tagged[:4])}"
            f"{', ...' if len(tagged) > 4 else ''})")
    return None


def zero_files(folder: str) -> ZeroFiles:
    """The model and optimizer state files of the tag folder, checked for gaps in the ranks."""
    single: Optional[str] = None
    model: Dict[int, str] = {}
    optim: Dict[int, str] = {}
    for name in sorted(os.listdir(folder)):
        zero = _ZERO_FILE.match(name)
        match = zero or _MODEL_FILE.match(name)
        if match is None:
            continue
        if int(match.group(2) if zero else match.group(1)) != 0:  # the model parallel rank
            raise ForeignCheckpointError(
                f"{folder} holds {name}: a model (tensor or pipeline) parallel checkpoint, whose "
                "weights are split by layer as well; only model parallel rank 00 is supported")
        refuse_link(os.path.join(folder, name))
        if zero is None:
            single = os.path.join(folder, name)
        else:
            (model if zero.group(3) == "model" else optim)[int(zero.group(1))] = name
    if not optim:
        raise ForeignCheckpointError(
            f"{folder} has no *{_OPTIM_SUFFIX} files: not a ZeRO checkpoint (without ZeRO, "
            "mp_rank_00_model_states.pt holds the whole module under 'module': convert that "
            "file, with --prefix module.)")
    for table, kind in ((optim, "optimizer"), (model, "model")):
        missing = [r for r in range(max(table) + 1) if r not in table] if table else []
        if missing:
            raise ForeignCheckpointError(f"{folder} lacks the {kind} states of rank(s) "
                                         f"{', '.join(map(str, missing))}")
    return ZeroFiles(folder, single, [os.path.join(folder, model[r]) for r in sorted(model)],
                     [os.path.join(folder, optim[r]) for r in sorted(optim)])
