# SPDX-License-Identifier: Apache-2.0
"""The SeaweedFS server the S3 tests use; it lives in the package (fastpersist.bench.seaweedfs)
so that the object-tier benchmark starts the same server."""

from fastpersist.bench.seaweedfs import (ACCESS_KEY, READER_ACCESS_KEY, READER_SECRET_KEY,
                                         SECRET_KEY, SeaweedFS, SeaweedFSUnavailable, find_weed,
                                         free_ports)

__all__ = ["ACCESS_KEY", "READER_ACCESS_KEY", "READER_SECRET_KEY", "SECRET_KEY", "SeaweedFS",
           "SeaweedFSUnavailable", "find_weed", "free_ports"]
