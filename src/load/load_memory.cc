// SPDX-License-Identifier: Apache-2.0
// The caller's memory of a load (see load_plan.h): how far a destination reaches, whether this
// process may write it, and writing converted elements into it, strided or not.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/prefault.h"
#include "fastpersist/dtype.h"
#include "load/load_plan.h"

namespace fastpersist::checkpoint {
namespace {

bool multiply(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// [begin, end) of every writable mapping of this process, in address order.
std::optional<std::vector<std::pair<uintptr_t, uintptr_t>>> writable_mappings() {
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return std::nullopt;
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  char line[512];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long begin = 0, end = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &begin, &end, perms) == 3 && perms[1] == 'w') {
      if (!out.empty() && out.back().second == begin) {
        out.back().second = end;  // adjacent mappings make one writable range
      } else {
        out.emplace_back(begin, end);
      }
    }
    // A line longer than the buffer (a long path): skip its rest.
    while (std::strchr(line, '\n') == nullptr && std::fgets(line, sizeof line, maps) != nullptr) {
    }
  }
  std::fclose(maps);
  return out;
}

}  // namespace

Result<uint64_t> destination_extent(const std::vector<uint64_t>& shape,
                                    const std::vector<int64_t>& strides, size_t element_size) {
  uint64_t count = 1;
  for (uint64_t d : shape) {
    if (!multiply(count, d, &count))
      return Status(StatusCode::kInvalidArgument, "the shape overflows");
  }
  if (count == 0) return uint64_t{0};
  uint64_t bytes = 0;
  if (strides.empty()) {
    if (!multiply(count, element_size, &bytes))
      return Status(StatusCode::kInvalidArgument, "the shape overflows");
    return bytes;
  }
  if (strides.size() != shape.size()) {
    return Status(StatusCode::kInvalidArgument, "it has " + std::to_string(strides.size()) +
                                                    " strides for " + std::to_string(shape.size()) +
                                                    " dimensions");
  }
  // Sorted by stride, each dimension must step past everything the smaller ones reach: then no
  // two elements share memory, and the last element is the farthest.
  std::vector<std::pair<uint64_t, uint64_t>> dims;  // (stride, size)
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1) continue;
    if (strides[k] <= 0) {
      return Status(StatusCode::kInvalidArgument,
                    "its strides are negative or repeat elements (stride " +
                        std::to_string(strides[k]) + ")");
    }
    dims.emplace_back(static_cast<uint64_t>(strides[k]), shape[k]);
  }
  std::sort(dims.begin(), dims.end());
  uint64_t reach = 0;  // the farthest element offset so far
  for (const auto& [stride, size] : dims) {
    uint64_t step = 0;
    if (stride <= reach) {
      return Status(StatusCode::kInvalidArgument,
                    "its strides make elements overlap (stride " + std::to_string(stride) + ")");
    }
    if (!multiply(size - 1, stride, &step) || __builtin_add_overflow(reach, step, &reach)) {
      return Status(StatusCode::kInvalidArgument, "its strides overflow");
    }
  }
  if (!multiply(reach + 1, element_size, &bytes))
    return Status(StatusCode::kInvalidArgument, "its strides overflow");
  return bytes;
}

Status check_writable(std::vector<MemoryRange> ranges) {
  if (ranges.empty()) return Status::ok();
  auto mappings = writable_mappings();
  if (!mappings) return Status::ok();  // no /proc: the O_DIRECT reads would report EFAULT
  for (const MemoryRange& r : ranges) {
    auto begin = reinterpret_cast<uintptr_t>(r.data);
    uintptr_t end = 0;
    bool wraps = __builtin_add_overflow(begin, r.size, &end);
    // The last mapping that starts at or before `begin`.
    auto it =
        std::upper_bound(mappings->begin(), mappings->end(), std::make_pair(begin, UINTPTR_MAX));
    bool ok = !wraps && it != mappings->begin() && std::prev(it)->second >= end;
    if (!ok) {
      return Status(StatusCode::kInvalidArgument,
                    "the destination of '" + (r.name ? *r.name : std::string()) + "' (" +
                        std::to_string(r.size) + " bytes) is not writable memory of this process");
    }
  }
  return Status::ok();
}

Status write_elements(const std::byte* src, const std::string& src_dtype, uint64_t first,
                      uint64_t count, const OutputMemory& out) {
  const DtypeInfo* from = find_dtype(src_dtype);
  const DtypeInfo* to = find_dtype(out.dtype);
  if (from == nullptr || to == nullptr)
    return Status(StatusCode::kInternal, "write_elements: unknown dtype");
  const size_t rank = out.shape.size();
  if (out.strides.empty() || rank == 0) {
    return convert_elements(src_dtype, src, out.dtype, out.data + first * to->size,
                            static_cast<size_t>(count));
  }
  // Row by row along the last dimension: convert the row's run, then place it by stride.
  const uint64_t row_length = out.shape[rank - 1];
  const int64_t inner_stride = out.strides[rank - 1];
  std::vector<std::byte> row;
  for (uint64_t e = first; e < first + count;) {
    uint64_t row_index = e / row_length;
    uint64_t column = e % row_length;
    uint64_t take = std::min(row_length - column, first + count - e);
    int64_t offset = static_cast<int64_t>(column) * inner_stride;
    for (size_t k = rank - 1; k-- > 0;) {
      offset += static_cast<int64_t>(row_index % out.shape[k]) * out.strides[k];
      row_index /= out.shape[k];
    }
    std::byte* at = out.data + offset * static_cast<int64_t>(to->size);
    const std::byte* from_bytes = src + (e - first) * from->size;
    if (inner_stride == 1) {
      FP_RETURN_IF_ERROR(
          convert_elements(src_dtype, from_bytes, out.dtype, at, static_cast<size_t>(take)));
    } else {
      row.resize(static_cast<size_t>(take) * to->size);
      FP_RETURN_IF_ERROR(convert_elements(src_dtype, from_bytes, out.dtype, row.data(),
                                          static_cast<size_t>(take)));
      for (uint64_t j = 0; j < take; ++j) {
        std::memcpy(at + static_cast<int64_t>(j) * inner_stride * static_cast<int64_t>(to->size),
                    row.data() + j * to->size, to->size);
      }
    }
    e += take;
  }
  return Status::ok();
}

Result<std::shared_ptr<PinnedBuffer>> new_load_memory(uint64_t bytes, bool huge_pages) {
  FP_ASSIGN_OR_RETURN(PinnedBuffer b,
                      PinnedBuffer::allocate(static_cast<size_t>(std::max<uint64_t>(bytes, 1)),
                                             /*lock_memory=*/false));
  constexpr uint64_t kHugePage = uint64_t{2} << 20;
  if (huge_pages && bytes >= kHugePage)
    (void)::madvise(b.data(), static_cast<size_t>(bytes), MADV_HUGEPAGE);
  return std::make_shared<PinnedBuffer>(std::move(b));
}

void prefault_load_memory(const std::vector<std::shared_ptr<PinnedBuffer>>& buffers) {
  std::vector<std::pair<std::byte*, size_t>> ranges;
  ranges.reserve(buffers.size());
  for (const auto& b : buffers) ranges.emplace_back(b->data(), b->capacity());
  prefault_memory(ranges);
}

OutputMemory output_of(const LoadDestination& d) {
  OutputMemory out{d.data, d.dtype, d.shape, d.strides};
  if (is_contiguous(d.shape, d.strides)) out.strides.clear();
  return out;
}

}  // namespace fastpersist::checkpoint
