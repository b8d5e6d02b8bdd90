// SPDX-License-Identifier: Apache-2.0
// See staged_read.h.
#include "load/staged_read.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>

#include "buffer/device_copy.h"
#include "common/align.h"
#include "fastpersist/checksum.h"
#include "fastpersist/pinned_buffer.h"

namespace fastpersist::checkpoint {
namespace {

constexpr uint64_t kAlignment = 4096;
// Copy and hash in pieces that stay in the CPU's cache between the two passes.
constexpr size_t kCopyChunkBytes = size_t{256} << 10;

// Bytes [target_pos, target_pos + length) of one target, found at `slot_pos` in a piece's slot.
struct Part {
  size_t target = 0;
  uint64_t target_pos = 0;
  uint64_t slot_pos = 0;
  uint64_t length = 0;
};

// One aligned read: [begin, read_end) of a file into one slot.
struct Piece {
  const std::string* path = nullptr;
  uint64_t begin = 0;
  uint64_t end = 0;  // last wanted byte + 1
  uint64_t file_size = 0;
  std::vector<Part> parts;
  uint64_t read_end() const { return std::min(align_up(end, kAlignment), file_size); }
};

std::vector<Piece> plan_pieces(const std::vector<StagedTarget>& targets,
                               const std::vector<size_t>& order, const StagedReadOptions& o) {
  std::vector<Piece> pieces;
  for (size_t i : order) {
    const StagedTarget& t = targets[i];
    uint64_t pos = 0;
    while (pos < t.length) {
      uint64_t at = t.file_offset + pos;
      bool join = !pieces.empty() && *pieces.back().path == t.path && at >= pieces.back().end &&
                  at - pieces.back().end <= o.max_gap_bytes &&
                  at < pieces.back().begin + o.slot_bytes;
      if (!join) pieces.push_back({&t.path, align_down(at, kAlignment), at, t.file_size, {}});
      Piece& p = pieces.back();
      // Whole 4 KiB pages up to the slot's end, so the aligned read fits the slot.
      uint64_t take = std::min(t.length - pos, p.begin + o.slot_bytes - at);
      p.parts.push_back({i, pos, at - p.begin, take});
      p.end = at + take;
      pos += take;
    }
  }
  return pieces;
}

class StagedReader {
 public:
  StagedReader(IoEngine& engine, const std::vector<StagedTarget>& targets,
               const StagedReadOptions& o)
      : engine_(engine), targets_(targets), o_(o) {}

  Status run() {
    std::vector<size_t> order(targets_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const StagedTarget& x = targets_[a];
      const StagedTarget& y = targets_[b];
      return x.path != y.path ? x.path < y.path : x.file_offset < y.file_offset;
    });
    std::vector<Piece> pieces = plan_pieces(targets_, order, o_);
    if (pieces.empty()) return Status::ok();
    size_t slots = std::clamp<size_t>(o_.slots, 1, pieces.size());
    // From the process's pool: a load after the first reuses warm, locked slots instead of
    // faulting in fresh memory under its O_DIRECT reads (slow on a lazily backed VM).
    for (size_t s = 0; s < slots; ++s) {
      FP_ASSIGN_OR_RETURN(std::shared_ptr<PinnedBuffer> b,
                          default_pinned_pool().acquire(static_cast<size_t>(o_.slot_bytes)));
      free_.push_back(std::move(b));
    }
    Status first;
    size_t next = 0;
    while ((next < pieces.size() && first.is_ok()) || !inflight_.empty()) {
      while (next < pieces.size() && !free_.empty() && first.is_ok()) {
        Status st = submit(pieces[next++]);
        if (!st.is_ok()) first = st;
      }
      if (inflight_.empty()) break;
      Status st = finish_oldest(first.is_ok());
      if (first.is_ok() && !st.is_ok()) first = st;
    }
    return first;
  }

 private:
  struct InFlight {
    const Piece* piece;
    std::shared_ptr<PinnedBuffer> slot;
    IoTicket ticket;
  };

  Status submit(const Piece& p) {
    std::shared_ptr<PinnedBuffer> slot = std::move(free_.back());
    free_.pop_back();
    IoRequest req;
    req.kind = IoKind::kRead;
    req.buffer = slot->data();
    req.length = p.read_end() - p.begin;
    req.path = *p.path;
    req.file_offset = p.begin;
    Result<IoTicket> t = engine_.start(req);
    if (!t.is_ok()) {
      free_.push_back(std::move(slot));
      return t.status();
    }
    inflight_.push_back({&p, std::move(slot), std::move(t).value()});
    return Status::ok();
  }

  // Waits for the oldest read; with `deliver`, copies its bytes to their destinations.
  Status finish_oldest(bool deliver) {
    InFlight f = std::move(inflight_.front());
    inflight_.pop_front();
    Result<uint64_t> r = f.ticket.wait();
    Status st = r.is_ok() ? Status::ok() : r.status();
    if (st.is_ok() && deliver) {
      for (const Part& part : f.piece->parts) {
        st = deliver_part(part, f.slot->data());
        if (!st.is_ok()) break;
      }
      // The slot is read into again next: the copies out of it to device memory must be done
      // (also those started before a failure).
      std::vector<int> devices;
      for (const Part& part : f.piece->parts) {
        int d = targets_[part.target].device;
        if (d >= 0 && std::find(devices.begin(), devices.end(), d) == devices.end())
          devices.push_back(d);
      }
      for (int d : devices) {
        Status copied = buffer::finish_copies(d);
        if (st.is_ok()) st = copied;
      }
    }
    free_.push_back(std::move(f.slot));
    return st;
  }

  Status deliver_part(const Part& part, const std::byte* slot) {
    const StagedTarget& t = targets_[part.target];
    const bool hashing = static_cast<bool>(o_.on_checksum);
    if (hashing && part.target_pos == 0) hash_.reset();
    for (uint64_t done = 0; done < part.length;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyChunkBytes, part.length - done));
      std::byte* to = t.destination + part.target_pos + done;
      const std::byte* from = slot + part.slot_pos + done;
      if (t.device >= 0) {
        FP_RETURN_IF_ERROR(buffer::start_copy_to_device(to, from, n, t.device));
        if (hashing) hash_.update(from, n);  // the device memory is not for host eyes
      } else {
        std::memcpy(to, from, n);
        if (hashing) hash_.update(to, n);
      }
      done += n;
    }
    if (hashing && part.target_pos + part.length == t.length)
      return o_.on_checksum(part.target, hash_.digest());
    return Status::ok();
  }

  IoEngine& engine_;
  const std::vector<StagedTarget>& targets_;
  const StagedReadOptions& o_;
  std::vector<std::shared_ptr<PinnedBuffer>> free_;
  std::deque<InFlight> inflight_;
  // Pieces arrive in file order and a target's parts are consecutive, so one running hash does.
  Xxh3Stream hash_;
};

}  // namespace

Status read_staged(IoEngine& engine, const std::vector<StagedTarget>& targets,
                   const StagedReadOptions& options) {
  if (options.slot_bytes < kAlignment || options.slot_bytes % kAlignment != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "staged read slots must be a positive multiple of 4096 bytes");
  }
  for (const StagedTarget& t : targets) {
    if (t.length > 0 && (t.destination == nullptr || t.file_offset + t.length > t.file_size)) {
      return Status(StatusCode::kInvalidArgument,
                    "staged read target outside its file or without memory")
          .with_path(t.path);
    }
  }
  return StagedReader(engine, targets, options).run();
}

}  // namespace fastpersist::checkpoint
