// SPDX-License-Identifier: Apache-2.0
#include "stream/parallel_records.h"

#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>

#include "fastpersist/layout.h"

namespace fastpersist::stream {

std::vector<DoneRecord> read_records(const std::string& path) {
  std::vector<DoneRecord> out;
  std::ifstream in(path);
  DoneRecord r;
  while (in >> r.rank >> r.total >> r.digest >> r.inode >> r.writers >> r.stripe) out.push_back(r);
  return out;
}

Status write_records(const std::string& path, const std::vector<DoneRecord>& records) {
  if (records.empty()) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::from_errno(errno, "cannot remove the writers' record").with_path(path);
    }
    return Status::ok();
  }
  std::string tmp = path + std::string(kRecordReplaceSuffix);
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const DoneRecord& r : records) {
      out << r.rank << ' ' << r.total << ' ' << r.digest << ' ' << r.inode << ' ' << r.writers
          << ' ' << r.stripe << '\n';
    }
    out.flush();
    if (!out)
      return Status(StatusCode::kIoError, "cannot write the writers' record", EIO).with_path(tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::from_errno(errno, "cannot update the writers' record").with_path(path);
  }
  return Status::ok();
}

std::vector<DoneRecord> with_record(const std::vector<DoneRecord>& records,
                                    const DoneRecord& mine) {
  std::vector<DoneRecord> out;
  for (const DoneRecord& r : records) {
    if (r.inode == mine.inode && r.rank != mine.rank) out.push_back(r);
  }
  out.push_back(mine);
  return out;
}

std::vector<DoneRecord> records_of(const std::vector<DoneRecord>& records, uint64_t inode) {
  std::vector<DoneRecord> out;
  for (const DoneRecord& r : records) {
    if (r.inode == inode) out.push_back(r);
  }
  return out;
}

unsigned matching_ranks(const std::vector<DoneRecord>& records, const DoneRecord& mine) {
  std::vector<bool> seen(mine.writers, false);
  unsigned n = 0;
  for (const DoneRecord& r : records) {
    if (r.same_attempt(mine) && r.rank < mine.writers && !seen[r.rank]) {
      seen[r.rank] = true;
      ++n;
    }
  }
  return n;
}

namespace {

// "rank 2" or "ranks 0, 1, 3".
std::string rank_list(const std::vector<unsigned>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string stream_text(const DoneRecord& r) {
  char digest[32];
  std::snprintf(digest, sizeof digest, "%016" PRIx64, r.digest);
  return std::to_string(r.total) + " bytes, digest " + digest;
}

std::string layout_text(const DoneRecord& r) {
  return std::to_string(r.writers) + " writers, " + std::to_string(r.stripe) + "-byte stripes";
}

// The last record of `rank` for `inode`, or null.
const DoneRecord* record_of(const std::vector<DoneRecord>& records, unsigned rank, uint64_t inode) {
  const DoneRecord* found = nullptr;
  for (const DoneRecord& r : records) {
    if (r.rank == rank && r.inode == inode) found = &r;
  }
  return found;
}

// One clause for a rank whose record disagrees with `mine`.
std::string difference_text(const DoneRecord& r, const DoneRecord& mine) {
  if (r.writers != mine.writers || r.stripe != mine.stripe) {
    return "rank " + std::to_string(r.rank) + " closed as one of " + layout_text(r) +
           " (this writer: " + layout_text(mine) + ")";
  }
  return "rank " + std::to_string(r.rank) + " closed with a different stream (" + stream_text(r) +
         ")";
}

}  // namespace

std::string describe_incomplete_set(const std::vector<DoneRecord>& records,
                                    const DoneRecord& mine) {
  std::vector<unsigned> same;
  std::vector<unsigned> missing;
  std::vector<std::string> clauses;
  bool different_bytes = false;
  for (unsigned rank = 0; rank < mine.writers; ++rank) {
    if (rank == mine.rank) continue;
    const DoneRecord* r = record_of(records, rank, mine.inode);
    if (r == nullptr) {
      missing.push_back(rank);
    } else if (r->same_attempt(mine)) {
      same.push_back(rank);
    } else {
      clauses.push_back(difference_text(*r, mine));
      different_bytes = different_bytes || (r->writers == mine.writers && r->stripe == mine.stripe);
    }
  }
  for (const DoneRecord& r : records) {  // a record of a larger writer count
    if (r.inode == mine.inode && r.rank >= mine.writers) {
      clauses.push_back(difference_text(r, mine));
    }
  }
  std::string out = "this writer is rank " + std::to_string(mine.rank) + " of " +
                    std::to_string(mine.writers) + " (" + stream_text(mine) + ")";
  if (!same.empty()) out += "; " + rank_list(same) + " closed with the same stream";
  for (const std::string& c : clauses) out += "; " + c;
  if (different_bytes) {
    out +=
        ": the writers serialized different bytes, the stream is not deterministic across "
        "writers (e.g. torch's legacy format in different processes, whose storage keys are "
        "memory addresses; use the zip format)";
  }
  if (!missing.empty()) {
    out += "; " + rank_list(missing) + (missing.size() == 1 ? " has" : " have") + " not closed";
  }
  return out;
}

}  // namespace fastpersist::stream
