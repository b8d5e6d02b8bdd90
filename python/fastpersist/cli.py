# SPDX-License-Identifier: Apache-2.0
"""``python -m fastpersist.cli ARGS``: the ``fastpersist`` command line, run in this process.

The ``fastpersist`` executable hands a command line that names an object store (``fastpersist
list s3://bucket/run1``) to this module, because the store's client (boto3) lives in Python.
The commands themselves are the C++ ones (tools/), run through ``_core.run_cli`` with the
package's object-store opener installed; nothing is parsed or printed here.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from . import _core


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``fastpersist ARGS`` and returns its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    # The C++ side hands a URL to Python only once: from here on it must be served in-process.
    os.environ["FASTPERSIST_CLI_IN_PYTHON"] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    return int(_core.run_cli(args))


if __name__ == "__main__":
    sys.exit(main())
