// SPDX-License-Identifier: Apache-2.0
// CheckpointReader::load: runs a LoadPlan (load_plan.h). Direct reads first (one read() call,
// at most max_memory in flight), then the tensors streamed in pieces, then the compressed
// tensors (load_decode.cc), then the tensors read into spans, in batches of at most max_memory
// (64 MiB when progress is reported) so that the memory of converted tensors' spans is released
// batch by batch.
#include <algorithm>
#include <cstring>

#include "checkpoint/load_plan.h"
#include "common/align.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/dtype.h"

namespace fastpersist {
namespace {

constexpr uint64_t kProgressBatchBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxGapBytes = uint64_t{1} << 20;
constexpr size_t kResultAlignment = 64;  // of every tensor placed in new memory

uint64_t element_count(const ManifestTensor& t) { return t.length / find_dtype(t.dtype)->size; }

Result<std::shared_ptr<PinnedBuffer>> new_memory(uint64_t bytes) {
  return checkpoint::new_load_memory(bytes);
}

}  // namespace

Result<LoadResult> CheckpointReader::load(const LoadRequest& request) {
  using checkpoint::LoadRoute;
  FP_ASSIGN_OR_RETURN(checkpoint::LoadPlan plan, checkpoint::plan_load(manifest_, dir_, request));
  LoadResult out;
  out.destinations = std::move(plan.destination_state);
  out.missing = std::move(plan.missing);
  out.unexpected = std::move(plan.unexpected);
  out.mismatched = std::move(plan.mismatched);
  out.loaded_index.assign(manifest_.tensors.size(), -1);
  out.tensors.resize(plan.tensors.size());
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    const checkpoint::PlannedTensor& p = plan.tensors[k];
    LoadedTensor& lt = out.tensors[k];
    lt.tensor = p.tensor;
    lt.dtype = p.dtype;
    lt.shape = manifest_.tensors[p.tensor].shape;
    lt.nbytes = element_count(manifest_.tensors[p.tensor]) * find_dtype(p.dtype)->size;
    if (!p.destinations.empty()) lt.destination = static_cast<long>(p.destinations[0]);
    out.loaded_index[p.tensor] = static_cast<long>(k);
  }
  const bool verify = request.verify;
  const uint64_t total = plan.total_bytes;
  auto report = [&](uint64_t bytes) {
    out.bytes_read += bytes;
    if (request.progress) request.progress(out.bytes_read, total);
  };
  if (request.progress) request.progress(0, total);
  auto outputs_of = [&](const checkpoint::PlannedTensor& p) {
    std::vector<checkpoint::OutputMemory> outputs;
    for (size_t d : p.destinations)
      outputs.push_back(checkpoint::output_of(request.destinations[d]));
    return outputs;
  };

  // 1. Straight into the caller's memory.
  std::vector<TensorReadRequest> direct;
  uint64_t direct_bytes = 0;
  for (const checkpoint::PlannedTensor& p : plan.tensors) {
    if (p.route != LoadRoute::kDirect) continue;
    const LoadDestination& d = request.destinations[p.destinations[0]];
    direct.push_back(
        {p.tensor, d.data, d.capacity_bytes, d.memory == MemoryKind::kHost ? -1 : d.device});
    direct_bytes += manifest_.tensors[p.tensor].length;
  }
  if (!direct.empty()) {
    FP_RETURN_IF_ERROR(read(direct, verify, request.max_memory, kMaxGapBytes).status());
    report(direct_bytes);
  }

  // 2. Larger than the budget: in pieces, each converted into its final memory.
  const uint64_t piece_bytes = std::max<uint64_t>(4096, align_down(request.max_memory / 2, 4096));
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    const checkpoint::PlannedTensor& p = plan.tensors[k];
    if (p.route != LoadRoute::kStream) continue;
    const ManifestTensor& t = manifest_.tensors[p.tensor];
    std::vector<checkpoint::OutputMemory> outputs = outputs_of(p);
    LoadedTensor& lt = out.tensors[k];
    if (outputs.empty()) {
      FP_ASSIGN_OR_RETURN(lt.buffer, new_memory(lt.nbytes));
      outputs.push_back({lt.buffer->data(), p.dtype, t.shape, {}});
    }
    const size_t element = find_dtype(t.dtype)->size;
    auto sink = [&](uint64_t offset, const std::byte* data, size_t size) -> Status {
      for (const checkpoint::OutputMemory& o : outputs) {
        FP_RETURN_IF_ERROR(
            checkpoint::write_elements(data, t.dtype, offset / element, size / element, o));
      }
      return Status::ok();
    };
    FP_RETURN_IF_ERROR(read_pieces(p.tensor, piece_bytes, verify, sink));
    report(t.length);
  }

  // 3. Compressed: decoded on every core, batch by batch (load_decode.cc).
  FP_RETURN_IF_ERROR(load_decoded(plan, request, out, report));

  // 4. Into spans: the results themselves, or converted into their outputs batch by batch.
  auto run_batch = [&](const std::vector<size_t>& batch, uint64_t batch_bytes) -> Status {
    std::vector<TensorReadRequest> reads;
    reads.reserve(batch.size());
    uint64_t converted_bytes = 0;
    for (size_t k : batch) {
      const checkpoint::PlannedTensor& p = plan.tensors[k];
      reads.push_back({p.tensor, nullptr});
      if (p.route == LoadRoute::kConvert && p.destinations.empty()) {
        converted_bytes += align_up(out.tensors[k].nbytes, kResultAlignment);
      }
    }
    FP_ASSIGN_OR_RETURN(ReadResult spans, read(reads, verify, 0, kMaxGapBytes));
    std::shared_ptr<PinnedBuffer> converted;
    if (converted_bytes > 0) {
      FP_ASSIGN_OR_RETURN(converted, new_memory(converted_bytes));
    }
    size_t converted_at = 0;
    for (size_t j = 0; j < batch.size(); ++j) {
      const checkpoint::PlannedTensor& p = plan.tensors[batch[j]];
      const ManifestTensor& t = manifest_.tensors[p.tensor];
      LoadedTensor& lt = out.tensors[batch[j]];
      if (t.length == 0) continue;  // nothing to place; an empty result
      const std::byte* data = spans.data[j];
      if (p.route == LoadRoute::kSpan) {
        const std::shared_ptr<PinnedBuffer>& buffer = spans.spans[j]->buffer;
        auto offset = static_cast<size_t>(data - buffer->data());
        if (offset % find_dtype(t.dtype)->size == 0) {
          lt.buffer = buffer;
          lt.offset = offset;
        } else {  // another writer's file may misalign a tensor: copy rather than fail
          FP_ASSIGN_OR_RETURN(lt.buffer, new_memory(t.length));
          std::memcpy(lt.buffer->data(), data, static_cast<size_t>(t.length));
        }
        continue;
      }
      std::vector<checkpoint::OutputMemory> outputs = outputs_of(p);
      if (outputs.empty()) {
        lt.buffer = converted;
        lt.offset = converted_at;
        outputs.push_back({converted->data() + converted_at, p.dtype, t.shape, {}});
        converted_at += align_up(lt.nbytes, kResultAlignment);
      }
      for (const checkpoint::OutputMemory& o : outputs) {
        FP_RETURN_IF_ERROR(checkpoint::write_elements(data, t.dtype, 0, element_count(t), o));
      }
    }
    report(batch_bytes);
    return Status::ok();
  };
  uint64_t limit = request.max_memory;
  if (request.progress)
    limit = std::min(limit == 0 ? kProgressBatchBytes : limit, kProgressBatchBytes);
  std::vector<size_t> batch;
  uint64_t batch_bytes = 0;
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    const checkpoint::PlannedTensor& p = plan.tensors[k];
    if (p.route != LoadRoute::kSpan && p.route != LoadRoute::kConvert) continue;
    uint64_t length = manifest_.tensors[p.tensor].length;
    if (limit != 0 && !batch.empty() && batch_bytes + length > limit) {
      FP_RETURN_IF_ERROR(run_batch(batch, batch_bytes));
      batch.clear();
      batch_bytes = 0;
    }
    batch.push_back(k);
    batch_bytes += length;
  }
  if (!batch.empty()) FP_RETURN_IF_ERROR(run_batch(batch, batch_bytes));
  return out;
}

}  // namespace fastpersist
