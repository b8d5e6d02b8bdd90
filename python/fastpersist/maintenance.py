# SPDX-License-Identifier: Apache-2.0
"""Cleaning up after writers that died.

A ``FastFileWriter`` (and so ``fastpersist.save``) writes into a hidden temporary next to its
target, ``.<name>.fp-tmp-XXXXXX``, and holds a lock on it until it commits or aborts. When the
process dies first (SIGKILL, the OOM killer, a node failure) the temporary stays behind, never
under the target's name. The next writer of the same target removes it by itself;
``clean_stale_temp_files`` (or ``fastpersist clean DIR``) removes those of every target in a
folder. A temporary whose writer is alive is locked and is never touched, so both are safe while
other jobs save into the folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Tuple, Union

from . import _core

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class StaleFiles:
    """What ``clean_stale_temp_files`` found in one folder."""

    removed: List[str] = field(default_factory=list)
    """Temporaries of dead writers that were removed (would be, with ``dry_run``)."""
    in_use: List[str] = field(default_factory=list)
    """Temporaries that a living writer holds; kept."""
    failed: List[Tuple[str, str]] = field(default_factory=list)
    """(path, reason) for each temporary-looking entry that could not be removed."""
    removed_bytes: int = 0
    """Disk space the removed temporaries held."""


def clean_stale_temp_files(folder: PathLike, *, dry_run: bool = False) -> StaleFiles:
    """Removes the temporaries that dead ``FastFileWriter`` processes left in ``folder``.

    Not recursive. Raises ``FileNotFoundError`` (an ``OSError``) when the folder cannot be read.
    """
    r = _core.remove_stale_temp_files(os.fspath(folder), "", bool(dry_run))
    return StaleFiles(removed=list(r["removed"]), in_use=list(r["in_use"]),
                      failed=[(p, why) for p, why in r["failed"]],
                      removed_bytes=int(r["removed_bytes"]))
