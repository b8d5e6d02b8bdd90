# SPDX-License-Identifier: Apache-2.0
"""``install(engine, **options)``: puts a FastPersistCheckpointEngine into a DeepSpeed engine.

DeepSpeed builds its checkpoint engine in ``create_checkpoint_engine`` with hard-coded branches
(no registry), so the engine is swapped after ``deepspeed.initialize``, and two of the engine's
methods are wrapped on the instance:

- ``save_checkpoint`` checks the tag before DeepSpeed creates any folder, records the global step
  for the manifest, and passes ``save_latest=False``: DeepSpeed would rewrite ``latest`` in
  place (truncate, then write) after our commit replaced it atomically.
- ``load_checkpoint`` first commits a save that is still open (async).
"""

from __future__ import annotations

import atexit
import functools
import os
import weakref
from typing import Any, Optional

from .. import _core
from .engine import FastPersistCheckpointEngine
from .settings import EngineSettings, merge_options

_INSTALLED = "_fastpersist_checkpoint_engine"


def install(engine: Any, **options: Any) -> Any:
    """Makes `engine` (a ``deepspeed.DeepSpeedEngine``) save and load through fastpersist; returns
    it. Call on every rank, after ``deepspeed.initialize``. `options` (see docs/integrations.md)
    may also come from the config's ``"fastpersist"`` section."""
    from deepspeed.runtime.engine import DeepSpeedEngine  # type: ignore[import-not-found, import-untyped, unused-ignore]

    if not isinstance(engine, DeepSpeedEngine):
        raise TypeError("fastpersist.deepspeed.install needs the engine deepspeed.initialize "
                        f"returned (a DeepSpeedEngine), got {type(engine).__name__}")
    if engine.zero_nvme_offload_optimizer():
        raise ValueError("fastpersist.deepspeed.install: ZeRO NVMe offload of the optimizer is not "
                         "supported (DeepSpeed copies the swap folder into the tag itself, past "
                         "the checkpoint engine, so the tag could not commit atomically)")
    config = getattr(getattr(engine, "_config", None), "_param_dict", None)
    settings = EngineSettings(merge_options(options, config))
    old = getattr(engine, _INSTALLED, None)
    if old is not None:
        old.close()  # commits what it had open, releases its folders' locks
    ours = FastPersistCheckpointEngine(settings)
    engine.checkpoint_engine = ours
    setattr(engine, _INSTALLED, ours)
    if old is None:
        _wrap(engine)
    _close_at_exit(ours)
    return engine


def installed(engine: Any) -> FastPersistCheckpointEngine:
    """The engine's FastPersistCheckpointEngine; TypeError when install() was not called."""
    ours = getattr(engine, _INSTALLED, None)
    if ours is None or engine.checkpoint_engine is not ours:
        raise TypeError("fastpersist: this DeepSpeed engine does not use fastpersist; call "
                        "fastpersist.deepspeed.install(engine) first")
    return ours


def wait(engine: Any) -> None:
    """Commits the engine's async save that no optimizer step committed yet (every rank calls
    it); raises that save's error."""
    installed(engine).wait()


def _wrap(engine: Any) -> None:
    save = engine.save_checkpoint
    load = engine.load_checkpoint

    @functools.wraps(save)
    def save_checkpoint(save_dir: Any, tag: Optional[Any] = None, client_state: Any = None,
                        save_latest: bool = True, exclude_frozen_parameters: bool = False) -> Any:
        ours = installed(engine)
        if tag is not None:
            _core.validate_tag(str(tag))  # before DeepSpeed makes any folder
        ours.expect(int(engine.global_steps), {"zero_stage": int(engine.zero_optimization_stage())})
        result = save(save_dir, tag=tag, client_state={} if client_state is None else client_state,
                      save_latest=False, exclude_frozen_parameters=exclude_frozen_parameters)
        ours.saved()
        return result

    @functools.wraps(load)
    def load_checkpoint(load_dir: Any, tag: Optional[Any] = None, *args: Any, **kwargs: Any) -> Any:
        installed(engine).wait()
        return load(load_dir, resolve_tag(engine, load_dir, tag), *args, **kwargs)

    engine.save_checkpoint = save_checkpoint
    engine.load_checkpoint = load_checkpoint


def resolve_tag(engine: Any, load_dir: Any, tag: Optional[Any]) -> Optional[str]:
    """The tag a load reads: `tag`, or the one the pointer file names (``latest``, or
    ``latest_universal`` for a universal load, as DeepSpeed picks it; None when there is none).
    Either must be a plain tag name: a pointer file is untrusted input, and a name such as
    ``../../x`` would send the load outside `load_dir` (ValueError)."""
    where = "the tag"
    if tag is None:
        name = "latest_universal" if engine.load_universal_checkpoint() else "latest"
        pointer = os.path.join(os.fspath(load_dir), name)
        if not os.path.isfile(pointer):
            return None
        with open(pointer, "rb") as f:
            tag = f.read(4097).decode("utf-8", errors="replace").strip()
        where = f"the tag {pointer} names"
    tag = str(tag)
    try:
        _core.validate_tag(tag)
    except ValueError as e:
        raise ValueError(f"fastpersist: {where} ({tag[:200]!r}) is not a tag name: {e}") from None
    return tag


def _close_at_exit(ours: FastPersistCheckpointEngine) -> None:
    """At interpreter exit, commits an async save still open (every rank exits through here)."""
    ref = weakref.ref(ours)

    def close() -> None:
        engine = ref()
        if engine is None or engine.closed:
            return
        try:
            engine.close()
        except Exception as e:  # noqa: BLE001 (at exit there is nobody to raise to)
            import sys

            print(f"fastpersist: the async DeepSpeed checkpoint could not be committed at exit: {e}",
                  file=sys.stderr)

    atexit.register(close)
