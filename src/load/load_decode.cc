// SPDX-License-Identifier: Apache-2.0
// CheckpointReader::load's step for compressed tensors (route kDecode, load_plan.h).
//
// The tensors are taken in batches of about 64 MiB (max_memory / 2 when bounded). While the
// workers decode one batch (every chunk of it at once, encoded_read.h), the calling thread reads
// the next batch's stored bytes and then checks and places the finished one: reading, decoding
// and checksumming overlap. Each tensor is decoded straight into its destination when that is
// one contiguous tensor of the stored dtype, into new memory when it is returned as stored,
// and otherwise into a span that is then converted into its outputs.
#include <algorithm>
#include <memory>
#include <vector>

#include "common/task_pool.h"
#include "fastpersist/checksum.h"
#include "fastpersist/dtype.h"
#include "load/delta_base.h"
#include "load/encoded_read.h"
#include "load/load_plan.h"
#include "load/reader_impl.h"

namespace fastpersist {
namespace {

constexpr uint64_t kBatchBytes = uint64_t{64} << 20;

struct Batch {
  std::vector<size_t> plan_index;                         // into LoadPlan::tensors
  std::vector<const std::byte*> stored;                   // each tensor's stored bytes
  std::vector<std::byte*> raw;                            // where each tensor is decoded
  std::vector<std::shared_ptr<PinnedBuffer>> to_convert;  // set: raw is this span, converted after
  uint64_t raw_bytes = 0;
  // Last: destroyed first, so no decoding task outlives the memory above.
  std::unique_ptr<checkpoint::ParallelDecode> decode;
};

}  // namespace

struct CheckpointReader::Impl::DecodeStep {
  Impl& reader;
  const checkpoint::LoadPlan& plan;
  const LoadRequest& request;
  LoadResult& out;
  const std::function<void(uint64_t)>& report;

  Status run() {
    using checkpoint::LoadRoute;
    const Manifest& m = reader.manifest_;
    std::vector<size_t> todo;
    uint64_t chunks = 0;
    for (size_t k = 0; k < plan.tensors.size(); ++k) {
      if (plan.tensors[k].route != LoadRoute::kDecode) continue;
      todo.push_back(k);
      chunks += chunk_count(m.tensors[plan.tensors[k].tensor].length, kCodecChunkBytes);
    }
    if (todo.empty()) return Status::ok();
    TaskPool pool(TaskPool::choose_threads(0, static_cast<size_t>(chunks)));
    uint64_t limit =
        request.max_memory != 0 ? std::max<uint64_t>(request.max_memory / 2, 1) : kBatchBytes;
    // Two buffers of stored bytes, reused batch after batch: one is read into while the other's
    // batch is decoded.
    PinnedBuffer stored[2];
    size_t next_buffer = 0;
    std::unique_ptr<Batch> previous;
    for (size_t i = 0; i < todo.size();) {
      auto batch = std::make_unique<Batch>();
      uint64_t bytes = 0;
      std::vector<size_t> tensors;
      for (; i < todo.size(); ++i) {
        const ManifestTensor& t = m.tensors[plan.tensors[todo[i]].tensor];
        uint64_t cost = t.length + t.stored_length;
        if (!batch->plan_index.empty() && bytes + cost > limit) break;
        batch->plan_index.push_back(todo[i]);
        tensors.push_back(plan.tensors[todo[i]].tensor);
        bytes += cost;
      }
      FP_RETURN_IF_ERROR(
          reader.read_stored_into(tensors, request.verify, stored[next_buffer], &batch->stored));
      next_buffer ^= 1;
      batch->decode = std::make_unique<checkpoint::ParallelDecode>(pool);
      FP_RETURN_IF_ERROR(start(*batch));
      if (previous) FP_RETURN_IF_ERROR(finish(*previous));
      previous = std::move(batch);
    }
    return finish(*previous);
  }

  // Chooses where each tensor of the batch is decoded and queues its chunks.
  Status start(Batch& b) {
    const Manifest& m = reader.manifest_;
    b.raw.resize(b.plan_index.size());
    b.to_convert.resize(b.plan_index.size());
    for (size_t j = 0; j < b.plan_index.size(); ++j) {
      const checkpoint::PlannedTensor& p = plan.tensors[b.plan_index[j]];
      const ManifestTensor& t = m.tensors[p.tensor];
      LoadedTensor& lt = out.tensors[b.plan_index[j]];
      b.raw_bytes += t.length;
      const LoadDestination* only =
          p.destinations.size() == 1 ? &request.destinations[p.destinations[0]] : nullptr;
      if (only != nullptr && only->dtype == t.dtype &&
          checkpoint::is_contiguous(t.shape, only->strides)) {
        b.raw[j] = only->data;
      } else if (p.destinations.empty() && p.dtype == t.dtype) {
        FP_ASSIGN_OR_RETURN(lt.buffer, checkpoint::new_load_memory(t.length, /*huge_pages=*/true));
        lt.offset = 0;
        b.raw[j] = lt.buffer->data();
      } else {
        FP_ASSIGN_OR_RETURN(b.to_convert[j],
                            checkpoint::new_load_memory(t.length, /*huge_pages=*/true));
        b.raw[j] = b.to_convert[j]->data();
      }
      auto base = reader.delta_base_of(t);
      if (!base.is_ok()) return base.status();
      Status st = b.decode->add(t, b.stored[j], b.raw[j], std::move(base).value());
      if (!st.is_ok()) return std::move(st).with_path(reader.path_of(t));
    }
    return Status::ok();
  }

  // Waits for the batch's chunks, checks every tensor's checksum, converts what needs it.
  Status finish(Batch& b) {
    const Manifest& m = reader.manifest_;
    FP_RETURN_IF_ERROR(b.decode->wait());
    const bool verify = request.verify && m.checksum_algorithm != kNoChecksum;
    for (size_t j = 0; j < b.plan_index.size(); ++j) {
      const checkpoint::PlannedTensor& p = plan.tensors[b.plan_index[j]];
      const ManifestTensor& t = m.tensors[p.tensor];
      if (verify) {
        uint64_t actual = xxh3_64(b.raw[j], static_cast<size_t>(t.length));
        if (actual != t.checksum) {
          const std::string whose =
              t.delta_base ? "the checkpoint or its base (" + t.delta_base->file + ") is damaged"
                           : "the checkpoint is damaged";
          return Status(StatusCode::kDataLoss, checkpoint::tensor_place(t) +
                                                   " fails its checksum after decoding (manifest " +
                                                   checksum_to_hex(t.checksum) + ", data " +
                                                   checksum_to_hex(actual) + "): " + whose)
              .with_path(reader.path_of(t))
              .with_range(t.offset, t.stored_length);
        }
      }
      if (!b.to_convert[j]) continue;
      LoadedTensor& lt = out.tensors[b.plan_index[j]];
      std::vector<checkpoint::OutputMemory> outputs;
      for (size_t d : p.destinations)
        outputs.push_back(checkpoint::output_of(request.destinations[d]));
      if (outputs.empty()) {
        FP_ASSIGN_OR_RETURN(lt.buffer, checkpoint::new_load_memory(lt.nbytes));
        lt.offset = 0;
        outputs.push_back({lt.buffer->data(), p.dtype, t.shape, {}});
      }
      const uint64_t count = t.length / find_dtype(t.dtype)->size;
      for (const checkpoint::OutputMemory& o : outputs) {
        FP_RETURN_IF_ERROR(checkpoint::write_elements(b.raw[j], t.dtype, 0, count, o));
      }
      b.to_convert[j].reset();
    }
    report(b.raw_bytes);
    return Status::ok();
  }
};

Status CheckpointReader::Impl::load_decoded(const checkpoint::LoadPlan& plan,
                                            const LoadRequest& request, LoadResult& out,
                                            const std::function<void(uint64_t)>& report) {
  return DecodeStep{*this, plan, request, out, report}.run();
}

}  // namespace fastpersist
