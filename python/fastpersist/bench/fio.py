# SPDX-License-Identifier: Apache-2.0
"""The hardware limit the peer benchmark reports against: fio's O_DIRECT write and read.

One setting is not the limit (fastpersist's writer already beats fio's 8 MiB, queue-depth-32
single job on this VM), so :func:`best` tries several, the configuration ``fastpersist tune``
wrote among them when one is active, and keeps the fastest for each direction. With ``numjobs``
above one the file is split into that many ranges, one per job, so every setting moves the
same bytes.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

_MiB = 1 << 20


@dataclass(frozen=True)
class FioSettings:
    ioengine: str = "io_uring"
    block_size: int = 8 * _MiB
    iodepth: int = 32
    numjobs: int = 1

    def label(self) -> str:
        bs = f"{self.block_size // _MiB}M" if self.block_size % _MiB == 0 else f"{self.block_size // 1024}K"
        return f"{self.ioengine} bs {bs} qd {self.iodepth} x{self.numjobs}"


@dataclass
class FioRun:
    nbytes: int
    seconds: float
    cpu_seconds: float


def find() -> Optional[str]:
    return shutil.which("fio")


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(fio: str, rw: str, path: str, size: int, s: FioSettings) -> FioRun:
    """One fio job group moving `size` bytes (rounded down to whole blocks per job) to or from
    `path`; a write ends with an fsync per job. CPU time is fio's own (user + system)."""
    if rw not in ("write", "read"):
        raise ValueError(f"rw must be write or read, not {rw!r}")
    per_job = size // s.numjobs // s.block_size * s.block_size
    if per_job == 0:
        raise ValueError(f"{size} bytes are fewer than {s.numjobs} blocks of {s.block_size}")
    cmd = [fio, "--name=limit", f"--filename={path}", f"--rw={rw}", "--direct=1",
           f"--ioengine={s.ioengine}", f"--bs={s.block_size}", f"--iodepth={s.iodepth}",
           f"--numjobs={s.numjobs}", f"--size={per_job}", f"--offset_increment={per_job}",
           "--group_reporting", "--output-format=json"]
    if rw == "write":
        cmd.append("--end_fsync=1")
    cpu0 = _child_cpu()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cpu = _child_cpu() - cpu0
    if done.returncode != 0:
        raise RuntimeError(f"fio failed ({done.returncode}): {shlex.join(cmd)}\n{done.stderr.strip()}")
    out = done.stdout
    job: Dict[str, Any] = json.loads(out[out.find("{"):])["jobs"][0]
    part = job[rw]
    want = per_job * s.numjobs
    if job.get("error") or part["io_bytes"] != want:
        raise RuntimeError(f"fio {rw} moved {part['io_bytes']} of {want} bytes: {shlex.join(cmd)}")
    # The group's runtime (ms) is its slowest job's, the end fsync included.
    return FioRun(part["io_bytes"], max(part["runtime"], 1) / 1000.0, cpu)


def candidates(configured: Optional[FioSettings] = None) -> List[FioSettings]:
    """The settings :func:`best` tries: fio's usual single job, deeper queues and more jobs,
    and `configured` (tune's best) when given."""
    out = [FioSettings(), FioSettings(iodepth=64, numjobs=2), FioSettings(numjobs=4),
           FioSettings(block_size=1 * _MiB, iodepth=64, numjobs=4)]
    if configured is not None and configured not in out:
        out.insert(0, configured)
    return out


def from_engine(engine: Dict[str, Any]) -> FioSettings:
    """fio settings matching a fastpersist engine configuration (fastpersist.active_config())."""
    backend = str(engine.get("backend", "")).lower()
    return FioSettings(ioengine="libaio" if "aio" in backend and "uring" not in backend else "io_uring",
                       block_size=int(engine.get("block_size") or 8 * _MiB),
                       iodepth=int(engine.get("queue_depth") or 32),
                       numjobs=max(1, int(engine.get("intra_op_parallelism") or 1)))


def best(fio: str, path: str, size: int, settings: List[FioSettings],
         log: Any = None) -> Tuple[FioSettings, FioSettings]:
    """(fastest write setting, fastest read setting), each tried once on `size` bytes at `path`
    (the file is left behind, written by the last write)."""
    writes: List[Tuple[float, FioSettings]] = []
    reads: List[Tuple[float, FioSettings]] = []
    for s in settings:
        w = run(fio, "write", path, size, s)
        r = run(fio, "read", path, size, s)
        writes.append((w.nbytes / w.seconds, s))
        reads.append((r.nbytes / r.seconds, s))
        if log is not None:
            log(f"fio {s.label()}: write {w.nbytes / w.seconds / 1e9:.2f} GB/s, "
                f"read {r.nbytes / r.seconds / 1e9:.2f} GB/s")
    if os.path.exists(path):
        os.sync()
    return max(writes, key=lambda x: x[0])[1], max(reads, key=lambda x: x[0])[1]
