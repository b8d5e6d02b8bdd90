# SPDX-License-Identifier: Apache-2.0
"""Cleaning up after writers that died.

A ``FastFileWriter`` (and so ``fastpersist.save``) writes into a hidden temporary next to its
target, ``.<name>.fp-tmp-XXXXXX``, and holds a lock on it until it commits or aborts. When the
process dies first (SIGKILL, the OOM killer, a node failure) the temporary stays behind, never
under the target's name. The next writer of the same target removes it by itself;
``clean_stale_temp_files`` (or ``fastpersist clean DIR``) removes those of every target in a
folder. A temporary whose writer is alive is locked and is never touched, so both are safe while
other jobs save into the folder.

Parallel writers share ``.<name>.fp-partial`` (with ``.done`` and ``.lock`` records). A set that
no writer holds any more could still be completed by a rank that has not started yet, so it is
removed only once it has not been written for ``parallel_min_age`` seconds (default one hour).
"""

from __future__ import annotations

import os
from typing import Optional, Union

from . import _core

PathLike = Union[str, "os.PathLike[str]"]


#: What ``clean_stale_temp_files`` found in one folder (the C++ record, read-only): removed,
#: in_use, too_recent, failed ((path, reason) pairs), removed_bytes.
StaleFiles = _core.StaleFiles


def clean_stale_temp_files(folder: PathLike, *, dry_run: Optional[bool] = None,
                           parallel_min_age: Optional[float] = None,
                           recursive: Optional[bool] = None) -> StaleFiles:
    """Removes the temporaries that dead ``FastFileWriter`` processes left in ``folder`` (and in
    every folder below it with ``recursive``: symlinks are not followed, other filesystems not
    entered, an unreadable folder is listed in ``failed``).

    Arguments left at None take the C++ defaults (``StaleFileOptions``): no dry run, one hour,
    not recursive.

    Raises ``FileNotFoundError`` (an ``OSError``) when ``folder`` cannot be read.
    """
    if parallel_min_age is not None and parallel_min_age < 0:
        raise ValueError(f"parallel_min_age must be >= 0 seconds, got {parallel_min_age}")
    return _core.remove_stale_temp_files(
        os.fspath(folder), dry_run=None if dry_run is None else bool(dry_run),
        parallel_set_min_age_seconds=None if parallel_min_age is None else float(parallel_min_age),
        recursive=None if recursive is None else bool(recursive))
