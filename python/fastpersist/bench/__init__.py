# SPDX-License-Identifier: Apache-2.0
"""Checkpoint benchmarks mirroring DeepSpeedExamples ``deepnvme/model_checkpoint``.

``python -m fastpersist.bench tensor|model|roundtrip --help``. Every saving run prints one line
per mechanism, ``<tag> -- X.XX GB, Y.YY secs, Z.ZZ GB/s`` (GB = 1e9 bytes), measured in the
same run on the same folder so the numbers compare.
"""
