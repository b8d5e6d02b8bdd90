# SPDX-License-Identifier: Apache-2.0
"""``fastpersist.save`` / ``fastpersist.load``: files plain torch reads and writes, loaded back
without a second copy, with torch.load's arguments and clear errors for what is not a
checkpoint."""

from __future__ import annotations

import errno
import gc
import os
import pickle
from typing import Any, Dict

import pytest
import torch

import fastpersist
from _torch_objects import (OBJECTS, assert_equal_objects, assert_same_file, assert_same_sharing,
                            fastpersist_save_reference, mixed, save_config, tensors,
                            torch_save_bytes)


class NotAllowed:
    """A class outside torch's weights_only allowlist."""

    def __init__(self, value: int) -> None:
        self.value = value


@pytest.fixture(scope="module")
def objects() -> Dict[str, Any]:
    pytest.importorskip("transformers")
    return {name: build() for name, build in OBJECTS.items()}


@pytest.fixture(scope="module")
def mixed_object() -> Any:
    return mixed()


def _serialization_config():
    from torch.utils.serialization import config

    return (config.save.storage_alignment, config.save.compute_crc32,
            config.save.use_pinned_memory_for_d2h)


# ---------------------------------------------------------------------------- save
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("name", list(OBJECTS))
def test_save_then_torch_load_and_fastpersist_load(objects, tmp_path, name, legacy):
    obj = objects[name]
    path = tmp_path / "ckpt.pt"
    stats = fastpersist.save(obj, path, use_legacy_format=legacy)
    written = path.read_bytes()
    assert stats["bytes"] == len(written)
    assert stats["committed"] and stats["file_committed"]
    assert_same_file(written, fastpersist_save_reference(obj, legacy))
    for loaded in (torch.load(path, weights_only=True), fastpersist.load(path)):
        assert_equal_objects(loaded, obj)
        assert_same_sharing(loaded, obj)
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_save_aligns_storages_and_skips_crc(mixed_object, tmp_path):
    import zipfile

    fastpersist.save(mixed_object, tmp_path / "a.pt")
    reader = torch._C.PyTorchFileReader(str(tmp_path / "a.pt"))
    data = [r for r in reader.get_all_records() if r.startswith("data/")]
    assert data and all(reader.get_record_offset(r) % 4096 == 0 for r in data)
    infos = zipfile.ZipFile(tmp_path / "a.pt").infolist()
    assert {i.CRC for i in infos if i.file_size} == {0}


def test_save_options_are_honoured_and_torch_settings_restored(mixed_object, tmp_path, backend):
    before = _serialization_config()
    fastpersist.save(mixed_object, tmp_path / "crc.pt", compute_crc32=True, align_storages=False,
                     backend=backend, io_buffer_mb=0.0625, single_io_buffer=True, durable=False)
    assert _serialization_config() == before
    with save_config(storage_alignment=64, compute_crc32=True):
        expected = torch_save_bytes(mixed_object)
    assert_same_file((tmp_path / "crc.pt").read_bytes(), expected)
    assert_equal_objects(fastpersist.load(tmp_path / "crc.pt", backend=backend), mixed_object)


def test_settings_are_restored_when_save_raises(tmp_path):
    before = _serialization_config()

    class Boom:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fastpersist.save({"x": Boom()}, tmp_path / "x.pt")
    assert _serialization_config() == before
    assert os.listdir(tmp_path) == []


class _ConfigProbe:
    """Records torch's D2H setting at the moment torch.save pickles it."""

    seen = []

    def __reduce__(self):
        from torch.utils.serialization import config

        _ConfigProbe.seen.append(config.save.use_pinned_memory_for_d2h)
        return (_ConfigProbe, ())


@pytest.mark.parametrize("pinned_d2h", [True, False])
def test_gpu_storages_are_copied_through_pinned_memory(tmp_path, pinned_d2h):
    # torch copies each GPU storage to the host inside torch.save, after pickling: the setting
    # that makes that copy a pinned DMA must be on while torch.save runs (and only then).
    _ConfigProbe.seen.clear()
    before = _serialization_config()
    fastpersist.save({"probe": _ConfigProbe(), "t": torch.arange(4)}, tmp_path / "p.pt",
                     pinned_d2h=pinned_d2h)
    assert _ConfigProbe.seen == [pinned_d2h]
    assert _serialization_config() == before


def test_pickle_protocol_is_passed_to_torch(tmp_path):
    obj = {"t": torch.arange(10), "s": "text"}
    fastpersist.save(obj, tmp_path / "p4.pt", pickle_protocol=4)
    pkl = torch._C.PyTorchFileReader(str(tmp_path / "p4.pt")).get_record("data.pkl")
    assert bytes(pkl)[:2] == b"\x80\x04"
    # torch's weights_only unpickler does not read protocol 4 (FRAME opcodes), nor does ours.
    assert_equal_objects(fastpersist.load(tmp_path / "p4.pt", weights_only=False), obj)


# ---------------------------------------------------------------------------- load
def test_load_is_zero_copy_from_one_buffer(mixed_object, tmp_path):
    """Every storage is a view of the one buffer the file was read into, at its record's data
    offset; the tensors are writable and keep that buffer alive on their own."""
    path = tmp_path / "z.pt"
    fastpersist.save(mixed_object, path)
    size = os.path.getsize(path)
    loaded = fastpersist.load(path)
    ts = [t for t in tensors(loaded) if t.untyped_storage().nbytes()]
    starts = [t.untyped_storage().data_ptr() for t in ts]
    lo = min(starts)
    assert all(s + t.untyped_storage().nbytes() <= lo + size for s, t in zip(starts, ts))
    reader = torch._C.PyTorchFileReader(str(path))
    offsets = sorted(reader.get_record_offset(r) for r in reader.get_all_records()
                     if r.startswith("data/") and reader.get_record_size(r) > 0)
    assert sorted({p - lo for p in starts}) == [o - offsets[0] for o in offsets]
    # Writable, and a write lands in the shared buffer only (the file is untouched).
    big = loaded["large"]["big_f32"]
    big.add_(1)
    assert torch.equal(big, mixed_object["large"]["big_f32"] + 1)
    # The buffer outlives everything but one tensor.
    keep = loaded["dtypes"]["complex64"]
    del loaded, ts, big
    gc.collect()
    torch.empty(1 << 20).fill_(7.0)  # reuse freed memory, if it were freed
    assert torch.equal(keep, mixed_object["dtypes"]["complex64"])
    assert_equal_objects(torch.load(path, weights_only=True), mixed_object)


@pytest.mark.parametrize("map_location", [
    "cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda storage, location: storage, None,
], ids=["str", "device", "dict", "callable", "none"])
def test_map_location(tmp_path, map_location):
    obj = {"w": torch.randn(33, 7), "v": torch.arange(5).t(), "n": 3}
    fastpersist.save(obj, tmp_path / "m.pt")
    loaded = fastpersist.load(tmp_path / "m.pt", map_location=map_location)
    assert_equal_objects(loaded, obj)
    assert loaded["w"].device.type == "cpu"


def test_map_location_callable_sees_every_storage(tmp_path):
    obj = {"a": torch.ones(3), "b": torch.zeros(4, dtype=torch.int8)}
    fastpersist.save(obj, tmp_path / "m.pt")
    seen = []

    def where(storage, location):
        seen.append(location)
        return storage

    assert_equal_objects(fastpersist.load(tmp_path / "m.pt", map_location=where), obj)
    assert seen == ["cpu", "cpu"]


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_weights_only_refuses_a_custom_class(tmp_path, legacy):
    path = tmp_path / "c.pt"
    fastpersist.save({"obj": NotAllowed(7), "t": torch.ones(2)}, path, use_legacy_format=legacy)
    with pytest.raises(pickle.UnpicklingError, match="NotAllowed") as info:
        fastpersist.load(path)
    assert "weights_only" in str(info.value)
    loaded = fastpersist.load(path, weights_only=False)
    assert isinstance(loaded["obj"], NotAllowed) and loaded["obj"].value == 7


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 3")
@pytest.mark.parametrize("protocol", [2, 3])
def test_loads_legacy_files_written_by_torch(tmp_path, protocol):
    obj = {"views": torch.arange(20.0).view(4, 5).t(), "i": torch.arange(9, dtype=torch.int16)}
    obj["same"] = obj["views"]
    torch.save(obj, tmp_path / "old.pt", _use_new_zipfile_serialization=False,
               pickle_protocol=protocol)
    loaded = fastpersist.load(tmp_path / "old.pt")
    assert_equal_objects(loaded, obj)
    assert_same_sharing(loaded, obj)


def test_loads_zip_files_written_by_torch_to_a_path(mixed_object, tmp_path):
    """torch.save to a path names the archive after the file, not "archive/"."""
    torch.save(mixed_object, tmp_path / "plain.v2.pt")
    loaded = fastpersist.load(tmp_path / "plain.v2.pt")
    assert_equal_objects(loaded, mixed_object)
    assert_same_sharing(loaded, mixed_object)


@pytest.mark.parametrize("engine", [{"backend": "threads", "block_size": 4096, "queue_depth": 2,
                                     "intra_op_parallelism": 3}, {}])
def test_load_engine_options(tmp_path, engine):
    obj = {"t": torch.randn(100003)}
    fastpersist.save(obj, tmp_path / "e.pt")
    assert_equal_objects(fastpersist.load(tmp_path / "e.pt", **engine), obj)


def test_load_errors_are_clear(tmp_path):
    missing = tmp_path / "missing.pt"
    with pytest.raises(FileNotFoundError) as info:
        fastpersist.load(missing)
    assert info.value.errno == errno.ENOENT and info.value.filename == str(missing)

    with pytest.raises(IsADirectoryError):
        fastpersist.load(tmp_path)

    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(EOFError, match="empty.pt.*empty, not a checkpoint"):
        fastpersist.load(tmp_path / "empty.pt")

    for name, content in [("text.pt", b"hello, world\n" * 100), ("bin.pt", bytes(range(256)) * 9),
                          ("pickle.pt", pickle.dumps({"not": "torch"}, protocol=2))]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(pickle.UnpicklingError, match=f"{name}.*not a torch checkpoint"):
            fastpersist.load(tmp_path / name)

    # A zip that is not complete (a torn copy): torch's zip reader names the problem.
    fastpersist.save({"t": torch.ones(5000)}, tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "torn.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(RuntimeError, match="zip archive"):
        fastpersist.load(tmp_path / "torn.pt")


# ---------------------------------------------------------------------------- devices
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() "
                    "is False)")
def test_gpu_tensors_round_trip(tmp_path):  # pragma: no cover - needs a GPU
    obj = {"gpu": torch.randn(1000, device="cuda"), "cpu": torch.arange(10)}
    fastpersist.save(obj, tmp_path / "g.pt")
    loaded = fastpersist.load(tmp_path / "g.pt")
    assert loaded["gpu"].device.type == "cuda"
    assert torch.equal(loaded["gpu"].cpu(), obj["gpu"].cpu())
    on_cpu = fastpersist.load(tmp_path / "g.pt", map_location="cpu")
    assert on_cpu["gpu"].device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() "
                    "is False)")
def test_gpu_state_is_written_zero_copy_from_pinned_memory(tmp_path):  # pragma: no cover
    # Pinned host copies are page-aligned and storages sit at 4096-aligned offsets: the
    # writer sends them to O_DIRECT directly. Bytes equal torch.save's of the same object.
    obj = {"w": torch.randn(1 << 20, device="cuda"), "b": torch.randn(3, 5, device="cuda")}
    stats = fastpersist.save(obj, tmp_path / "g.pt")
    assert stats["zero_copy_bytes"] >= 4 << 20, stats
    assert_equal_objects(torch.load(tmp_path / "g.pt"), obj)


def test_cuda_map_location_without_cuda_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    fastpersist.save({"t": torch.ones(3)}, tmp_path / "c.pt")
    with pytest.raises(RuntimeError, match="CUDA"):
        fastpersist.load(tmp_path / "c.pt", map_location="cuda")

