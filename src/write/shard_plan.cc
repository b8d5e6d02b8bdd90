// SPDX-License-Identifier: Apache-2.0
#include "write/shard_plan.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <unordered_set>

#include "buffer/cuda_runtime.h"

namespace fastpersist::checkpoint {

namespace {

Status check_tensor(const TensorSource& t) {
  auto fail = [&](const std::string& why) {
    return Status(StatusCode::kInvalidArgument, "tensor '" + t.name + "': " + why);
  };
  if (t.name.empty()) return {StatusCode::kInvalidArgument, "a tensor has an empty name"};
  if (t.name.rfind("__", 0) == 0)
    return fail("names starting with '__' are reserved by safetensors");
  auto elem = safetensors_dtype_size(t.dtype);
  if (!elem) return fail("unknown dtype '" + t.dtype + "'");
  uint64_t count = 1;
  for (uint64_t d : t.shape) {
    if (d != 0 && count > UINT64_MAX / d) return fail("element count overflows");
    count *= d;
  }
  if (count > UINT64_MAX / *elem || count * *elem != t.nbytes) {
    return fail("nbytes " + std::to_string(t.nbytes) + " does not match shape x dtype size");
  }
  if (t.nbytes > 0 && t.data == nullptr) return fail("no data");
  if (t.device < -1) return fail("invalid device " + std::to_string(t.device));
  if (t.device >= 0 && !buffer::cuda_runtime().available) {
    return Status(StatusCode::kUnavailable,
                  "tensor '" + t.name + "' is in the memory of CUDA device " +
                      std::to_string(t.device) +
                      ", but the CUDA runtime is not available: " + buffer::cuda_runtime().reason);
  }
  return Status::ok();
}

// The most a tensor of `nbytes` can take in an encoded file whose chunks are `chunk` bytes (the
// writer's: 4 MiB, or a smaller staging window: encoded_file_writer.cc).
uint64_t encoded_bound(Compression c, uint64_t nbytes, uint32_t chunk) {
  uint64_t chunks = chunk_count(nbytes, chunk);
  uint64_t full = nbytes / chunk;
  uint64_t bound = full * chunk_frame_bound(c, chunk) + chunk_table_bytes(chunks);
  if (chunks > full) bound += chunk_frame_bound(c, static_cast<size_t>(nbytes % chunk));
  return std::max(nbytes, bound);
}

}  // namespace

uint64_t encoded_header_reserve(const SafetensorsHeader& raw_layout) {
  constexpr uint64_t kEntrySlack = 64;
  constexpr uint64_t kMetadataSlack = 128;  // the "fastpersist.encoding" entry
  uint64_t bytes = raw_layout.data_start + kEntrySlack * raw_layout.tensors.size() + kMetadataSlack;
  return (bytes + kSafetensorsDefaultAlignment - 1) / kSafetensorsDefaultAlignment *
         kSafetensorsDefaultAlignment;
}

Result<std::vector<PlannedFile>> plan_files(const std::vector<TensorSource>& tensors,
                                            const DataFileOptions& options,
                                            std::optional<uint32_t> rank,
                                            const std::vector<std::optional<DeltaSource>>& deltas) {
  std::unordered_set<std::string> names;
  uint64_t total = 0;
  for (const TensorSource& t : tensors) {
    FP_RETURN_IF_ERROR(check_tensor(t));
    if (!names.insert(t.name).second) {
      return Status(StatusCode::kInvalidArgument, "tensor name '" + t.name + "' appears twice");
    }
    total += t.nbytes;
  }
  uint64_t target = std::max<uint64_t>(options.target_file_bytes, 1);
  uint64_t min_file = std::max<uint64_t>(options.min_file_bytes, 1);
  uint64_t by_target = (total + target - 1) / target;
  uint64_t by_parallel =
      std::min<uint64_t>(std::max(options.max_parallel_files, 1u), total / min_file);
  uint64_t count = std::max<uint64_t>({by_target, by_parallel, 1});
  count = std::min<uint64_t>(count, tensors.size());  // no tensors: no data file at all

  // Largest first onto the least-filled file.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].nbytes > tensors[b].nbytes; });
  std::vector<uint64_t> fill(count, 0);
  std::vector<std::vector<size_t>> members(count);
  for (size_t i : order) {
    size_t f = static_cast<size_t>(std::min_element(fill.begin(), fill.end()) - fill.begin());
    fill[f] += tensors[i].nbytes;
    members[f].push_back(i);
  }

  std::vector<PlannedFile> files;
  files.reserve(count);
  for (size_t f = 0; f < count; ++f) {
    PlannedFile file;
    file.name = data_file_name(f, count, rank);
    // The caller's order, then widest element first (widest_first_order, safetensors.h): every
    // offset is a multiple of the element size.
    std::vector<size_t>& given = members[f];
    std::sort(given.begin(), given.end());
    std::vector<SafetensorsEntry> entries;
    entries.reserve(given.size());
    for (size_t i : given) entries.push_back({tensors[i].name, tensors[i].dtype, tensors[i].shape});
    const std::vector<size_t> data_order = widest_first_order(entries);
    std::vector<SafetensorsEntry> laid_out;
    laid_out.reserve(data_order.size());
    for (size_t k : data_order) {
      file.tensors.push_back(given[k]);
      laid_out.push_back(std::move(entries[k]));
    }
    entries = std::move(laid_out);
    FP_ASSIGN_OR_RETURN(file.header,
                        encode_safetensors_header(entries, {{"format", "pt"}},
                                                  kSafetensorsDefaultAlignment, &file.layout));
    file.size = file.layout.file_bytes();
    auto has_delta = [&](size_t i) { return i < deltas.size() && deltas[i].has_value(); };
    if (options.compression != Compression::kNone ||
        std::any_of(file.tensors.begin(), file.tensors.end(), has_delta)) {
      file.encoded = true;
      file.encoded_header_bytes = encoded_header_reserve(file.layout);
      file.size = file.encoded_header_bytes;
      const auto chunk = static_cast<uint32_t>(
          std::min<size_t>(kCodecChunkBytes, options.effective_window_bytes()));
      for (size_t i : file.tensors) {
        uint64_t bound = encoded_bound(options.compression, tensors[i].nbytes, chunk);
        // A delta is zstd frames, whatever the codec of the others.
        if (has_delta(i))
          bound = std::max(bound, encoded_bound(Compression::kZstd, tensors[i].nbytes, chunk));
        file.size += bound;
      }
    }
    files.push_back(std::move(file));
  }
  return files;
}

}  // namespace fastpersist::checkpoint
