// SPDX-License-Identifier: Apache-2.0
// The engine conformance suite's parameters and fixture: every real backend (io_uring, libaio,
// threads) crossed with the engine configurations that change how a request is cut up and
// queued. Every TEST_P on EngineTest runs against all of them; a backend this machine lacks is
// skipped with the probe's reason.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "fastpersist/io_engine.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {

struct EngineConfig {
  std::string name;  // the configuration, without the backend
  Backend backend = Backend::kThreads;
  unsigned intra_op_parallelism = 1;
  unsigned queue_depth = 32;
  size_t block_size = size_t{1} << 20;
  bool overlap_events = false;
  bool single_submit = false;
  bool direct_io = true;
  // 0: every transfer with a whole aligned block tries O_DIRECT, so small sizes exercise it too.
  size_t direct_io_min_bytes = 0;
  // Every operation is cut short by the fault backend (and resumed by the engine).
  bool short_transfers = false;

  EngineOptions options() const;
  std::string test_name() const;  // "<backend>_<name>", a valid gtest parameter name
};

// gtest prints parameters with this (instead of a byte dump).
void PrintTo(const EngineConfig& config, std::ostream* os);

// Every backend x every configuration.
std::vector<EngineConfig> conformance_configs();
// The subset that also moves 64 MiB + 3 bytes (kept small so the suite stays fast).
std::vector<EngineConfig> large_transfer_configs();

Result<std::unique_ptr<IoEngine>> make_engine(const EngineConfig& config);

class EngineTest : public ::testing::TestWithParam<EngineConfig> {
 protected:
  void SetUp() override;

  Result<uint64_t> write_at(const std::string& path, const std::byte* data, uint64_t length,
                            uint64_t offset, bool truncate = false);
  Result<uint64_t> read_at(const std::string& path, std::byte* data, uint64_t length,
                           uint64_t offset);

  // Writes `size` random bytes at `offset` of a new file from a buffer `misalign` bytes past a
  // page boundary, checks the file with plain POSIX reads, reads it back through the engine
  // into a buffer with the other alignment and compares.
  void check_round_trip(const std::string& path, uint64_t size, uint64_t offset, size_t misalign);

  // A small write and read, to show the engine still works (e.g. after an error).
  void check_engine_still_works();

  // Whether the test folder's filesystem accepts O_DIRECT (and the configuration asks for it).
  bool direct_expected() const { return GetParam().direct_io && folder_mode_.direct; }

  TempDir dir_;
  FileIoMode folder_mode_;
  std::unique_ptr<IoEngine> engine_;
};

}  // namespace fastpersist::testing
