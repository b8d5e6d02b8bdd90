# SPDX-License-Identifier: Apache-2.0
"""Import a checkpoint directory written by torch.distributed.checkpoint's ``FileSystemWriter``.

Such a directory (``dcp.save(state, checkpoint_id=DIR)``, by any number of ranks) holds
``DIR/.metadata``, the pickled ``Metadata`` the coordinator writes last, and the ranks' data
files (``__<rank>_<i>.distcp``; one file per item with ``single_file_per_rank=False``). The
metadata maps every stored item to ``(file, offset, length)``: a tensor chunk is a ``torch.save``
archive there, a non-tensor value (a ``BYTE_IO`` item: a step counter, ``param_groups``) the
``torch.save`` of that value.

:func:`load_dcp_dir` reassembles the full, unsharded state in this process, with DCP's own
reader and planner and no process group, as ``torch.distributed.checkpoint.format_utils.
dcp_to_torch_save`` does: every sharded tensor (DTensor, ShardedTensor, FSDP) becomes one tensor
of its global shape, and the nesting is restored from ``metadata.planner_data``.

Trust. A checkpoint directory is untrusted input. torch's ``FileSystemReader`` (2.13) unpickles
``.metadata`` with plain ``pickle.load``, and ``DefaultLoadPlanner.load_bytes`` loads ``BYTE_IO``
values with ``torch.load(weights_only=False)``: a hostile checkpoint runs code through either.
Here, unless ``weights_only=False``, ``.metadata`` is read and checked by
:mod:`fastpersist.import_dcp_metadata` (a restricted unpickler, then every file, range and chunk
against the directory) and ``BYTE_IO`` values are loaded with ``torch.load(weights_only=True)``
(tensor items already are, by ``FileSystemReader``). A refused global raises
:class:`~fastpersist.import_errors.UnsafeForeignObjectError` naming it.
"""

from __future__ import annotations

import io
import pickle
import warnings
from typing import Any, Callable, Dict, Optional

import torch

from .import_dcp_metadata import (METADATA_FILE, is_dcp_dir, rank_local_metadata,
                                  read_metadata)
from .import_errors import ForeignCheckpointError, weights_only_refusal
from .pickle_bounds import PickleRefusedError, check_torch_file

__all__ = ["is_dcp_dir", "load_dcp_dir", "rank_local_metadata"]

# report(done, total) in bytes of the items read
_Report = Optional[Callable[[int, int], None]]


# ----------------------------------------------------------------------------- loading
def _load_value(data: io.BytesIO, fqn: str, weights_only: bool) -> Any:
    try:
        if weights_only:
            check_torch_file(data.getvalue(), f"the value {fqn}")
        return torch.load(data, map_location="cpu", weights_only=weights_only)
    except PickleRefusedError as e:
        raise ForeignCheckpointError(str(e)) from None
    except pickle.UnpicklingError as e:
        if weights_only:
            raise weights_only_refusal(e, f"the value {fqn}") from None
        raise ForeignCheckpointError(f"the value {fqn} is not loadable: {e}") from None
    except Exception as e:  # noqa: BLE001 - torch.load fails on garbage in many ways
        raise ForeignCheckpointError(f"the value {fqn} is not a loadable torch archive "
                                     f"({type(e).__name__}: {e})") from None


def _planner(weights_only: bool, metadata: Any, report: _Report) -> Any:
    """DCP's planner that rebuilds the state from the metadata, with BYTE_IO values loaded
    with ``weights_only`` and the bytes of each item reported when it has been read."""
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    total = sum(info.length for info in metadata.storage_data.values())
    done = [0]

    def item_read(read_item: Any) -> None:
        if report is not None:
            done[0] += metadata.storage_data[read_item.storage_index].length
            report(done[0], total)

    class Planner(_EmptyStateDictLoadPlanner):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.loaded: Dict[str, Any] = {}

        def set_up_planner(self, state_dict: Dict[str, Any], metadata: Any = None,
                           is_coordinator: bool = False) -> None:
            # dcp.load hands the planner a dict of its own, which this fills: keep it.
            super().set_up_planner(state_dict, metadata, is_coordinator)
            self.loaded = state_dict

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            obj = _load_value(value, fqn, weights_only)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj
            item_read(read_item)

        def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
            item_read(read_item)

    if report is not None:
        report(0, total)
    return Planner()


def _reader(path: str, metadata: Any) -> Any:
    """DCP's FileSystemReader, handed the metadata read (and checked) here."""
    from torch.distributed.checkpoint import FileSystemReader

    class Reader(FileSystemReader):  # type: ignore[misc]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return metadata

    return Reader(path)


def load_dcp_dir(path: str, *, weights_only: bool = True, report: _Report = None) -> Any:
    """The full state saved in the DCP checkpoint directory ``path``, on the CPU.

    Args:
        path: a directory written by ``FileSystemWriter`` (``dcp.save(state, checkpoint_id=path)``).
        weights_only: see the module's docstring; ``False`` only for checkpoints you trust.
        report: called with (bytes read, total) as each stored item is read.

    Returns:
        The state as it was saved (nested dicts and lists), every tensor whole.

    Raises:
        UnsafeForeignObjectError: ``weights_only`` and a pickle needs a refused global.
        ForeignCheckpointError: a damaged or incomplete checkpoint.
    """
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.api import CheckpointException

    if not is_dcp_dir(path):
        local = rank_local_metadata(path)
        if local:
            raise ForeignCheckpointError(
                f"{path} was saved with use_collectives=False: it has only per-rank metadata "
                f"({', '.join(local[:4])}{', ...' if len(local) > 4 else ''}) and no global "
                f"{METADATA_FILE}, so its ranks' shards cannot be reassembled")
        raise ForeignCheckpointError(f"{path} has no {METADATA_FILE}: not a DCP checkpoint")
    metadata = read_metadata(path, weights_only=weights_only)
    planner = _planner(weights_only, metadata, report)
    try:
        with warnings.catch_warnings():
            # "torch.distributed is disabled ...: assuming the intent is to load in a single
            # process": that is the intent.
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp_load({}, storage_reader=_reader(path, metadata), planner=planner, no_dist=True)
    except CheckpointException as e:
        failures = list(e.failures.values())
        cause = failures[0][0] if failures else e
        if isinstance(cause, ForeignCheckpointError):
            raise cause from None
        raise ForeignCheckpointError(
            f"DCP could not read {path}: {type(cause).__name__}: {cause}") from None
    return planner.loaded
