# SPDX-License-Identifier: Apache-2.0
"""Fuzz targets for the Python readers of untrusted pickles: one function per reader, each
taking any bytes, and :func:`run_one`, which checks the two properties every target has:

- **Only the reader's documented errors.** Anything else (a TypeError out of a hostile
  REDUCE, an IndexError in a check) is a bug: callers catch the documented classes to skip a
  damaged checkpoint, and a stray class escapes them.
- **No allocation larger than the input justifies** (issue 38): the peak of Python's traced
  allocations during one input stays under ``MEMORY_SLACK + MEMORY_PER_BYTE * len(input)``. A
  46-byte ``bytearray(3 * 10**9)`` pickle breaks it by gigabytes; a legitimate pickle of many
  small objects stays far below.

The corpora are ``tests/fuzz/corpus/py_<target>/`` (seeds made by
``make_py_fuzz_seeds.py``, and every input that ever failed). ``tests/python/test_fuzz_corpora.py``
replays them in ``make test``; ``py_fuzz.py`` fuzzes a target with atheris (``make fuzz``).
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import tempfile
import tracemalloc
from typing import Callable, Dict, Tuple, Type

import torch

from fastpersist import dcp, import_deepspeed
from fastpersist.checkpoint_state import unflatten_state
from fastpersist.errors import CheckpointCorruptError
from fastpersist.import_dcp import _load_value
from fastpersist.import_dcp_metadata import read_metadata
from fastpersist.import_errors import ForeignCheckpointError

MEMORY_SLACK = 4 << 20
MEMORY_PER_BYTE = 256


class FuzzFailure(AssertionError):
    """An input broke one of the properties (see the module's docstring)."""


def _scratch() -> str:
    path = os.path.join(tempfile.gettempdir(), f"fp-pyfuzz-{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    return path


def remove_scratch() -> None:
    """Removes the folder the targets write their files in (this process's)."""
    shutil.rmtree(os.path.join(tempfile.gettempdir(), f"fp-pyfuzz-{os.getpid()}"), ignore_errors=True)


def object_sidecar(data: bytes) -> None:
    """A checkpoint's object sidecar (``objects.pkl``), unpickled as ``load()`` does."""
    unflatten_state(data, lambda name: torch.zeros(2) if name != "dropped" else None)


def dcp_metadata(data: bytes) -> None:
    """DCP's ``.metadata`` in a folder with one 1 MiB data file (``__0_0.distcp``), read and
    checked as ``fastpersist convert`` reads it."""
    folder = os.path.join(_scratch(), "dcp")
    os.makedirs(folder, exist_ok=True)
    data_file = os.path.join(folder, "__0_0.distcp")
    if not os.path.exists(data_file):
        with open(data_file, "wb") as f:
            f.truncate(1 << 20)
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        f.write(data)
    read_metadata(folder)


def imported_dcp_value(data: bytes) -> None:
    """A DCP non-tensor value (a small ``torch.save`` archive), as ``convert`` loads it."""
    _load_value(io.BytesIO(data), "fuzz.value", True)


def own_dcp_value(data: bytes) -> None:
    """The same, as fastpersist.dcp's ``FastPersistReader`` checks it."""
    dcp.check_value(data, "fuzz.value")


def _states_file(data: bytes) -> str:
    path = os.path.join(_scratch(), "states.pt")
    with open(path, "wb") as f:
        f.write(data)
    return path


def deepspeed_model_states(data: bytes) -> None:
    """A DeepSpeed ``mp_rank_00_model_states.pt``, read as ``fastpersist convert`` reads it."""
    import_deepspeed._model_states(_states_file(data), True)


def deepspeed_optim_states(data: bytes) -> None:
    """A DeepSpeed ``*_optim_states.pt``, read as ``fastpersist convert`` reads it."""
    import_deepspeed._optim_states(_states_file(data), True)


Reader = Callable[[bytes], None]
# target -> (its readers, each run on every input; the errors they document)
TARGETS: Dict[str, Tuple[Tuple[Reader, ...], Tuple[Type[BaseException], ...]]] = {
    "py_object_sidecar": ((object_sidecar,), (pickle.UnpicklingError,)),
    "py_dcp_metadata": ((dcp_metadata,), (ForeignCheckpointError,)),
    "py_dcp_value": ((imported_dcp_value, own_dcp_value),
                     (ForeignCheckpointError, CheckpointCorruptError, pickle.UnpicklingError)),
    "py_deepspeed_states": ((deepspeed_model_states, deepspeed_optim_states),
                            (ForeignCheckpointError,)),
}


def run_one(target: str, data: bytes) -> None:
    """Runs `target` on `data`; raises FuzzFailure when a property breaks."""
    readers, allowed = TARGETS[target]
    bound = MEMORY_SLACK + MEMORY_PER_BYTE * len(data)
    for read in readers:
        tracemalloc.start()
        try:
            try:
                read(data)
            except allowed:
                pass
            except Exception as e:  # noqa: BLE001 - the property under test
                raise FuzzFailure(f"{read.__name__}: {type(e).__name__} escaped: {e}") from e
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        if peak > bound:
            raise FuzzFailure(f"{read.__name__}: {peak} bytes allocated for an input of "
                              f"{len(data)} bytes (more than {bound})")
