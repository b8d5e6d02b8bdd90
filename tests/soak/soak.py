# SPDX-License-Identifier: Apache-2.0
"""Soak test, run on demand: `make soak SOAK_MINUTES=60` (or `python tests/soak/soak.py`).

For the given time, a "training job" saves checkpoints in a loop into a root on a small
loop-mounted ext4 filesystem, and is disturbed the way real jobs are:

- it is killed with SIGKILL at random moments (mid-save, mid-retention, between saves);
- the filesystem is squeezed, now and then, to less free space than one checkpoint (ENOSPC);
- a fraction of its fsync/fdatasync calls fail with EIO (tests/soak/fp_faults.c, preloaded);
- meanwhile another process runs `fastpersist verify ROOT` over and over, and between jobs
  `fastpersist prune` runs on the root;
- half of the jobs (--tier-fraction) also drain every checkpoint into a tier (a second root on the same
  filesystem, so squeezes and fsync faults reach the drains too) and now and then wait for the
  drains (``drained TAG``); `fastpersist verify TIER` runs over and over as well, and between
  jobs `fastpersist drain ROOT TIER` runs now and then.

After every job ends (killed or failed), the root is checked as a restarted job sees it
(tests/python/test_checkpoint_crash.py, check_root_after_kill): the manager opens it, every listed
checkpoint verifies and loads bit-identical to what its step saved, `latest` follows the rules,
no reported commit is lost; keep_last holds (beyond what waits for a tier); after a job with
a tier, each checkpoint it reported is still local or in the tier (unless the tier's retention
would not keep it); the tier's checkpoints verify and load bit-identical, and no
acknowledged drain is lost (beyond the tier's own retention). Any violation, any DAMAGED from the
concurrent verifier, or a job that
fails for a reason that was not injected, stops the soak with status 1.

The totals (operations, faults injected, crashes survived, bytes verified) are printed as a
table and written as JSON (--report); docs/reliability.md records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

import _checkpoint_crash_child as child  # noqa: E402
import fastpersist  # noqa: E402
import test_checkpoint_crash as crash  # noqa: E402
from _checkpoint_models import assert_state_equal  # noqa: E402


def build_faults(out: Path) -> Path:
    lib = out / "fp_faults.so"
    cc = shutil.which(os.environ.get("CC", "cc")) or "gcc"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(HERE / "fp_faults.c"), "-ldl"],
                   check=True)
    return lib


class LoopFs:
    """A small ext4 image, loop-mounted (root only)."""

    def __init__(self, base: Path, size: str) -> None:
        self.img, self.mnt = base / "soak.img", base / "mnt"
        self.mnt.mkdir()
        subprocess.run(["truncate", "-s", size, str(self.img)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", str(self.img)], check=True)
        subprocess.run(["mount", "-o", "loop", str(self.img), str(self.mnt)], check=True)

    def close(self) -> None:
        if subprocess.run(["umount", str(self.mnt)]).returncode != 0:
            subprocess.run(["umount", "-l", str(self.mnt)])


class Squeezer:
    """Fills the filesystem with one file so that only `free` bytes stay available."""

    def __init__(self, mnt: Path) -> None:
        self.mnt = mnt
        self.filler = mnt / "filler"

    def set_free(self, free: Optional[int]) -> None:
        if self.filler.exists():
            self.filler.unlink()
        if free is None:
            return
        st = os.statvfs(self.mnt)
        avail = st.f_bfree * st.f_frsize  # root may use the reserved blocks too
        size = max(0, avail - free)
        fd = os.open(self.filler, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            if size:
                os.posix_fallocate(fd, 0, size)
        except OSError:
            pass  # the filesystem is as full as it gets
        finally:
            os.close(fd)


class Verifier(threading.Thread):
    """`fastpersist verify ROOT --json` in a loop while jobs run."""

    def __init__(self, cli: str, root: Path) -> None:
        super().__init__(daemon=True)
        self.cli, self.root = cli, root
        self.stop = threading.Event()
        self.runs = self.checked = self.bytes = self.gone = 0
        self.problems: List[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.root.exists():
                time.sleep(0.1)
                continue
            r = subprocess.run([self.cli, "verify", str(self.root), "--json"], capture_output=True,
                               text=True, timeout=300)
            self.runs += 1
            try:
                doc = json.loads(r.stdout)
            except json.JSONDecodeError:
                if "no checkpoints to verify" not in r.stdout + r.stderr:
                    self.problems.append(f"verify {self.root} printed no JSON (status {r.returncode}): "
                                         f"{r.stderr[-500:]}")
                continue
            for c in doc.get("checkpoints", []):
                if c["ok"]:
                    self.checked += 1
                    self.bytes += c.get("bytes_checked", 0)
                else:
                    self.problems.append(f"verify {self.root}: {c['tag']} DAMAGED: {c['problems']}")
            self.gone += len(doc.get("removed_while_checked", []))
            time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--image-size", default="192M")
    ap.add_argument("--fsync-fault-permille", type=int, default=3)
    ap.add_argument("--max-kill-delay", type=float, default=3.0)
    ap.add_argument("--tier-fraction", type=float, default=0.5,
                    help="the fraction of jobs that also drain into the tier (0: no tier)")
    ap.add_argument("--cli", default=os.environ.get("FASTPERSIST_CLI", "build/tools/fastpersist"))
    ap.add_argument("--report", type=Path, default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("soak: needs root (it loop-mounts an ext4 image for real ENOSPC)", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="fastpersist-soak-"))
    fs = LoopFs(base, args.image_size)
    root = fs.mnt / "run"
    squeezer = Squeezer(fs.mnt)
    os.environ.update(LD_PRELOAD=str(build_faults(base)), FP_FAULT_ROOT=str(fs.mnt),
                      FP_FAULT_FSYNC_PERMILLE=str(args.fsync_fault_permille))
    server = crash.ForkServer(base / "server.stderr")
    for name in ("LD_PRELOAD", "FP_FAULT_ROOT", "FP_FAULT_FSYNC_PERMILLE"):
        del os.environ[name]  # only the jobs (children of the fork server) get the faults
    tier = fs.mnt / "tier"
    verifier = Verifier(args.cli, root)
    verifier.start()
    tier_verifier = Verifier(args.cli, tier)
    tier_verifier.start()
    t: Dict[str, int] = {"jobs": 0, "killed": 0, "failed_enospc": 0, "failed_eio": 0,
                         "commits_reported": 0, "squeezed": 0, "prunes": 0, "checks": 0, "retention_failed": 0,
                         "checkpoints_loaded": 0, "bytes_loaded": 0, "tier_jobs": 0,
                         "drains_acknowledged": 0, "failed_drain_eio_enospc": 0, "cli_drains": 0,
                         "tier_checkpoints_loaded": 0}
    drained: List[str] = []  # every checkpoint the tier was said to hold (drained TAG, drain CLI)
    history = crash.History()
    end = time.monotonic() + args.minutes * 60
    started_at = time.monotonic()
    failure: Optional[str] = None
    try:
        while time.monotonic() < end and failure is None:
            squeeze = rng.random() < 0.25
            squeezer.set_free(rng.randrange(1 << 20, 4 << 20) if squeeze else None)
            t["squeezed"] += squeeze
            first_step = crash._next_first_step(history)
            with_tier = rng.random() < args.tier_fraction
            context = f"seed {args.seed}, job {t['jobs']}{' (with a tier)' if with_tier else ''}"
            pid = server.fork(root, rng.randrange(1 << 30), tier if with_tier else None)
            t["jobs"] += 1
            t["tier_jobs"] += with_tier
            lines: List[str] = []
            first = server.child_line(pid, time.monotonic() + 120)
            if first is not None and first != "started":
                lines.append(first)  # it failed at once (ENOSPC or EIO while opening)
            else:
                deadline = time.monotonic() + rng.uniform(0.0, args.max_kill_delay)
                while time.monotonic() < deadline:
                    line = server.child_line(pid, deadline)
                    if line is None:
                        break
                    lines.append(line)
                    if line.startswith("failed"):
                        break
            if not (lines and lines[-1].startswith("failed")):
                try:
                    os.kill(pid, signal.SIGKILL)
                    t["killed"] += 1
                except ProcessLookupError:
                    pass
            status, rest = server.reap(pid)
            lines += rest
            committed = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("committed ")]
            retention_failed = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("retention-failed ")]
            t["retention_failed"] += len(retention_failed)
            history.retention_failed.update(retention_failed)
            acknowledged = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("drained ")]
            t["drains_acknowledged"] += len(acknowledged)
            drained += acknowledged
            failed = [ln for ln in lines if ln.startswith("failed")]
            for ln in failed:
                if "drain" in ln and _injected(ln):
                    t["failed_drain_eio_enospc"] += 1
                elif "No space left" in ln or "ENOSPC" in ln or "Errno 28" in ln:
                    t["failed_enospc"] += 1
                elif "Input/output error" in ln or "EIO" in ln or "Errno 5" in ln:
                    t["failed_eio"] += 1
                else:
                    failure = f"{context}: the job failed for a reason that was not injected: {ln}"
            t["commits_reported"] += len(committed)
            history.reported += committed
            squeezer.set_free(None)  # the restarted job's checks run with room to spare
            if not root.exists():
                # The first job failed (squeezed) or was killed before it created the root:
                # nothing can have been committed, and there is nothing to check yet.
                if history.reported:
                    failure = f"{context}: the root is gone after commits were reported"
                    break
                continue
            try:
                crash.check_root_after_kill(root, history, first_step, context, with_tier)
                if with_tier:
                    check_pins(history.listed_steps, tier, committed, context)
            except AssertionError as exc:
                failure = f"{context}: {exc} (the job's last lines: {lines[-6:]})"
                break
            t["checks"] += 1
            t["checkpoints_loaded"] += len(history.listed_steps)
            t["bytes_loaded"] += len(history.listed_steps) * _state_bytes()
            if rng.random() < 0.2:
                r = subprocess.run([args.cli, "prune", str(root), "--keep-last", str(child.KEEP_LAST)],
                                   capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    failure = f"{context}: prune failed ({r.returncode}): {r.stderr}"
                t["prunes"] += 1
            if failure is None and args.tier_fraction > 0 and rng.random() < 0.1:
                r = subprocess.run([args.cli, "drain", str(root), str(tier), "--keep-last",
                                    str(child.TIER_KEEP_LAST)], capture_output=True, text=True, timeout=300)
                if r.returncode != 0:
                    failure = f"{context}: drain failed ({r.returncode}): {r.stderr}"
                with fastpersist.CheckpointManager(root) as mgr:
                    drained += mgr.list()  # every local checkpoint is in the tier now
                t["cli_drains"] += 1
            if failure is None:
                try:
                    t["tier_checkpoints_loaded"] += check_tier(tier, drained, context)
                except AssertionError as exc:
                    failure = f"{context}: tier: {exc}"
            for v in (verifier, tier_verifier):
                if v.problems and failure is None:
                    failure = f"{context}: {v.problems[0]}"
    finally:
        for v in (verifier, tier_verifier):
            v.stop.set()
        for v in (verifier, tier_verifier):
            v.join(timeout=600)
        server.close()
        squeezer.set_free(None)
        fs.close()
        shutil.rmtree(base, ignore_errors=True)
    minutes = (time.monotonic() - started_at) / 60
    report = {"seed": args.seed, "minutes": round(minutes, 1), **t,
              "verify_runs": verifier.runs, "verify_checkpoints_intact": verifier.checked,
              "verify_bytes": verifier.bytes, "verify_gone_while_checked": verifier.gone,
              "tier_verify_runs": tier_verifier.runs,
              "tier_verify_checkpoints_intact": tier_verifier.checked,
              "tier_verify_bytes": tier_verifier.bytes,
              "tier_verify_gone_while_checked": tier_verifier.gone,
              "debris_left_by_kills": history.debris_seen,
              "unreported_commits_found": history.unreported_commits,
              "lost": 0 if failure is None else None, "failure": failure}
    width = max(len(k) for k in report)
    print("soak results")
    for k, v in report.items():
        print(f"  {k:<{width}}  {v}")
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if failure is None else 1


def _injected(line: str) -> bool:
    """The failure is one the soak injects: ENOSPC or EIO."""
    return any(m in line for m in ("No space left", "ENOSPC", "Errno 28", "Input/output error", "EIO",
                                   "Errno 5"))


def check_pins(local_steps: List[int], tier: Path, committed: List[str], context: str) -> None:
    """Nothing a tier selects is lost to local retention (tiers.md): each checkpoint the killed
    job reported is still local, or in the tier, or the tier's retention would not keep it (it
    has TIER_KEEP_LAST newer ones, counting those still waiting locally)."""
    if not committed:
        return
    tier_steps: List[int] = []
    if tier.exists():
        with fastpersist.CheckpointManager(tier) as mgr:
            tier_steps = [c.step for c in mgr.checkpoints()]
    held = set(local_steps) | set(tier_steps)
    for tag in committed:
        step = crash._step_of(tag)
        newer = [s for s in held if s > step]
        assert step in held or len(newer) >= child.TIER_KEEP_LAST, (
            f"{context}: {tag} was committed for a tier and is neither local nor in the tier "
            f"(only {len(newer)} newer checkpoints are): local {sorted(local_steps)}, "
            f"tier {sorted(tier_steps)}")


def check_tier(tier: Path, drained: List[str], context: str) -> int:
    """The tier as a restarted job (or a reader of the tier) sees it: it opens; every checkpoint
    it lists verifies and loads bit-identical to what its step saved; every checkpoint said to be
    drained is there unless the tier's retention had TIER_KEEP_LAST newer ones. Returns how
    many checkpoints were loaded."""
    if not tier.exists():
        assert not drained, f"{context}: drains of {drained[-3:]} were acknowledged, the tier is gone"
        return 0
    with fastpersist.CheckpointManager(tier) as mgr:
        infos = mgr.checkpoints()
        tags = [c.tag for c in infos]
        for info in infos:
            problems = mgr.verify(info.tag)
            assert problems == [], f"{context}: {info.tag} does not verify in the tier: {problems}"
            assert_state_equal(mgr.load(info.tag), child.expected_state(info.step),
                               f"{context}: tier {info.tag}")
    steps = [c.step for c in infos]
    for tag in set(drained):
        step = crash._step_of(tag)
        newer = [s for s in steps if s > step]
        if len(newer) < child.TIER_KEEP_LAST:
            assert tag in tags, (f"{context}: {tag} was drained and only {len(newer)} newer "
                                 f"checkpoints are in the tier, but it is gone: {tags}")
    return len(infos)


_STATE_BYTES: Optional[int] = None


def _state_bytes() -> int:
    """Bytes of tensor data in one checkpoint of the job (each listed one is loaded and compared)."""
    global _STATE_BYTES
    if _STATE_BYTES is None:
        import torch

        def walk(x) -> int:
            if isinstance(x, torch.Tensor):
                return x.numel() * x.element_size()
            if isinstance(x, dict):
                return sum(walk(v) for v in x.values())
            if isinstance(x, (list, tuple)):
                return sum(walk(v) for v in x)
            return 0

        _STATE_BYTES = walk(child.make_state(1))
    return _STATE_BYTES


if __name__ == "__main__":
    sys.exit(main())
