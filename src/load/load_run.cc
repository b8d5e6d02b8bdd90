// SPDX-License-Identifier: Apache-2.0
// CheckpointReader::load: runs a LoadPlan (load_plan.h). Direct reads first (one read() call,
// at most max_memory in flight), then the tensors streamed in pieces, then the compressed
// tensors (load_decode.cc), then the tensors read into spans, in batches of at most max_memory
// (64 MiB when progress is reported) so that the memory of converted tensors' spans is released
// batch by batch.
#include <algorithm>
#include <cstring>

#include "common/align.h"
#include "fastpersist/dtype.h"
#include "load/load_plan.h"
#include "load/reader_impl.h"

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

struct CheckpointReader::Impl::LoadRun {
  Impl& reader;
  const LoadRequest& request;
  checkpoint::LoadPlan plan;
  LoadResult out;
  uint64_t total = 0;

  const ManifestTensor& tensor_of(const checkpoint::PlannedTensor& p) const {
    return reader.manifest_.tensors[p.tensor];
  }

  Result<LoadResult> run() {
    describe_results();
    total = plan.total_bytes;
    if (request.progress) request.progress(0, total);
    FP_RETURN_IF_ERROR(read_direct());
    FP_RETURN_IF_ERROR(read_streamed());
    // 3. Compressed: decoded on every core, batch by batch (load_decode.cc).
    FP_RETURN_IF_ERROR(
        reader.load_decoded(plan, request, out, [this](uint64_t bytes) { report(bytes); }));
    FP_RETURN_IF_ERROR(read_spans());
    return std::move(out);
  }

  void report(uint64_t bytes) {
    out.bytes_read += bytes;
    if (request.progress) request.progress(out.bytes_read, total);
  }

  // What the plan decided, before any read: each loaded tensor's dtype, shape, size and place.
  void describe_results() {
    out.destinations = std::move(plan.destination_state);
    out.missing = std::move(plan.missing);
    out.unexpected = std::move(plan.unexpected);
    out.mismatched = std::move(plan.mismatched);
    out.loaded_index.assign(reader.manifest_.tensors.size(), -1);
    out.tensors.resize(plan.tensors.size());
    for (size_t k = 0; k < plan.tensors.size(); ++k) {
      const checkpoint::PlannedTensor& p = plan.tensors[k];
      LoadedTensor& lt = out.tensors[k];
      lt.tensor = p.tensor;
      lt.dtype = p.dtype;
      lt.shape = tensor_of(p).shape;
      lt.nbytes = element_count(tensor_of(p)) * find_dtype(p.dtype)->size;
      if (!p.destinations.empty()) lt.destination = static_cast<long>(p.destinations[0]);
      out.loaded_index[p.tensor] = static_cast<long>(k);
    }
  }

  std::vector<checkpoint::OutputMemory> outputs_of(const checkpoint::PlannedTensor& p) const {
    std::vector<checkpoint::OutputMemory> outputs;
    for (size_t d : p.destinations)
      outputs.push_back(checkpoint::output_of(request.destinations[d]));
    return outputs;
  }

  // 1. Straight into the caller's memory.
  Status read_direct() {
    std::vector<TensorReadRequest> direct;
    uint64_t direct_bytes = 0;
    for (const checkpoint::PlannedTensor& p : plan.tensors) {
      if (p.route != checkpoint::LoadRoute::kDirect) continue;
      const LoadDestination& d = request.destinations[p.destinations[0]];
      direct.push_back(
          {p.tensor, d.data, d.capacity_bytes, d.memory == MemoryKind::kHost ? -1 : d.device});
      direct_bytes += tensor_of(p).length;
    }
    if (direct.empty()) return Status::ok();
    FP_RETURN_IF_ERROR(
        reader.read(direct, request.verify, request.max_memory, kMaxGapBytes).status());
    report(direct_bytes);
    return Status::ok();
  }

  // 2. Larger than the budget: in pieces, each converted into its final memory.
  Status read_streamed() {
    const uint64_t piece_bytes = std::max<uint64_t>(4096, align_down(request.max_memory / 2, 4096));
    for (size_t k = 0; k < plan.tensors.size(); ++k) {
      const checkpoint::PlannedTensor& p = plan.tensors[k];
      if (p.route != checkpoint::LoadRoute::kStream) continue;
      const ManifestTensor& t = tensor_of(p);
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
      FP_RETURN_IF_ERROR(reader.read_pieces(p.tensor, piece_bytes, request.verify, sink));
      report(t.length);
    }
    return Status::ok();
  }

  // 4. Into spans: the results themselves, or converted into their outputs batch by batch.
  Status read_spans() {
    uint64_t limit = request.max_memory;
    if (request.progress)
      limit = std::min(limit == 0 ? kProgressBatchBytes : limit, kProgressBatchBytes);
    std::vector<size_t> batch;
    uint64_t batch_bytes = 0;
    for (size_t k = 0; k < plan.tensors.size(); ++k) {
      const checkpoint::PlannedTensor& p = plan.tensors[k];
      if (p.route != checkpoint::LoadRoute::kSpan && p.route != checkpoint::LoadRoute::kConvert)
        continue;
      uint64_t length = tensor_of(p).length;
      if (limit != 0 && !batch.empty() && batch_bytes + length > limit) {
        FP_RETURN_IF_ERROR(run_batch(batch, batch_bytes));
        batch.clear();
        batch_bytes = 0;
      }
      batch.push_back(k);
      batch_bytes += length;
    }
    if (!batch.empty()) FP_RETURN_IF_ERROR(run_batch(batch, batch_bytes));
    return Status::ok();
  }

  Status run_batch(const std::vector<size_t>& batch, uint64_t batch_bytes) {
    std::vector<TensorReadRequest> reads;
    reads.reserve(batch.size());
    uint64_t converted_bytes = 0;
    for (size_t k : batch) {
      const checkpoint::PlannedTensor& p = plan.tensors[k];
      reads.push_back({p.tensor, nullptr});
      if (p.route == checkpoint::LoadRoute::kConvert && p.destinations.empty()) {
        converted_bytes += align_up(out.tensors[k].nbytes, kResultAlignment);
      }
    }
    FP_ASSIGN_OR_RETURN(ReadResult spans, reader.read(reads, request.verify, 0, kMaxGapBytes));
    std::shared_ptr<PinnedBuffer> converted;
    if (converted_bytes > 0) {
      FP_ASSIGN_OR_RETURN(converted, new_memory(converted_bytes));
    }
    size_t converted_at = 0;
    for (size_t j = 0; j < batch.size(); ++j) {
      const checkpoint::PlannedTensor& p = plan.tensors[batch[j]];
      const ManifestTensor& t = tensor_of(p);
      LoadedTensor& lt = out.tensors[batch[j]];
      if (t.length == 0) continue;  // nothing to place; an empty result
      if (p.route == checkpoint::LoadRoute::kSpan) {
        FP_RETURN_IF_ERROR(keep_span(t, lt, *spans.spans[j], spans.data[j]));
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
        FP_RETURN_IF_ERROR(
            checkpoint::write_elements(spans.data[j], t.dtype, 0, element_count(t), o));
      }
    }
    report(batch_bytes);
    return Status::ok();
  }

  // A span read becomes the result itself, without a copy, when its tensor is aligned for its
  // dtype there.
  static Status keep_span(const ManifestTensor& t, LoadedTensor& lt, const LoadedSpan& span,
                          const std::byte* data) {
    const std::shared_ptr<PinnedBuffer>& buffer = span.buffer;
    auto offset = static_cast<size_t>(data - buffer->data());
    if (offset % find_dtype(t.dtype)->size == 0) {
      lt.buffer = buffer;
      lt.offset = offset;
      return Status::ok();
    }
    // Another writer's file may misalign a tensor: copy rather than fail.
    FP_ASSIGN_OR_RETURN(lt.buffer, new_memory(t.length));
    std::memcpy(lt.buffer->data(), data, static_cast<size_t>(t.length));
    return Status::ok();
  }
};

Result<LoadResult> CheckpointReader::Impl::load(const LoadRequest& request) {
  FP_ASSIGN_OR_RETURN(checkpoint::LoadPlan plan, checkpoint::plan_load(manifest_, dir_, request));
  return LoadRun{*this, request, std::move(plan), {}, 0}.run();
}

}  // namespace fastpersist
