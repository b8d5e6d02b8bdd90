// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/options.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace fastpersist {
namespace {

constexpr const char* kEnvVars[] = {
    "FASTPERSIST_BACKEND",       "FASTPERSIST_BLOCK_SIZE",
    "FASTPERSIST_QUEUE_DEPTH",   "FASTPERSIST_INTRA_OP_PARALLELISM",
    "FASTPERSIST_SINGLE_SUBMIT", "FASTPERSIST_OVERLAP_EVENTS",
    "FASTPERSIST_DIRECT_IO",     "FASTPERSIST_DIRECT_IO_MIN_BYTES",
};

// Clears every FASTPERSIST_* variable for the test and restores what was there afterwards.
class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kEnvVars) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kEnvVars) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  static void set(const char* name, const char* value) { ::setenv(name, value, 1); }

 private:
  std::map<std::string, std::string> saved_;
};

TEST(ParseSizeTest, AcceptsPlainNumbersAndBinaryUnits) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"4096", 4096},
      {"1b", 1},
      {"1B", 1},
      {"64KiB", 64 << 10},
      {"64k", 64 << 10},
      {"64KB", 64 << 10},
      {"8M", 8 << 20},
      {"8mib", 8 << 20},
      {"1GiB", uint64_t{1} << 30},
      {"2g", uint64_t{2} << 30},
      {"3T", uint64_t{3} << 40},
      {"4 KiB", 4 << 10},
      {"512 ", 512},
      {"16777215T", uint64_t{16777215} << 40},
      {"18446744073709551615", UINT64_MAX},
  };
  for (const Case& c : cases) {
    Result<uint64_t> r = parse_size(c.text);
    ASSERT_TRUE(r.is_ok()) << "'" << c.text << "': " << r.status().to_string();
    EXPECT_EQ(*r, c.bytes) << "'" << c.text << "'";
  }
}

TEST(ParseSizeTest, RejectsWhatIsNotASize) {
  for (const char* text : {"", " ", "abc", "-1", "1.5G", "K", "12 parsecs", "8MiBs", "0x10",
                           "16777216T", "18446744073709551616"}) {
    Result<uint64_t> r = parse_size(text);
    ASSERT_FALSE(r.is_ok()) << "'" << text << "' parsed as " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << r.status().message();
  }
}

// Hugging Face's units (transformers' convert_file_size_to_int): decimal KB/MB/GB, binary
// KiB/MiB/GiB, a lowercase final "b" for bits. test_safetensors_interop.py compares with
// transformers itself.
TEST(ParseHfSizeTest, DecimalAndBinaryUnitsAsHuggingFaceMeansThem) {
  EXPECT_EQ(*parse_hf_size("5GB"), uint64_t{5000000000});
  EXPECT_EQ(*parse_hf_size("5gB"), uint64_t{5000000000});
  EXPECT_EQ(*parse_hf_size("5gb"), uint64_t{625000000})
      << "a final lowercase b: bits, as transformers reads it";
  EXPECT_EQ(*parse_hf_size("5GiB"), uint64_t{5} << 30);
  EXPECT_EQ(*parse_hf_size("100KB"), uint64_t{100000});
  EXPECT_EQ(*parse_hf_size("10MB"), uint64_t{10000000});
  EXPECT_EQ(*parse_hf_size("3mib"), uint64_t{3} << 20);
  EXPECT_EQ(*parse_hf_size("7KiB"), uint64_t{7} << 10);
  EXPECT_EQ(*parse_hf_size("5Gb"), uint64_t{625000000}) << "bits";
  EXPECT_EQ(*parse_hf_size("4096"), uint64_t{4096});
  for (const char* text :
       {"", "GB", "5 GB", "-5GB", "5TB", "5G", "1.5GB", "99999999999999999999GB", "x5MB"}) {
    Result<uint64_t> r = parse_hf_size(text);
    ASSERT_FALSE(r.is_ok()) << "'" << text << "' parsed as " << *r;
    EXPECT_NE(r.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(ParseBackendTest, NamesAndAliasesRoundTrip) {
  for (Backend b : {Backend::kAuto, Backend::kIoUring, Backend::kLibaio, Backend::kThreads}) {
    Result<Backend> r = parse_backend(backend_name(b));
    ASSERT_TRUE(r.is_ok()) << backend_name(b);
    EXPECT_EQ(*r, b);
  }
  EXPECT_EQ(parse_backend("uring").value(), Backend::kIoUring);
  EXPECT_EQ(parse_backend("aio").value(), Backend::kLibaio);
  EXPECT_EQ(backend_name(Backend::kIoUring), "io_uring");
  EXPECT_EQ(backend_name(Backend::kLibaio), "libaio");
  EXPECT_EQ(backend_name(Backend::kThreads), "threads");
  EXPECT_EQ(backend_name(Backend::kAuto), "auto");
}

TEST(ParseBackendTest, UnknownNameListsTheChoices) {
  Result<Backend> r = parse_backend("spdk");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("spdk"), std::string::npos) << m;
  EXPECT_NE(m.find("io_uring"), std::string::npos) << m;
  EXPECT_FALSE(parse_backend("").is_ok());
  EXPECT_FALSE(parse_backend("IO_URING").is_ok());
}

TEST(EngineOptionsTest, DefaultsAreDeepNvmeDefaults) {
  EngineOptions o;
  EXPECT_EQ(o.backend, Backend::kAuto);
  EXPECT_EQ(o.block_size, size_t{1} << 20);
  EXPECT_EQ(o.queue_depth, 128u);
  EXPECT_FALSE(o.single_submit);
  EXPECT_FALSE(o.overlap_events);
  EXPECT_EQ(o.intra_op_parallelism, 1u);
  EXPECT_TRUE(o.direct_io);
  EXPECT_EQ(o.direct_io_min_bytes, size_t{64} << 10);
  EXPECT_TRUE(o.validate().is_ok());
}

TEST(EngineOptionsTest, ValidateChecksRanges) {
  auto with = [](auto change) {
    EngineOptions o;
    change(o);
    return o.validate();
  };
  EXPECT_FALSE(with([](EngineOptions& o) { o.block_size = 0; }).is_ok());
  EXPECT_TRUE(with([](EngineOptions& o) { o.block_size = 1; }).is_ok());
  EXPECT_TRUE(with([](EngineOptions& o) { o.block_size = size_t{1} << 30; }).is_ok());
  EXPECT_FALSE(with([](EngineOptions& o) { o.block_size = (size_t{1} << 30) + 1; }).is_ok());
  EXPECT_FALSE(with([](EngineOptions& o) { o.queue_depth = 0; }).is_ok());
  EXPECT_TRUE(with([](EngineOptions& o) { o.queue_depth = 1; }).is_ok());
  EXPECT_TRUE(with([](EngineOptions& o) { o.queue_depth = 65536; }).is_ok());
  EXPECT_FALSE(with([](EngineOptions& o) { o.queue_depth = 65537; }).is_ok());
  EXPECT_FALSE(with([](EngineOptions& o) { o.intra_op_parallelism = 0; }).is_ok());
  EXPECT_TRUE(with([](EngineOptions& o) { o.intra_op_parallelism = 1024; }).is_ok());
  EXPECT_FALSE(with([](EngineOptions& o) { o.intra_op_parallelism = 1025; }).is_ok());
  Status st = with([](EngineOptions& o) { o.queue_depth = 0; });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("queue_depth"), std::string::npos) << st.message();
}

TEST_F(EnvTest, NoVariablesKeepsTheBase) {
  EngineOptions base;
  base.queue_depth = 7;
  base.backend = Backend::kThreads;
  Result<EngineOptions> r = engine_options_from_env(base);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->queue_depth, 7u);
  EXPECT_EQ(r->backend, Backend::kThreads);
  EXPECT_EQ(r->block_size, base.block_size);
}

TEST_F(EnvTest, EveryVariableIsApplied) {
  set("FASTPERSIST_BACKEND", "threads");
  set("FASTPERSIST_BLOCK_SIZE", "8M");
  set("FASTPERSIST_QUEUE_DEPTH", "32");
  set("FASTPERSIST_INTRA_OP_PARALLELISM", "4");
  set("FASTPERSIST_SINGLE_SUBMIT", "1");
  set("FASTPERSIST_OVERLAP_EVENTS", "true");
  set("FASTPERSIST_DIRECT_IO", "off");
  set("FASTPERSIST_DIRECT_IO_MIN_BYTES", "4KiB");
  Result<EngineOptions> r = engine_options_from_env();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, Backend::kThreads);
  EXPECT_EQ(r->block_size, size_t{8} << 20);
  EXPECT_EQ(r->queue_depth, 32u);
  EXPECT_EQ(r->intra_op_parallelism, 4u);
  EXPECT_TRUE(r->single_submit);
  EXPECT_TRUE(r->overlap_events);
  EXPECT_FALSE(r->direct_io);
  EXPECT_EQ(r->direct_io_min_bytes, size_t{4096});
}

TEST_F(EnvTest, BooleansAcceptTheUsualSpellings) {
  for (const char* yes : {"1", "true", "on", "yes"}) {
    set("FASTPERSIST_SINGLE_SUBMIT", yes);
    Result<EngineOptions> r = engine_options_from_env();
    ASSERT_TRUE(r.is_ok()) << yes;
    EXPECT_TRUE(r->single_submit) << yes;
  }
  for (const char* no : {"0", "false", "off", "no"}) {
    set("FASTPERSIST_DIRECT_IO", no);
    Result<EngineOptions> r = engine_options_from_env();
    ASSERT_TRUE(r.is_ok()) << no;
    EXPECT_FALSE(r->direct_io) << no;
  }
}

TEST_F(EnvTest, UnknownValuesAreErrorsNamingTheVariable) {
  struct Case {
    const char* name;
    const char* value;
  };
  const Case cases[] = {
      {"FASTPERSIST_BACKEND", "spdk"},
      {"FASTPERSIST_BLOCK_SIZE", "lots"},
      {"FASTPERSIST_BLOCK_SIZE", "0"},     // parses, but validate() refuses it
      {"FASTPERSIST_QUEUE_DEPTH", "32K"},  // counts take no units
      {"FASTPERSIST_QUEUE_DEPTH", "-1"},
      {"FASTPERSIST_QUEUE_DEPTH", "0"},
      {"FASTPERSIST_INTRA_OP_PARALLELISM", "two"},
      {"FASTPERSIST_SINGLE_SUBMIT", "maybe"},
      {"FASTPERSIST_OVERLAP_EVENTS", ""},
      {"FASTPERSIST_DIRECT_IO", "2"},
      {"FASTPERSIST_DIRECT_IO_MIN_BYTES", "1.5K"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name) + "=" + c.value);
    set(c.name, c.value);
    Result<EngineOptions> r = engine_options_from_env();
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    ::unsetenv(c.name);
  }
  set("FASTPERSIST_SINGLE_SUBMIT", "maybe");
  Result<EngineOptions> r = engine_options_from_env();
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("FASTPERSIST_SINGLE_SUBMIT"), std::string::npos)
      << r.status().message();
}

// 2^32 + 1 used to wrap to 1 when narrowed to unsigned and then passed validation: a typo in a
// tuning variable silently became a queue depth of one.
TEST_F(EnvTest, CountsTooLargeForUnsignedAreRejectedNotWrapped) {
  set("FASTPERSIST_QUEUE_DEPTH", "4294967297");
  Result<EngineOptions> r = engine_options_from_env();
  EXPECT_FALSE(r.is_ok()) << "queue_depth became " << r->queue_depth;
  ::unsetenv("FASTPERSIST_QUEUE_DEPTH");
  set("FASTPERSIST_INTRA_OP_PARALLELISM", "4294967298");
  r = engine_options_from_env();
  EXPECT_FALSE(r.is_ok()) << "intra_op_parallelism became " << r->intra_op_parallelism;
}

}  // namespace
}  // namespace fastpersist
