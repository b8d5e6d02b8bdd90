# SPDX-License-Identifier: Apache-2.0
"""Writes the seeds of the Python fuzz targets (py_targets.py) into tests/fuzz/corpus/py_*/:
what real writers produce (fastpersist's object sidecar, DCP's ``.metadata`` and values,
DeepSpeed's state files, written by the real libraries on the CPU through
tests/python/_foreign_writers.py), and the hostile inputs issue 38 found, which stay as
regression inputs.

Run it from the repository root with the package installed (``make python``):
``.venv/bin/python tests/fuzz/make_py_fuzz_seeds.py``.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from fastpersist.checkpoint_state import flatten_state

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
WRITERS = HERE.parent / "python" / "_foreign_writers.py"

class _SizedCall:
    """Pickles as ``ctor(size)`` without allocating anything."""

    def __init__(self, ctor: type, size: int) -> None:
        self.ctor, self.size = ctor, size

    def __reduce__(self) -> tuple:
        return (self.ctor, (self.size,))


# bytearray(3 * 10**9) in 41 bytes, bytes(10**8) in 42: what the restricted loaders must refuse.
BYTEARRAY_BOMB = pickle.dumps(_SizedCall(bytearray, 3 * 10**9), protocol=2)
BYTES_BOMB = pickle.dumps(_SizedCall(bytes, 10**8), protocol=4)


def _write(target: str, name: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def _torch_save(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _with_data_pkl(archive: bytes, pickled: bytes) -> bytes:
    """`archive` (a torch.save zip) with its data.pkl replaced by `pickled`."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = pickled if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, body)
    return out.getvalue()


def _legacy_torch_save(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


def _legacy_with_object(pickled: bytes) -> bytes:
    """A legacy (pre-zip) torch.save file whose object pickle, the fourth, is `pickled`."""
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

    head = b"".join(pickle.dumps(x, protocol=2) for x in (
        MAGIC_NUMBER, PROTOCOL_VERSION,
        {"protocol_version": PROTOCOL_VERSION, "little_endian": True, "type_sizes": {}}))
    return head + pickled + pickle.dumps([], protocol=2)


def sidecar_seeds() -> None:
    state = {
        "model": collections.OrderedDict(w=torch.zeros(3), b=torch.ones(2)),
        "optim": {"state": {0: {"step": torch.tensor(3.0)}},
                  "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]},
        "step": 7, "name": "run", "shape": torch.Size([2, 3]), "dtype": torch.bfloat16,
        "flags": [True, None, 1.5, b"raw"], "nested": ((1, 2), [3, {"k": "v"}]),
    }
    _write("py_object_sidecar", "seed-state", flatten_state(state).objects)
    _write("py_object_sidecar", "seed-bare-tensor", flatten_state(torch.zeros(4)).objects)
    _write("py_object_sidecar", "regression-bytearray-bomb", BYTEARRAY_BOMB)
    _write("py_object_sidecar", "regression-bytes-bomb", BYTES_BOMB)
    # REDUCE of something that is not callable: a TypeError inside the unpickler.
    _write("py_object_sidecar", "regression-reduce-not-callable", b"\x80\x02N)R.")


def dcp_seeds(work: Path) -> None:
    out = work / "dcp"
    subprocess.run([sys.executable, str(WRITERS), "dcp", str(out), "1"], check=True)
    metadata = (out / "default" / ".metadata").read_bytes()
    _write("py_dcp_metadata", "seed-real", metadata)
    _write("py_dcp_metadata", "regression-bytearray-bomb", BYTEARRAY_BOMB)
    # A nesting path whose list index makes DCP's set_element grow a list to 3 million.
    m = pickle.loads(metadata)
    fqn = next(iter(m.planner_data))
    m.planner_data[fqn] = ("optim", "param_groups", 3_000_000)
    _write("py_dcp_metadata", "regression-planner-index", pickle.dumps(m))
    for value in (42, "run-7", [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0]}], None):
        _write("py_dcp_value", f"seed-{type(value).__name__}", _torch_save(value))
    _write("py_dcp_value", "regression-bytearray-bomb", _with_data_pkl(_torch_save(0), BYTEARRAY_BOMB))
    _write("py_dcp_value", "seed-legacy", _legacy_torch_save(42))
    _write("py_dcp_value", "regression-legacy-bytearray-bomb", _legacy_with_object(BYTEARRAY_BOMB))


def deepspeed_seeds(work: Path) -> None:
    out = work / "ds"
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    subprocess.run([sys.executable, str(WRITERS), "deepspeed", str(out), "1", "1", "0"], check=True, env=env)
    for path in sorted(out.rglob("*.pt")):
        _write("py_deepspeed_states", f"seed-{path.name}", path.read_bytes())
    model = next(out.rglob("mp_rank_00_model_states.pt")).read_bytes()
    _write("py_deepspeed_states", "regression-bytearray-bomb", _with_data_pkl(model, BYTEARRAY_BOMB))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sidecar_seeds()
        dcp_seeds(Path(tmp))
        deepspeed_seeds(Path(tmp))
    for target in sorted(p.name for p in CORPUS.glob("py_*")):
        print(f"{target}: {len(os.listdir(CORPUS / target))} inputs")


if __name__ == "__main__":
    main()
