// SPDX-License-Identifier: Apache-2.0
// CheckpointReader's state and steps, private to the library (the public class forwards here).
// One file per step:
//   checkpoint_reader.cc   open, the files table, raw reads into spans and destinations (read)
//   piece_read.cc          one tensor streamed in pieces through two slots (read_pieces)
//   load_run.cc            a whole load: a LoadPlan run route by route (load)
//   load_decode.cc         the load's compressed tensors, decoded on every core
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fastpersist/checkpoint_reader.h"
#include "load/delta_base.h"
#include "load/load_plan.h"

namespace fastpersist {

namespace checkpoint {
// kDataLoss naming tensor `t` of the file at `path`, whose bytes hash to `actual`.
Status checksum_mismatch(const std::string& path, const ManifestTensor& t, uint64_t actual);
}  // namespace checkpoint

class CheckpointReader::Impl {
 public:
  static constexpr uint64_t kReadAlignment = 4096;  // of every O_DIRECT read's offset

  Impl(std::string dir, Manifest manifest, std::shared_ptr<IoEngine> engine);

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }

  Result<LoadResult> load(const LoadRequest& request);
  Result<ReadResult> read(const std::vector<TensorReadRequest>& requests, bool verify,
                          uint64_t max_in_flight_bytes, uint64_t max_gap_bytes);
  Status read_pieces(size_t tensor, uint64_t piece_bytes, bool verify, const PieceSink& sink);
  Result<std::string> read_file(std::string_view name);

 private:
  struct ReadCall;    // one read() (checkpoint_reader.cc)
  struct LoadRun;     // one load() (load_run.cc)
  struct DecodeStep;  // load()'s compressed tensors (load_decode.cc)

  // The file a tensor lies in (decode_manifest checked that it is listed), and its path
  // (manifest_file_path: a v2 reference may point into another checkpoint of the root).
  const ManifestFile& file_of(const ManifestTensor& t) const { return *files_.at(t.file).first; }
  const std::string& path_of(const ManifestTensor& t) const { return files_.at(t.file).second; }
  Status check_encoding(const ManifestTensor& t) const;
  // The leading bytes (length prefix + JSON header) of each named data file against their
  // checksum: the header says which bytes are which tensor, so a load that trusts it checks it.
  Status check_file_headers(const std::set<std::string>& files) const;
  // The base bytes of an XOR delta (t.delta_base set); null for any other tensor.
  Result<std::shared_ptr<const checkpoint::DeltaBaseBytes>> delta_base_of(
      const ManifestTensor& t) const;
  // The stored bytes of `tensors` (compressed ones included) into `buffer` (grown when too
  // small, else reused: no fresh memory to fault in), one aligned read per tensor; `data[i]`
  // receives where tensor i's stored bytes start. Data headers checked when `verify_headers`,
  // tensor checksums never (load() checks them on the decoded bytes).
  Status read_stored_into(const std::vector<size_t>& tensors, bool verify_headers,
                          PinnedBuffer& buffer, std::vector<const std::byte*>* data);
  // load()'s step for compressed tensors: decodes every tensor the plan routes there;
  // `report(bytes)` after each batch.
  Status load_decoded(const checkpoint::LoadPlan& plan, const LoadRequest& request, LoadResult& out,
                      const std::function<void(uint64_t)>& report);

  std::string dir_;
  Manifest manifest_;
  std::shared_ptr<IoEngine> engine_;
  std::unordered_map<std::string, std::pair<const ManifestFile*, std::string>> files_;
};

}  // namespace fastpersist
