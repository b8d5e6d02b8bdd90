// SPDX-License-Identifier: Apache-2.0
// cuFile is found at run time or its absence explained, and the GDS driver's mode is read from
// procfs and the environment without opening cuFile's driver.
#include "io/cufile_library.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

// Sets an environment variable for one scope and restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::string old_;
  bool had_ = false;
};

TEST(CuFileLibrary, FoundWithEveryEntryPointOrExplainsWhyNot) {
  io::CuFileLibrary lib = io::load_cufile_library();
  if (lib.available) {
    EXPECT_FALSE(lib.library.empty());
    EXPECT_NE(lib.driver_open, nullptr);
    EXPECT_NE(lib.handle_register, nullptr);
    EXPECT_NE(lib.handle_deregister, nullptr);
    EXPECT_NE(lib.buf_register, nullptr);
    EXPECT_NE(lib.buf_deregister, nullptr);
    EXPECT_NE(lib.read, nullptr);
    EXPECT_NE(lib.write, nullptr);
  } else {
    EXPECT_NE(lib.reason.find("libcufile"), std::string::npos) << lib.reason;
    EXPECT_EQ(lib.read, nullptr);
  }
}

TEST(CuFileLibrary, DisabledWithCuda) {
  ScopedEnv off("FASTPERSIST_DISABLE_CUDA", "1");
  io::CuFileLibrary lib = io::load_cufile_library();
  EXPECT_FALSE(lib.available);
  EXPECT_EQ(lib.reason, "disabled by FASTPERSIST_DISABLE_CUDA");
}

TEST(CuFileLibrary, AConfiguredPathThatFailsIsNamedInTheReason) {
  ScopedEnv cuda("FASTPERSIST_DISABLE_CUDA", nullptr);
  TempDir dir;  // a folder without libcufile.so.0 in it
  ScopedEnv path("FASTPERSIST_CUFILE_LIBRARY", dir.path().c_str());
  io::CuFileLibrary lib = io::load_cufile_library();
  if (lib.available) GTEST_SKIP() << "cuFile found elsewhere: " << lib.library;
  EXPECT_NE(lib.reason.find(dir.path() + "/libcufile.so.0"), std::string::npos) << lib.reason;
  EXPECT_NE(lib.reason.find("FASTPERSIST_CUFILE_LIBRARY"), std::string::npos) << lib.reason;
}

TEST(CuFileLibrary, ErrorTexts) {
  EXPECT_EQ(io::cufile_error_text({5011, 0}), "cuFile error 5011");
  EXPECT_EQ(io::cufile_error_text({5030, 201}), "cuFile error 5030 (CUDA driver error 201)");
  EXPECT_EQ(io::cufile_result_text(-1, 5), "cuFile I/O failed with errno 5");
  EXPECT_EQ(io::cufile_result_text(-5014, 0), "cuFile error 5014");
}

TEST(GdsDriver, WithoutNvidiaFsIsCompatibilityMode) {
  ScopedEnv force("CUFILE_FORCE_COMPAT_MODE", nullptr);
  TempDir proc;
  io::GdsDriverInfo info = io::probe_gds_driver(proc.path());
  EXPECT_FALSE(info.nvidia_fs_loaded);
  EXPECT_TRUE(info.compat_mode);
  EXPECT_EQ(info.mode.rfind("compatibility mode: the nvidia-fs kernel driver is not loaded", 0), 0u)
      << info.mode;
}

TEST(GdsDriver, WithNvidiaFsIsGpuDirectUnlessCompatibilityIsForced) {
  TempDir proc;
  ASSERT_EQ(::mkdir((proc.path() + "/driver").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((proc.path() + "/driver/nvidia-fs").c_str(), 0755), 0);
  std::ofstream(proc.path() + "/driver/nvidia-fs/version") << "version: 2.17\n";
  {
    ScopedEnv force("CUFILE_FORCE_COMPAT_MODE", nullptr);
    io::GdsDriverInfo info = io::probe_gds_driver(proc.path());
    EXPECT_TRUE(info.nvidia_fs_loaded);
    EXPECT_EQ(info.nvidia_fs_version, "version: 2.17");
    EXPECT_FALSE(info.compat_mode);
    EXPECT_EQ(info.mode.rfind("GPUDirect Storage: nvidia-fs version: 2.17", 0), 0u) << info.mode;
  }
  ScopedEnv force("CUFILE_FORCE_COMPAT_MODE", "true");
  io::GdsDriverInfo info = io::probe_gds_driver(proc.path());
  EXPECT_TRUE(info.forced_compat_mode);
  EXPECT_TRUE(info.compat_mode);
  EXPECT_NE(info.mode.find("CUFILE_FORCE_COMPAT_MODE"), std::string::npos) << info.mode;
}

}  // namespace
}  // namespace fastpersist::testing
