# SPDX-License-Identifier: Apache-2.0
"""The options of the DeepSpeed checkpoint engine: given to ``install(engine, **options)`` and/or
in the DeepSpeed config's ``"fastpersist"`` section (DeepSpeed's config parser keeps a section it
does not know in ``engine._config._param_dict``), plus the ``"aio"`` knobs the config spells out.

Options that mean what a :class:`fastpersist.CheckpointManager` option means have its name and
its default (the C++ ``CheckpointOptions`` and ``FastFileWriterOptions``; nothing is defaulted
here). A value given both ways must agree.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .. import _core
from .._checkpoint_options import checkpoint_options
from .._engine_options import check_flag
from ..distributed import DEFAULT_TIMEOUT

# The options, and what each one is. Every one defaults to None: the C++ default.
OPTIONS: Dict[str, str] = {
    "keep_last": "keep only the newest N committed tags of the save folder",
    "keep_every": "also keep every tag whose step is a multiple of N",
    "durable": "fdatasync every file and fsync the folders before a tag commits",
    "checksums": "record the XXH3-64 of every file in the tag's manifest",
    "async_save": "save_checkpoint returns once the state is pickled; the files are written "
                  "while training goes on, and the tag commits at the next optimizer step",
    "io_buffer_mb": "pinned staging memory of each file writer, MiB (a split tag's: of all "
                    "its files together)",
    "single_io_buffer": "one staging half instead of two that overlap",
    "backend": "I/O backend: auto, io_uring, libaio, threads",
    "block_size": "bytes per I/O request",
    "queue_depth": "requests in flight per thread",
    "intra_op_parallelism": "I/O threads",
    "timeout": "seconds a rank waits for the others in a save or a load",
    "weights_only": "load files with torch.load(weights_only=True), DeepSpeed's own classes "
                    "allowed (False: any pickle; only for files you trust)",
    "compression": "none, zstd or lz4: the tensors of each file compressed (the tag is then "
                   "stored split, readable through fastpersist or after `fastpersist convert`)",
    "compression_level": "the codec's level (default: the codec's own)",
    "compression_threads": "threads that compress (default: one per core)",
    "incremental": "tensors equal to the last full tag's are stored as references to it (the tag "
                   "is then stored split, like a compressed one)",
    "full_every": "incremental: every N-th tag is full",
}

# The options that store a tag split (include/fastpersist/split_file.h) when they are on.
SPLIT_OPTIONS = ("compression", "incremental")

# CheckpointManager options that a DeepSpeed tag cannot honour, and why.
_NOT_HERE = {
    "xor_deltas": "a DeepSpeed file's pieces are untyped bytes, and XOR deltas need float "
                  "tensors; use incremental=True alone",
}

# DeepSpeed's "aio" config keys -> our option names.
_AIO = {"block_size": "block_size", "queue_depth": "queue_depth",
        "intra_op_parallelism": "intra_op_parallelism", "thread_count": "intra_op_parallelism"}


class EngineSettings:
    """The options in force, checked once (a bad one raises before anything is written)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.given: Dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        engine_knobs = {k: self.given.get(k) for k in
                        ("durable", "checksums", "backend", "block_size", "queue_depth",
                         "intra_op_parallelism", "compression", "compression_level",
                         "compression_threads", "incremental", "full_every")}
        # The C++ options (defaults filled in); raises TypeError/ValueError naming the option.
        self.checkpoint = checkpoint_options(engine_knobs, self.given.get("keep_last"),
                                             self.given.get("keep_every"))
        self.engine = self.checkpoint.engine
        self.durable = bool(self.checkpoint.durable)
        self.checksums = bool(self.checkpoint.checksums)
        # Compressed or incremental tags are stored split (files.py, split_file.h).
        self.split = self.checkpoint.compression != "none" or bool(self.checkpoint.incremental)
        w = _core.FastFileWriterOptions()
        w.durable = self.durable
        if "io_buffer_mb" in self.given:
            mb = self.given["io_buffer_mb"]
            if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not mb > 0:
                raise ValueError(f"fastpersist: io_buffer_mb must be a number of MiB > 0, got {mb!r}")
            w.io_buffer_bytes = int(mb * (1 << 20))
        if "single_io_buffer" in self.given:
            w.single_io_buffer = check_flag("single_io_buffer", self.given["single_io_buffer"])
        self.writer = w
        # A split tag's ShardWriter stages from the lent storages, which stay unchanged until
        # the write ends, so it needs no snapshot of the whole state (the manager's budget 0):
        # it gets the staging memory a plain file's writer has.
        self.checkpoint.staging_budget_bytes = w.io_buffer_bytes
        self.async_save = check_flag("async_save", self.given.get("async_save", False))
        self.weights_only = check_flag("weights_only", self.given.get("weights_only", True))
        timeout = self.given.get("timeout", DEFAULT_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"fastpersist: timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)


def merge_options(given: Mapping[str, Any], ds_config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The options from ``install(**given)``, the config's "fastpersist" section and the knobs
    its "aio" section spells out. Unknown names, and values given twice that differ, raise a
    ValueError naming them and where each came from."""
    check_names(given, "fastpersist.deepspeed.install()")
    sources = [("install()", given)]
    if ds_config is not None:
        section = ds_config.get("fastpersist")
        if section is not None:
            where = "the DeepSpeed config's \"fastpersist\" section"
            if not isinstance(section, Mapping):
                raise ValueError(f"fastpersist: {where} must be an object, got "
                                 f"{type(section).__name__}")
            check_names(section, where)
            sources.append((where, section))
        aio = ds_config.get("aio")
        if isinstance(aio, Mapping):
            knobs: Dict[str, Any] = {}
            for key, name in _AIO.items():  # intra_op_parallelism wins over thread_count
                if aio.get(key) is not None and name not in knobs:
                    knobs[name] = aio[key]
            sources.append(("the DeepSpeed config's \"aio\" section", knobs))
    merged: Dict[str, Any] = {}
    origin: Dict[str, str] = {}
    for where, options in sources:
        for name, value in options.items():
            if value is None:
                continue
            if name in merged and merged[name] != value:
                raise ValueError(f"fastpersist: option {name!r} is {merged[name]!r} in "
                                 f"{origin[name]} but {value!r} in {where}; give it once, or "
                                 "the same value")
            merged[name] = value
            origin[name] = where
    return merged


def check_names(options: Mapping[str, Any], where: str) -> None:
    for name in options:
        if name in _NOT_HERE:
            raise ValueError(f"fastpersist: option {name!r} in {where}: {_NOT_HERE[name]}")
        if name not in OPTIONS:
            raise ValueError(f"fastpersist: unknown option {name!r} in {where}; the DeepSpeed "
                             f"engine takes: {', '.join(sorted(OPTIONS))}")
