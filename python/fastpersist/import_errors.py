# SPDX-License-Identifier: Apache-2.0
"""Errors of the importers of foreign checkpoints (:mod:`fastpersist.import_dcp`,
:mod:`fastpersist.import_deepspeed`), which ``fastpersist convert`` turns into its messages."""

from __future__ import annotations

import pickle
import re

__all__ = ["ForeignCheckpointError", "UnsafeForeignObjectError", "refuse_link",
           "weights_only_refusal"]


class ForeignCheckpointError(ValueError):
    """A foreign checkpoint that cannot be imported: damaged, incomplete, or of a kind the
    importer does not handle. The message names the file and says why."""


class UnsafeForeignObjectError(ForeignCheckpointError, pickle.UnpicklingError):
    """A pickle in the checkpoint needs a global (class or function) that the restricted loader
    refuses; the message names it. Only ``weights_only=False`` (``--unsafe-pickle``) loads it,
    which runs whatever the pickle says: for checkpoints you trust only."""


def weights_only_refusal(error: BaseException, what: str) -> UnsafeForeignObjectError:
    """The error for ``torch.load(weights_only=True)`` refusing ``what``, naming the refused
    global when torch's message does ("Unsupported global: GLOBAL argparse.Namespace ...")."""
    text = str(error)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return UnsafeForeignObjectError(
            f"{what} needs {found.group(1)}, which torch.load(weights_only=True) refuses")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    detail = next((line.split(":", 1)[1].strip() for line in lines
                   if line.startswith("WeightsUnpickler error:")),
                  lines[0] if lines else type(error).__name__)
    return UnsafeForeignObjectError(f"torch.load(weights_only=True) refused {what}: {detail}")


def refuse_link(path: str) -> str:
    """`path`, unless it is a symbolic link: an import reads a checkpoint's own files only, never
    through a link, which could lead outside the folder it was given (fastpersist's own readers
    refuse links the same way)."""
    import os

    if os.path.islink(path):
        raise ForeignCheckpointError(f"{path} is a symbolic link, which a checkpoint never holds: "
                                     "an import does not follow it (it could lead anywhere); copy "
                                     "the file or folder in its place")
    return path
