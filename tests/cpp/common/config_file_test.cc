// SPDX-License-Identifier: Apache-2.0
// Configuration files (config_file.h): what `fastpersist tune --output` writes is read back the
// same; every field is checked (unknown keys, wrong types, ranges, format and version named in
// the message); sizes take units; the file is applied under the environment variables, and
// use_config_file() takes precedence over FASTPERSIST_CONFIG.
#include "fastpersist/config_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "testing/temp_dir.h"

namespace fastpersist {
namespace {

std::string config(const std::string& engine, const std::string& extra = "") {
  return R"({"format": "fastpersist-config", "version": 1, "engine": )" + engine + extra + "}";
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Clears FASTPERSIST_CONFIG, FASTPERSIST_QUEUE_DEPTH and the chosen file around each test.
class ConfigEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    ::unsetenv(kConfigEnvVariable);
    ::unsetenv("FASTPERSIST_QUEUE_DEPTH");
    ASSERT_TRUE(use_config_file("").is_ok());
  }
  testing::TempDir dir_{testing::temp_root()};
};

TEST(ConfigFileTest, WhatEncodeWritesParsesBackTheSame) {
  EngineOptions e;
  e.backend = Backend::kLibaio;
  e.block_size = size_t{2} << 20;
  e.queue_depth = 16;
  e.intra_op_parallelism = 4;
  e.single_submit = true;
  e.overlap_events = true;
  e.direct_io_min_bytes = 4096;
  const std::string text = encode_config(e, size_t{128} << 20, R"({"write_gb_per_s": 2.5})");
  EXPECT_NE(text.find("\"tuned\""), std::string::npos);
  Result<ConfigFile> c = parse_config(text, "test");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.backend, Backend::kLibaio);
  EXPECT_EQ(c->engine.block_size, size_t{2} << 20);
  EXPECT_EQ(c->engine.queue_depth, 16u);
  EXPECT_EQ(c->engine.intra_op_parallelism, 4u);
  EXPECT_TRUE(c->engine.single_submit);
  EXPECT_TRUE(c->engine.overlap_events);
  EXPECT_EQ(c->engine.direct_io_min_bytes, 4096u);
  EXPECT_EQ(c->writer_io_buffer_bytes, size_t{128} << 20);
}

// The file's "engine" keys are kEngineSettings' names, each written by encode_config, in order.
TEST(ConfigFileTest, TheEngineKeysAreTheEngineSettings) {
  const std::string text = encode_config(EngineOptions{}, std::nullopt, "");
  size_t at = 0;
  for (const EngineSetting& setting : kEngineSettings) {
    const std::string key = "\"" + std::string(setting.name) + "\":";
    const size_t found = text.find(key, at);
    EXPECT_NE(found, std::string::npos) << key << " in order in " << text;
    if (found != std::string::npos) at = found;
  }
  Result<ConfigFile> unknown = parse_config(config(R"({"queue_dept": 8})"), "test");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("known: backend, block_size, queue_depth"),
            std::string::npos)
      << unknown.status().message();
}

TEST(ConfigFileTest, OnlyTheFieldsGivenChangeAndSizesTakeUnits) {
  EngineOptions base;
  base.queue_depth = 7;
  Result<ConfigFile> c = parse_config(config(R"({"block_size": "4MiB"})"), "test", base);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.block_size, size_t{4} << 20);
  EXPECT_EQ(c->engine.queue_depth, 7u);
  EXPECT_FALSE(c->writer_io_buffer_bytes.has_value());
}

TEST(ConfigFileTest, EveryMistakeIsNamed) {
  struct Case {
    std::string text;
    std::string needle;
  };
  const Case cases[] = {
      {config(R"({"queue_depht": 8})"), "unknown setting \"engine.queue_depht\""},
      {config(R"({"queue_depth": "8"})"), "\"engine.queue_depth\" must be a non-negative integer"},
      {config(R"({"queue_depth": -1})"), "\"engine.queue_depth\" must be a non-negative integer"},
      {config(R"({"queue_depth": 0})"), "queue_depth must be in [1, 65536]"},
      {config(R"({"block_size": "8 parsecs"})"), "\"engine.block_size\": cannot parse size"},
      {config(R"({"block_size": 1.5})"), "\"engine.block_size\" must be a byte count"},
      {config(R"({"single_submit": 1})"), "\"engine.single_submit\" must be true or false"},
      {config(R"({"backend": "spdk"})"), "unknown backend 'spdk'"},
      {config("{}", R"(, "writer": {"io_buffer_bytes": 1000})"), "multiple of 8 KiB"},
      {config("{}", R"(, "writer": {"buffer": 1})"), "unknown setting \"writer.buffer\""},
      {config("{}", R"(, "aio": {})"), "unknown section \"aio\""},
      {config("[]"), "\"engine\" must be an object"},
      {R"({"format": "deepspeed", "version": 1})", "not a fastpersist configuration"},
      {R"({"format": "fastpersist-config", "version": 2})",
       "version 2 is not one this fastpersist reads"},
      {R"({"format": "fastpersist-config"})", "\"version\" must be an integer"},
      {"{\"format\": ", "not valid JSON"},
      {"[1, 2]", "a configuration is a JSON object"},
      {std::string(100000, '[') + std::string(100000, ']'), "nested deeper"},
      {config(R"({"queue_depth": 8, "queue_depth": 64})"), "the key \"queue_depth\" appears twice"},
      {R"({"format": "fastpersist-config", "version": 1, "version": 1})",
       "the key \"version\" appears twice"},
  };
  for (const Case& c : cases) {
    Result<ConfigFile> r = parse_config(c.text, "my.json");
    ASSERT_FALSE(r.is_ok()) << c.text.substr(0, 80);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("my.json: "), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.text.substr(0, 80) << " -> " << r.status().message();
  }
}

TEST_F(ConfigEnvTest, TheFileAppliesUnderTheVariablesAndUseConfigFileWins) {
  const std::string from_env = dir_.file("env.json");
  const std::string chosen = dir_.file("chosen.json");
  write(from_env, config(R"({"queue_depth": 8, "block_size": 65536})"));
  write(chosen, config(R"({"queue_depth": 24})"));
  ::setenv(kConfigEnvVariable, from_env.c_str(), 1);
  Result<EngineOptions> o = engine_options_from_env();
  ASSERT_TRUE(o.is_ok()) << o.status().to_string();
  EXPECT_EQ(o->queue_depth, 8u);
  EXPECT_EQ(o->block_size, 65536u);
  ::setenv("FASTPERSIST_QUEUE_DEPTH", "12", 1);  // a variable overrides the file
  o = engine_options_from_env();
  ASSERT_TRUE(o.is_ok());
  EXPECT_EQ(o->queue_depth, 12u);
  ::unsetenv("FASTPERSIST_QUEUE_DEPTH");
  Result<ConfigFile> c = use_config_file(chosen);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->path, chosen);
  o = engine_options_from_env();
  ASSERT_TRUE(o.is_ok());
  EXPECT_EQ(o->queue_depth, 24u);
  EXPECT_EQ(o->block_size, EngineOptions{}.block_size) << "the chosen file replaces the other";
  // Read once: a later change of the file does not change the process's settings.
  write(chosen, config(R"({"queue_depth": 99})"));
  EXPECT_EQ(engine_options_from_env()->queue_depth, 24u);
  ASSERT_TRUE(use_config_file("").is_ok());
  EXPECT_EQ(engine_options_from_env()->queue_depth, 8u);
}

TEST_F(ConfigEnvTest, AMissingOrBadFileIsAnErrorNamingIt) {
  ::setenv(kConfigEnvVariable, dir_.file("missing.json").c_str(), 1);
  Result<EngineOptions> o = engine_options_from_env();
  ASSERT_FALSE(o.is_ok());
  EXPECT_NE(o.status().message().find("FASTPERSIST_CONFIG="), std::string::npos)
      << o.status().message();
  EXPECT_NE(o.status().message().find("missing.json"), std::string::npos);
  const std::string fifo = dir_.file("fifo.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  Result<ConfigFile> c = use_config_file(fifo);  // never blocks on a FIFO
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("FIFO"), std::string::npos) << c.status().message();
  const std::string bad = dir_.file("bad.json");
  write(bad, config(R"({"queue_depth": 0})"));
  c = use_config_file(bad);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("bad.json"), std::string::npos);
  // A failed use_config_file() changes nothing.
  ::unsetenv(kConfigEnvVariable);
  EXPECT_EQ(engine_options_from_env()->queue_depth, EngineOptions{}.queue_depth);
}

}  // namespace
}  // namespace fastpersist
