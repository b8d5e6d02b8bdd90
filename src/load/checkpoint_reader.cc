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

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/align.h"
#include "common/printable.h"
#include "common/regular_file.h"
#include "common/unique_fd.h"
#include "fastpersist/checksum.h"
#include "load/encoded_read.h"
#include "load/load_plan.h"
#include "load/reader_impl.h"
#include "load/staged_read.h"

namespace fastpersist {
namespace checkpoint {

Status checksum_mismatch(const std::string& path, const ManifestTensor& t, uint64_t actual) {
  return Status(StatusCode::kDataLoss, "tensor '" + t.name + "' in " + t.file +
                                           " fails its checksum (manifest " +
                                           checksum_to_hex(t.checksum) + ", data " +
                                           checksum_to_hex(actual) + "): the checkpoint is damaged")
      .with_path(path)
      .with_range(t.offset, t.length);
}

}  // namespace checkpoint

namespace {

using checkpoint::checksum_mismatch;
constexpr uint64_t kReadAlignment = CheckpointReader::Impl::kReadAlignment;
constexpr uint64_t kMaxSpanBytes = uint64_t{64} << 20;  // one new buffer per span

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

// ---- the public class: forwards to Impl ----

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& dir,
                                                                 std::shared_ptr<IoEngine> engine) {
  if (!engine) return Status(StatusCode::kInvalidArgument, "CheckpointReader needs an engine");
  FP_ASSIGN_OR_RETURN(Manifest m, read_manifest(dir));
  FP_RETURN_IF_ERROR(checkpoint::check_manifest_files(dir, m));
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(std::make_unique<Impl>(dir, std::move(m), std::move(engine))));
}

const Manifest& CheckpointReader::manifest() const { return impl_->manifest(); }
const std::string& CheckpointReader::dir() const { return impl_->dir(); }

Result<LoadResult> CheckpointReader::load(const LoadRequest& request) {
  return impl_->load(request);
}

Result<CheckpointReader::ReadResult> CheckpointReader::read(
    const std::vector<TensorReadRequest>& requests, bool verify, uint64_t max_in_flight_bytes,
    uint64_t max_gap_bytes) {
  return impl_->read(requests, verify, max_in_flight_bytes, max_gap_bytes);
}

Status CheckpointReader::read_pieces(size_t tensor, uint64_t piece_bytes, bool verify,
                                     const PieceSink& sink) {
  return impl_->read_pieces(tensor, piece_bytes, verify, sink);
}

// ---- Impl ----

CheckpointReader::Impl::Impl(std::string dir, Manifest manifest, std::shared_ptr<IoEngine> engine)
    : dir_(std::move(dir)), manifest_(std::move(manifest)), engine_(std::move(engine)) {
  files_.reserve(manifest_.files.size());
  for (const ManifestFile& f : manifest_.files) {
    files_.emplace(f.name, std::make_pair(&f, manifest_file_path(dir_, f)));
  }
}

Result<std::shared_ptr<const checkpoint::DeltaBaseBytes>> CheckpointReader::Impl::delta_base_of(
    const ManifestTensor& t) const {
  if (!t.delta_base) return std::shared_ptr<const checkpoint::DeltaBaseBytes>();
  return checkpoint::DeltaBaseBytes::open(t, files_.at(t.delta_base->file).second);
}

Status CheckpointReader::Impl::check_encoding(const ManifestTensor& t) const {
  Status st = check_encoding_supported(t);
  if (st.is_ok()) return st;
  return std::move(st).with_path(path_of(t));
}

Status CheckpointReader::Impl::check_file_headers(const std::set<std::string>& files) const {
  for (const std::string& name : files) {
    const auto& [file, path] = files_.at(name);
    FP_RETURN_IF_ERROR(check_file_header(path, *file));
  }
  return Status::ok();
}

Status CheckpointReader::Impl::read_stored_into(const std::vector<size_t>& tensors,
                                                bool verify_headers, PinnedBuffer& buffer,
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
  if (verify_headers) FP_RETURN_IF_ERROR(check_file_headers(files));
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

// One read(): requests checked, spans planned and allocated, direct reads in flight (bounded),
// then everything else through the staged ring, checksums checked as the bytes arrive.
struct CheckpointReader::Impl::ReadCall {
  ReadCall(Impl& r, const std::vector<TensorReadRequest>& reqs, bool check, uint64_t in_flight,
           uint64_t gap)
      : reader(r),
        requests(reqs),
        verify(check),
        max_in_flight_bytes(in_flight),
        max_gap_bytes(gap) {}

  Impl& reader;
  const std::vector<TensorReadRequest>& requests;
  bool verify;
  uint64_t max_in_flight_bytes;
  uint64_t max_gap_bytes;

  ReadResult out;
  std::vector<checkpoint::StagedTarget> staged;
  std::vector<size_t> staged_request;  // per staged target: its request
  std::deque<Pending> inflight;
  uint64_t direct_in_flight = 0;
  Status first;  // the first failure; later reads are still waited for

  const ManifestTensor& tensor_of(size_t i) const {
    return reader.manifest_.tensors[requests[i].tensor];
  }

  Result<ReadResult> run() {
    if (reader.manifest_.checksum_algorithm == kNoChecksum) verify = false;  // nothing to compare
    if (verify) FP_RETURN_IF_ERROR(check_headers());
    std::map<std::string, std::vector<size_t>> by_file;
    FP_RETURN_IF_ERROR(check_requests(by_file));
    FP_RETURN_IF_ERROR(allocate_spans(plan_spans(by_file)));
    start_direct_reads();
    while (!inflight.empty()) finish_one();
    if (first.is_ok() && !staged.empty()) read_staged();
    check_empty_span_tensors();
    if (!first.is_ok()) return first;
    return std::move(out);
  }

  Status check_headers() const {
    std::set<std::string> files;
    for (const TensorReadRequest& r : requests) {
      if (r.tensor < reader.manifest_.tensors.size())
        files.insert(reader.manifest_.tensors[r.tensor].file);
    }
    return reader.check_file_headers(files);
  }

  // Every request is valid before the first read; those without a destination, by file.
  Status check_requests(std::map<std::string, std::vector<size_t>>& by_file) {
    out.spans.resize(requests.size());
    out.data.resize(requests.size(), nullptr);
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].tensor >= reader.manifest_.tensors.size()) {
        return Status(StatusCode::kInvalidArgument, "tensor index out of range");
      }
      const ManifestTensor& t = tensor_of(i);
      FP_RETURN_IF_ERROR(reader.check_encoding(t));
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
    return Status::ok();
  }

  // Spans: neighbouring requested tensors of one file, read as one piece.
  std::vector<SpanPlan> plan_spans(std::map<std::string, std::vector<size_t>>& by_file) const {
    std::vector<SpanPlan> spans;
    for (auto& [file, reqs] : by_file) {
      std::sort(reqs.begin(), reqs.end(),
                [&](size_t a, size_t b) { return tensor_of(a).offset < tensor_of(b).offset; });
      for (size_t i : reqs) {
        const ManifestTensor& t = tensor_of(i);
        bool extend = !spans.empty() && spans.back().file == file && t.offset >= spans.back().end &&
                      t.offset - spans.back().end <= max_gap_bytes &&
                      t.offset + t.stored_length - spans.back().begin <= kMaxSpanBytes;
        if (!extend) spans.push_back({file, t.offset, t.offset, {}});
        spans.back().end = std::max(spans.back().end, t.offset + t.stored_length);
        spans.back().requests.push_back(i);
      }
    }
    return spans;
  }

  // Spans: new memory, faulted in up front on every core (prefault_load_memory), then filled
  // through the staged ring with the unaligned destinations below (the pooled ring's warm slots
  // take the O_DIRECT reads; the copy out of them and the checksums run on this thread). Reading
  // O_DIRECT straight into the new pages instead faulted them in inside each read's submission,
  // at 0.4 to 0.8 GB/s on the benchmark VM against 1.4 to 1.7 this way (docs/performance.md).
  Status allocate_spans(const std::vector<SpanPlan>& spans) {
    std::vector<std::shared_ptr<PinnedBuffer>> fresh;
    for (const SpanPlan& s : spans) {
      const auto& [f, path] = reader.files_.at(s.file);
      uint64_t begin = align_down(s.begin, kReadAlignment);
      uint64_t end = std::min(align_up(s.end, kReadAlignment), f->size);
      FP_ASSIGN_OR_RETURN(std::shared_ptr<PinnedBuffer> buffer,
                          checkpoint::new_load_memory(end - begin));
      auto span = std::make_shared<LoadedSpan>();
      span->file = s.file;
      span->file_offset = begin;
      span->buffer = buffer;
      for (size_t i : s.requests) {
        const ManifestTensor& t = tensor_of(i);
        std::byte* at = buffer->data() + (t.offset - begin);
        out.spans[i] = span;
        out.data[i] = at;
        staged.push_back({path, f->size, t.offset, t.length, at});
        staged_request.push_back(i);
      }
      fresh.push_back(std::move(buffer));
    }
    checkpoint::prefault_load_memory(fresh);
    return Status::ok();
  }

  void finish_one() {
    Pending p = std::move(inflight.front());
    inflight.pop_front();
    direct_in_flight -= p.direct_bytes;
    if (!p.ticket.valid()) {  // an empty tensor: nothing read, the checksum of nothing
      const ManifestTensor& t = tensor_of(p.requests[0]);
      uint64_t empty = xxh3_64(nullptr, 0);
      if (verify && first.is_ok() && empty != t.checksum)
        first = checksum_mismatch(reader.path_of(t), t, empty);
      return;
    }
    auto r = p.ticket.wait();
    if (!r.is_ok()) {
      if (first.is_ok()) first = r.status();
      return;
    }
    if (!verify || !first.is_ok()) return;
    for (size_t i : p.requests) {
      const ManifestTensor& t = tensor_of(i);
      uint64_t actual = xxh3_64(out.data[i], t.length);
      if (actual != t.checksum) {
        first = checksum_mismatch(reader.path_of(t), t, actual);
        return;
      }
    }
  }

  // Destinations: straight into the caller's memory when it lines up with the file for
  // O_DIRECT, else through the staged ring (staged_read.h) once the reads above are done.
  void start_direct_reads() {
    for (size_t i = 0; i < requests.size() && first.is_ok(); ++i) {
      if (requests[i].destination == nullptr) continue;
      const ManifestTensor& t = tensor_of(i);
      if (t.length == 0) {
        inflight.push_back({IoTicket(), {i}, 0});
        continue;
      }
      auto address = reinterpret_cast<uintptr_t>(requests[i].destination);
      // Device memory goes through the staged ring too: the kernel cannot read into it.
      if (requests[i].device >= 0 || (address - t.offset) % kReadAlignment != 0) {
        staged.push_back({reader.path_of(t), reader.file_of(t).size, t.offset, t.length,
                          requests[i].destination, requests[i].device});
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
      req.path = reader.path_of(t);
      req.file_offset = t.offset;
      auto ticket = reader.engine_->start(req);
      if (!ticket.is_ok()) {
        first = ticket.status();
        break;
      }
      inflight.push_back({std::move(ticket).value(), {i}, t.length});
      direct_in_flight += t.length;
    }
  }

  void read_staged() {
    checkpoint::StagedReadOptions so;
    so.max_gap_bytes = max_gap_bytes;
    if (max_in_flight_bytes != 0 && max_in_flight_bytes < so.slot_bytes * so.slots) {
      so.slots = 2;
      so.slot_bytes = std::max(kReadAlignment, align_down(max_in_flight_bytes / 2, kReadAlignment));
    }
    if (verify) {
      so.on_checksum = [&](size_t target, uint64_t actual) {
        const ManifestTensor& t = tensor_of(staged_request[target]);
        return actual == t.checksum ? Status::ok()
                                    : checksum_mismatch(reader.path_of(t), t, actual);
      };
    }
    bool to_device = std::any_of(staged.begin(), staged.end(),
                                 [](const checkpoint::StagedTarget& t) { return t.device >= 0; });
    if (to_device) {
      // Copies to a device select it on the copying thread: not the caller's, whose current
      // device is its own business (torch's).
      std::thread copier([&] { first = checkpoint::read_staged(*reader.engine_, staged, so); });
      copier.join();
    } else {
      first = checkpoint::read_staged(*reader.engine_, staged, so);
    }
  }

  // Empty tensors read from spans: still check their recorded checksum.
  void check_empty_span_tensors() {
    for (size_t i = 0; i < requests.size() && verify && first.is_ok(); ++i) {
      const ManifestTensor& t = tensor_of(i);
      if (t.length == 0 && requests[i].destination == nullptr &&
          xxh3_64(nullptr, 0) != t.checksum) {
        first = checksum_mismatch(reader.path_of(t), t, xxh3_64(nullptr, 0));
      }
    }
  }
};

Result<CheckpointReader::ReadResult> CheckpointReader::Impl::read(
    const std::vector<TensorReadRequest>& requests, bool verify, uint64_t max_in_flight_bytes,
    uint64_t max_gap_bytes) {
  return ReadCall(*this, requests, verify, max_in_flight_bytes, max_gap_bytes).run();
}

Result<std::string> CheckpointReader::read_objects() {
  if (impl_->manifest().find_file(kObjectsFileName) == nullptr) return std::string();
  return impl_->read_file(kObjectsFileName);
}

Result<std::string> CheckpointReader::read_file(std::string_view name) {
  return impl_->read_file(name);
}

Result<std::string> CheckpointReader::Impl::read_file(std::string_view name) {
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
