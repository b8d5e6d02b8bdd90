# Patterns for the typed stubs of fastpersist._core (nanobind's stubgen; python/CMakeLists.txt).
# Each entry: a regular expression matched against a qualified name, then the lines that replace
# what stubgen would write for it.

# CheckpointManager has a method named `list`, which hides the builtin in the annotations of the
# class body: spell the builtin builtins.list there.
_core\.CheckpointManager\.list$:
    \import builtins
    \import typing
    def list(self) -> builtins.list[dict[str, typing.Any]]:
        \doc

_core\.CheckpointManager\.prune$:
    \import builtins
    def prune(self, keep_last: int | None, keep_every: int | None, verify: bool = False) -> tuple[builtins.list[str], builtins.list[str]]:
        \doc

# A module attribute set at import (m.attr), which stubgen does not list.
^_core\.__suffix__$:
    __version__: str

# PinnedBuffer exports the buffer protocol (numpy.frombuffer, memoryview, torch.frombuffer).
_core\.PinnedBuffer\.__suffix__$:
    def __buffer__(self, flags: int, /) -> memoryview: ...
