// SPDX-License-Identifier: Apache-2.0
// The engine conformance suite, error and descriptor half: every backend and configuration of
// testing/engine_fixture.h (instantiated in engine_conformance_test.cc) must turn each mistake
// and each refusal of the operating system into a clear error with errno and path, and keep
// working afterwards; and requests on a caller's descriptor must behave like requests by path
// whatever flags (O_APPEND, O_DIRECT) the caller opened it with.
#include <fcntl.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "common/unique_fd.h"
#include "fastpersist/io_engine.h"
#include "testing/engine_fixture.h"
#include "testing/mount_util.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

IoRequest by_path(IoKind kind, const std::string& path, std::byte* buffer, uint64_t length,
                  uint64_t offset = 0) {
  IoRequest r;
  r.kind = kind;
  r.path = path;
  r.buffer = buffer;
  r.length = length;
  r.file_offset = offset;
  return r;
}

IoRequest by_fd(IoKind kind, int fd, std::byte* buffer, uint64_t length, uint64_t offset) {
  IoRequest r;
  r.kind = kind;
  r.fd = fd;
  r.buffer = buffer;
  r.length = length;
  r.file_offset = offset;
  return r;
}

// Checks an OS error: its code, errno, and that it names the file.
void expect_os_error(const Status& st, StatusCode code, int err, const std::string& path) {
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_EQ(st.sys_errno(), err) << st.to_string() << " (expected " << std::strerror(err) << ")";
  EXPECT_EQ(st.path(), path) << st.to_string();
  EXPECT_NE(st.to_string().find(path), std::string::npos) << st.to_string();
}

// Runs the calling thread with another filesystem uid. For root this drops CAP_DAC_OVERRIDE
// along with it, so permission bits apply; the engine opens files on the submitting thread.
class ScopedFsUid {
 public:
  explicit ScopedFsUid(uid_t uid) : previous_(static_cast<uid_t>(::setfsuid(uid))) {}
  ~ScopedFsUid() { ::setfsuid(previous_); }
  ScopedFsUid(const ScopedFsUid&) = delete;
  ScopedFsUid& operator=(const ScopedFsUid&) = delete;

 private:
  uid_t previous_;
};

constexpr uid_t kNobody = 65534;

TEST_P(EngineTest, MissingDirectoryIsNotFound) {
  std::string path = dir_.file("no-such-dir/file.bin");
  std::vector<std::byte> data = random_bytes(4096, 1);
  expect_os_error(write_at(path, data.data(), data.size(), 0).status(), StatusCode::kNotFound,
                  ENOENT, path);
  expect_os_error(read_at(path, data.data(), data.size(), 0).status(), StatusCode::kNotFound,
                  ENOENT, path);
  std::string missing = dir_.file("missing.bin");
  expect_os_error(read_at(missing, data.data(), data.size(), 0).status(), StatusCode::kNotFound,
                  ENOENT, missing);
  // Open errors come back from submit itself; nothing is left pending.
  Result<IoTicket> t = engine_->submit(by_path(IoKind::kWrite, path, data.data(), data.size()));
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->pending(), 0u);
  FP_ASSERT_OK_AND_ASSIGN(size_t n, engine_->wait());
  EXPECT_EQ(n, 0u);
  check_engine_still_works();
}

TEST_P(EngineTest, PermissionDeniedIsAClearError) {
  const bool root = ::geteuid() == 0;
  std::string locked = dir_.file("locked");
  std::string secret = locked + "/secret.bin";
  std::string private_file = dir_.file("private.bin");
  ASSERT_EQ(::mkdir(locked.c_str(), 0755), 0) << std::strerror(errno);
  std::vector<std::byte> data = random_bytes(100000, 2);
  FP_ASSERT_OK(write_whole_file(secret, data));
  FP_ASSERT_OK(write_whole_file(private_file, data));
  ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
  ASSERT_EQ(::chmod(private_file.c_str(), 0), 0);
  // The unprivileged uid must reach the test folder itself to meet the locked entries in it.
  if (root) {
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  }
  {
    // Root ignores permission bits; as another fs uid it does not (CAP_DAC_OVERRIDE is dropped).
    ScopedFsUid as_nobody(root ? kNobody : ::geteuid());
    if (root && static_cast<uid_t>(::setfsuid(static_cast<uid_t>(-1))) != kNobody) {
      GTEST_SKIP() << "root cannot switch its filesystem uid here (no CAP_SETUID), so permission "
                      "bits do not apply to it";
    }
    std::string fresh = locked + "/new.bin";
    expect_os_error(write_at(fresh, data.data(), data.size(), 0).status(), StatusCode::kIoError,
                    EACCES, fresh);
    expect_os_error(read_at(secret, data.data(), data.size(), 0).status(), StatusCode::kIoError,
                    EACCES, secret);
    expect_os_error(read_at(private_file, data.data(), data.size(), 0).status(),
                    StatusCode::kIoError, EACCES, private_file);
    expect_os_error(write_at(private_file, data.data(), data.size(), 0).status(),
                    StatusCode::kIoError, EACCES, private_file);
  }
  ASSERT_EQ(::chmod(locked.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(private_file.c_str(), 0600), 0);
  // The refused write did not truncate the file.
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> still, read_whole_file(private_file));
  EXPECT_EQ("", first_difference(data, still));
  check_engine_still_works();
}

TEST_P(EngineTest, ReadOnlyFilesystemIsAClearError) {
  if (::geteuid() != 0) GTEST_SKIP() << "a read-only bind mount needs root";
  std::string source = dir_.file("source");
  std::string target = dir_.file("read-only");
  ASSERT_EQ(::mkdir(source.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(target.c_str(), 0755), 0);
  std::vector<std::byte> data = random_bytes(kMiB + 7, 3);
  FP_ASSERT_OK(write_whole_file(source + "/existing.bin", data));
  // Best effort: a crash then cannot leave the mount behind in the shared namespace.
  (void)enter_private_mount_namespace();
  Result<ScopedMount> mount = ScopedMount::read_only_bind(source, target);
  if (!mount.is_ok())
    GTEST_SKIP() << "cannot make a read-only mount: " << mount.status().to_string();

  std::string fresh = target + "/new.bin";
  std::string existing = target + "/existing.bin";
  expect_os_error(write_at(fresh, data.data(), data.size(), 0).status(), StatusCode::kIoError,
                  EROFS, fresh);
  expect_os_error(write_at(existing, data.data(), data.size(), 0).status(), StatusCode::kIoError,
                  EROFS, existing);
  expect_os_error(write_at(existing, data.data(), 10, 5).status(), StatusCode::kIoError, EROFS,
                  existing);
  // Reading from a read-only filesystem is fine.
  TestBuffer back(data.size(), 1);
  FP_ASSERT_OK(read_at(existing, back.data(), back.size(), 0));
  EXPECT_EQ("", first_difference(data, back.span()));
  FP_ASSERT_OK(mount->unmount());
  check_engine_still_works();
}

TEST_P(EngineTest, ReadPastTheEndIsOutOfRange) {
  std::string path = dir_.file("short.bin");
  std::vector<std::byte> data = random_bytes(100000, 4);
  FP_ASSERT_OK(write_whole_file(path, data));
  TestBuffer buf(2 * data.size());
  struct Range {
    uint64_t offset, length;
  };
  for (Range r : {Range{0, data.size() + 1}, Range{data.size(), 1}, Range{data.size() + 4096, 10},
                  Range{4096, data.size()}}) {
    SCOPED_TRACE("read at " + std::to_string(r.offset) + " of " + std::to_string(r.length));
    Status st = read_at(path, buf.data(), r.length, r.offset).status();
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
    EXPECT_EQ(st.path(), path);
    EXPECT_EQ(st.offset(), r.offset);
    EXPECT_EQ(st.length(), r.length);
  }
  // The exact end is fine, and so is an empty read there.
  FP_ASSERT_OK_AND_ASSIGN(uint64_t n, read_at(path, buf.data(), data.size(), 0));
  EXPECT_EQ(n, data.size());
  FP_ASSERT_OK_AND_ASSIGN(n, read_at(path, buf.data(), 0, data.size()));
  EXPECT_EQ(n, 0u);
  check_engine_still_works();
}

TEST_P(EngineTest, PathIsADirectory) {
  std::vector<std::byte> data = random_bytes(kMiB, 5);
  std::string path = dir_.path();
  // The same mistake gives the same error whichever way it is made.
  expect_os_error(write_at(path, data.data(), data.size(), 0).status(), StatusCode::kIoError,
                  EISDIR, path);
  expect_os_error(write_at(path, data.data(), data.size(), 4096).status(), StatusCode::kIoError,
                  EISDIR, path);
  expect_os_error(read_at(path, data.data(), data.size(), 0).status(), StatusCode::kIoError, EISDIR,
                  path);
  check_engine_still_works();
}

TEST_P(EngineTest, BadArgumentsAreInvalidArgument) {
  std::vector<std::byte> data(16);
  auto code_of = [&](IoRequest r) { return engine_->run(r).status().code(); };
  EXPECT_EQ(code_of(by_path(IoKind::kWrite, dir_.file("x"), nullptr, 10)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(by_path(IoKind::kRead, dir_.file("x"), nullptr, 10)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(by_path(IoKind::kWrite, "", data.data(), data.size())),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(by_path(IoKind::kWrite, dir_.file("x"), data.data(), 16, UINT64_MAX - 8)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(by_path(IoKind::kWrite, dir_.file("x"), data.data(), 16, uint64_t{INT64_MAX})),
            StatusCode::kInvalidArgument);
  Result<IoTicket> t = engine_->submit(by_path(IoKind::kWrite, dir_.file("x"), nullptr, 1));
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("null"), std::string::npos) << t.status().to_string();
  // A null buffer with nothing to move is not a mistake: it makes an empty file.
  FP_ASSERT_OK_AND_ASSIGN(uint64_t n,
                          engine_->run(by_path(IoKind::kWrite, dir_.file("empty"), nullptr, 0)));
  EXPECT_EQ(n, 0u);
  FP_ASSERT_OK_AND_ASSIGN(uint64_t size, file_size(dir_.file("empty")));
  EXPECT_EQ(size, 0u);
  EXPECT_EQ(engine_->pending(), 0u);
  check_engine_still_works();
}

TEST_P(EngineTest, RequestsOnACallersDescriptor) {
  std::string path = dir_.file("by-fd.bin");
  std::vector<std::byte> expected = random_bytes(2 * kMiB, 6);
  FP_ASSERT_OK(write_whole_file(path, expected));
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fd.valid()) << std::strerror(errno);

  // At offset 0 a descriptor's file is updated in place, never truncated.
  TestBuffer head(3 * 4096 + 5, 0);
  fill_random(head.span(), 7);
  FP_ASSERT_OK_AND_ASSIGN(
      uint64_t n, engine_->run(by_fd(IoKind::kWrite, fd.get(), head.data(), head.size(), 0)));
  EXPECT_EQ(n, head.size());
  std::memcpy(expected.data(), head.data(), head.size());
  TestBuffer middle(kMiB + 7, 1);
  fill_random(middle.span(), 8);
  FP_ASSERT_OK(engine_->run(by_fd(IoKind::kWrite, fd.get(), middle.data(), middle.size(), 4097)));
  std::memcpy(expected.data() + 4097, middle.data(), middle.size());
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
  ASSERT_EQ("", first_difference(expected, on_disk));

  TestBuffer back(kMiB + 7, 0);
  FP_ASSERT_OK(engine_->run(by_fd(IoKind::kRead, fd.get(), back.data(), back.size(), 4097)));
  EXPECT_EQ("", first_difference(middle.span(), back.span()));
  // The caller's descriptor is still open, and its file position untouched.
  EXPECT_NE(::fcntl(fd.get(), F_GETFD), -1);
  EXPECT_EQ(::lseek(fd.get(), 0, SEEK_CUR), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDWR);
  check_engine_still_works();
}

TEST_P(EngineTest, AppendModeDescriptorStillWritesAtTheOffset) {
  // pwrite on an O_APPEND descriptor appends whatever the offset (a Linux quirk); the engine
  // must write where it was asked.
  std::string path = dir_.file("append.bin");
  std::vector<std::byte> expected = random_bytes(256 << 10, 9);
  FP_ASSERT_OK(write_whole_file(path, expected));
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
  ASSERT_TRUE(fd.valid()) << std::strerror(errno);
  struct Patch {
    uint64_t offset, length;
  };
  for (Patch p : {Patch{100, 5000}, Patch{4096, 70000}, Patch{0, 128 << 10}}) {
    TestBuffer patch(p.length, p.offset % 2);
    fill_random(patch.span(), p.offset + 1);
    FP_ASSERT_OK(engine_->run(by_fd(IoKind::kWrite, fd.get(), patch.data(), p.length, p.offset)));
    std::memcpy(expected.data() + p.offset, patch.data(), p.length);
  }
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
  EXPECT_EQ("", first_difference(expected, on_disk));
  EXPECT_NE(::fcntl(fd.get(), F_GETFL) & O_APPEND, 0) << "the caller's flags are left alone";
}

TEST_P(EngineTest, ODirectDescriptorTakesUnalignedRequests) {
  std::string path = dir_.file("direct.bin");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644));
  if (!fd.valid() && errno == EINVAL)
    GTEST_SKIP() << "the test folder's filesystem refuses O_DIRECT";
  ASSERT_TRUE(fd.valid()) << std::strerror(errno);
  TestBuffer aligned(kMiB, 0);
  fill_random(aligned.span(), 10);
  FP_ASSERT_OK(engine_->run(by_fd(IoKind::kWrite, fd.get(), aligned.data(), aligned.size(), 0)));
  // Unaligned offset, length and memory: the head and tail cannot go O_DIRECT.
  TestBuffer odd(kMiB + 7, 1);
  fill_random(odd.span(), 11);
  FP_ASSERT_OK(engine_->run(by_fd(IoKind::kWrite, fd.get(), odd.data(), odd.size(), 4097)));
  std::vector<std::byte> expected(aligned.span().begin(), aligned.span().end());
  expected.resize(4097 + odd.size());
  std::memcpy(expected.data() + 4097, odd.data(), odd.size());
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> on_disk, read_whole_file(path));
  ASSERT_EQ("", first_difference(expected, on_disk));

  TestBuffer back(expected.size() - 3, 1);
  FP_ASSERT_OK(engine_->run(by_fd(IoKind::kRead, fd.get(), back.data(), back.size(), 3)));
  EXPECT_EQ("", first_difference(std::span(expected).subspan(3), back.span()));
}

TEST_P(EngineTest, DescriptorErrors) {
  std::string path = dir_.file("fd-errors.bin");
  std::vector<std::byte> data = random_bytes(8192, 12);
  FP_ASSERT_OK(write_whole_file(path, data));
  UniqueFd read_only(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd write_only(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  ASSERT_TRUE(read_only.valid() && write_only.valid());
  EXPECT_EQ(
      engine_->run(by_fd(IoKind::kWrite, read_only.get(), data.data(), 10, 0)).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      engine_->run(by_fd(IoKind::kRead, write_only.get(), data.data(), 10, 0)).status().code(),
      StatusCode::kInvalidArgument);
  Status bad = engine_->run(by_fd(IoKind::kWrite, INT_MAX, data.data(), 10, 0)).status();
  EXPECT_EQ(bad.code(), StatusCode::kIoError) << bad.to_string();
  EXPECT_EQ(bad.sys_errno(), EBADF) << bad.to_string();
  Status past = engine_->run(by_fd(IoKind::kRead, read_only.get(), data.data(), 10, 8190)).status();
  EXPECT_EQ(past.code(), StatusCode::kOutOfRange) << past.to_string();
  check_engine_still_works();
}

}  // namespace
}  // namespace fastpersist::testing
