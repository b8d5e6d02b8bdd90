# SPDX-License-Identifier: Apache-2.0
"""Deterministic objects to checkpoint, reference bytes from ``torch.save`` into ``io.BytesIO``,
and deep comparison of loaded objects. Shared by the writer, save/load, failure and parallel
writer tests; importable in a spawned child process (no pytest here)."""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import zipfile
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
              torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_tensor(shape: Any, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Seeded values of any dtype: the same in every process."""
    g = _gen(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(1 << 30)), min(info.max, 1 << 30), shape, generator=g,
                         dtype=dtype)


def every_dtype() -> Dict[str, torch.Tensor]:
    """One tensor per dtype, none a multiple of 512 bytes long."""
    return {str(dt).replace("torch.", ""): random_tensor((1000 + 7 * i,), dt, seed=i)
            for i, dt in enumerate(ALL_DTYPES)}


def odd_sizes() -> Dict[str, torch.Tensor]:
    """Sizes around the 512/4096-byte and staging boundaries, and one scalar."""
    out = {f"u8_{n}": random_tensor((n,), torch.uint8, seed=n) for n in (1, 511, 513, 4095, 4097)}
    out["f32_3x333"] = random_tensor((3, 333), torch.float32, seed=3)
    out["scalar"] = torch.tensor(3.25)
    out["f64_100001"] = random_tensor((100001,), torch.float64, seed=5)  # ~800 KB: many halves
    return out


def empty_tensors() -> Dict[str, Any]:
    return {"empty_f32": torch.empty(0), "empty_2d": torch.zeros(0, 7, dtype=torch.int64),
            "empty_bool": torch.empty(3, 0, dtype=torch.bool), "after": torch.arange(5)}


def views() -> Dict[str, torch.Tensor]:
    """Non-contiguous views; torch saves each whole underlying storage."""
    base = random_tensor((64, 33), torch.float32, seed=11)
    other = random_tensor((10, 20, 30), torch.float16, seed=12)
    return {
        "transpose": base.t(),
        "slice": base[5:17, 3:30],
        "stride2": base[::2, ::3],
        "narrow_offset": torch.arange(1000, dtype=torch.int32).narrow(0, 123, 77),
        "permute": other.permute(2, 0, 1),
        "expand": torch.arange(7.0).unsqueeze(0).expand(5, 7),
        "complex_real": random_tensor((50,), torch.complex64, seed=13).real,
    }


def shared_storages() -> Dict[str, Any]:
    base = random_tensor((1234,), torch.float32, seed=21)
    return {"base": base, "head": base[:100], "tail": base[1000:],
            "matrix": base[:1200].view(40, 30),
            "nested": {"again": base, "list": [base[7:9], base[7:9]]}}


def nested_containers() -> Dict[str, Any]:
    return {
        "ints": [1, -2, 3 ** 40], "none": None, "str": "héllo, wörld", "float": 1.5, "bool": True,
        "tuple": (1, "two", (3.0, None), torch.arange(3)),
        "deep": {"a": {"b": {"c": [torch.ones(2, 2), {"d": torch.zeros(3, dtype=torch.int8)}]}}},
        "list_of_tensors": [random_tensor((17,), torch.float64, seed=s) for s in range(5)],
        "int_keys": {0: "zero", 1: torch.tensor([1])},
    }


def page_aligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in page-aligned memory. torch's CPU allocator aligns to 64 bytes only, and
    O_DIRECT (the zero-copy path) needs 512 or 4096."""
    nbytes = t.numel() * t.element_size()
    out = torch.frombuffer(mmap.mmap(-1, max(nbytes, 1)), dtype=t.dtype, count=t.numel())
    return out.view(t.shape).copy_(t)


def large_aligned(mib: float = 3) -> Dict[str, torch.Tensor]:
    """Tensors big enough for the zero-copy path (>= 1 MiB, whole 4 KiB blocks, page-aligned
    memory) plus an odd-sized one in ordinary memory."""
    n = int(mib * (1 << 20))
    return {"big_u8": page_aligned(random_tensor((n,), torch.uint8, seed=31)),
            "big_f32": random_tensor((n // 4 + 3,), torch.float32, seed=32)}


def small_model_and_optimizer(seed: int = 0) -> Dict[str, Any]:
    """A small torch.nn model and its Adam state after one step."""
    torch.manual_seed(seed)
    nn = torch.nn
    model = nn.Sequential(nn.Conv1d(3, 5, 3), nn.Flatten(), nn.LayerNorm(40), nn.Linear(40, 13),
                          nn.BatchNorm1d(13))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = model(torch.randn(4, 3, 10, generator=_gen(seed))).square().mean()
    loss.backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}


_GPT2: Dict[int, Dict[str, Any]] = {}


def gpt2_state(seed: int = 0) -> Dict[str, Any]:
    """A GPT-2 from a small config with random weights (no download); tied wte/lm_head share a
    storage. Built once per process."""
    if seed not in _GPT2:
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(seed)
        cfg = GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=64, vocab_size=1000,
                         bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        _GPT2[seed] = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    return _GPT2[seed]


def mixed() -> Dict[str, Any]:
    """A bit of everything, for the writer-settings matrix."""
    return {"dtypes": every_dtype(), "odd": odd_sizes(), "empty": empty_tensors(), "views": views(),
            "shared": shared_storages(), "nested": nested_containers(),
            "large": large_aligned(1.5), "model": small_model_and_optimizer()}


OBJECTS: Dict[str, Callable[[], Any]] = {
    "every_dtype": every_dtype,
    "odd_sizes": odd_sizes,
    "empty_tensors": empty_tensors,
    "views": views,
    "shared_storages": shared_storages,
    "nested_containers": nested_containers,
    "large_aligned": large_aligned,
    "model_and_adam": small_model_and_optimizer,
    "gpt2_and_adam": gpt2_state,
    "plain_tensor": lambda: random_tensor((12345,), torch.float32, seed=7),
}


# ---------------------------------------------------------------------------- serialization
@contextlib.contextmanager
def save_config(storage_alignment: Optional[int] = None,
                compute_crc32: Optional[bool] = None) -> Iterator[None]:
    """Temporarily sets torch.utils.serialization.config.save (global state; restored)."""
    from torch.utils.serialization import config

    saved = {"storage_alignment": config.save.storage_alignment,
             "compute_crc32": config.save.compute_crc32}
    try:
        if storage_alignment is not None:
            config.save.storage_alignment = storage_alignment
        if compute_crc32 is not None:
            config.save.compute_crc32 = compute_crc32
        yield
    finally:
        for k, v in saved.items():
            setattr(config.save, k, v)


def torch_save_bytes(obj: Any, legacy: bool = False) -> bytes:
    """What plain torch.save writes into a file object with the current settings."""
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


def fastpersist_save_reference(obj: Any, legacy: bool = False) -> bytes:
    """What fastpersist.save must write: torch.save with 4096-byte alignment and no CRC."""
    with save_config(storage_alignment=None if legacy else 4096, compute_crc32=False):
        return torch_save_bytes(obj, legacy)


def zip_records(data: bytes) -> List[Any]:
    """(name, header offset, data offset, size, payload) of each record, in file order."""
    reader = torch._C.PyTorchFileReader(io.BytesIO(data))
    out = []
    for info in zipfile.ZipFile(io.BytesIO(data)).infolist():
        name = info.filename.split("/", 1)[1]
        out.append((name, info.header_offset, reader.get_record_offset(name), info.file_size,
                    bytes(reader.get_record(name))))
    return out


def assert_same_file(actual: bytes, expected: bytes) -> None:
    """Byte identity, with a record-level diagnosis for zip checkpoints when it fails."""
    if actual == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(actual, expected)) if a != b),
                 min(len(actual), len(expected)))
    detail = ""
    if expected[:4] == b"PK\x03\x04":
        try:
            a_recs, e_recs = zip_records(actual), zip_records(expected)
            diffs = [(a[:4], e[:4]) for a, e in zip(a_recs, e_recs) if a != e]
            detail = f"; records differing (name, header, data offset, size): {diffs[:5]}"
            if len(a_recs) != len(e_recs):
                detail += f"; {len(a_recs)} records vs {len(e_recs)}"
        except Exception as e:  # noqa: BLE001 - only for the message
            detail = f"; the written file is not a readable zip: {e}"
    raise AssertionError(f"files differ: {len(actual)} bytes vs {len(expected)} expected, first "
                         f"difference at byte {first}{detail}")


# ---------------------------------------------------------------------------- comparison
def assert_equal_objects(actual: Any, expected: Any, path: str = "obj") -> None:
    """Deep equality: same container types and keys, tensors equal in dtype, shape, stride,
    storage offset and values."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)} is not a tensor"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.stride() == expected.stride(), f"{path}: stride differs"
        assert actual.storage_offset() == expected.storage_offset(), f"{path}: offset differs"
        assert actual.device == expected.device, f"{path}: device {actual.device}"
        assert torch.equal(actual, expected), f"{path}: values differ"
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_equal_objects(actual[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length differs"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_equal_objects(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def tensors(obj: Any) -> List[torch.Tensor]:
    """Every tensor in a nested container, in traversal order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def storage_groups(obj: Any) -> List[List[int]]:
    """Indices (into tensors(obj)) of tensors grouped by shared storage: the sharing pattern."""
    groups: Dict[int, List[int]] = {}
    for i, t in enumerate(tensors(obj)):
        s = t.untyped_storage()
        groups.setdefault(s.data_ptr() if s.nbytes() else -i - 1, []).append(i)  # empty: alone
    return sorted(groups.values())


def assert_same_sharing(actual: Any, expected: Any) -> None:
    assert storage_groups(actual) == storage_groups(expected), "storage sharing differs"


# ---------------------------------------------------------------------------- parallel writers
_PARALLEL_OBJECT: Dict[str, Any] = {}


def save_as_parallel_writer(path: str, num_writers: int, rank: int, stripe_mb: float,
                            legacy: bool = False, io_buffer_mb: float = 0.0625) -> Dict[str, Any]:
    """One writer of `num_writers`: builds the deterministic `mixed()` object in this process
    (once) and persists its share of the stream. Runs in spawned worker processes."""
    import fastpersist

    if "obj" not in _PARALLEL_OBJECT:
        _PARALLEL_OBJECT["obj"] = mixed()
    with fastpersist.FastFileWriter(path, num_parallel_writers=num_writers, writer_rank=rank,
                                    stripe_mb=stripe_mb, io_buffer_mb=io_buffer_mb) as f:
        torch.save(_PARALLEL_OBJECT["obj"], f, _use_new_zipfile_serialization=not legacy)
    return {"pid": os.getpid(), "rank": rank, "committed": f.committed, **f.stats()}


def _file_barrier(folder: str, rank: int, num_writers: int, timeout: float = 60.0) -> None:
    """Waits (bounded polling) until every rank has created its file in `folder`, so writers in
    different processes start their saves together; raises TimeoutError otherwise."""
    import time

    open(os.path.join(folder, f"ready-{rank}"), "w").close()
    deadline = time.monotonic() + timeout
    while len(os.listdir(folder)) < num_writers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {os.listdir(folder)} of {num_writers} writers arrived")
        time.sleep(0.005)


def parallel_writer_outcome(path: str, num_writers: int, rank: int, stripe_mb: float,
                            legacy: bool, commit_timeout: float, barrier: str) -> Dict[str, Any]:
    """Like `save_as_parallel_writer` with a commit timeout, after a barrier with the other
    ranks; reports the error of close() (type, errno, text) and how long close() took instead
    of raising. Runs in spawned worker processes."""
    import time

    import fastpersist

    if "obj" not in _PARALLEL_OBJECT:
        _PARALLEL_OBJECT["obj"] = mixed()
    _file_barrier(barrier, rank, num_writers)
    f = fastpersist.FastFileWriter(path, num_parallel_writers=num_writers, writer_rank=rank,
                                   stripe_mb=stripe_mb, io_buffer_mb=0.0625,
                                   commit_timeout=commit_timeout)
    torch.save(_PARALLEL_OBJECT["obj"], f, _use_new_zipfile_serialization=not legacy)
    out: Dict[str, Any] = {"pid": os.getpid(), "rank": rank, "error_type": None, "errno": None,
                           "error": ""}
    start = time.monotonic()
    try:
        f.close()
    except OSError as e:
        out.update(error_type=type(e).__name__, errno=e.errno, error=str(e))
    out.update(close_secs=time.monotonic() - start, committed=f.committed,
               file_committed=f.file_committed)
    return out
