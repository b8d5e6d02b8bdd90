// SPDX-License-Identifier: Apache-2.0
// Reading checkpoints: listing a root, finding the latest, verifying, and reading tensors with
// parallel O_DIRECT into aligned memory or straight into the caller's memory. None of this
// takes the root's lock: readers never modify a root.
//
// A directory counts as a committed checkpoint when its name is a valid tag, its manifest
// decodes, and every file it names exists with the recorded size (cheap checks). Checksums are
// verified by verify_checkpoint() and by CheckpointReader when asked.
//
// Thread-safety: free functions are safe from any thread; a CheckpointReader may be shared by
// threads (each call is independent).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_load.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/layout.h"  // kLatestFileName
#include "fastpersist/manifest.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist {

// Committed checkpoints under `root`, oldest to newest (manifest sequence, then tag). Directories
// that fail the cheap checks are skipped; `skipped` (optional) receives "tag: reason" for each.
Result<std::vector<CheckpointInfo>> list_checkpoints(const std::string& root,
                                                     std::vector<std::string>* skipped = nullptr);

// The newest committed checkpoint (highest commit sequence), or nullopt. <root>/latest names the
// same tag for other tools (a manager repairs it when a crash left it behind).
Result<std::optional<std::string>> latest_checkpoint(const std::string& root);

// Checks a checkpoint directory: manifest, every file's size and header checksum, every tensor's
// checksum, and that each data file's safetensors header agrees with the manifest. Returns the
// list of problems (empty when intact); an error only when the directory cannot be examined.
// `progress(done_bytes, total_bytes)` is called as data is checked.
struct VerifyReport {
  std::vector<std::string> problems;  // "tensor 'model.w' in tensors-00000-of-00001...: ..."
  uint64_t bytes_checked = 0;
  // false: saved without checksums; only sizes, headers and the frames of compressed tensors
  // (which carry content checksums of their own) were checked
  bool has_checksums = true;
  bool ok() const { return problems.empty(); }
};
Result<VerifyReport> verify_checkpoint(
    const std::string& dir, IoEngine& engine,
    const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

// One contiguous piece of a data file read into aligned memory: bytes [file_offset,
// file_offset + size) of `file` are at buffer->data() + buffer_offset.
struct LoadedSpan {
  std::string file;
  uint64_t file_offset = 0;
  std::shared_ptr<PinnedBuffer> buffer;
  size_t buffer_offset = 0;
};

// Where one tensor's bytes go: `destination` (the caller's memory, `capacity` writable bytes,
// at least the tensor's length) or, when null, a span the reader allocates.
struct TensorReadRequest {
  size_t tensor = 0;  // index into manifest().tensors
  std::byte* destination = nullptr;
  uint64_t capacity = 0;
  int device = -1;  // >= 0: `destination` is memory of this CUDA device (see LoadDestination)
};

class CheckpointReader {
 public:
  // Reads and decodes the manifest of the checkpoint directory `dir`.
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string& dir,
                                                        std::shared_ptr<IoEngine> engine);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const Manifest& manifest() const;
  const std::string& dir() const;

  // Plans and runs a whole load (checkpoint_load.h): selects, checks (names, shapes, every
  // destination's capacity, strides and writability, encodings) before the first read, then
  // reads each tensor by the fastest route that keeps within `max_memory`:
  //  - straight into a contiguous destination of the stored dtype (O_DIRECT when it lines up
  //    with the file, else through the staged ring);
  //  - into new page-aligned spans that become the results without a copy (grouped per file);
  //  - into a span and then converted / scattered into its outputs (another dtype, strides);
  //  - larger than max_memory and converted or copied: in pieces of max_memory / 2, each
  //    written into the outputs as it arrives (read_pieces).
  // Errors: kInvalidArgument (the request: strict mismatches listed, capacities, dtypes),
  // kUnavailable (an encoding this build cannot decode), kDataLoss (checksums, naming file and
  // tensor), I/O errors. On an error after the first read, destinations may hold partial data.
  Result<LoadResult> load(const LoadRequest& request);

  // Reads the requested tensors; kInvalidArgument, before any read, for a destination whose
  // capacity is smaller than its tensor. Requests without a destination are grouped per file into
  // as few spans as possible (a gap of unrequested bytes up to `max_gap_bytes` is read through
  // rather than split); `spans[i]` and `offsets[i]` then locate request i's bytes
  // (spans[i] == nullptr for requests with a destination); a span is new memory, faulted in
  // up front on every core and filled through the ring of slots below. A destination that
  // lines up with its tensor's file offset (address = offset mod 4096) is read into straight;
  // any other goes through a ring of aligned slots, taken from the process's pinned pool and
  // copied from there (at most `max_in_flight_bytes` of slots when bounded, else 256 MiB). Every
  // read is in flight at once, bounded by `max_in_flight_bytes` (0 = unbounded) for requests with a
  // destination; with `verify` each tensor's checksum is checked as its read completes (kDataLoss
  // names it). Raw tensors only: a compressed one is kInvalidArgument (load() and read_pieces
  // decode).
  struct ReadResult {
    std::vector<std::shared_ptr<LoadedSpan>> spans;  // per request
    std::vector<const std::byte*> data;              // per request: where its bytes are
  };
  Result<ReadResult> read(const std::vector<TensorReadRequest>& requests, bool verify,
                          uint64_t max_in_flight_bytes = 0, uint64_t max_gap_bytes = 1 << 20);

  // Streams tensor `tensor`'s bytes in file order, in pieces of at most `piece_bytes` (a
  // positive multiple of 4096, so no element of any dtype straddles two pieces):
  // `sink(offset_in_tensor, data, size)` gets each piece while the next one is read. The
  // memory used is two buffers of piece_bytes + 8 KiB, whatever the tensor's size: this is how
  // a bounded load converts a tensor larger than its budget. With `verify` the checksum of all
  // the pieces is checked after the last one (kDataLoss): the sink has then seen the damaged
  // bytes, so a caller that filled its own memory must treat it as not loaded. A non-OK
  // status from the sink stops the stream and is returned.
  using PieceSink = std::function<Status(uint64_t offset, const std::byte* data, size_t size)>;
  Status read_pieces(size_t tensor, uint64_t piece_bytes, bool verify, const PieceSink& sink);

  // The whole objects sidecar (empty when the checkpoint has none), checksum-checked.
  Result<std::string> read_objects();
  // The whole file `name` of role "objects" (objects.pkl, a distributed checkpoint's sidecars),
  // checksum-checked: kNotFound when the manifest lists no such file, kDataLoss when its bytes
  // are not the recorded ones.
  Result<std::string> read_file(std::string_view name);

  // The reader's state and steps (load/reader_impl.h, private to the library).
  class Impl;

 private:
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastpersist
