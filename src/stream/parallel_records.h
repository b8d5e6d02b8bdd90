// SPDX-License-Identifier: Apache-2.0
// The parallel writers' record file "<partial>.done" (private to src/stream): one line per
// writer whose stripes are durable, "rank total digest inode writers stripe". Callers hold the
// writers' lock (parallel_commit.cc) around every read-modify-write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fastpersist/status.h"

namespace fastpersist::stream {

struct DoneRecord {
  unsigned rank = 0;
  uint64_t total = 0;   // stream size in bytes
  uint64_t digest = 0;  // XXH3 of the whole stream
  uint64_t inode = 0;   // of the shared temporary the stripes went to
  unsigned writers = 0;
  uint64_t stripe = 0;

  // Same attempt: same bytes, same file, same partition of the stream into stripes.
  bool same_attempt(const DoneRecord& o) const {
    return total == o.total && digest == o.digest && inode == o.inode && writers == o.writers &&
           stripe == o.stripe;
  }
};

// The records in `path`; none when it does not exist.
std::vector<DoneRecord> read_records(const std::string& path);
// Replaces `path` with `records` (write-new + rename); removes it when `records` is empty.
Status write_records(const std::string& path, const std::vector<DoneRecord>& records);

// The records of `mine.inode` with `mine` in place of its rank's earlier one (a record left by a
// crashed earlier attempt of that rank on the same file). Records of other inodes are dropped:
// the caller has checked that the shared temporary path names `mine.inode`, so they describe
// files that were removed or committed long ago.
std::vector<DoneRecord> with_record(const std::vector<DoneRecord>& records, const DoneRecord& mine);
// The records of `inode`.
std::vector<DoneRecord> records_of(const std::vector<DoneRecord>& records, uint64_t inode);
// How many ranks have a record of the same attempt as `mine`.
unsigned matching_ranks(const std::vector<DoneRecord>& records, const DoneRecord& mine);

// Why the set of `mine` is not complete, from the records of its inode: this writer's rank and
// stream, which other ranks recorded the same stream, which a different one (size, digest,
// writer count or stripe size) and which have no record. One sentence without a trailing
// period, for an error message.
std::string describe_incomplete_set(const std::vector<DoneRecord>& records, const DoneRecord& mine);

}  // namespace fastpersist::stream
