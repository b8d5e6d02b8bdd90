// SPDX-License-Identifier: Apache-2.0
// GdsRequests' registry of device buffers pinned with cuFileBufRegister (gds_requests.h).
#include <utility>
#include <vector>

#include "handle/gds_requests.h"
#include "io/cufile_library.h"

namespace fastpersist::handle {

Status GdsRequests::pin(const MemorySpan& memory) {
  {
    std::lock_guard lock(pins_mu_);
    for (const auto& [start, pin] : pins_) {
      if (memory.data < start + pin.bytes && start < memory.data + memory.bytes) {
        return Status(StatusCode::kInvalidArgument,
                      "the device buffer overlaps one this handle already pinned");
      }
    }
  }
  Status st = run_on_device(memory.device, [&] {
    io::CuFileError e = io::cufile_library().buf_register(memory.data, memory.bytes, 0);
    if (e.err != io::kCuFileSuccess) {
      return Status(StatusCode::kIoError, "cuFileBufRegister of " + std::to_string(memory.bytes) +
                                              " bytes failed: " + io::cufile_error_text(e));
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  std::lock_guard lock(pins_mu_);
  pins_[memory.data] = Pin{memory.bytes, memory.device};
  return Status::ok();
}

Result<bool> GdsRequests::unpin(const MemorySpan& memory) {
  int device = -1;
  {
    std::lock_guard lock(pins_mu_);
    auto it = pins_.find(memory.data);
    if (it == pins_.end()) return false;
    device = it->second.device;
    pins_.erase(it);
  }
  Status st = run_on_device(device, [&] {
    io::CuFileError e = io::cufile_library().buf_deregister(memory.data);
    if (e.err != io::kCuFileSuccess) {
      return Status(StatusCode::kIoError,
                    "cuFileBufDeregister failed: " + io::cufile_error_text(e));
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return true;
}

bool GdsRequests::is_pinned(const MemorySpan& memory) const {
  std::lock_guard lock(pins_mu_);
  auto it = pins_.upper_bound(memory.data);
  if (it == pins_.begin()) return false;
  --it;
  return memory.data + memory.bytes <= it->first + it->second.bytes;
}

void GdsRequests::unpin_all() {
  std::vector<std::pair<const std::byte*, Pin>> all;
  {
    std::lock_guard lock(pins_mu_);
    all.assign(pins_.begin(), pins_.end());
  }
  for (const auto& [start, pin] : all) {
    (void)unpin(MemorySpan::cuda(start, pin.bytes, pin.device));
  }
}

}  // namespace fastpersist::handle
