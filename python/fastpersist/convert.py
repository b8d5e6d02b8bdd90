# SPDX-License-Identifier: Apache-2.0
"""Convert between torch files, safetensors files and fastpersist checkpoint directories.

::

    python -m fastpersist.convert model.pt model.safetensors
    python -m fastpersist.convert model.safetensors ckpts/step-00001000   # a new checkpoint
    python -m fastpersist.convert model.safetensors ckpts --tag imported  # ckpts/imported
    python -m fastpersist.convert ckpts/step-00001000 model.safetensors --prefix model.
    python -m fastpersist.convert ckpts/step-00001000 state.pt

(``fastpersist convert ...`` runs this.) Formats are told apart by the path:

- SRC is what the library's path classifier says it is (``_core.classify_path``, the one the
  CLI's ``inspect``, ``list`` and ``verify`` use): a checkpoint directory (or its
  ``manifest.json``); a root, whose latest checkpoint is converted; a safetensors file; or a
  torch file, loaded like ``torch.load(weights_only=True)`` (``--unsafe-pickle``:
  ``weights_only=False``, only for files you trust; a zip-format file is read by the engine and
  unpickled by torch, as :func:`fastpersist.load` does). A file of unknown type is tried as a
  torch file. A directory with a checkpoint's data files but no ``manifest.json`` is an
  incomplete or foreign checkpoint directory: not a committed checkpoint, so it is refused.
  Two foreign formats are imported, so users can migrate (a directory is looked at for them
  before it is taken as a root):

  - a directory written by torch.distributed.checkpoint's ``FileSystemWriter`` (``.metadata``
    and ``__<rank>_<i>.distcp`` files), by any number of ranks: its full, unsharded state
    (:mod:`fastpersist.import_dcp`);
  - a DeepSpeed ZeRO checkpoint folder (stages 1-3; the folder with ``latest``, or one of its
    tag folders ``global_stepN``), what DeepSpeed's ``zero_to_fp32.py`` takes: its fp32 model
    weights (:mod:`fastpersist.import_deepspeed`).

  Their pickles are loaded with the restricted loaders of those modules unless
  ``--unsafe-pickle``.

  A DeepSpeed tag that :mod:`fastpersist.deepspeed` saved with ``compression`` or
  ``incremental`` (stored split: :mod:`fastpersist.split_tags`) converts the other way: into
  the plain tag DST (``ROOT/TAG``), its files byte for byte what ``torch.save`` produced, for
  DeepSpeed's own engine, ``zero_to_fp32`` and ``ds_to_universal``. Any other directory is refused,
  saying what convert looked for.
- DST: ``*.safetensors`` is a safetensors file; ``*.pt``, ``*.pth``, ``*.bin``, ``*.ckpt`` a torch
  file (written with :func:`fastpersist.save`, loadable by ``torch.load``); anything else is a new
  checkpoint directory ``ROOT/TAG`` written with :class:`fastpersist.CheckpointManager`, where
  DST is ``ROOT/TAG``, or DST is ``ROOT`` and ``--tag TAG``.

A safetensors file is a flat ``{name: tensor}`` map: a nested state is flattened with the names
of :func:`fastpersist.checkpoint_state.flatten_state` (``"model.layer.0.weight"``), and a state
with non-tensor values (a step counter, optimizer ``param_groups``) is refused unless
``--drop-non-tensors``. Tied tensors (aliases) are written once per name. ``--prefix P`` keeps
only the tensors whose name starts with P, and strips it (``--prefix model.`` turns a training
checkpoint into the model's ``state_dict``).

Progress: ``--progress`` draws a bar per phase on stderr (``convert read SRC``, ``convert write
DST``; by default only when stderr is a terminal, never with ``--no-progress``), and
:func:`convert` takes ``progress(phase, path, done, total)``. Every number is measured bytes:

- read: a torch file in zip format (what ``torch.save`` writes) is read in 64 MiB chunks by the
  engine into one buffer, and torch unpickles it with every storage a view of that buffer, as
  :func:`fastpersist.load` does, so reporting costs no extra copy. A legacy (non-zip) torch file
  goes to ``torch.load``, which cannot report: its size is reported once it is loaded. A
  safetensors file is read in chunks the same way; a checkpoint in batches of tensors.
- write: bytes handed to the writer (safetensors: after each tensor; torch: after each write of
  ``torch.save``, whose total is the tensor bytes until the file's own records pass it). A
  checkpoint has no byte counter while it saves: its bar stays at 0 until the checkpoint is
  committed, then shows the bytes written in all its files.

Exit status: 0 done, 1 failed, 2 bad arguments.
"""

from __future__ import annotations

import collections
import errno
import os
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import _core, cli, import_dcp, import_deepspeed, split_tags
from .checkpoint_state import flatten_state
from .errors import CheckpointLockedError
from .import_errors import ForeignCheckpointError, UnsafeForeignObjectError
from .pickle_bounds import PickleRefusedError, check_torch_file

__all__ = ["ConvertError", "convert", "main"]

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
SAFETENSORS_SUFFIX = ".safetensors"
_Kind = _core.PathKind
MANIFEST = _core.layout.MANIFEST_FILE_NAME
_MAX_LISTED = 8
# How the summary line names a source kind where its name is not enough.
_SOURCE_NAMES = {"dcp": "DCP checkpoint", "deepspeed": "DeepSpeed ZeRO checkpoint"}


# progress(phase, path, done, total): phase "read" (of SRC) or "write" (of DST), in bytes.
Progress = Callable[[str, str, int, int], None]
_Report = Optional[Callable[[int, int], None]]


def _reporter(progress: Optional[Progress], phase: str, path: str) -> _Report:
    if progress is None:
        return None
    return lambda done, total: progress(phase, path, done, total)


class ConvertError(Exception):
    """A conversion that cannot be done; the message says why (exit status 1)."""

    exit_code = 1


class ConvertUsageError(ConvertError):
    """Bad arguments: a path that does not exist, an option that does not apply (exit 2)."""

    exit_code = 2


@dataclass
class _Source:
    kind: str  # "torch", "safetensors", "checkpoint", "dcp", "deepspeed"
    path: str
    notes: List[str] = field(default_factory=list)


@dataclass
class _Destination:
    kind: str  # "torch", "safetensors", "checkpoint"
    path: str
    root: str = ""
    tag: str = ""


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _MAX_LISTED else "")


# ----------------------------------------------------------------------------- detection
def _detect_source(src: str) -> _Source:
    info = _core.classify_path(src)
    if info.kind == _Kind.MISSING:
        raise ConvertUsageError(f"SRC {info.error}")
    if info.kind == _Kind.CHECKPOINT:
        return _Source("checkpoint", info.path)
    if info.kind == _Kind.INCOMPLETE_CHECKPOINT:
        raise ConvertError(f"SRC {src} is {info.description}: a save that never finished, a "
                           "damaged checkpoint, or files another tool wrote "
                           "(`fastpersist verify` says more)")
    if info.kind == _Kind.ROOT:
        foreign = _detect_foreign_dir(src)
        if foreign is not None:
            return foreign
        latest = _core.latest_checkpoint(src)
        if latest is None:
            raise ConvertUsageError(
                f"SRC {src} is a directory convert does not recognize: not a fastpersist "
                "checkpoint root (it has no committed checkpoint), not a "
                f"torch.distributed.checkpoint directory (no {import_dcp.METADATA_FILE}), not a "
                "DeepSpeed checkpoint folder (no `latest` file naming a folder with "
                "*_model_states.pt files)")
        return _Source("checkpoint", os.path.join(src, latest),
                       [f"{src} is a checkpoint root: converting its latest checkpoint, {latest}"])
    if info.kind == _Kind.SAFETENSORS:
        return _Source("safetensors", src)
    if not os.path.isfile(src):  # a FIFO or device: reading it could block forever
        raise ConvertUsageError(f"SRC {src} is not a regular file (a FIFO, socket or device), "
                                "so not a torch or safetensors file")
    return _Source("torch", src)  # a torch file, or a file of unknown type tried as one


def _detect_foreign_dir(src: str) -> Optional[_Source]:
    """A DCP directory or a DeepSpeed ZeRO folder, or None for neither."""
    if import_dcp.is_dcp_dir(src) or import_dcp.rank_local_metadata(src):
        return _Source("dcp", src, ["the full state, every sharded tensor reassembled whole"])
    try:
        folder = import_deepspeed.find_deepspeed_checkpoint(src)
    except ForeignCheckpointError as e:
        raise ConvertError(str(e)) from None
    if folder is None:
        return None
    notes = ["the fp32 model weights (from the optimizer's master copy); the optimizer's "
             "state is not converted"]
    if os.path.normpath(folder) != os.path.normpath(src):
        notes.insert(0, f"{src} is a DeepSpeed checkpoint folder: converting the tag its "
                        f"latest file names, {os.path.basename(folder)}")
    return _Source("deepspeed", folder, notes)


def _detect_destination(dst: str, tag: Optional[str], overwrite: bool) -> _Destination:
    lower = dst.lower()
    if lower.endswith(SAFETENSORS_SUFFIX) or lower.endswith(TORCH_SUFFIXES):
        kind = "safetensors" if lower.endswith(SAFETENSORS_SUFFIX) else "torch"
        if tag is not None:
            raise ConvertUsageError(f"--tag applies to checkpoint destinations, not to the "
                                    f"{kind} file {dst}")
        if os.path.isdir(dst):
            raise ConvertUsageError(f"DST {dst} is a directory, not a {kind} file")
        if os.path.exists(dst) and not overwrite:
            raise ConvertUsageError(f"DST {dst} exists; pass --overwrite to replace it")
        return _Destination(kind, dst)
    info = _core.classify_path(dst)
    if tag is not None:
        if info.kind in (_Kind.CHECKPOINT, _Kind.INCOMPLETE_CHECKPOINT):
            raise ConvertUsageError(f"with --tag, DST is the root that gets the new checkpoint, "
                                    f"but {dst} is {info.description}")
        if info.kind != _Kind.MISSING and info.kind != _Kind.ROOT:
            raise ConvertUsageError(f"DST {dst} is {info.description}, not a checkpoint root")
        root = dst
    else:
        if info.kind in (_Kind.CHECKPOINT, _Kind.INCOMPLETE_CHECKPOINT):
            raise ConvertUsageError(f"DST {dst} is {info.description}; checkpoints are never "
                                    "replaced: choose a new tag")
        if info.kind == _Kind.ROOT:
            raise ConvertUsageError(f"DST {dst} exists; to add a checkpoint to the root {dst}, "
                                    "pass --tag TAG")
        if info.kind != _Kind.MISSING:
            raise ConvertUsageError(
                f"DST {dst} is an existing file of unknown type; name a *.safetensors or "
                f"*{'/*'.join(TORCH_SUFFIXES)} file, or a new checkpoint directory ROOT/TAG")
        stripped = dst.rstrip("/") or dst
        root, tag = os.path.split(stripped)
        root = root or "."
    try:
        _core.validate_tag(tag)
    except ValueError as e:
        raise ConvertUsageError(f"{tag!r} cannot be a checkpoint tag: {e}") from None
    path = os.path.join(root, tag)
    if os.path.exists(path):
        raise ConvertUsageError(f"{path} already exists; checkpoints are never replaced")
    return _Destination("checkpoint", path, root, tag)


# ----------------------------------------------------------------------------- loading
def _load_torch(path: str, unsafe: bool, report: _Report) -> Any:
    from . import serialization

    try:
        if serialization.is_zip_checkpoint(path) and serialization.can_load_zip_buffer():
            # Read by the engine (in chunks when reporting), then unpickled with every storage
            # a view of that buffer: one copy, as torch.load itself makes.
            buf = serialization.read_file(path, progress=report)
            return serialization.load_zip_buffer(buf, "cpu", weights_only=not unsafe)
        # torch.load reads a legacy file itself: only its size can be reported, once loaded.
        size = os.path.getsize(path)
        if report is not None:
            report(0, size)
        if not unsafe:
            check_torch_file(path, path)  # no bytearray(N) beyond the file (pickle_bounds.py)
        state = torch.load(path, map_location="cpu", weights_only=not unsafe)
        if report is not None:
            report(size, size)
        return state
    except PickleRefusedError as e:
        raise ConvertError(f"{path} is not a loadable torch file: {e}") from None
    except pickle.UnpicklingError as e:
        if unsafe:
            raise ConvertError(f"{path} is not a loadable torch file: {e}") from None
        first = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        raise ConvertError(
            f"torch.load(weights_only=True) refused {path}: {first}. If you trust this file, "
            "pass --unsafe-pickle (it may run arbitrary code while loading)") from None
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise  # the file could not be read
        # torch's zip reader says EINVAL about an archive it cannot parse
        raise ConvertError(f"{path} is not a loadable torch file ({e})") from None
    except Exception as e:  # noqa: BLE001 - torch.load fails on garbage in many ways
        raise ConvertError(f"{path} is not a loadable torch file "
                           f"({type(e).__name__}: {e})") from None


def _load_foreign(src: _Source, unsafe: bool, report: _Report) -> Any:
    try:
        if src.kind == "dcp":
            return import_dcp.load_dcp_dir(src.path, weights_only=not unsafe, report=report)
        return import_deepspeed.load_deepspeed_dir(src.path, weights_only=not unsafe,
                                                   report=report)
    except UnsafeForeignObjectError as e:
        raise ConvertError(f"{e}. If you trust this checkpoint, pass --unsafe-pickle (it may "
                           "run arbitrary code while loading)") from None
    except ForeignCheckpointError as e:
        raise ConvertError(str(e)) from None


def _load(src: _Source, unsafe: bool, prefix: Optional[str], report: _Report) -> Any:
    if src.kind == "torch":
        return _load_torch(src.path, unsafe, report)
    if src.kind in ("dcp", "deepspeed"):
        return _load_foreign(src, unsafe, report)
    if src.kind == "safetensors":
        from .safetensors_io import load_safetensors, safetensors_header, tensors_from_buffer
        from .serialization import read_file

        if report is None:
            return load_safetensors(src.path)
        return tensors_from_buffer(src.path, safetensors_header(src.path),
                                   read_file(src.path, progress=report))
    from .checkpoint_loading import load_checkpoint_dir, written_through_dcp
    from .checkpoint_state import UnsafeCheckpointObjectError
    from .writer import engine_options

    keys = None if prefix is None else (lambda n: n.startswith(prefix))
    if written_through_dcp(_core.CheckpointReader(src.path, engine_options()).manifest):
        keys = None  # DCP reassembles the whole state; the prefix is applied afterwards
    try:
        return load_checkpoint_dir(src.path, engine_options(), keys=keys,
                                   weights_only=not unsafe, progress=report)
    except UnsafeCheckpointObjectError as e:
        raise ConvertError(f"{src.path}: the checkpoint's objects need globals that "
                           f"weights_only=True refuses ({e}); if you trust it, pass "
                           "--unsafe-pickle") from None


# ----------------------------------------------------------------------------- shaping
def _non_tensor_values(state: Any, name: str = "") -> List[str]:
    """Paths of the values a safetensors file cannot hold (walking what flatten_state walks)."""
    out: List[str] = []
    if isinstance(state, torch.Tensor):
        return out
    if type(state) in (dict, collections.OrderedDict):
        if not state:
            return [f"{name or '<top level>'} (empty dict)"]
        for k, v in state.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                out.append(f"{name + '.' if name else ''}{k!r} (key of type {type(k).__name__})")
                continue
            out += _non_tensor_values(v, f"{name}.{k}" if name else str(k))
        return out
    if type(state) in (list, tuple):
        if not state:
            return [f"{name or '<top level>'} (empty {type(state).__name__})"]
        for i, v in enumerate(state):
            out += _non_tensor_values(v, f"{name}.{i}" if name else str(i))
        return out
    return [f"{name or '<top level>'} ({type(state).__name__})"]


def _flat_tensors(state: Any) -> Dict[str, torch.Tensor]:
    """{name: tensor} of every tensor flatten_state finds; aliases become their own names."""
    try:
        flat = flatten_state(state)
    except ValueError as e:
        raise ConvertError(f"cannot name the tensors of SRC: {e}") from None
    out = dict(flat.tensors)
    for alias, target in flat.aliases.items():
        out[alias] = out[target]
    return out


def _select_prefix(state: Any, prefix: str) -> Dict[str, torch.Tensor]:
    flat = _flat_tensors(state)
    out: Dict[str, torch.Tensor] = {}
    for name, t in flat.items():
        if name.startswith(prefix):
            stripped = name[len(prefix):]
            if not stripped:
                raise ConvertError(f"--prefix {prefix!r} is a whole tensor name; end it with '.' "
                                   "to select the tensors under it")
            out[stripped] = t
    if not out:
        sample = _listed(sorted(flat)) if flat else "none"
        raise ConvertError(f"no tensor name starts with {prefix!r} (names: {sample})")
    return out


def _for_safetensors(state: Any, drop: bool, notes: List[str]) -> Dict[str, torch.Tensor]:
    if isinstance(state, torch.Tensor) or type(state) not in (dict, collections.OrderedDict):
        raise ConvertError(f"SRC holds a {type(state).__name__}, but a safetensors file needs a "
                           "dict of tensors")
    others = _non_tensor_values(state)
    if others and not drop:
        raise ConvertError(
            f"SRC holds {len(others)} non-tensor value(s) a safetensors file cannot store: "
            f"{_listed(others)}. Pass --drop-non-tensors to leave them out, --prefix to select "
            "tensors, or convert to a checkpoint directory or .pt file, which keep them")
    if others:
        notes.append(f"left out {len(others)} non-tensor value(s): {_listed(others)}")
    flat = _flat_tensors(state)
    if not flat:
        raise ConvertError("SRC holds no tensors")
    return flat


def _owning_copies(state: Any) -> Any:
    """The state with every tensor that views a larger buffer cloned, so torch.save writes only
    its own bytes (loaders return views of one read buffer). Shared tensors stay shared."""
    memo: Dict[int, torch.Tensor] = {}

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) not in memo:
                own = x.untyped_storage().nbytes() == x.numel() * x.element_size()
                memo[id(x)] = x if own and x.storage_offset() == 0 else x.clone()
            return memo[id(x)]
        if type(x) in (dict, collections.OrderedDict):
            return type(x)((k, walk(v)) for k, v in x.items())
        if type(x) is list:
            return [walk(v) for v in x]
        if type(x) is tuple:
            return tuple(walk(v) for v in x)
        return x

    return walk(state)


def _summary(state: Any) -> Tuple[int, int]:
    """(number of tensors, bytes) as flatten_state sees the state."""
    try:
        flat = flatten_state(state)
    except ValueError:
        return 0, 0
    return len(flat.tensors), sum(t.numel() * t.element_size() for _, t in flat.tensors)


# ----------------------------------------------------------------------------- the conversion
def convert(src: str, dst: str, *, tag: Optional[str] = None, prefix: Optional[str] = None,
            drop_non_tensors: bool = False, unsafe_pickle: bool = False,
            overwrite: bool = False, progress: Optional[Progress] = None,
            compression: Optional[str] = None,
            compression_level: Optional[int] = None) -> List[str]:
    """Converts SRC to DST (see the module's docstring); returns lines describing what it did.

    `progress(phase, path, done, total)` is called as bytes are read ("read", the SRC file or
    checkpoint) and written ("write", DST), with (0, total) when a phase starts.

    Raises :class:`ConvertError` (or :class:`ConvertUsageError`) with a message for the user.
    """
    source = _detect_source(src)
    dest = _detect_destination(dst, tag, overwrite)
    if (compression is not None or compression_level is not None) and dest.kind != "checkpoint":
        raise ConvertUsageError("--compression and --compression-level apply to a checkpoint DST "
                                f"only, not to a {dest.kind} file")
    if os.path.exists(dest.path) and os.path.samefile(source.path, dest.path):
        raise ConvertUsageError("SRC and DST are the same file")
    notes = list(source.notes)
    if source.kind == "checkpoint" and _is_split_deepspeed_tag(source.path):
        return _convert_split_tag(source, dest, progress, prefix, compression, compression_level)
    state = _load(source, unsafe_pickle, prefix, _reporter(progress, "read", source.path))
    report = _reporter(progress, "write", dest.path)
    if prefix is not None:
        state = _select_prefix(state, prefix)

    if dest.kind == "safetensors":
        from .safetensors_io import save_safetensors

        tensors = _for_safetensors(state, drop_non_tensors, notes)
        try:
            save_safetensors(tensors, dest.path, progress=report)
        except (TypeError, ValueError) as e:
            raise ConvertError(f"cannot write {dest.path}: {e}") from None
        written = f"safetensors file {dest.path}"
        count, nbytes = len(tensors), sum(t.numel() * t.element_size() for t in tensors.values())
    elif dest.kind == "torch":
        from .serialization import save

        state = _owning_copies(state)
        count, nbytes = _summary(state)
        on_write = None
        if report is not None:
            # The file's size is known only once written: the tensor bytes until it passes them.
            report(0, nbytes)
            on_write = lambda done: report(done, max(done, nbytes))  # noqa: E731
        stats = save(state, dest.path, progress=on_write)
        if report is not None:
            report(stats["bytes"], stats["bytes"])
        written = f"torch file {dest.path}"
    else:
        from .checkpoint import CheckpointManager
        from .errors import CheckpointLockedError

        try:
            manager = CheckpointManager(dest.root, compression=compression,
                                        compression_level=compression_level)
        except CheckpointLockedError as e:
            raise ConvertError(str(e)) from None
        except ValueError as e:  # a level outside the codec's range
            raise ConvertUsageError(str(e)) from None
        count, nbytes = _summary(state)
        try:
            # No byte counter while a checkpoint saves: report the start and the commit.
            if report is not None:
                report(0, nbytes)
            handle = manager.save_async(dest.tag, state,
                                        metadata={"converted_from": os.path.abspath(src)})
            handle.wait()
            if report is not None:
                report(handle.bytes, handle.bytes)
        finally:
            manager.close()
        written = f"checkpoint {dest.path} (root {dest.root}, tag {dest.tag})"
    what = _SOURCE_NAMES.get(source.kind, source.kind)
    lines = [f"converted {what} {source.path} -> {written}: "
             f"{count} tensor{'s' if count != 1 else ''}, {_core.format_bytes(nbytes)}"]
    return lines + [f"note: {n}" for n in notes]


def _is_split_deepspeed_tag(path: str) -> bool:
    try:
        manifest = _core.CheckpointReader(path, _core.EngineOptions()).manifest
    except (OSError, ValueError):
        return False  # _load reports what is wrong with it
    return split_tags.is_split_tag(manifest)


def _convert_split_tag(source: _Source, dest: _Destination, progress: Optional[Progress],
                       prefix: Optional[str], compression: Optional[str],
                       compression_level: Optional[int]) -> List[str]:
    """A DeepSpeed tag saved compressed or incremental -> the plain tag DST (ROOT/TAG)."""
    if dest.kind != "checkpoint":
        raise ConvertUsageError(
            f"SRC {source.path} is a DeepSpeed tag stored split (saved with compression or "
            "incremental): it converts into a plain DeepSpeed tag folder, DST ROOT/TAG, whose "
            f"files torch.load and DeepSpeed read; not into a {dest.kind} file")
    if prefix is not None or compression is not None or compression_level is not None:
        raise ConvertUsageError("--prefix, --compression and --compression-level do not apply "
                                "to a DeepSpeed tag: its files are written back as they were")
    try:
        done = split_tags.convert_split_tag(source.path, dest.root, dest.tag,
                                            _reporter(progress, "write", dest.path))
    except (OSError, ValueError, CheckpointLockedError) as e:
        raise ConvertError(f"cannot convert {source.path}: {e}") from None
    return [f"converted DeepSpeed tag {source.path} (stored split) -> plain DeepSpeed tag "
            f"{dest.path} (root {dest.root}, tag {dest.tag}; `latest` names it): "
            f"{done['files']} file{'s' if done['files'] != 1 else ''}, {_core.format_bytes(done['bytes'])}"]


class _Bars:
    """The bars of one conversion on stderr, one line per phase (read, then write). As a context
    manager: ends the last line, or blanks it when the conversion raised (the error message
    then starts on a clean line)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._key: Optional[Tuple[str, str]] = None
        self._bar: Optional[_core.ProgressBar] = None

    def __call__(self, phase: str, path: str, done: int, total: int) -> None:
        if self._bar is None or self._key != (phase, path):
            self._finish(clear=False)
            self._key = (phase, path)
            self._bar = _core.ProgressBar(f"convert {phase} {path}", self.enabled)
        self._bar.update(done, total)

    def _finish(self, clear: bool) -> None:
        if self._bar is not None:
            self._bar.finish(clear)
        self._key, self._bar = None, None

    def __enter__(self) -> "_Bars":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._finish(clear=exc_type is not None)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """`python -m fastpersist.convert`: the command line of `fastpersist convert`, parsed by the
    CLI's own parser (tools/convert_args.h) and run here; --materialize runs in C++."""
    name = prog or "python -m fastpersist.convert"
    parsed = _core.parse_convert_args(list(sys.argv[1:] if argv is None else argv), name)
    if parsed.args is None:  # --help, or a bad command line
        sys.stdout.write(parsed.out)
        sys.stderr.write(parsed.err)
        return int(parsed.exit_code)
    args = parsed.args
    if args.materialize:
        return cli.main(["convert", *args.to_argv()])
    shown = True if args.progress else False if args.no_progress else _core.stderr_is_tty()
    try:
        with _Bars(shown) as bars:
            lines = convert(args.src, args.dst, tag=args.tag, prefix=args.prefix,
                            drop_non_tensors=args.drop_non_tensors,
                            unsafe_pickle=args.unsafe_pickle, overwrite=args.overwrite,
                            progress=bars if bars.enabled else None,
                            compression=args.compression,
                            compression_level=args.compression_level)
    except ConvertError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - one line for the user; FASTPERSIST_DEBUG=1 for more
        if os.environ.get("FASTPERSIST_DEBUG"):
            raise
        print(f"{name}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
