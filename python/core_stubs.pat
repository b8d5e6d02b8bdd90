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

# `layout` is a submodule; stubgen writes `from _core import layout`, which mypy cannot resolve
# inside the package. Its names, as a namespace class (what the façade reads from it).
^_core\.layout$:
    \import typing
    class layout:
        """The on-disk names of a checkpoint root (include/fastpersist/layout.h)."""
        DATA_FILE_PREFIX: typing.ClassVar[str]
        DCP_METADATA_FILE_NAME: typing.ClassVar[str]
        DATA_FILE_SUFFIX: typing.ClassVar[str]
        LATEST_FILE_NAME: typing.ClassVar[str]
        LOCK_FILE_NAME: typing.ClassVar[str]
        MANIFEST_FILE_NAME: typing.ClassVar[str]
        OBJECTS_FILE_NAME: typing.ClassVar[str]
        TEMP_DIR_PREFIX: typing.ClassVar[str]
        TRASH_DIR_PREFIX: typing.ClassVar[str]
        @staticmethod
        def data_file_name(index: int, count: int, rank: int | None = None) -> str: ...
        @staticmethod
        def is_data_file_name(name: str) -> bool: ...
        @staticmethod
        def dcp_objects_file_name(rank: int) -> str: ...
