// SPDX-License-Identifier: Apache-2.0
// Backend probing and AUTO selection, and probe_file_io: what `fastpersist report` prints and
// what IoEngine::create relies on.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/align.h"
#include "fastpersist/io_backend.h"
#include "fastpersist/io_engine.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

TEST(BackendRegistryTest, ProbesEveryBackendInPreferenceOrder) {
  std::array<BackendProbe, 3> probes = probe_all_backends();
  EXPECT_EQ(probes[0].backend, Backend::kIoUring);
  EXPECT_EQ(probes[1].backend, Backend::kLibaio);
  EXPECT_EQ(probes[2].backend, Backend::kThreads);
  for (const BackendProbe& p : probes) {
    SCOPED_TRACE(std::string(backend_name(p.backend)));
    EXPECT_FALSE(p.reason.empty()) << "every probe says why (or how) it is available";
    if (p.available) {
      EXPECT_TRUE(p.built_in);
    }
    if (!p.built_in) {
      EXPECT_FALSE(p.fix.empty()) << "a backend left out of the build names the package to install";
    }
    BackendProbe single = probe_backend(p.backend);
    EXPECT_EQ(single.available, p.available);
    EXPECT_EQ(single.reason, p.reason);
  }
  // The portable backend needs nothing from the kernel.
  EXPECT_TRUE(probes[2].available);
}

TEST(BackendRegistryTest, AutoPicksTheFirstAvailableAndSaysWhy) {
  Backend expected = Backend::kThreads;
  for (const BackendProbe& p : probe_all_backends()) {
    if (p.available) {
      expected = p.backend;
      break;
    }
  }
  std::string why;
  FP_ASSERT_OK_AND_ASSIGN(Backend chosen, resolve_backend(Backend::kAuto, &why));
  EXPECT_EQ(chosen, expected);
  EXPECT_NE(why.find(std::string(backend_name(expected))), std::string::npos) << why;

  BackendProbe auto_probe = probe_backend(Backend::kAuto);
  EXPECT_EQ(auto_probe.backend, Backend::kAuto);
  EXPECT_TRUE(auto_probe.available);
  EXPECT_EQ(auto_probe.reason, why);

  FP_ASSERT_OK_AND_ASSIGN(auto engine, IoEngine::create(EngineOptions{}));
  EXPECT_EQ(engine->options().backend, expected);
  EXPECT_EQ(engine->backend_name(), backend_name(expected));
  EXPECT_EQ(engine->backend_reason(), why);
}

TEST(BackendRegistryTest, ExplicitBackendIsUsedOrRefusedWithTheReason) {
  for (Backend b : real_backends()) {
    SCOPED_TRACE(std::string(backend_name(b)));
    BackendProbe p = probe_backend(b);
    EngineOptions o;
    o.backend = b;
    Result<std::unique_ptr<IoEngine>> engine = IoEngine::create(o);
    if (p.available) {
      FP_ASSERT_OK(engine);
      EXPECT_EQ((*engine)->backend_name(), backend_name(b));
      EXPECT_NE((*engine)->backend_reason().find("explicitly"), std::string::npos);
      FP_EXPECT_OK(backend_factory(b));
    } else {
      ASSERT_FALSE(engine.is_ok());
      EXPECT_EQ(engine.status().code(), StatusCode::kUnavailable);
      EXPECT_NE(engine.status().message().find(p.reason), std::string::npos)
          << engine.status().to_string();
      EXPECT_EQ(backend_factory(b).status().code(), StatusCode::kUnavailable);
    }
  }
}

TEST(BackendRegistryTest, InvalidOptionsAreRefusedBeforeAnyWorkerStarts) {
  EngineOptions o;
  o.block_size = 0;
  EXPECT_EQ(IoEngine::create(o).status().code(), StatusCode::kInvalidArgument);
  o = EngineOptions{};
  o.intra_op_parallelism = 0;
  FP_ASSERT_OK_AND_ASSIGN(BackendFactory factory, backend_factory(Backend::kThreads));
  EXPECT_EQ(IoEngine::create(o, factory, "custom").status().code(), StatusCode::kInvalidArgument);
}

TEST(BackendRegistryTest, CustomFactoryErrorsPropagate) {
  BackendFactory broken = [](unsigned) -> Result<std::unique_ptr<IoBackend>> {
    return Status(StatusCode::kUnavailable, "no queue for you", ENOMEM);
  };
  Result<std::unique_ptr<IoEngine>> engine = IoEngine::create(EngineOptions{}, broken, "broken");
  ASSERT_FALSE(engine.is_ok());
  EXPECT_EQ(engine.status().message(), "no queue for you");
}

TEST(ProbeFileIoTest, FolderFileAndMissingPath) {
  TempDir dir;
  FP_ASSERT_OK_AND_ASSIGN(FileIoMode folder, probe_file_io(dir.path()));
  if (folder.direct) {
    EXPECT_TRUE(folder.fallback_reason.empty());
    EXPECT_TRUE(is_power_of_two(folder.offset_alignment)) << folder.offset_alignment;
    EXPECT_TRUE(is_power_of_two(folder.memory_alignment)) << folder.memory_alignment;
    EXPECT_LE(folder.offset_alignment, 65536u);
  } else {
    EXPECT_FALSE(folder.fallback_reason.empty());
  }
  // Probing a folder leaves nothing behind in it.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  std::string file = dir.file("probe-me.bin");
  FP_ASSERT_OK(write_whole_file(file, random_bytes(10, 1)));
  FP_ASSERT_OK_AND_ASSIGN(FileIoMode on_file, probe_file_io(file));
  EXPECT_EQ(on_file.direct, folder.direct);

  Result<FileIoMode> missing = probe_file_io(dir.file("missing/nothing"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().path(), dir.file("missing/nothing"));
}

}  // namespace
}  // namespace fastpersist::testing
