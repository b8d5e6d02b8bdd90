// SPDX-License-Identifier: Apache-2.0
#include "load/file_stream.h"

#include <algorithm>
#include <array>

#include "fastpersist/pinned_buffer.h"

namespace fastpersist::checkpoint {

Status stream_file(const std::string& path, uint64_t size, IoEngine& engine,
                   const std::function<Status(uint64_t, const std::byte*, size_t)>& consume,
                   size_t window_bytes, const std::function<Status()>& before_read) {
  if (size == 0) return Status::ok();
  std::array<PinnedBuffer, 2> windows;
  for (auto& w : windows) {
    FP_ASSIGN_OR_RETURN(w, PinnedBuffer::allocate(window_bytes, /*lock_memory=*/false));
  }
  std::array<IoTicket, 2> tickets;
  std::array<uint64_t, 2> offsets{};
  std::array<size_t, 2> lengths{};
  auto submit = [&](int slot, uint64_t offset) -> Status {
    if (before_read) FP_RETURN_IF_ERROR(before_read());
    size_t n = static_cast<size_t>(std::min<uint64_t>(window_bytes, size - offset));
    IoRequest req;
    req.kind = IoKind::kRead;
    req.buffer = windows[static_cast<size_t>(slot)].data();
    req.length = n;
    req.path = path;
    req.file_offset = offset;
    FP_ASSIGN_OR_RETURN(tickets[static_cast<size_t>(slot)], engine.start(req));
    offsets[static_cast<size_t>(slot)] = offset;
    lengths[static_cast<size_t>(slot)] = n;
    return Status::ok();
  };
  uint64_t next = 0;
  int slot = 0;
  FP_RETURN_IF_ERROR(submit(0, 0));
  next = lengths[0];
  Status first;
  for (;;) {
    size_t s = static_cast<size_t>(slot);
    bool more = next < size;
    if (more && first.is_ok()) {
      Status st = submit(1 - slot, next);
      if (st.is_ok()) {
        next += lengths[1 - s];
      } else {
        first = st;
        more = false;
      }
    } else {
      more = false;
    }
    auto r = tickets[s].wait();
    if (first.is_ok() && !r.is_ok()) first = r.status();
    if (first.is_ok()) first = consume(offsets[s], windows[s].data(), lengths[s]);
    if (!more) break;
    slot = 1 - slot;
  }
  // The other slot may still be in flight after an error: wait before its buffer goes away.
  for (auto& t : tickets) {
    if (t.valid()) (void)t.wait();
  }
  return first;
}

}  // namespace fastpersist::checkpoint
