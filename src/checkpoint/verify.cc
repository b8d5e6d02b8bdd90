// SPDX-License-Identifier: Apache-2.0
// verify_checkpoint: every byte of every file of a checkpoint checked against the manifest,
// streaming (memory stays at two read windows whatever the checkpoint's size).
#include <algorithm>
#include <map>

#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/file_stream.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/checksum.h"
#include "fastpersist/safetensors.h"

namespace fastpersist {
namespace {

std::string describe(const Status& st) {
  std::string text = st.message();
  if (st.sys_errno() != 0) text += " (errno " + std::to_string(st.sys_errno()) + ")";
  return text;
}

// Header of a data file against the manifest's view of the same tensors.
void check_header(const std::string& path, const ManifestFile& f, const Manifest& m,
                  std::vector<std::string>& problems) {
  auto header = read_safetensors_header(path);
  if (!header.is_ok()) {
    problems.push_back(f.name + ": safetensors header unreadable: " + describe(header.status()));
    return;
  }
  if (header->data_start != f.checksum_bytes) {
    problems.push_back(f.name + ": header is " + std::to_string(header->data_start) +
                       " bytes, the manifest says " + std::to_string(f.checksum_bytes));
  }
  for (const ManifestTensor& t : m.tensors) {
    if (t.file != f.name) continue;
    auto k = header->find(t.name);
    if (!k) {
      problems.push_back("tensor '" + t.name + "': missing from the header of " + f.name);
      continue;
    }
    const SafetensorsTensor& h = header->tensors[*k];
    if (h.dtype != t.dtype || h.shape != t.shape || header->data_start + h.begin != t.offset ||
        h.nbytes() != t.length) {
      problems.push_back("tensor '" + t.name + "': the header of " + f.name +
                         " disagrees with the manifest (dtype, shape or offsets)");
    }
  }
}

// Streams one file, checksumming its leading bytes and each tensor's range.
Status check_data(const std::string& path, const ManifestFile& f, const Manifest& m,
                  IoEngine& engine, uint64_t* checked,
                  const std::function<void(uint64_t, uint64_t)>& progress, uint64_t total,
                  std::vector<std::string>& problems) {
  struct Range {
    uint64_t begin, end, expected;
    std::string what;
  };
  std::vector<Range> ranges;
  ranges.push_back({0, f.checksum_bytes, f.checksum,
                    f.role == "objects" ? f.name : "header of " + f.name});
  for (const ManifestTensor& t : m.tensors) {
    if (t.file == f.name) ranges.push_back({t.offset, t.offset + t.length, t.checksum, "tensor '" + t.name + "'"});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Xxh3Stream> streams(ranges.size());
  size_t first_open = 0;
  auto consume = [&](uint64_t off, const std::byte* data, size_t n) {
    uint64_t end = off + n;
    for (size_t r = first_open; r < ranges.size() && ranges[r].begin < end; ++r) {
      uint64_t b = std::max(ranges[r].begin, off);
      uint64_t e = std::min(ranges[r].end, end);
      if (b < e) streams[r].update(data + (b - off), static_cast<size_t>(e - b));
    }
    while (first_open < ranges.size() && ranges[first_open].end <= end) ++first_open;
    *checked += n;
    if (progress) progress(*checked, total);
  };
  FP_RETURN_IF_ERROR(checkpoint::stream_file(path, f.size, engine, consume));
  for (size_t r = 0; r < ranges.size(); ++r) {
    uint64_t actual = streams[r].digest();
    if (actual != ranges[r].expected) {
      problems.push_back(ranges[r].what + " in " + f.name + " (offset " + std::to_string(ranges[r].begin) +
                         ", length " + std::to_string(ranges[r].end - ranges[r].begin) +
                         ") fails its checksum: manifest " + checksum_to_hex(ranges[r].expected) +
                         ", data " + checksum_to_hex(actual));
    }
  }
  return Status::ok();
}

}  // namespace

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
  report.has_checksums = m.checksum_algorithm != kNoChecksum;
  uint64_t total = 0;
  for (const ManifestFile& f : m.files) total += f.size;
  for (const ManifestFile& f : m.files) {
    std::string path = checkpoint::join_path(dir, f.name);
    auto size = checkpoint::file_size(path);
    if (!size.is_ok()) {
      report.problems.push_back(f.name + ": missing (" + describe(size.status()) + ")");
      continue;
    }
    if (*size != f.size) {
      report.problems.push_back(f.name + ": " + std::to_string(*size) + " bytes, the manifest says " +
                                std::to_string(f.size) + " (truncated or replaced)");
      continue;
    }
    if (f.role == "tensors") check_header(path, f, m, report.problems);
    if (!report.has_checksums) continue;
    Status st = check_data(path, f, m, engine, &report.bytes_checked, progress, total, report.problems);
    if (!st.is_ok()) report.problems.push_back(f.name + ": cannot be read: " + st.to_string());
  }
  return report;
}

}  // namespace fastpersist
