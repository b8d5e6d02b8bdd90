# SPDX-License-Identifier: Apache-2.0
"""No allocation larger than the input justifies (pickle_bounds.py): a few bytes of pickle that
call ``bytearray(3 * 10**9)`` are refused before anything is allocated, in every restricted
reader of a checkpoint's pickles: the object sidecar, DCP metadata (fastpersist's and an
imported directory's), DCP values, and DeepSpeed files in ``convert``. Peak memory is measured
in a child process."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fastpersist.checkpoint_state import unflatten_state
from fastpersist.import_dcp_metadata import unpickle_metadata
from fastpersist.import_errors import ForeignCheckpointError
from fastpersist.pickle_bounds import PickleTooLargeError, check_pickle, check_torch_file

HUGE = 3 * 10**9


class _Bomb:
    def __reduce__(self) -> Any:
        return (bytearray, (HUGE,))


def _bomb_pickle(protocol: int = 2) -> bytes:
    return pickle.dumps(_Bomb(), protocol=protocol)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_sized_constructor_beyond_the_input_is_refused_and_real_bytes_pass(protocol: int) -> None:
    data = _bomb_pickle(protocol)
    assert len(data) < 100
    with pytest.raises(PickleTooLargeError, match=rf"holds the size {HUGE}"):
        check_pickle(data, len(data), "a bomb")
    check_pickle(pickle.dumps({"b": bytearray(b"abc"), "n": 7}, protocol=protocol), 100, "fine")
    check_pickle(pickle.dumps({"steps": HUGE}, protocol=protocol), 10, "an int alone is fine")


def test_the_restricted_readers_refuse_it() -> None:
    data = _bomb_pickle()
    # Protocol 4 names builtins.bytearray, which torch's allowlist holds (protocol 2's
    # __builtin__ spelling is refused as a global already).
    with pytest.raises(PickleTooLargeError, match="object sidecar asks for bytearray"):
        unflatten_state(_bomb_pickle(4), lambda name: None, weights_only=True)
    with pytest.raises(ForeignCheckpointError, match="asks for bytearray"):
        unpickle_metadata(data, "dcp-metadata.pt")
    buffer = io.BytesIO()
    torch.save({"module": _Bomb()}, buffer)
    with pytest.raises(PickleTooLargeError):
        check_torch_file(buffer.getvalue(), "a value")


def _peak_kib_loading(path: Path) -> "tuple[str, int]":
    """Loads `path` with convert's DeepSpeed loader in a child process: (its output, its peak
    RSS in KiB)."""
    child = f"""
import resource
from fastpersist.import_deepspeed import _load
from fastpersist.import_errors import ForeignCheckpointError
try:
    _load({str(path)!r}, True)
except ForeignCheckpointError as e:
    print("refused:", e)
print("peak_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, int(proc.stdout.split("peak_kib")[1])


def test_a_deepspeed_file_with_a_bomb_costs_no_memory(tmp_path: Path) -> None:
    """convert's DeepSpeed loader refuses the file, and the child's peak RSS stays within 1 GB
    of the same child loading a harmless file of that size (the pickle asks for 3 GB)."""
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": _Bomb()}, str(path))
    assert path.stat().st_size < 4096
    harmless = tmp_path / "harmless.pt"
    torch.save({"module": bytearray(b"x" * 16)}, str(harmless))
    _, baseline_kib = _peak_kib_loading(harmless)
    out, peak_kib = _peak_kib_loading(path)
    assert "refused:" in out and "more than its" in out, out
    assert peak_kib < baseline_kib + 1_000_000, f"peak RSS {peak_kib} KiB, {baseline_kib} KiB without the bomb"
