// SPDX-License-Identifier: Apache-2.0
// The whole `fastpersist` command line as a function: the executable's main() calls it, and so
// does the Python package (`python -m fastpersist.cli`, `_core.run_cli`), which installs an
// object-store client first. A command line that names an object store ("s3://...") while this
// process has no client is handed over to that Python: the executable itself links no S3 client.
#pragma once

namespace fastpersist::cli {

// Parses and runs one command; returns its exit status (command.h). Writes to stdout/stderr and
// flushes both before returning.
int run_cli(int argc, char** argv);

}  // namespace fastpersist::cli
