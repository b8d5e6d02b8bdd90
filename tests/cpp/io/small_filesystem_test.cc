// SPDX-License-Identifier: Apache-2.0
// The engine on real filesystems with particular properties, mounted for the test (needs root;
// skipped with the reason otherwise): a tiny ext4 image that fills up, tmpfs, and ramfs, which
// refuses O_DIRECT. Mounts live in a private mount namespace when the kernel allows one, so a
// crashed test leaves nothing mounted behind.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include "fastpersist/io_engine.h"
#include "testing/mount_util.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"
#include "testing/watchdog.h"

namespace fastpersist::testing {
namespace {

using std::chrono::seconds;

constexpr uint64_t kMiB = uint64_t{1} << 20;

IoRequest request(IoKind kind, const std::string& path, std::byte* buffer, uint64_t length,
                  uint64_t offset = 0) {
  IoRequest r;
  r.kind = kind;
  r.path = path;
  r.buffer = buffer;
  r.length = length;
  r.file_offset = offset;
  return r;
}

struct FsCase {
  Backend backend;
  bool direct_io;
};

void PrintTo(const FsCase& c, std::ostream* os) {
  *os << backend_name(c.backend) << (c.direct_io ? " direct" : " buffered");
}

class SmallFilesystemTest : public ::testing::TestWithParam<FsCase> {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() == 0) (void)enter_private_mount_namespace();  // best effort, see the header
  }

  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting test filesystems needs root";
    if (auto why = backend_skip_reason(GetParam().backend)) GTEST_SKIP() << *why;
    mount_point_ = dir_.file("mnt");
    ASSERT_EQ(::mkdir(mount_point_.c_str(), 0755), 0) << std::strerror(errno);
    EngineOptions o;
    o.backend = GetParam().backend;
    o.direct_io = GetParam().direct_io;
    o.direct_io_min_bytes = 0;
    o.intra_op_parallelism = 2;
    o.overlap_events = true;
    FP_ASSERT_OK_AND_ASSIGN(engine_, IoEngine::create(o));
  }

  // Mounts `make()`'s filesystem at mount_point_, or skips the test saying why it could not.
  template <typename Make>
  void mount_or_skip(Make make) {
    Result<ScopedMount> m = make();
    if (!m.is_ok()) GTEST_SKIP() << "cannot mount the test filesystem: " << m.status().to_string();
    mount_.emplace(std::move(m).value());
  }

  void check_round_trip(const std::string& path, uint64_t size, uint64_t offset, size_t misalign) {
    SCOPED_TRACE("size " + std::to_string(size) + " at " + std::to_string(offset));
    TestBuffer data(size, misalign);
    fill_random(data.span(), size ^ offset);
    FP_ASSERT_OK(engine_->run(request(IoKind::kWrite, path, data.data(), size, offset)));
    FP_ASSERT_OK_AND_ASSIGN(uint64_t on_disk, file_size(path));
    EXPECT_EQ(on_disk, offset + size);
    TestBuffer back(size, 1 - misalign);
    FP_ASSERT_OK(engine_->run(request(IoKind::kRead, path, back.data(), size, offset)));
    ASSERT_EQ("", first_difference(data.span(), back.span()));
  }

  // A full filesystem: the write fails with ENOSPC, promptly, and says so.
  void check_disk_full(uint64_t size) {
    std::string path = mount_point_ + "/too-big.bin";
    TestBuffer data(size, 0);
    fill_random(data.span(), 1);
    run_with_watchdog(seconds(60), "a write to a full filesystem", [&] {
      Result<uint64_t> r = engine_->run(request(IoKind::kWrite, path, data.data(), data.size()));
      ASSERT_FALSE(r.is_ok()) << "wrote " << *r << " bytes to a filesystem too small for them";
      const Status& st = r.status();
      EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
      EXPECT_EQ(st.sys_errno(), ENOSPC) << st.to_string();
      EXPECT_EQ(st.path(), path);
      EXPECT_TRUE(st.offset().has_value());
      EXPECT_NE(st.to_string().find("No space left on device"), std::string::npos)
          << st.to_string();
    });
    // The same through submit/wait, with a second request queued behind it. Where the engine
    // can reserve the space up front (fallocate before O_DIRECT writes), ENOSPC comes from
    // submit itself; otherwise from wait(). Either way it is ENOSPC, never a hang.
    run_with_watchdog(seconds(60), "async writes to a full filesystem", [&] {
      Status first;
      for (const std::string& p : {path, path + ".2"}) {
        Result<IoTicket> t = engine_->submit(request(IoKind::kWrite, p, data.data(), data.size()));
        if (!t.is_ok() && first.is_ok()) first = t.status();
      }
      Result<size_t> waited = engine_->wait();
      if (first.is_ok()) {
        ASSERT_FALSE(waited.is_ok());
        first = waited.status();
      }
      EXPECT_EQ(first.sys_errno(), ENOSPC) << first.to_string();
    });
    // Space freed, the engine carries on.
    ::unlink(path.c_str());
    ::unlink((path + ".2").c_str());
    check_round_trip(mount_point_ + "/after.bin", kMiB + 7, 4097, 1);
  }

  TempDir dir_;
  std::string mount_point_;
  std::optional<ScopedMount> mount_;  // unmounted before dir_ is removed
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(SmallFilesystemTest, FullExt4IsNoSpaceLeft) {
  mount_or_skip(
      [&] { return ScopedMount::ext4_image(dir_.file("fs.img"), mount_point_, 16 * kMiB); });
  check_disk_full(32 * kMiB);
}

TEST_P(SmallFilesystemTest, FullTmpfsIsNoSpaceLeft) {
  mount_or_skip([&] { return ScopedMount::memory_fs("tmpfs", mount_point_, 8 * kMiB); });
  check_disk_full(16 * kMiB);
}

TEST_P(SmallFilesystemTest, Ext4RoundTrips) {
  mount_or_skip(
      [&] { return ScopedMount::ext4_image(dir_.file("fs.img"), mount_point_, 64 * kMiB); });
  for (uint64_t size : {uint64_t{1}, uint64_t{4095}, uint64_t{4096}, kMiB + 7, 9 * kMiB + 1}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{512}, uint64_t{4097}}) {
      check_round_trip(mount_point_ + "/f-" + std::to_string(size) + "-" + std::to_string(offset),
                       size, offset, offset % 2);
    }
  }
  FP_ASSERT_OK_AND_ASSIGN(FileIoMode mode, probe_file_io(mount_point_));
  IoStats s = engine_->stats();
  EXPECT_EQ(s.direct_bytes + s.buffered_bytes, s.bytes_written + s.bytes_read);
  if (GetParam().direct_io && mode.direct) {
    EXPECT_GT(s.direct_bytes, 0u);
    EXPECT_EQ(s.direct_fallbacks, 0u);
  }
}

TEST_P(SmallFilesystemTest, TmpfsRoundTripsDirectOrRecordsTheFallback) {
  mount_or_skip([&] { return ScopedMount::memory_fs("tmpfs", mount_point_, 64 * kMiB); });
  check_round_trip(mount_point_ + "/a.bin", kMiB + 7, 0, 0);
  check_round_trip(mount_point_ + "/b.bin", 3 * kMiB, 4097, 1);
  FP_ASSERT_OK_AND_ASSIGN(FileIoMode mode, probe_file_io(mount_point_));
  IoStats s = engine_->stats();
  if (!GetParam().direct_io) {
    EXPECT_EQ(s.direct_bytes, 0u);
    EXPECT_EQ(s.direct_fallbacks, 0u);
  } else if (mode.direct) {  // tmpfs takes O_DIRECT since Linux 6.6
    EXPECT_GT(s.direct_bytes, 0u);
    EXPECT_EQ(s.direct_fallbacks, 0u);
  } else {
    EXPECT_EQ(s.direct_bytes, 0u);
    EXPECT_GT(s.direct_fallbacks, 0u);
    EXPECT_NE(s.last_fallback_reason.find("O_DIRECT"), std::string::npos) << s.last_fallback_reason;
  }
}

TEST_P(SmallFilesystemTest, RamfsRefusesODirectAndTheEngineFallsBack) {
  mount_or_skip([&] { return ScopedMount::memory_fs("ramfs", mount_point_); });
  FP_ASSERT_OK_AND_ASSIGN(FileIoMode mode, probe_file_io(mount_point_));
  if (mode.direct) GTEST_SKIP() << "this kernel's ramfs accepts O_DIRECT; nothing falls back";
  EXPECT_NE(mode.fallback_reason.find("EINVAL"), std::string::npos) << mode.fallback_reason;

  check_round_trip(mount_point_ + "/a.bin", kMiB + 7, 0, 0);
  check_round_trip(mount_point_ + "/b.bin", 2 * kMiB, 4096, 0);
  IoStats s = engine_->stats();
  EXPECT_EQ(s.direct_bytes, 0u);
  EXPECT_EQ(s.buffered_bytes, s.bytes_written + s.bytes_read);
  if (GetParam().direct_io) {
    // One fallback per write; reads of those files fall back too.
    EXPECT_EQ(s.direct_fallbacks, 4u);
    EXPECT_NE(s.last_fallback_reason.find(mount_point_), std::string::npos)
        << s.last_fallback_reason;
    EXPECT_NE(s.last_fallback_reason.find("refuses O_DIRECT"), std::string::npos)
        << s.last_fallback_reason;
  } else {
    EXPECT_EQ(s.direct_fallbacks, 0u);
  }
}

std::vector<FsCase> cases() {
  std::vector<FsCase> out;
  for (Backend b : real_backends()) {
    out.push_back({b, true});
    out.push_back({b, false});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllBackends, SmallFilesystemTest, ::testing::ValuesIn(cases()),
                         [](const auto& p) {
                           return std::string(backend_name(p.param.backend)) +
                                  (p.param.direct_io ? "_direct" : "_buffered");
                         });

}  // namespace
}  // namespace fastpersist::testing
