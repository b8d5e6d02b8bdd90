// SPDX-License-Identifier: Apache-2.0
#include "testing/engine_fixture.h"

#include <utility>

#include "testing/fault_backend.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

// The configurations each backend runs. Together they cover: one and several workers
// (including a parallelism that does not divide the sizes), lock-step and overlapped event
// loops, single submit, block sizes from one page to 1 MiB, queues from 1 to 32, O_DIRECT on and
// off, the default small-transfer threshold, and short transfers on every operation.
std::vector<EngineConfig> base_configs() {
  std::vector<EngineConfig> c;
  c.push_back({.name = "p1_bs1m"});
  c.push_back({.name = "p3_bs1m_overlap", .intra_op_parallelism = 3, .overlap_events = true});
  c.push_back({.name = "p1_bs4k_single_submit", .block_size = 4096, .single_submit = true});
  c.push_back({.name = "p3_bs4k_overlap_qd4",
               .intra_op_parallelism = 3,
               .queue_depth = 4,
               .block_size = 4096,
               .overlap_events = true});
  c.push_back({.name = "p2_buffered_overlap",
               .intra_op_parallelism = 2,
               .overlap_events = true,
               .direct_io = false});
  c.push_back({.name = "p2_qd1_default_threshold",
               .intra_op_parallelism = 2,
               .queue_depth = 1,
               .block_size = 64 << 10,
               .direct_io_min_bytes = EngineOptions{}.direct_io_min_bytes});
  c.push_back({.name = "p3_short_transfers",
               .intra_op_parallelism = 3,
               .queue_depth = 8,
               .block_size = 256 << 10,
               .overlap_events = true,
               .short_transfers = true});
  return c;
}

std::vector<EngineConfig> for_every_backend(const std::vector<EngineConfig>& configs) {
  std::vector<EngineConfig> out;
  for (Backend b : real_backends()) {
    for (EngineConfig c : configs) {
      c.backend = b;
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace

EngineOptions EngineConfig::options() const {
  EngineOptions o;
  o.backend = backend;
  o.intra_op_parallelism = intra_op_parallelism;
  o.queue_depth = queue_depth;
  o.block_size = block_size;
  o.overlap_events = overlap_events;
  o.single_submit = single_submit;
  o.direct_io = direct_io;
  o.direct_io_min_bytes = direct_io_min_bytes;
  return o;
}

std::string EngineConfig::test_name() const {
  return std::string(backend_name(backend)) + "_" + name;
}

void PrintTo(const EngineConfig& config, std::ostream* os) { *os << config.test_name(); }

std::vector<EngineConfig> conformance_configs() { return for_every_backend(base_configs()); }

std::vector<EngineConfig> large_transfer_configs() {
  std::vector<EngineConfig> big;
  for (const EngineConfig& c : base_configs()) {
    if (c.name == "p1_bs1m" || c.name == "p3_bs1m_overlap") big.push_back(c);
  }
  return for_every_backend(big);
}

Result<std::unique_ptr<IoEngine>> make_engine(const EngineConfig& config) {
  if (!config.short_transfers) return IoEngine::create(config.options());
  FP_ASSIGN_OR_RETURN(
      auto faults,
      FaultInjector::create({.kind = FaultKind::kShort, .repeat = true}, config.backend));
  return IoEngine::create(config.options(), faults->factory(),
                          std::string(backend_name(config.backend)) + " with short transfers");
}

void EngineTest::SetUp() {
  if (auto why = backend_skip_reason(GetParam().backend)) GTEST_SKIP() << *why;
  FP_ASSERT_OK_AND_ASSIGN(folder_mode_, probe_file_io(dir_.path()));
  FP_ASSERT_OK_AND_ASSIGN(engine_, make_engine(GetParam()));
}

Result<uint64_t> EngineTest::write_at(const std::string& path, const std::byte* data,
                                      uint64_t length, uint64_t offset, bool truncate) {
  IoRequest r;
  r.kind = IoKind::kWrite;
  r.buffer = const_cast<std::byte*>(data);
  r.length = length;
  r.path = path;
  r.file_offset = offset;
  r.truncate = truncate;
  return engine_->run(r);
}

Result<uint64_t> EngineTest::read_at(const std::string& path, std::byte* data, uint64_t length,
                                     uint64_t offset) {
  IoRequest r;
  r.kind = IoKind::kRead;
  r.buffer = data;
  r.length = length;
  r.path = path;
  r.file_offset = offset;
  return engine_->run(r);
}

void EngineTest::check_round_trip(const std::string& path, uint64_t size, uint64_t offset,
                                  size_t misalign) {
  SCOPED_TRACE("size " + std::to_string(size) + ", offset " + std::to_string(offset) +
               ", buffer misaligned by " + std::to_string(misalign));
  TestBuffer src(size, misalign);
  fill_random(src.span(), size * 1000003 + offset * 31 + misalign);
  FP_ASSERT_OK_AND_ASSIGN(uint64_t written, write_at(path, src.data(), size, offset));
  EXPECT_EQ(written, size);

  // A write that moves no bytes creates the file but does not extend it.
  uint64_t expected_size = size == 0 ? 0 : offset + size;
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
  ASSERT_EQ(on_disk.size(), expected_size);
  if (size > 0) {
    for (uint64_t i = 0; i < offset; ++i) {
      ASSERT_EQ(on_disk[i], std::byte{0}) << "the hole before the offset has data at " << i;
    }
    ASSERT_EQ("", first_difference(src.span(), std::span(on_disk).subspan(offset)));
  }
  if (size == 0 && offset > 0) return;  // nothing to read: the offset is past the end

  TestBuffer dst(size, misalign == 0 ? 1 : 0);
  FP_ASSERT_OK_AND_ASSIGN(uint64_t read, read_at(path, dst.data(), size, offset));
  EXPECT_EQ(read, size);
  ASSERT_EQ("", first_difference(src.span(), dst.span()));
}

void EngineTest::check_engine_still_works() {
  SCOPED_TRACE("the engine still works afterwards");
  check_round_trip(dir_.file("still-works"), (64 << 10) + 5, 4097, 1);
}

}  // namespace fastpersist::testing
