// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/guarded.h"
#include "testing/status_matchers.h"

namespace fastpersist {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status st;
  EXPECT_TRUE(st.is_ok());
  EXPECT_TRUE(static_cast<bool>(st));
  EXPECT_EQ(st.code(), StatusCode::kOk);
  EXPECT_EQ(st.sys_errno(), 0);
  EXPECT_EQ(st.to_string(), "ok");
  EXPECT_TRUE(Status::ok().is_ok());
}

TEST(StatusTest, FromErrnoClassifiesTheCode) {
  EXPECT_EQ(Status::from_errno(ENOENT, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(Status::from_errno(ENOSYS, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(Status::from_errno(EOPNOTSUPP, "x").code(), StatusCode::kUnavailable);
  for (int err : {EIO, ENOSPC, EACCES, EROFS, EINVAL, EISDIR}) {
    Status st = Status::from_errno(err, "x");
    EXPECT_EQ(st.code(), StatusCode::kIoError) << std::strerror(err);
    EXPECT_EQ(st.sys_errno(), err);
    EXPECT_FALSE(st.is_ok());
  }
}

TEST(StatusTest, ToStringCarriesErrnoPathAndRange) {
  Status st =
      Status::from_errno(ENOSPC, "write failed").with_path("/data/ckpt.bin").with_range(4096, 8192);
  std::string s = st.to_string();
  EXPECT_NE(s.find("io error: write failed"), std::string::npos) << s;
  EXPECT_NE(s.find("[errno 28: "), std::string::npos) << s;
  EXPECT_NE(s.find(std::strerror(ENOSPC)), std::string::npos) << s;
  EXPECT_NE(s.find("path /data/ckpt.bin"), std::string::npos) << s;
  EXPECT_NE(s.find("offset 4096, length 8192"), std::string::npos) << s;
  EXPECT_EQ(st.path(), "/data/ckpt.bin");
  EXPECT_EQ(st.offset(), 4096u);
  EXPECT_EQ(st.length(), 8192u);
}

TEST(StatusTest, ToStringWithoutErrnoOrContext) {
  Status st(StatusCode::kInvalidArgument, "block_size must be positive");
  EXPECT_EQ(st.to_string(), "invalid argument: block_size must be positive");
  EXPECT_FALSE(st.offset().has_value());
  EXPECT_FALSE(st.length().has_value());
  EXPECT_TRUE(st.path().empty());
}

TEST(StatusTest, RangeWithoutPath) {
  Status st = Status(StatusCode::kOutOfRange, "past end").with_range(10, 20);
  EXPECT_EQ(st.to_string(), "out of range: past end (offset 10, length 20)");
}

TEST(StatusTest, WithPathChainsOnLvalues) {
  Status st(StatusCode::kIoError, "boom", EIO);
  Status& ref = st.with_path("/p").with_range(1, 2);
  EXPECT_EQ(&ref, &st);
  EXPECT_EQ(st.path(), "/p");
  EXPECT_EQ(st.offset(), 1u);
}

TEST(StatusTest, CopiesAreIndependentValues) {
  Status a = Status::from_errno(EIO, "a").with_path("/a");
  Status b = a;
  b.with_path("/b");
  EXPECT_EQ(a.path(), "/a");
  EXPECT_EQ(b.path(), "/b");
  EXPECT_EQ(b.sys_errno(), EIO);
}

TEST(StatusTest, EveryCodeHasAName) {
  EXPECT_STREQ(status_code_name(StatusCode::kOk), "ok");
  EXPECT_STREQ(status_code_name(StatusCode::kInvalidArgument), "invalid argument");
  EXPECT_STREQ(status_code_name(StatusCode::kIoError), "io error");
  EXPECT_STREQ(status_code_name(StatusCode::kNotFound), "not found");
  EXPECT_STREQ(status_code_name(StatusCode::kUnavailable), "unavailable");
  EXPECT_STREQ(status_code_name(StatusCode::kOutOfRange), "out of range");
  EXPECT_STREQ(status_code_name(StatusCode::kInternal), "internal error");
}

TEST(ResultTest, HoldsAValueOrAStatus) {
  Result<int> good = 42;
  ASSERT_TRUE(good.is_ok());
  EXPECT_TRUE(good.status().is_ok());
  EXPECT_EQ(*good, 42);
  EXPECT_EQ(good.value(), 42);

  Result<int> bad = Status(StatusCode::kNotFound, "missing");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_FALSE(static_cast<bool>(bad));
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bad.status().message(), "missing");
}

TEST(ResultTest, MovesOutMoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r->get(), 7);
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

Status fails_when(bool fail) {
  if (fail) return Status(StatusCode::kIoError, "inner", EIO);
  return Status::ok();
}

Status propagate(bool fail, bool* reached_end) {
  FP_RETURN_IF_ERROR(fails_when(fail));
  *reached_end = true;
  return Status::ok();
}

Result<int> parse(bool fail) {
  if (fail) return Status(StatusCode::kInvalidArgument, "bad number");
  return 5;
}

Result<int> doubled(bool fail) {
  FP_ASSIGN_OR_RETURN(int v, parse(fail));
  return v * 2;
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesTheFirstError) {
  bool reached = false;
  Status st = propagate(true, &reached);
  EXPECT_FALSE(reached);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.sys_errno(), EIO);
  EXPECT_TRUE(propagate(false, &reached).is_ok());
  EXPECT_TRUE(reached);
}

TEST(StatusMacrosTest, AssignOrReturnBindsOrPropagates) {
  Result<int> ok = doubled(false);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, 10);
  Result<int> bad = doubled(true);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "bad number");
}

}  // namespace
}  // namespace fastpersist

namespace fastpersist {
namespace {

// A thread's body that throws never reaches std::terminate: memory running out is ENOMEM,
// anything else kInternal, both naming the work; a body that returns passes its Status on.
TEST(RunGuardedTest, TurnsExceptionsIntoStatuses) {
  Status oom = run_guarded("a drain pass", []() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(oom.sys_errno(), ENOMEM);
  EXPECT_NE(oom.message().find("a drain pass ran out of memory"), std::string::npos)
      << oom.to_string();
  Status other =
      run_guarded("a save", []() -> Status { throw std::length_error("vector too long"); });
  EXPECT_EQ(other.code(), StatusCode::kInternal);
  EXPECT_NE(other.message().find("a save failed: vector too long"), std::string::npos)
      << other.to_string();
  Status passed = run_guarded("a save", [] { return Status(StatusCode::kBusy, "held"); });
  EXPECT_EQ(passed.code(), StatusCode::kBusy);
  FP_EXPECT_OK(run_guarded("a save", [] { return Status::ok(); }));
}

}  // namespace
}  // namespace fastpersist
