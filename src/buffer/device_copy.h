// SPDX-License-Identifier: Apache-2.0
// Copies from CUDA device memory into host memory with the run-time-loaded CUDA runtime: one
// non-blocking stream per (thread, device), so a copy neither waits for nor holds up the work
// the training loop queued on the device's default stream. The caller makes sure the device
// memory is ready (the Python façade synchronizes the tensors' current streams first) and stays
// valid until the copy returns.
#pragma once

#include <cstddef>

#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist::buffer {

// OK when device-to-host copies from `device` can run in this process (the runtime loaded, the
// device selectable, a stream created); otherwise the reason, ready for an error message.
// Probes on a short-lived thread of its own: the caller's current device is not touched.
Status device_copy_ready(int device);

// Makes `device` current on this thread (a copying thread) and registers `window` with the
// CUDA runtime there, once, so copies into it are DMA at full speed. Staging memory is not
// registered when it is allocated: a background thread that has not selected a device would
// register it with, and create a context on, device 0.
Status prepare_copy_target(PinnedBuffer& window, int device);

// Copies `bytes` from `src` (memory of CUDA device `device`) to `dst` (host memory; pinned or
// registered memory makes it a DMA at full speed) and waits until the bytes are there.
Status copy_from_device(void* dst, const void* src, size_t bytes, int device);

// The pipelined form (AioHandle's staging of device buffers): start_copy_* only enqueue the copy
// on this thread's stream for `device` and return; finish_copies waits until every copy this
// thread enqueued for `device` is done (and reports the first failure). Host memory must stay
// valid, and not be reused, until finish_copies returned.
Status start_copy_from_device(void* dst, const void* src, size_t bytes, int device);
Status start_copy_to_device(void* dst, const void* src, size_t bytes, int device);
Status finish_copies(int device);

}  // namespace fastpersist::buffer
