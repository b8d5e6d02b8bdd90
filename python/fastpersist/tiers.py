# SPDX-License-Identifier: Apache-2.0
"""Tiers: more places each committed checkpoint lives (docs/tiers.md).

::

    mgr = fastpersist.CheckpointManager(
        "/mnt/nvme/run1", keep_last=2,
        tiers=[fastpersist.Tier("/mnt/hdd/run1", keep_last=20, keep_every=10_000)])

A save commits locally at full speed; a C++ thread then copies each committed checkpoint a tier
selects into that tier (direct reads, every checksum checked on the way, committed there with
the manifest last). These are the plain values the façade hands to C++: the drain, its policy,
its pins and its retries are all in C++ (src/checkpoint/tier_*.cc).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Union

from . import _core
from ._engine_options import check_uint
from ._system import parse_size
from .object_store import open_object_store

PathLike = Union[str, "os.PathLike[str]"]
Size = Union[int, str]
_INT64_MAX = (1 << 63) - 1


class TierWarning(UserWarning):
    """A drain into a tier failed. Local saves go on; the drain is retried."""


@dataclass(frozen=True)
class Tier:
    """Where committed checkpoints are copied after the local save.

    Args:
        path: a directory, usually on another filesystem (an HDD, NFS, a parallel
            filesystem); created if needed. It is a checkpoint root of its own: every
            fastpersist reader and command works on it.
        keep_last, keep_every: the tier's own retention (as CheckpointManager's).
        every: send only checkpoints whose step is a multiple of `every` (None: all).
        bandwidth: a cap on the drain, bytes per second or a size string ("200MiB").
        part_size: object stores: the size of each uploaded part and ranged read [32MiB].
        transfers: object stores: how many parts go up (or come down) at once [8].
        store: object stores: the client to use (e.g. ``fastpersist.S3Store(url,
            endpoint_url=...)``); None opens `path` with the default client (boto3, which
            reads credentials and ``AWS_ENDPOINT_URL`` from the environment).

    `path` may be an object store's URL, ``"s3://bucket/prefix"``: the checkpoints go there as
    objects, each committed by its manifest, uploaded last (docs/tiers.md).
    """

    path: PathLike
    keep_last: Optional[int] = None
    keep_every: Optional[int] = None
    every: Optional[int] = None
    bandwidth: Optional[Size] = None
    part_size: Optional[Size] = None
    transfers: Optional[int] = None
    store: Any = None

    def _options(self) -> Any:
        path = os.fspath(self.path)
        if not isinstance(path, str):
            raise TypeError(f"fastpersist: a tier path must be a str or os.PathLike, got {path!r}")
        o = _core.TierOptions()
        o.path = path
        if self.store is not None or _core.is_object_store_url(path):
            o.store = self.store if self.store is not None else open_object_store(path)
            url = o.store.url  # C++ checked that it is a store: a str url and every method
            if self.store is not None and _core.is_object_store_url(path) and path.rstrip("/") != url:
                raise ValueError(f"fastpersist: tier {path!r} names another place than its store "
                                 f"({url!r})")
            o.path = url
            if self.part_size is not None:
                o.part_bytes = parse_size(self.part_size)
            if self.transfers is not None:
                o.transfers = check_uint("transfers", self.transfers, (1 << 32) - 1)
        elif self.part_size is not None or self.transfers is not None:
            raise ValueError(f"fastpersist: tier {path!r}: part_size and transfers are for object "
                             "stores (s3:// URLs), not directories")
        if self.keep_last is not None:
            o.keep_last = check_uint("keep_last", self.keep_last, (1 << 32) - 1)
        for name in ("keep_every", "every"):
            value = getattr(self, name)
            if value is not None:
                setattr(o, name, check_uint(name, value, _INT64_MAX))
        if self.bandwidth is not None:
            o.bandwidth_bytes_per_second = parse_size(self.bandwidth)
        o.validate()  # C++ says what is wrong (keep_last 0, every 0, ...)
        return o


def tier_options(tiers: Optional[Sequence[Tier]]) -> List[Any]:
    """``_core.TierOptions`` for each of `tiers` (a list of Tier)."""
    if tiers is None:
        return []
    if isinstance(tiers, (Tier, str, os.PathLike)):
        raise TypeError("fastpersist: tiers= takes a list of fastpersist.Tier")
    out = []
    for t in tiers:
        if not isinstance(t, Tier):
            raise TypeError(f"fastpersist: tiers= takes fastpersist.Tier objects, got {type(t).__name__}")
        out.append(t._options())
    return out


#: Where one tier stands (:meth:`CheckpointManager.tier_status`; the C++ record, read-only):
#: path, draining (the tag being copied now, "" when idle), waiting (selected, not yet there,
#: oldest first), last_drained, checkpoints_drained, bytes_drained, seconds_draining,
#: last_error ("" when the latest attempt succeeded).
TierStatus = _core.TierStatus

#: A committed checkpoint and every root that holds it, the local root first
#: (:meth:`CheckpointManager.locations`; the C++ record, read-only): tag, step, created_unix,
#: roots, local, info.
CheckpointLocation = _core.CheckpointLocation
