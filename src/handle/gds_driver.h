// SPDX-License-Identifier: Apache-2.0
// The process-wide side of GdsHandle's cuFile use: selecting a device on the calling thread, and
// cuFile's driver, opened once per process.
#pragma once

#include <string>

#include "fastpersist/status.h"

namespace fastpersist::handle {

// cudaSetDevice on this thread; kUnavailable when the runtime is missing or the device unusable.
Status select_device(int device);

// Opens cuFile's driver once per process, on the calling thread (which must have selected a
// device); OK or kUnavailable with cuFile's error. Never closed: cuFile releases it at exit,
// and a handle closing it would pull it from under another handle's transfers.
Status open_cufile_driver();
// After open_cufile_driver succeeded: what the driver reported ("" before).
std::string cufile_driver_mode();

}  // namespace fastpersist::handle
