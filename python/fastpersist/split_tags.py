# SPDX-License-Identifier: Apache-2.0
"""DeepSpeed tags stored split (include/fastpersist/split_file.h): what marks one, and its
conversion back into a plain tag whose files ``torch.load``, DeepSpeed's own engine,
``zero_to_fp32`` and ``ds_to_universal`` read.

The DeepSpeed checkpoint engine (:mod:`fastpersist.deepspeed`) stores a tag split when it saves
with ``compression`` or ``incremental``: each file's tensor storages become checkpoint tensors
``<file>#<k>`` (compressed, or references to an earlier tag), the rest a skeleton under the
file's own name. Its manifest's metadata says ``{"deepspeed": {"split_files": true}}``. Nothing
here imports DeepSpeed."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Optional

from . import _core

SPLIT_KEY = "split_files"


def deepspeed_metadata(manifest: Any) -> Optional[Dict[str, Any]]:
    """The manifest metadata's ``"deepspeed"`` section (what the engine records), or None."""
    try:
        metadata = json.loads(manifest.metadata_json)
    except ValueError:
        return None
    section = metadata.get("deepspeed") if isinstance(metadata, dict) else None
    return section if isinstance(section, dict) else None


def is_split_tag(manifest: Any) -> bool:
    section = deepspeed_metadata(manifest)
    return section is not None and section.get(SPLIT_KEY) is True


def convert_split_tag(src: str, root: str, tag: str,
                      report: Optional[Callable[[int, int], None]] = None) -> Dict[str, int]:
    """Writes the split tag `src` as the plain tag ``root/tag``: each file streamed back
    together (every piece checksum-checked) and written durably, one at a time, then committed like the
    engine's own plain tags (a manifest with every file's checksum; ``root/latest`` names it).
    Returns {"files": n, "bytes": total}."""
    engine = _core.EngineOptions()
    reader = _core.CheckpointReader(src, engine)
    manifest = reader.manifest
    if not is_split_tag(manifest):
        raise ValueError(f"{src} is not a DeepSpeed tag stored split")
    files = [f for f in manifest.files if f.role == "objects" and "/" not in f.name]
    total = sum(int(f.size) for f in files)  # skeletons: the files are larger; updated below
    manager = _core.CheckpointManager(root, _core.CheckpointOptions())
    try:
        commit = manager.begin_commit(tag)
        try:
            records = []
            done = 0
            for f in files:  # each streamed by C++: a few MiB of memory, whatever its size
                record = reader.write_plain_split_file(f.name, commit.directory, True, True, f.rank)
                records.append(record)
                done += int(record.size)
                if report is not None:
                    report(done, max(done, total))
            section = dict(deepspeed_metadata(manifest) or {})
            section.pop(SPLIT_KEY, None)
            section["converted_from"] = os.path.abspath(src)
            commit.commit(_core.CommitContent(
                files=records, step=manifest.step, metadata_json=json.dumps({"deepspeed": section}),
                versions=dict(manifest.versions), world_size=manifest.world_size))
        except BaseException:
            commit.abort()
            raise
    finally:
        manager.close()
    return {"files": len(records), "bytes": done}
