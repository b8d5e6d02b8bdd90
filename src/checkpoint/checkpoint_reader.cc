// SPDX-License-Identifier: Apache-2.0
// CheckpointReader: tensors of a checkpoint read with parallel O_DIRECT, either into spans of
// new page-aligned memory (the caller wraps tensors around them without a copy; filled through
// the ring of aligned slots, staged_read.h) or into the caller's memory (straight, when it
// lines up with the file; else through the same ring); checksums checked as the bytes arrive.
#include "fastpersist/checkpoint_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/encoded_read.h"
#include "checkpoint/load_plan.h"
#include "checkpoint/save_job.h"
#include "checkpoint/staged_read.h"
#include "common/align.h"
#include "common/printable.h"
#include "common/regular_file.h"
#include "common/unique_fd.h"
#include "fastpersist/checksum.h"

namespace fastpersist {
namespace {

constexpr uint64_t kReadAlignment = 4096;
constexpr uint64_t kMaxSpanBytes = uint64_t{64} << 20;  // one new buffer per span

Status checksum_mismatch(const std::string& path, const ManifestTensor& t, uint64_t actual) {
  return Status(StatusCode::kDataLoss, "tensor '" + t.name + "' in " + t.file +
                                           " fails its checksum (manifest " +
                                           checksum_to_hex(t.checksum) + ", data " +
                                           checksum_to_hex(actual) + "): the checkpoint is damaged")
      .with_path(path)
      .with_range(t.offset, t.length);
}

struct SpanPlan {
  std::string file;
  uint64_t begin = 0;  // tensor bytes covered
  uint64_t end = 0;
  std::vector<size_t> requests;
};

struct Pending {
  IoTicket ticket;
  std::vector<size_t> requests;  // whose bytes this read brings
  uint64_t direct_bytes = 0;     // bytes read into the caller's memory (bounded)
};

// The leading bytes of a data file (length prefix + JSON header) against their checksum: the
// header says which bytes are which tensor, so a load that trusts it must check it too.
Status check_file_header(const std::string& path, const ManifestFile& f) {
  FP_ASSIGN_OR_RETURN(RegularFile file,
                      open_regular_file(path, Symlinks::kRefuse, "checkpoint file"));
  // Hashed in pieces: the manifest says how many bytes, and a damaged or hostile one must not
  // decide how much memory a load allocates.
  constexpr size_t kPiece = size_t{1} << 20;
  std::vector<char> piece(static_cast<size_t>(std::min<uint64_t>(f.checksum_bytes, kPiece)));
  Xxh3Stream hash;
  uint64_t done = 0;
  while (done < f.checksum_bytes) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(f.checksum_bytes - done, piece.size()));
    ssize_t n = ::pread(file.fd.get(), piece.data(), want, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno(errno, "cannot read the header").with_path(path);
    if (n == 0) break;
    hash.update(piece.data(), static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  uint64_t actual = hash.digest();
  if (done != f.checksum_bytes || actual != f.checksum) {
    return Status(StatusCode::kDataLoss,
                  "the safetensors header of " + f.name + " fails its checksum (manifest " +
                      checksum_to_hex(f.checksum) + ", data " + checksum_to_hex(actual) +
                      "): the checkpoint is damaged")
        .with_path(path)
        .with_range(0, f.checksum_bytes);
  }
  return Status::ok();
}

}  // namespace

CheckpointReader::CheckpointReader(std::string dir, Manifest manifest,
                                   std::shared_ptr<IoEngine> engine)
    : dir_(std::move(dir)), manifest_(std::move(manifest)), engine_(std::move(engine)) {
  files_.reserve(manifest_.files.size());
  for (const ManifestFile& f : manifest_.files) {
    files_.emplace(f.name, std::make_pair(&f, manifest_file_path(dir_, f)));
  }
}

Result<std::shared_ptr<const checkpoint::DeltaBaseBytes>> CheckpointReader::delta_base_of(
    const ManifestTensor& t) const {
  if (!t.delta_base) return std::shared_ptr<const checkpoint::DeltaBaseBytes>();
  return checkpoint::DeltaBaseBytes::open(t, files_.at(t.delta_base->file).second);
}

Status CheckpointReader::check_encoding(const ManifestTensor& t) const {
  Status st = check_encoding_supported(t);
  if (st.is_ok()) return st;
  return std::move(st).with_path(path_of(t));
}

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& dir,
                                                                 std::shared_ptr<IoEngine> engine) {
  if (!engine) return Status(StatusCode::kInvalidArgument, "CheckpointReader needs an engine");
  FP_ASSIGN_OR_RETURN(Manifest m, read_manifest(dir));
  FP_RETURN_IF_ERROR(checkpoint::check_manifest_files(dir, m));
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(dir, std::move(m), std::move(engine)));
}

Status CheckpointReader::read_stored_into(const std::vector<size_t>& tensors, bool verify_headers,
                                          PinnedBuffer& buffer,
                                          std::vector<const std::byte*>* data) {
  if (manifest_.checksum_algorithm == kNoChecksum) verify_headers = false;
  struct Range {
    uint64_t begin = 0, end = 0;
  };
  std::vector<Range> ranges(tensors.size());
  std::set<std::string> files;
  uint64_t total = 0;
  for (size_t j = 0; j < tensors.size(); ++j) {
    if (tensors[j] >= manifest_.tensors.size())
      return Status(StatusCode::kInvalidArgument, "tensor index out of range");
    const ManifestTensor& t = manifest_.tensors[tensors[j]];
    FP_RETURN_IF_ERROR(check_encoding(t));
    ranges[j].begin = align_down(t.offset, kReadAlignment);
    ranges[j].end = std::min(align_up(t.offset + t.stored_length, kReadAlignment), file_of(t).size);
    if (t.stored_length == 0) ranges[j].end = ranges[j].begin;
    total += align_up(ranges[j].end - ranges[j].begin, kReadAlignment);
    files.insert(t.file);
  }
  if (verify_headers) {
    for (const std::string& name : files) {
      const auto& [file, path] = files_.at(name);
      FP_RETURN_IF_ERROR(check_file_header(path, *file));
    }
  }
  if (buffer.data() == nullptr || buffer.size() < total) {
    FP_ASSIGN_OR_RETURN(buffer, PinnedBuffer::allocate(
                                    static_cast<size_t>(std::max<uint64_t>(total, kReadAlignment)),
                                    /*lock_memory=*/false));
  }
  data->assign(tensors.size(), nullptr);
  std::vector<IoTicket> tickets;
  tickets.reserve(tensors.size());
  Status first;
  uint64_t at = 0;
  for (size_t j = 0; j < tensors.size() && first.is_ok(); ++j) {
    const ManifestTensor& t = manifest_.tensors[tensors[j]];
    (*data)[j] = buffer.data() + at + (t.offset - ranges[j].begin);
    if (ranges[j].end == ranges[j].begin) continue;
    IoRequest req;
    req.kind = IoKind::kRead;
    req.buffer = buffer.data() + at;
    req.length = ranges[j].end - ranges[j].begin;
    req.path = path_of(t);
    req.file_offset = ranges[j].begin;
    Result<IoTicket> ticket = engine_->start(req);
    if (!ticket.is_ok()) {
      first = ticket.status();
      break;
    }
    tickets.push_back(std::move(ticket).value());
    at += align_up(ranges[j].end - ranges[j].begin, kReadAlignment);
  }
  for (IoTicket& ticket : tickets) {  // every read finishes before the buffer may be reused
    Result<uint64_t> r = ticket.wait();
    if (first.is_ok() && !r.is_ok()) first = r.status();
  }
  return first;
}

Result<CheckpointReader::ReadResult> CheckpointReader::read(
    const std::vector<TensorReadRequest>& requests, bool verify, uint64_t max_in_flight_bytes,
    uint64_t max_gap_bytes) {
  if (manifest_.checksum_algorithm == kNoChecksum) verify = false;  // nothing to compare with
  if (verify) {
    std::set<std::string> files;
    for (const TensorReadRequest& r : requests) {
      if (r.tensor < manifest_.tensors.size()) files.insert(manifest_.tensors[r.tensor].file);
    }
    for (const std::string& name : files) {
      const auto& [file, path] = files_.at(name);
      FP_RETURN_IF_ERROR(check_file_header(path, *file));
    }
  }
  ReadResult out;
  out.spans.resize(requests.size());
  out.data.resize(requests.size(), nullptr);
  std::map<std::string, std::vector<size_t>> by_file;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].tensor >= manifest_.tensors.size()) {
      return Status(StatusCode::kInvalidArgument, "tensor index out of range");
    }
    const ManifestTensor& t = manifest_.tensors[requests[i].tensor];
    FP_RETURN_IF_ERROR(check_encoding(t));
    if (t.encoding != kEncodingRaw) {
      return Status(StatusCode::kInvalidArgument,
                    "tensor '" + t.name + "' is stored " + t.encoding +
                        "-compressed: read() gives raw tensors' bytes only; load() decodes it");
    }
    if (requests[i].destination != nullptr && requests[i].capacity < t.length) {
      return Status(StatusCode::kInvalidArgument,
                    "the destination of tensor '" + t.name + "' holds " +
                        std::to_string(requests[i].capacity) + " bytes, not its " +
                        std::to_string(t.length));
    }
    if (requests[i].destination == nullptr && t.stored_length > 0) by_file[t.file].push_back(i);
    if (requests[i].destination != nullptr) out.data[i] = requests[i].destination;
  }

  // Spans: neighbouring requested tensors of one file, read as one piece.
  std::vector<SpanPlan> spans;
  for (auto& [file, reqs] : by_file) {
    std::sort(reqs.begin(), reqs.end(), [&](size_t a, size_t b) {
      return manifest_.tensors[requests[a].tensor].offset <
             manifest_.tensors[requests[b].tensor].offset;
    });
    for (size_t i : reqs) {
      const ManifestTensor& t = manifest_.tensors[requests[i].tensor];
      bool extend = !spans.empty() && spans.back().file == file && t.offset >= spans.back().end &&
                    t.offset - spans.back().end <= max_gap_bytes &&
                    t.offset + t.stored_length - spans.back().begin <= kMaxSpanBytes;
      if (!extend) spans.push_back({file, t.offset, t.offset, {}});
      spans.back().end = std::max(spans.back().end, t.offset + t.stored_length);
      spans.back().requests.push_back(i);
    }
  }

  // Spans: new memory, faulted in up front on every core (prefault_load_memory), then filled
  // through the staged ring with the unaligned destinations below (the pooled ring's warm slots
  // take the O_DIRECT reads; the copy out of them and the checksums run on this thread). Reading
  // O_DIRECT straight into the new pages instead faulted them in inside each read's submission,
  // at 0.4 to 0.8 GB/s on the benchmark VM against 1.4 to 1.7 this way (docs/performance.md).
  std::vector<checkpoint::StagedTarget> staged;
  std::vector<size_t> staged_request;
  std::vector<std::shared_ptr<PinnedBuffer>> fresh;
  for (const SpanPlan& s : spans) {
    const auto& [f, path] = files_.at(s.file);
    uint64_t begin = align_down(s.begin, kReadAlignment);
    uint64_t end = std::min(align_up(s.end, kReadAlignment), f->size);
    FP_ASSIGN_OR_RETURN(std::shared_ptr<PinnedBuffer> buffer,
                        checkpoint::new_load_memory(end - begin));
    auto span = std::make_shared<LoadedSpan>();
    span->file = s.file;
    span->file_offset = begin;
    span->buffer = buffer;
    for (size_t i : s.requests) {
      const ManifestTensor& t = manifest_.tensors[requests[i].tensor];
      std::byte* at = buffer->data() + (t.offset - begin);
      out.spans[i] = span;
      out.data[i] = at;
      staged.push_back({path, f->size, t.offset, t.length, at});
      staged_request.push_back(i);
    }
    fresh.push_back(std::move(buffer));
  }
  checkpoint::prefault_load_memory(fresh);

  std::deque<Pending> inflight;
  Status first;
  uint64_t direct_in_flight = 0;
  auto finish_one = [&]() {
    Pending p = std::move(inflight.front());
    inflight.pop_front();
    direct_in_flight -= p.direct_bytes;
    if (!p.ticket.valid()) {  // an empty tensor: nothing read, the checksum of nothing
      const ManifestTensor& t = manifest_.tensors[requests[p.requests[0]].tensor];
      uint64_t empty = xxh3_64(nullptr, 0);
      if (verify && first.is_ok() && empty != t.checksum)
        first = checksum_mismatch(path_of(t), t, empty);
      return;
    }
    auto r = p.ticket.wait();
    if (!r.is_ok()) {
      if (first.is_ok()) first = r.status();
      return;
    }
    if (!verify || !first.is_ok()) return;
    for (size_t i : p.requests) {
      const ManifestTensor& t = manifest_.tensors[requests[i].tensor];
      uint64_t actual = xxh3_64(out.data[i], t.length);
      if (actual != t.checksum) {
        first = checksum_mismatch(path_of(t), t, actual);
        return;
      }
    }
  };

  // Destinations: straight into the caller's memory when it lines up with the file for
  // O_DIRECT, else through the staged ring (staged_read.h) once the reads above are done.
  for (size_t i = 0; i < requests.size() && first.is_ok(); ++i) {
    if (requests[i].destination == nullptr) continue;
    const ManifestTensor& t = manifest_.tensors[requests[i].tensor];
    if (t.length == 0) {
      inflight.push_back({IoTicket(), {i}, 0});
      continue;
    }
    auto address = reinterpret_cast<uintptr_t>(requests[i].destination);
    // Device memory goes through the staged ring too: the kernel cannot read into it.
    if (requests[i].device >= 0 || (address - t.offset) % kReadAlignment != 0) {
      staged.push_back({path_of(t), file_of(t).size, t.offset, t.length, requests[i].destination,
                        requests[i].device});
      staged_request.push_back(i);
      continue;
    }
    // Bounded: finish the oldest reads (spans first) until this one fits.
    while (max_in_flight_bytes != 0 && direct_in_flight > 0 &&
           direct_in_flight + t.length > max_in_flight_bytes && !inflight.empty()) {
      finish_one();
    }
    IoRequest req;
    req.kind = IoKind::kRead;
    req.buffer = requests[i].destination;
    req.length = t.length;
    req.path = path_of(t);
    req.file_offset = t.offset;
    auto ticket = engine_->start(req);
    if (!ticket.is_ok()) {
      first = ticket.status();
      break;
    }
    inflight.push_back({std::move(ticket).value(), {i}, t.length});
    direct_in_flight += t.length;
  }
  while (!inflight.empty()) finish_one();
  if (first.is_ok() && !staged.empty()) {
    checkpoint::StagedReadOptions so;
    so.max_gap_bytes = max_gap_bytes;
    if (max_in_flight_bytes != 0 && max_in_flight_bytes < so.slot_bytes * so.slots) {
      so.slots = 2;
      so.slot_bytes = std::max(kReadAlignment, align_down(max_in_flight_bytes / 2, kReadAlignment));
    }
    if (verify) {
      so.on_checksum = [&](size_t target, uint64_t actual) {
        const ManifestTensor& t = manifest_.tensors[requests[staged_request[target]].tensor];
        return actual == t.checksum ? Status::ok() : checksum_mismatch(path_of(t), t, actual);
      };
    }
    bool to_device = std::any_of(staged.begin(), staged.end(),
                                 [](const checkpoint::StagedTarget& t) { return t.device >= 0; });
    if (to_device) {
      // Copies to a device select it on the copying thread: not the caller's, whose current
      // device is its own business (torch's).
      std::thread copier([&] { first = checkpoint::read_staged(*engine_, staged, so); });
      copier.join();
    } else {
      first = checkpoint::read_staged(*engine_, staged, so);
    }
  }
  // Empty tensors read from spans: still check their recorded checksum.
  for (size_t i = 0; i < requests.size() && verify && first.is_ok(); ++i) {
    const ManifestTensor& t = manifest_.tensors[requests[i].tensor];
    if (verify && t.length == 0 && requests[i].destination == nullptr &&
        xxh3_64(nullptr, 0) != t.checksum) {
      first = checksum_mismatch(path_of(t), t, xxh3_64(nullptr, 0));
    }
  }
  if (!first.is_ok()) return first;
  return out;
}

Status CheckpointReader::read_pieces(size_t tensor, uint64_t piece_bytes, bool verify,
                                     const PieceSink& sink) {
  if (tensor >= manifest_.tensors.size()) {
    return Status(StatusCode::kInvalidArgument, "tensor index out of range");
  }
  if (piece_bytes == 0 || piece_bytes % kReadAlignment != 0) {
    return Status(StatusCode::kInvalidArgument, "piece_bytes must be a positive multiple of 4096");
  }
  if (manifest_.checksum_algorithm == kNoChecksum) verify = false;
  const ManifestTensor& t = manifest_.tensors[tensor];
  FP_RETURN_IF_ERROR(check_encoding(t));
  const ManifestFile* f = &file_of(t);
  const std::string& path = path_of(t);
  if (verify) FP_RETURN_IF_ERROR(check_file_header(path, *f));

  // What arrives is the stored bytes: raw ones go to the sink as they are; compressed ones
  // through a FrameStream, whose chunks go to the sink in pieces of at most piece_bytes.
  Xxh3Stream hash;
  std::unique_ptr<checkpoint::FrameStream> frames;
  if (t.encoding != kEncodingRaw) {
    FP_ASSIGN_OR_RETURN(ChunkTable table, checkpoint::read_chunk_table(path, t));
    FP_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::DeltaBaseBytes> base, delta_base_of(t));
    frames = std::make_unique<checkpoint::FrameStream>(
        t, std::move(table),
        [&](uint64_t offset, const std::byte* data, size_t size) -> Status {
          for (size_t done = 0; done < size;) {
            size_t n = static_cast<size_t>(std::min<uint64_t>(piece_bytes, size - done));
            if (verify) hash.update(data + done, n);
            FP_RETURN_IF_ERROR(sink(offset + done, data + done, n));
            done += n;
          }
          return Status::ok();
        },
        std::move(base));
  }
  auto consume = [&](uint64_t pos, const std::byte* data, size_t size) -> Status {
    if (frames) return frames->feed(data, size);
    if (verify) hash.update(data, size);
    return sink(pos, data, size);
  };
  const uint64_t stored = t.stored_length;

  // Two slots: the sink works on one while the next piece is read into the other.
  struct Slot {
    PinnedBuffer buffer;
    IoTicket ticket;
    uint64_t pos = 0;  // offset in the tensor
    size_t size = 0;   // tensor bytes in this piece
    size_t skip = 0;   // bytes before them in the buffer (the read starts 4096-aligned)
  };
  std::vector<Slot> slots(2);
  for (Slot& slot : slots) {
    FP_ASSIGN_OR_RETURN(
        slot.buffer, PinnedBuffer::allocate(static_cast<size_t>(piece_bytes + 2 * kReadAlignment),
                                            /*lock_memory=*/false));
  }
  auto submit = [&](Slot& slot, uint64_t pos) -> Status {
    slot.pos = pos;
    slot.size = static_cast<size_t>(std::min(piece_bytes, stored - pos));
    uint64_t begin = align_down(t.offset + pos, kReadAlignment);
    uint64_t end = std::min(align_up(t.offset + pos + slot.size, kReadAlignment), f->size);
    slot.skip = static_cast<size_t>(t.offset + pos - begin);
    IoRequest req;
    req.kind = IoKind::kRead;
    req.buffer = slot.buffer.data();
    req.length = end - begin;
    req.path = path;
    req.file_offset = begin;
    FP_ASSIGN_OR_RETURN(slot.ticket, engine_->start(req));
    return Status::ok();
  };
  // Every read in flight is waited for before returning: the slots die with this frame.
  auto settle = [&](Status st) {
    for (Slot& slot : slots) {
      if (slot.ticket.valid()) (void)slot.ticket.wait();
    }
    return st;
  };

  if (stored > 0) {
    FP_RETURN_IF_ERROR(submit(slots[0], 0));
    uint64_t next = slots[0].size;
    for (size_t cur = 0;; cur ^= 1) {
      Slot& slot = slots[cur];
      auto done = slot.ticket.wait();
      slot.ticket = IoTicket();
      if (!done.is_ok()) return settle(Status(done.status()).with_path(path));
      if (done.value() < slot.skip + slot.size) {
        return settle(
            Status(StatusCode::kDataLoss, "short read of tensor '" + t.name + "' in " + t.file)
                .with_path(path)
                .with_range(t.offset + slot.pos, slot.size));
      }
      if (next < stored) {
        Status st = submit(slots[cur ^ 1], next);
        if (!st.is_ok()) return settle(st);
        next += slots[cur ^ 1].size;
      }
      Status st = consume(slot.pos, slot.buffer.data() + slot.skip, slot.size);
      if (!st.is_ok()) return settle(st.with_path(path));
      if (slot.pos + slot.size == stored) break;
    }
  }
  if (frames) FP_RETURN_IF_ERROR(frames->finish().with_path(path));
  if (verify && hash.digest() != t.checksum) return checksum_mismatch(path_of(t), t, hash.digest());
  return Status::ok();
}

Result<std::string> CheckpointReader::read_objects() {
  if (manifest_.find_file(kObjectsFileName) == nullptr) return std::string();
  return read_file(kObjectsFileName);
}

Result<std::string> CheckpointReader::read_file(std::string_view name) {
  const ManifestFile* f = manifest_.find_file(name);
  if (f == nullptr || f->role != "objects") {
    return Status(StatusCode::kNotFound,
                  "the checkpoint has no objects file '" + printable(std::string(name)) + "'")
        .with_path(dir_);
  }
  FP_ASSIGN_OR_RETURN(std::string path, checkpoint::resolve_manifest_file(dir_, *f));
  FP_ASSIGN_OR_RETURN(std::string bytes, checkpoint::read_small_file(path, size_t{1} << 31));
  bool checked = manifest_.checksum_algorithm != kNoChecksum;
  uint64_t actual = checked ? xxh3_64(bytes.data(), bytes.size()) : 0;
  if (bytes.size() != f->size || actual != f->checksum) {
    return Status(StatusCode::kDataLoss, printable(f->name) + " fails its checksum (manifest " +
                                             checksum_to_hex(f->checksum) + ", data " +
                                             checksum_to_hex(actual) +
                                             "): the checkpoint is damaged")
        .with_path(path);
  }
  return bytes;
}

}  // namespace fastpersist
