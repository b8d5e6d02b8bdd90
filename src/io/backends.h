// SPDX-License-Identifier: Apache-2.0
// Constructors and probes of the built-in backends (private to src/io).
#pragma once

#include <memory>

#include "fastpersist/io_backend.h"

namespace fastpersist::io {

Result<std::unique_ptr<IoBackend>> make_uring_backend(unsigned queue_depth);
BackendProbe probe_uring();

Result<std::unique_ptr<IoBackend>> make_aio_backend(unsigned queue_depth);
BackendProbe probe_aio();

Result<std::unique_ptr<IoBackend>> make_thread_pool_backend(unsigned queue_depth);
BackendProbe probe_thread_pool();

// Runs one op synchronously with pread/pwrite; returns bytes (maybe short) or -errno.
int64_t run_op_blocking(const IoOp& op);

}  // namespace fastpersist::io
