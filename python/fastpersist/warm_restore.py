# SPDX-License-Identifier: Apache-2.0
"""Warm restore: ``CheckpointManager.resume(optimizer="background")``.

The model (everything but the hooked optimizers' entries) is loaded first and ``resume``
returns; the optimizer state is loaded on a background thread while the first forward and
backward passes run, and the optimizer hook (:meth:`CheckpointManager.hook_optimizer`) hands it
to ``optimizer.load_state_dict()`` at the optimizer's first ``step()``, waiting for it there if
it is still loading. Both parts are ordinary C++ loads of the same checkpoint (the GIL is
released while they read), split by tensor name: an optimizer hooked under ``key`` owns the
names ``key`` and ``key.*``. docs/tiers.md ("Warm restore") describes the behaviour.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, NoReturn, Optional

from .errors import CheckpointCorruptError

# resume(optimizer=...) values.
FOREGROUND = "foreground"
BACKGROUND = "background"
MODES = (FOREGROUND, BACKGROUND)


def owns(key: str, name: str) -> bool:
    """Whether tensor `name` belongs to the state saved under the top-level key `key`."""
    return name == key or name.startswith(key + ".")


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"hook_optimizer(key=...) takes the non-empty top-level key its state is "
                        f"saved under (e.g. \"optimizer\"), not {key!r}")
    return key


class BackgroundState:
    """An optimizer state that a warm restore is still loading, in place of it in the state
    ``resume(optimizer="background")`` returns.

    The hooked optimizer receives it by itself before its first ``step()``; do not pass this
    object to ``load_state_dict()`` (it refuses to act as a dict). ``result()`` waits and gives
    the loaded state, for code that wants it.
    """

    def __init__(self, key: str, tag: str, load: Callable[[], Any]) -> None:
        self.key = key
        self.tag = tag
        self._load = load
        self._done = threading.Event()
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"fastpersist-restore-{key}")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._load()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits for the state
            self._error = e
        finally:
            self._load = None  # type: ignore[assignment]
            self._done.set()

    def done(self) -> bool:
        """Whether the load finished (loaded or failed)."""
        return self._done.is_set()

    def result(self, timeout: Optional[float] = None) -> Any:
        """The loaded state; waits up to `timeout` seconds (None: for good).

        Raises the load's failure (a :class:`CheckpointCorruptError` naming the damaged tensor:
        the model already came from this checkpoint, so resume again with the default
        ``optimizer="foreground"``, which skips a damaged checkpoint), or ``TimeoutError``.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"fastpersist: the optimizer state {self.key!r} of {self.tag} is "
                               f"still loading after {timeout} s")
        if isinstance(self._error, CheckpointCorruptError):
            raise CheckpointCorruptError(
                f"fastpersist: warm restore of {self.key!r} from {self.tag} failed: {self._error}. "
                f"The model was loaded from {self.tag}: resume again with "
                f"optimizer=\"foreground\", which skips a damaged checkpoint") from self._error
        if self._error is not None:
            raise self._error
        return self._value

    def join(self) -> None:
        self._thread.join()

    def _refuse(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise TypeError(
            f"fastpersist: the state under {self.key!r} of {self.tag} is still loading in the "
            "background (resume(optimizer=\"background\")): the optimizer hooked under this key "
            "receives it before its first step(). Do not load it yourself; .result() waits "
            "for it")

    __getitem__ = keys = items = values = copy = __iter__ = __len__ = __contains__ = _refuse

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        state = "loaded" if self.done() and self._error is None else (
            "failed" if self.done() else "loading")
        return f"<fastpersist.BackgroundState {self.key!r} of {self.tag}: {state}>"


class HookedOptimizer:
    """An optimizer hooked to a manager, the key its state is saved under, and a warm restore
    not yet applied to it."""

    def __init__(self, optimizer: Any, key: str, hook: Any) -> None:
        self.optimizer = optimizer
        self.key = key
        self.hook = hook
        self.pending: Optional[BackgroundState] = None

    def apply_restore(self) -> None:
        """Waits for a pending warm restore and loads it into the optimizer. On failure it stays
        pending: every later step() raises again rather than step without the state."""
        if self.pending is None:
            return
        state = self.pending.result()
        self.optimizer.load_state_dict(state)
        self.pending = None


def start_background(state: Any, tag: str, hooked: List[HookedOptimizer],
                     load: Callable[[Callable[[str], bool]], Any]) -> Any:
    """After the foreground load of `state` (every name no hooked optimizer owns): starts one
    background load per hooked optimizer, ``load(selects)``, puts a :class:`BackgroundState` in
    its place in `state` and marks the optimizer pending. Returns `state`."""
    if not isinstance(state, dict):
        raise ValueError(f"fastpersist: resume(optimizer=\"background\") needs a checkpoint whose "
                         f"state is a dict; {tag} holds a {type(state).__name__}")
    missing = [h.key for h in hooked if h.key not in state]
    if missing:
        saved = ", ".join(repr(k) for k in state) or "none"
        raise ValueError(f"fastpersist: checkpoint {tag} has no entry {missing[0]!r} for the "
                         f"optimizer hooked under that key (its top-level keys: {saved}); pass "
                         "hook_optimizer(optimizer, key=...) the key the state was saved under")
    def loader(key: str) -> Callable[[], Any]:
        return lambda: load(lambda name: owns(key, name))[key]

    for h in hooked:
        h.pending = BackgroundState(h.key, tag, loader(h.key))
        state[h.key] = h.pending
    return state
