// SPDX-License-Identifier: Apache-2.0
// `fastpersist io-bench` output: the text a person reads and the JSON a script parses.
#include <iostream>

#include "format.h"
#include "io_bench.h"

namespace fastpersist::cli::io_bench {

double gb_per_s(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / kBytesPerGB / seconds : 0.0;
}

nlohmann::json to_json(const Settings& s, const Outcome& out, double best) {
  const EngineOptions& o = s.options;
  nlohmann::json loops = nlohmann::json::array();
  for (const Loop& l : out.loops) {
    loops.push_back({{"seconds", l.seconds},
                     {"fsync_seconds", l.fsync_seconds},
                     {"gb_per_s", gb_per_s(s.size, l.seconds)}});
  }
  return {{"version", FASTPERSIST_VERSION},
          {"op", s.write ? "write" : "read"},
          {"file", s.path},
          {"size", s.size},
          {"backend", out.backend},
          {"backend_reason", out.backend_reason},
          {"block_size", o.block_size},
          {"queue_depth", o.queue_depth},
          {"intra_op_parallelism", o.intra_op_parallelism},
          {"single_submit", o.single_submit},
          {"overlap_events", o.overlap_events},
          {"direct_io", o.direct_io},
          {"direct", out.mode.direct && o.direct_io},
          {"fallback_reason", out.mode.fallback_reason},
          {"offset_alignment", out.mode.offset_alignment},
          {"memory_alignment", out.mode.memory_alignment},
          {"buffer_locked", out.buffer_locked},
          {"loops", loops},
          {"best_gb_per_s", best},
          {"gb", "1e9 bytes"},
          {"stats",
           {{"direct_bytes", out.stats.direct_bytes},
            {"buffered_bytes", out.stats.buffered_bytes},
            {"bounce_bytes", out.stats.bounce_bytes},
            {"short_transfers", out.stats.short_transfers},
            {"direct_fallbacks", out.stats.direct_fallbacks},
            {"last_fallback_reason", out.stats.last_fallback_reason}}}};
}

void print_header(const Settings& s, const Outcome& out, unsigned loops) {
  const EngineOptions& o = s.options;
  std::cout << "fastpersist io-bench " << FASTPERSIST_VERSION << ": "
            << (s.write ? "write " : "read ") << format_bytes(s.size)
            << (s.write ? " to " : " from ") << s.path << ", " << loops
            << (loops == 1 ? " loop\n" : " loops\n");
  std::cout << "  backend: " << out.backend << " (" << out.backend_reason << ")\n";
  std::cout << "  block size " << format_bytes(o.block_size) << ", queue depth " << o.queue_depth
            << ", intra-op parallelism " << o.intra_op_parallelism << ", single submit "
            << on_off(o.single_submit) << ", overlap events " << on_off(o.overlap_events) << "\n";
  std::cout << "  O_DIRECT: ";
  if (!o.direct_io) {
    std::cout << "off (--no-direct)\n";
  } else if (out.mode.direct) {
    std::cout << "on (offset alignment " << format_bytes(out.mode.offset_alignment)
              << ", memory alignment " << format_bytes(out.mode.memory_alignment) << ")\n";
  } else {
    std::cout << "off: " << out.mode.fallback_reason << "\n";
  }
  std::cout << "  buffer: " << format_bytes(s.size) << " page-aligned, "
            << (out.buffer_locked ? "pinned (mlock)" : "not locked (memlock limit too small)")
            << "\n";
  std::cout << "  GB = 1e9 bytes; "
            << (s.write
                    ? "each loop writes a new file and includes its fsync (like fio --end_fsync=1)"
                    : "the file is evicted from the page cache before each loop")
            << "\n";
  std::cout.flush();
}

void print_footer(const Outcome& out, double best) {
  const IoStats& st = out.stats;
  const uint64_t total = st.direct_bytes + st.buffered_bytes;
  std::cout << "best: " << format_fixed(best, 2) << " GB/s\n";
  if (total > 0) {
    std::cout << "  moved "
              << format_fixed(
                     100.0 * static_cast<double>(st.direct_bytes) / static_cast<double>(total), 1)
              << "% with O_DIRECT, " << format_bytes(st.buffered_bytes)
              << " through the page cache, " << format_bytes(st.bounce_bytes)
              << " through bounce buffers";
    if (st.short_transfers > 0)
      std::cout << ", " << st.short_transfers << " short transfers resumed";
    std::cout << "\n";
  }
}

}  // namespace fastpersist::cli::io_bench
