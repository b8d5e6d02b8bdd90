// SPDX-License-Identifier: Apache-2.0
// verify_checkpoint: every byte of every file of a checkpoint checked against the manifest,
// streaming (memory stays at two read windows whatever the checkpoint's size). Linear in the
// number of tensors: each file's tensors come from one ManifestIndex, its header's by a hash
// map, and the checksum ranges of a file are walked once in offset order.
#include <algorithm>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>

#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/checksum.h"
#include "fastpersist/manifest_index.h"
#include "fastpersist/safetensors.h"
#include "load/delta_base.h"
#include "load/encoded_read.h"
#include "load/file_stream.h"
#include "load/verify_file.h"

namespace fastpersist {
namespace {

const std::string kStoredDtype = "U8";

std::string describe(const Status& st) {
  std::string text = st.message();
  if (st.sys_errno() != 0) text += " (errno " + std::to_string(st.sys_errno()) + ")";
  return text;
}

// Header of a data file against the manifest's view of the same tensors.
void check_header(const std::string& path, const ManifestFile& f, const Manifest& m,
                  std::span<const size_t> tensors, std::vector<std::string>& problems) {
  auto header = read_safetensors_header(path);
  if (!header.is_ok()) {
    problems.push_back(f.name + ": safetensors header unreadable: " + describe(header.status()));
    return;
  }
  if (header->data_start != f.checksum_bytes) {
    problems.push_back(f.name + ": header is " + std::to_string(header->data_start) +
                       " bytes, the manifest says " + std::to_string(f.checksum_bytes));
  }
  std::unordered_map<std::string_view, size_t> by_name;
  by_name.reserve(header->tensors.size());
  for (size_t k = 0; k < header->tensors.size(); ++k) by_name.emplace(header->tensors[k].name, k);
  for (size_t i : tensors) {
    const ManifestTensor& t = m.tensors[i];
    if (!check_encoding_supported(t).is_ok()) continue;  // reported once, by the caller
    auto k = by_name.find(t.name);
    if (k == by_name.end()) {
      problems.push_back("tensor '" + t.name + "': missing from the header of " + f.name);
      continue;
    }
    const SafetensorsTensor& h = header->tensors[k->second];
    // A compressed tensor is a U8 entry of its stored bytes (encoded_file_writer.h).
    const bool raw = t.encoding == kEncodingRaw;
    const std::string& dtype = raw ? t.dtype : kStoredDtype;
    const std::vector<uint64_t> shape = raw ? t.shape : std::vector<uint64_t>{t.stored_length};
    if (h.dtype != dtype || h.shape != shape || header->data_start + h.begin != t.offset ||
        h.nbytes() != t.stored_length) {
      problems.push_back("tensor '" + t.name + "': the header of " + f.name +
                         " disagrees with the manifest (dtype, shape or offsets)");
    }
  }
}

// The base bytes of an XOR delta (null for other tensors), found from the checkpoint's directory.
Result<std::shared_ptr<const checkpoint::DeltaBaseBytes>> delta_base(const std::string& dir,
                                                                     const Manifest& m,
                                                                     const ManifestTensor& t) {
  if (!t.delta_base) return std::shared_ptr<const checkpoint::DeltaBaseBytes>();
  const ManifestFile* file = m.find_file(t.delta_base->file);
  if (dir.empty() || file == nullptr) {
    return Status(StatusCode::kInternal,
                  checkpoint::tensor_place(t) + ": the base of an XOR delta cannot be found");
  }
  FP_ASSIGN_OR_RETURN(std::string path, checkpoint::resolve_manifest_file(dir, *file));
  return checkpoint::DeltaBaseBytes::open(t, path);
}

constexpr size_t kLeadingBytes = SIZE_MAX;

// One checked range of a file: its leading bytes or one tensor's stored bytes.
struct CheckedRange {
  uint64_t begin, end, expected;
  size_t tensor;  // index into m.tensors, or kLeadingBytes for the file's leading bytes
  // Compressed tensors: the stored bytes are decoded as they stream by, and the raw bytes
  // hashed (the checksum is of those). Null: the bytes themselves are hashed.
  std::unique_ptr<checkpoint::FrameStream> frames;
  Status damage;  // a frame that did not decode
};

// The ranges of file `f` to check, in file order.
std::vector<CheckedRange> ranges_of(const ManifestFile& f, const Manifest& m,
                                    std::span<const size_t> tensors, bool checksums) {
  std::vector<CheckedRange> ranges;
  ranges.reserve(tensors.size() + 1);
  if (checksums) ranges.push_back({0, f.checksum_bytes, f.checksum, kLeadingBytes, nullptr, {}});
  for (size_t i : tensors) {
    const ManifestTensor& t = m.tensors[i];
    // The checksum is of the raw bytes; only a supported encoding can give them back. Without
    // checksums, compressed tensors are still decoded: their frames carry content checksums of
    // their own, so damage shows even then.
    if (!check_encoding_supported(t).is_ok()) continue;
    if (!checksums && t.encoding == kEncodingRaw) continue;
    ranges.push_back({t.offset, t.offset + t.stored_length, t.checksum, i, nullptr, {}});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const CheckedRange& a, const CheckedRange& b) { return a.begin < b.begin; });
  return ranges;
}

// A FrameStream for each compressed range, hashing the decoded bytes into its stream; a table
// or base that cannot be read is the range's damage.
void open_frames(const std::string& path, const Manifest& m, const std::string& checkpoint_dir,
                 std::vector<CheckedRange>& ranges, std::vector<Xxh3Stream>& streams) {
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (ranges[r].tensor == kLeadingBytes) continue;
    const ManifestTensor& t = m.tensors[ranges[r].tensor];
    if (t.encoding == kEncodingRaw) continue;
    Result<ChunkTable> table = checkpoint::read_chunk_table(path, t);
    if (!table.is_ok()) {
      ranges[r].damage = table.status();
      continue;
    }
    Result<std::shared_ptr<const checkpoint::DeltaBaseBytes>> base =
        delta_base(checkpoint_dir, m, t);
    if (!base.is_ok()) {
      ranges[r].damage = base.status();
      continue;
    }
    Xxh3Stream* hash = &streams[r];
    ranges[r].frames = std::make_unique<checkpoint::FrameStream>(
        t, std::move(table).value(),
        [hash](uint64_t, const std::byte* data, size_t n) {
          hash->update(data, n);
          return Status::ok();
        },
        std::move(base).value());
  }
}

// Each range's verdict once the file has streamed by: damage, a digest that disagrees with a
// matching checksum, or a checksum mismatch.
void report_ranges(const ManifestFile& f, const Manifest& m, bool checksums,
                   std::vector<CheckedRange>& ranges, std::vector<Xxh3Stream>& streams,
                   std::vector<std::string>& problems) {
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (ranges[r].frames && ranges[r].damage.is_ok()) ranges[r].damage = ranges[r].frames->finish();
    if (!ranges[r].damage.is_ok()) {
      problems.push_back(ranges[r].damage.message());
      continue;
    }
    if (!checksums) continue;  // decoded without damage is all that can be known
    uint64_t actual = streams[r].digest();
    if (ranges[r].tensor != kLeadingBytes) {
      // The XXH3-128 content digest (incremental saves reference a base tensor by it) must
      // describe the same bytes as the checksum: a manifest edited in one and not the other
      // would make a later save reference the wrong bytes.
      const ManifestTensor& t = m.tensors[ranges[r].tensor];
      if (t.digest && actual == ranges[r].expected && streams[r].digest128() != *t.digest) {
        problems.push_back("tensor '" + t.name + "' in " + f.name +
                           ": its xxh3_128 content digest " + digest_to_hex(*t.digest) +
                           " is not that of its bytes (" + digest_to_hex(streams[r].digest128()) +
                           "), though its checksum matches: a forged or damaged manifest");
        continue;
      }
    }
    if (actual == ranges[r].expected) continue;
    std::string what = ranges[r].tensor != kLeadingBytes
                           ? "tensor '" + m.tensors[ranges[r].tensor].name + "'"
                       : f.role == "objects" ? f.name
                                             : "header of " + f.name;
    problems.push_back(what + " in " + f.name + " (offset " + std::to_string(ranges[r].begin) +
                       ", length " + std::to_string(ranges[r].end - ranges[r].begin) +
                       ") fails its checksum: manifest " + checksum_to_hex(ranges[r].expected) +
                       ", data " + checksum_to_hex(actual));
  }
}

// Streams one file, checksumming its leading bytes and each tensor's range (with `checksums`)
// and handing every byte to the sink (when there is one).
Status check_data(const std::string& path, const ManifestFile& f, const Manifest& m,
                  std::span<const size_t> tensors, bool checksums, const checkpoint::FileCheck& io,
                  std::vector<std::string>& problems) {
  std::vector<CheckedRange> ranges = ranges_of(f, m, tensors, checksums);
  std::vector<Xxh3Stream> streams(ranges.size());
  open_frames(path, m, io.checkpoint_dir, ranges, streams);
  size_t first_open = 0;
  auto consume = [&](uint64_t off, const std::byte* data, size_t n) -> Status {
    if (io.sink) FP_RETURN_IF_ERROR(io.sink(off, data, n));
    uint64_t end = off + n;
    for (size_t r = first_open; r < ranges.size() && ranges[r].begin < end; ++r) {
      uint64_t b = std::max(ranges[r].begin, off);
      uint64_t e = std::min(ranges[r].end, end);
      if (b >= e) continue;
      CheckedRange& range = ranges[r];
      if (range.frames && range.damage.is_ok()) {
        range.damage = range.frames->feed(data + (b - off), static_cast<size_t>(e - b));
      } else if (!range.frames && range.damage.is_ok()) {
        streams[r].update(data + (b - off), static_cast<size_t>(e - b));
      }
    }
    while (first_open < ranges.size() && ranges[first_open].end <= end) ++first_open;
    *io.checked += n;
    if (io.progress) io.progress(*io.checked, io.total);
    return Status::ok();
  };
  FP_RETURN_IF_ERROR(
      checkpoint::stream_file(path, f.size, io.engine, consume, io.window_bytes, io.before_read));
  report_ranges(f, m, checksums, ranges, streams, problems);
  return Status::ok();
}

}  // namespace

namespace checkpoint {

Status check_checkpoint_file(const std::string& path, const Manifest& m, size_t file,
                             std::span<const size_t> tensors, const FileCheck& io,
                             std::vector<std::string>& problems) {
  const ManifestFile& f = m.files[file];
  auto size = file_size(path);
  if (!size.is_ok()) {
    problems.push_back(f.name + ": missing (" + describe(size.status()) + ")");
    return Status::ok();
  }
  if (*size != f.size) {
    problems.push_back(f.name + ": " + std::to_string(*size) + " bytes, the manifest says " +
                       std::to_string(f.size) + " (truncated or replaced)");
    return Status::ok();
  }
  if (f.role == "tensors") check_header(path, f, m, tensors, problems);
  const bool checksums = m.checksum_algorithm != kNoChecksum;
  const bool encoded = std::any_of(tensors.begin(), tensors.end(),
                                   [&](size_t i) { return m.tensors[i].encoding != kEncodingRaw; });
  if (!checksums && !io.sink && !encoded) return Status::ok();
  return check_data(path, f, m, tensors, checksums, io, problems);
}

}  // namespace checkpoint

Result<VerifyReport> verify_checkpoint(const std::string& dir, IoEngine& engine,
                                       const std::function<void(uint64_t, uint64_t)>& progress) {
  VerifyReport report;
  auto manifest = read_manifest(dir);
  if (!manifest.is_ok()) {
    if (manifest.status().code() == StatusCode::kNotFound) {
      auto listing = checkpoint::list_dir(dir);
      if (!listing.is_ok()) return listing.status();  // the directory itself is not there
      report.problems.push_back(std::string(kManifestFileName) +
                                " is missing: not a committed checkpoint");
    } else if (manifest.status().code() == StatusCode::kDataLoss) {
      report.problems.push_back(std::string(kManifestFileName) +
                                " is damaged: " + describe(manifest.status()));
    } else {
      return manifest.status();
    }
    return report;
  }
  const Manifest& m = *manifest;
  const ManifestIndex index(m);
  report.has_checksums = m.checksum_algorithm != kNoChecksum;
  for (const ManifestTensor& t : m.tensors) {
    if (Status st = check_encoding_supported(t); !st.is_ok())
      report.problems.push_back(st.message());
  }
  uint64_t total = 0;
  for (const ManifestFile& f : m.files) total += f.size;
  checkpoint::FileCheck io{
      engine, nullptr, &report.bytes_checked, progress, total, size_t{32} << 20, nullptr, dir};
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    auto resolved = checkpoint::resolve_manifest_file(dir, f);
    if (!resolved.is_ok()) {
      report.problems.push_back(f.name + ": " + describe(resolved.status()));
      continue;
    }
    Status st = checkpoint::check_checkpoint_file(*resolved, m, i, index.tensors_in(i), io,
                                                  report.problems);
    if (!st.is_ok()) report.problems.push_back(f.name + ": cannot be read: " + st.to_string());
  }
  return report;
}

}  // namespace fastpersist
