# SPDX-License-Identifier: Apache-2.0
"""An S3-compatible bucket prefix as an object-store tier sees it (docs/tiers.md).

The C++ drain does the planning, checksum verification, part splitting, concurrency, commit
order (data objects first, ``manifest.json`` last as the commit marker), retention and pulls.
It calls an :class:`S3Store` for a few primitive operations, from several C++ threads at once:
boto3 clients are thread-safe and release the GIL during network I/O, so the calls overlap.

boto3 is an optional dependency (``pip install fastpersist[s3]``); it is imported when the
first store is made, so the rest of fastpersist works without it. Without an explicit client,
boto3 finds the credentials, the region and ``AWS_ENDPOINT_URL`` (an S3-compatible server:
MinIO, SeaweedFS, Ceph RGW) the way the AWS CLI does: environment variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
``AWS_PROFILE``), ``~/.aws/config`` and ``~/.aws/credentials``, instance roles. Pass
``client=`` for anything else (path-style addressing, timeouts, a proxy).

Errors are ``OSError`` subclasses naming the store URL and the key: a missing object or bucket
``FileNotFoundError``, refused credentials ``PermissionError``, an unreachable endpoint
``ConnectionError``, a range past the end of an object ``EOFError``; bad URLs and keys
``ValueError``.
"""

from __future__ import annotations

import contextlib
import errno
import re
from typing import Any, Iterator, List, Optional, Tuple, Union

from . import _core

from ._seekable import SeekableReader

# Bytes to send: anything with the buffer protocol of one dimension, usually a memoryview over
# a pinned buffer that C++ owns.
BytesLike = Union[bytes, bytearray, memoryview]
# Where a read lands: writable.
WritableBytes = Union[bytearray, memoryview]

SCHEME = "s3://"
# S3's DeleteObjects takes at most this many keys per request.
DELETE_BATCH = 1000
# The characters botocore itself accepts in a bucket name; S3-compatible servers differ in
# what else they require (AWS: 3-63 lowercase DNS characters), so the server has the last say.
_BUCKET_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
# A ranged read is copied into its buffer this many bytes at a time.
_READ_PIECE = 4 << 20
# "bytes START-END/TOTAL" of a 206 answer.
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")

_MISSING_BOTO3 = ("fastpersist: S3 tiers need boto3, which is not installed: "
                  "pip install boto3 (or pip install fastpersist[s3])")


def _check_segments(what: str, value: str, path: str) -> None:
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"fastpersist: {what} {value!r}: empty, '.' and '..' path segments "
                             "are not allowed")


def parse_url(url: str) -> Tuple[str, str]:
    """``s3://bucket[/prefix]`` -> ``(bucket, prefix)``, the prefix without a trailing '/'.

    Raises ValueError for another scheme, an empty bucket, or empty, '.' or '..' segments.
    """
    if not isinstance(url, str):
        raise TypeError(f"fastpersist: an S3 URL must be a str, got {type(url).__name__}")
    if not url.startswith(SCHEME):
        raise ValueError(f"fastpersist: {url!r} is not an S3 URL: expected s3://bucket/prefix")
    rest = url[len(SCHEME):]
    if rest.endswith("/"):
        rest = rest[:-1]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"fastpersist: S3 URL {url!r} names no bucket: "
                         "expected s3://bucket/prefix")
    if not _BUCKET_NAME.match(bucket):
        raise ValueError(f"fastpersist: S3 URL {url!r}: bucket {bucket!r} may hold only letters, "
                         "digits, '.', '-' and '_'")
    if prefix:
        _check_segments("S3 URL", url, prefix)
    elif "/" in rest:  # "s3://bucket//"
        raise ValueError(f"fastpersist: S3 URL {url!r}: empty path segments are not allowed")
    return bucket, prefix


def _check_key(key: str) -> None:
    """The one rule for object keys, C++'s (``ObjectStore::check_key``): the store's listing is
    untrusted input, and the core checks every key it is handed by the same function."""
    if not isinstance(key, str):
        raise TypeError(f"fastpersist: an object key must be a str, got {type(key).__name__}")
    _core.check_object_key(key)


def _check_prefix(prefix: str) -> None:
    """A listing prefix: empty (everything) or a key, optionally ending with '/'."""
    if not isinstance(prefix, str):
        raise TypeError(f"fastpersist: a key prefix must be a str, got {type(prefix).__name__}")
    if prefix:
        try:
            _core.check_object_key(prefix[:-1] if prefix.endswith("/") else prefix)
        except ValueError as e:
            raise ValueError(f"fastpersist: key prefix {prefix!r}: {e}") from None


def _bytes_view(data: BytesLike, *, writable: bool) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")  # raises TypeError when not C-contiguous
    if writable and view.readonly:
        raise TypeError("fastpersist: get_into needs a writable buffer, got a read-only one")
    return view


class _MemoryViewReader(SeekableReader):
    """A read-only, seekable file over a memoryview: what boto3 accepts as a ``Body``.

    botocore sizes the request from seek/tell (Content-Length), reads it in small pieces while
    sending (and, over plain http, once more to sign it) and seeks back before a retry, so no
    copy of the whole part is ever made. bytes or BytesIO would copy it up front.
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view

    def _size(self) -> int:
        return len(self._view)

    def read(self, size: Optional[int] = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view),
                                                                     self._pos + size)
        start = min(self._pos, end)
        self._pos = max(self._pos, end)
        return bytes(self._view[start:end])

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n


class S3Store:
    """An S3-compatible bucket prefix, as a fastpersist tier sees it.

    Args:
        url: ``s3://bucket`` or ``s3://bucket/some/prefix``. Keys are relative to the prefix
            ('/'-separated, never starting with '/').
        client: a boto3 S3 client to use as it is (its endpoint, credentials, retries).
        endpoint_url, region: for the client made when none is given; None leaves them to
            boto3 (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``~/.aws/config``).

    Thread-safety: every method may be called from several threads at once (boto3 clients are
    thread-safe; the store holds no other mutable state).

    Raises:
        ValueError: a malformed URL.
        ImportError: boto3 is not installed (the message says ``pip install boto3``).
    """

    url: str
    bucket: str
    prefix: str

    def __init__(self, url: str, *, client: Any = None, endpoint_url: Optional[str] = None,
                 region: Optional[str] = None) -> None:
        self.bucket, self.prefix = parse_url(url)
        self.url = SCHEME + (f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket)
        try:
            import botocore.exceptions  # type: ignore[import-not-found, import-untyped, unused-ignore]
            import urllib3.exceptions
        except ImportError as e:
            raise ImportError(_MISSING_BOTO3, name="boto3") from e
        self._botocore_errors = botocore.exceptions
        self._urllib3_errors = urllib3.exceptions
        if client is None:
            client = _make_client(endpoint_url, region)
        self._client = client

    @property
    def client(self) -> Any:
        """The boto3 S3 client this store uses."""
        return self._client

    @property
    def endpoint(self) -> str:
        """The endpoint URL the client talks to."""
        return str(self._client.meta.endpoint_url)

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    # ------------------------------------------------------------------ reading

    def list(self, prefix: str = "", *, page_size: int = 1000) -> List[Tuple[str, int]]:
        """Every object whose key starts with ``prefix`` (a string prefix, as S3's: pass
        ``"dir/"`` for one folder), recursively, as ``(key relative to the store, size)``.

        Pages through the whole listing, ``page_size`` keys a request (S3's maximum is 1000).
        Folder markers (keys ending with '/', made by some consoles) are left out.
        """
        _check_prefix(prefix)
        if page_size < 1:
            raise ValueError(f"fastpersist: page_size must be positive, got {page_size}")
        full = self._full(prefix)
        found: List[Tuple[str, int]] = []
        with self._errors("list", prefix):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full, PaginationConfig={"PageSize": page_size})
            for page in pages:
                for obj in page.get("Contents", ()):
                    key = obj["Key"]
                    if key.startswith(full) and not key.endswith("/"):
                        found.append((self._relative(key), int(obj["Size"])))
        return found

    def get_into(self, key: str, offset: int, out: WritableBytes) -> None:
        """Fills all of ``out`` with the object's bytes from ``offset`` (one ranged GET).

        A zero-length ``out`` sends no request.

        Raises:
            FileNotFoundError: no such object (or bucket).
            EOFError: the object ends before ``offset + len(out)``.
        """
        _check_key(key)
        view = _bytes_view(out, writable=True)
        if offset < 0:
            raise ValueError(f"fastpersist: {self._where(key)}: negative offset {offset}")
        length = len(view)
        if length == 0:
            return
        with self._errors("get", key, offset=offset, length=length):
            try:
                response = self._client.get_object(
                    Bucket=self.bucket, Key=self._full(key),
                    Range=f"bytes={offset}-{offset + length - 1}")
            except self._botocore_errors.ClientError as e:
                if _error_code(e) in ("InvalidRange", "416"):
                    raise self._short_read(key, offset, length, 0, None) from e
                raise
            body = response["Body"]
            try:
                status = response["ResponseMetadata"]["HTTPStatusCode"]
                size: Optional[int] = None
                if status == 206:
                    start, size = _parse_content_range(response.get("ContentRange", ""))
                    if start != offset:
                        raise OSError(errno.EIO, f"fastpersist: {self._where(key)}: asked for "
                                      f"bytes from {offset}, the server answered from {start}")
                elif offset != 0:
                    raise OSError(errno.EIO, f"fastpersist: {self._where(key)}: the server "
                                  f"ignored the range of a read at offset {offset}")
                got = 0
                while got < length:
                    # urllib3 reads each piece into bytes, then copies it into `out`: pieces
                    # bound that temporary, whatever the length of the read.
                    n = body.readinto(view[got:got + _READ_PIECE])
                    if not n:
                        break
                    got += n
                if got < length:
                    raise self._short_read(key, offset, length, got, size)
            finally:
                body.close()

    # ------------------------------------------------------------------ writing

    def put(self, key: str, data: BytesLike) -> None:
        """Writes one object (a single PUT; S3 takes up to 5 GiB this way)."""
        _check_key(key)
        body = _MemoryViewReader(_bytes_view(data, writable=False))
        with self._errors("put", key):
            self._client.put_object(Bucket=self.bucket, Key=self._full(key), Body=body)

    def begin_upload(self, key: str) -> str:
        """Starts a multipart upload of ``key``; returns its upload id."""
        _check_key(key)
        with self._errors("begin upload of", key):
            response = self._client.create_multipart_upload(Bucket=self.bucket,
                                                             Key=self._full(key))
        return str(response["UploadId"])

    def upload_part(self, key: str, upload_id: str, part_number: int, data: BytesLike) -> str:
        """Uploads part ``part_number`` (1..10000) of an upload; returns its ETag.

        Every part but the last must be at least 5 MiB (S3 checks when the upload completes).
        """
        _check_key(key)
        if not 1 <= part_number <= 10000:
            raise ValueError(f"fastpersist: {self._where(key)}: part number {part_number} "
                             "is outside 1..10000")
        body = _MemoryViewReader(_bytes_view(data, writable=False))
        with self._errors(f"upload part {part_number} of", key, upload_id=upload_id):
            response = self._client.upload_part(Bucket=self.bucket, Key=self._full(key),
                                                UploadId=upload_id, PartNumber=part_number,
                                                Body=body)
        return str(response["ETag"])

    def complete_upload(self, key: str, upload_id: str, etags: List[str]) -> None:
        """Completes an upload from parts 1..len(etags), in that order; the object appears."""
        _check_key(key)
        if not etags:
            raise ValueError(f"fastpersist: {self._where(key)}: an upload needs at least one part")
        parts = [{"ETag": etag, "PartNumber": i} for i, etag in enumerate(etags, start=1)]
        with self._errors("complete upload of", key, upload_id=upload_id):
            self._client.complete_multipart_upload(Bucket=self.bucket, Key=self._full(key),
                                                   UploadId=upload_id,
                                                   MultipartUpload={"Parts": parts})

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Abandons an upload and frees its parts. One already gone (aborted, completed,
        expired) is fine: an abort only ever cleans up."""
        _check_key(key)
        with self._errors("abort upload of", key, upload_id=upload_id):
            self._abort(self._full(key), upload_id)

    def abort_uploads(self, prefix: str = "") -> int:
        """Aborts every incomplete multipart upload of a key starting with ``prefix``, such as
        those a drain that died left behind; returns how many."""
        _check_prefix(prefix)
        aborted = 0
        with self._errors("abort uploads under", prefix):
            pages = self._client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self._full(prefix))
            uploads = [(u["Key"], u["UploadId"]) for page in pages
                       for u in page.get("Uploads", ())]
            for full_key, upload_id in uploads:
                if self._abort(full_key, upload_id):
                    aborted += 1
        return aborted

    def remove(self, keys: List[str]) -> None:
        """Deletes objects, up to 1000 a request. Keys already missing are fine.

        Raises:
            OSError: the server refused some keys (the message names them and why);
                PermissionError when every refusal was AccessDenied.
        """
        for key in keys:
            _check_key(key)
        for first in range(0, len(keys), DELETE_BATCH):
            batch = keys[first:first + DELETE_BATCH]
            with self._errors("remove", batch[0] if len(batch) == 1 else
                              f"{batch[0]} (and {len(batch) - 1} more)"):
                response = self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self._full(k)} for k in batch], "Quiet": True})
            failed = response.get("Errors", [])
            if failed:
                reasons = "; ".join(
                    f"{self._relative(e.get('Key', '?'))}: {e.get('Code', '?')} "
                    f"{e.get('Message', '')}".rstrip() for e in failed[:10])
                more = f" (and {len(failed) - 10} more)" if len(failed) > 10 else ""
                message = (f"fastpersist: {self.url}: could not remove {len(failed)} of "
                           f"{len(batch)} objects: {reasons}{more}")
                if all(e.get("Code") == "AccessDenied" for e in failed):
                    raise PermissionError(errno.EACCES, message)
                raise OSError(errno.EIO, message)

    # ------------------------------------------------------------------ helpers

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative(self, full_key: str) -> str:
        root = self._full("")
        return full_key[len(root):] if full_key.startswith(root) else full_key

    def _where(self, key: str) -> str:
        return f"{self.url}, key {key!r}"

    def _abort(self, full_key: str, upload_id: str) -> bool:
        """True when this call aborted the upload, False when it was already gone."""
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=full_key,
                                                UploadId=upload_id)
        except self._botocore_errors.ClientError as e:
            if _error_code(e) in ("NoSuchUpload", "404"):
                return False
            raise
        return True

    def _short_read(self, key: str, offset: int, length: int, got: int,
                    size: Optional[int]) -> EOFError:
        of = f" of {size}" if size is not None else ""
        return EOFError(f"fastpersist: {self._where(key)}: short read: asked for {length} bytes "
                        f"at offset {offset}, got {got} (the object{of} ends first)")

    @contextlib.contextmanager
    def _errors(self, op: str, key: str, *, offset: Optional[int] = None,
                length: Optional[int] = None, upload_id: Optional[str] = None) -> Iterator[None]:
        """Turns boto3's exceptions into OSError subclasses naming the store and the key."""
        where = f"{op} {self._where(key)}"
        if offset is not None:
            where += f" ({length} bytes at offset {offset})"
        if upload_id is not None:
            where += f" (upload {upload_id})"
        b = self._botocore_errors
        try:
            yield
        except b.ClientError as e:
            raise self._client_error(e, where) from e
        except (b.ConnectionError, b.HTTPClientError, b.ResponseStreamingError,
                b.IncompleteReadError, self._urllib3_errors.HTTPError, ConnectionError) as e:
            message = f"fastpersist: {where}: cannot reach {self.endpoint}: {e}"
            if isinstance(e, ConnectionError) and e.errno:
                raise ConnectionError(e.errno, message) from e
            raise ConnectionError(message) from e
        except (b.NoCredentialsError, b.PartialCredentialsError) as e:
            raise PermissionError(errno.EACCES, f"fastpersist: {where}: {e} (set "
                                  "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
                                  ) from e
        except b.ParamValidationError as e:
            raise ValueError(f"fastpersist: {where}: {e}") from e
        except b.BotoCoreError as e:
            raise OSError(errno.EIO, f"fastpersist: {where}: {e}") from e

    def _client_error(self, e: Any, where: str) -> OSError:
        code = _error_code(e)
        message = e.response.get("Error", {}).get("Message") or ""
        detail = f"{code}: {message}" if message else code
        if code == "NoSuchBucket":
            return FileNotFoundError(errno.ENOENT, f"fastpersist: {where}: bucket "
                                     f"{self.bucket!r} does not exist at {self.endpoint}")
        if code in ("NoSuchKey", "404", "NotFound"):
            return FileNotFoundError(errno.ENOENT, f"fastpersist: {where}: no such object")
        if code == "NoSuchUpload":
            return FileNotFoundError(errno.ENOENT, f"fastpersist: {where}: no such upload "
                                     "(aborted, completed or expired)")
        if code in ("AccessDenied", "403", "Forbidden", "InvalidAccessKeyId",
                    "SignatureDoesNotMatch", "AllAccessDisabled"):
            return PermissionError(errno.EACCES, f"fastpersist: {where}: {detail}")
        return OSError(errno.EIO, f"fastpersist: {where}: {detail}")


def open_object_store(url: str) -> S3Store:
    """The store for an object-store URL (``s3://bucket/prefix``), with the default client:
    boto3 reads the credentials, the region and ``AWS_ENDPOINT_URL`` from the environment.

    Raises:
        ValueError: not a URL of a kind of store fastpersist knows (only s3:// so far).
    """
    if isinstance(url, str) and url.startswith(SCHEME):
        return S3Store(url)
    raise ValueError(f"fastpersist: {url!r}: unsupported object store; fastpersist opens "
                     "s3://bucket/prefix (S3 and S3-compatible servers)")


def _error_code(e: Any) -> str:
    code = e.response.get("Error", {}).get("Code")
    if code:
        return str(code)
    return str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?"))


def _parse_content_range(value: str) -> Tuple[int, Optional[int]]:
    """``bytes 0-9/10`` -> (0, 10); the total is None when the server says '*'."""
    match = _CONTENT_RANGE.match(value or "")
    if not match:
        raise OSError(errno.EIO, f"fastpersist: unexpected Content-Range {value!r} "
                      "in a ranged read")
    total = match.group(3)
    return int(match.group(1)), None if total == "*" else int(total)


def _make_client(endpoint_url: Optional[str], region: Optional[str]) -> Any:
    try:
        import boto3.session  # type: ignore[import-not-found, import-untyped, unused-ignore]
        import botocore.config  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError as e:
        raise ImportError(_MISSING_BOTO3, name="boto3") from e
    config = botocore.config.Config(
        max_pool_connections=64,  # several C++ threads, each with requests in flight
        retries={"max_attempts": 3, "mode": "standard"},
        # No CRC32/MD5 of its own: fastpersist checks every byte against its xxHash3 checksums
        # (on the way up and again on every pull), so a second checksum would only cost CPU.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required")
    # A session of its own: boto3's default session is not safe to share between threads.
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region,
                                          config=config)


__all__ = ["S3Store", "open_object_store", "parse_url"]
