// SPDX-License-Identifier: Apache-2.0
// The rendezvous of parallel writers (private to src/stream).
//
// All writers of one file share the temporary "<dir>/.<name>.fp-partial". Each writer, after its
// own stripes are durable, appends a record "rank total digest inode writers stripe" to
// "<partial>.done" under an flock on "<partial>.lock". A record counts only if its total size,
// stream digest, inode, writer count and stripe size equal the caller's: records left by a crashed earlier attempt on another inode or with other
// content are ignored, and a record with the same inode and digest describes the very bytes
// this attempt would write. The writer whose record completes the set of ranks truncates the
// file to the exact size, fdatasyncs it, renames it onto the target, fsyncs the directory and
// removes the bookkeeping files. Writers whose streams differ (a non-deterministic
// serialization) never complete a set together, so such a file is never committed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "fastpersist/status.h"

namespace fastpersist::stream {

// A 64-bit digest of the whole stream (every writer sees every byte), used to prove that all
// writers serialized the same content.
class StreamDigest {
 public:
  StreamDigest();
  ~StreamDigest();
  StreamDigest(const StreamDigest&) = delete;
  StreamDigest& operator=(const StreamDigest&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t value() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

Result<UniqueFd> open_shared_partial(const std::string& target, std::string* partial_path);

Status finish_parallel(UniqueFd& fd, const std::string& partial_path, const std::string& target,
                       uint64_t digest, uint64_t total_bytes, unsigned rank, unsigned num_writers,
                       uint64_t stripe_bytes, bool durable, bool* committed);

}  // namespace fastpersist::stream
