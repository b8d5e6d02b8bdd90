# SPDX-License-Identifier: Apache-2.0
"""The baseline an S3 tier is measured against: an ``aws s3 cp``-style copy, one stream, on
the same boto3 client the tier uses (so the endpoint, credentials and connection settings are
the same and only the transfer differs).

boto3's own managed transfer, with one thread and so one request at a time: large files still
go as multipart uploads / ranged reads (boto3's default 8 MiB threshold and part size), but
never two parts at once.
"""

from __future__ import annotations

import os
from typing import Any, Union

PathLike = Union[str, "os.PathLike[str]"]


def _single_stream() -> Any:
    try:
        from boto3.s3.transfer import TransferConfig  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError as e:
        raise ImportError("fastpersist: the S3 baseline needs boto3: pip install boto3",
                          name="boto3") from e
    return TransferConfig(max_concurrency=1, use_threads=False)


def upload_file_single_stream(client: Any, bucket: str, key: str, path: PathLike) -> None:
    """Uploads the file at ``path`` to ``s3://bucket/key``, one request at a time."""
    client.upload_file(os.fspath(path), bucket, key, Config=_single_stream())


def download_file_single_stream(client: Any, bucket: str, key: str, path: PathLike) -> None:
    """Downloads ``s3://bucket/key`` into the file at ``path``, one request at a time."""
    client.download_file(bucket, key, os.fspath(path), Config=_single_stream())


__all__ = ["download_file_single_stream", "upload_file_single_stream"]
