// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the checkpoint tests (header-only: only *_test.cc files are compiled into
// fastpersist_checkpoint_tests). A TestState owns the bytes of a set of tensors and hands out a
// CheckpointContent that points into them; helpers read a checkpoint back and compare.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/safetensors.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace fastpersist::testing {

inline constexpr size_t kKiB = size_t{1} << 10;
inline constexpr size_t kMiB = size_t{1} << 20;

struct OwnedTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<std::byte> bytes;
};

// A model state: tensors with reproducible random bytes, plus the non-tensor parts.
class TestState {
 public:
  // Adds a tensor whose size is product(shape) * dtype size, filled from `seed`.
  OwnedTensor& add(const std::string& name, const std::string& dtype, std::vector<uint64_t> shape,
                   uint64_t seed) {
    uint64_t count = 1;
    for (uint64_t d : shape) count *= d;
    size_t bytes = static_cast<size_t>(count * safetensors_dtype_size(dtype).value_or(1));
    tensors.push_back({name, dtype, std::move(shape), random_bytes(bytes, seed)});
    return tensors.back();
  }

  // Non-owning: valid while this TestState lives and is not modified.
  CheckpointContent content() const {
    CheckpointContent c;
    for (const OwnedTensor& t : tensors) {
      c.tensors.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
    }
    c.aliases = aliases;
    c.objects = objects;
    c.step = step;
    c.metadata_json = metadata_json;
    return c;
  }

  const OwnedTensor* find(const std::string& name) const {
    for (const OwnedTensor& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }

  uint64_t total_bytes() const {
    uint64_t n = 0;
    for (const OwnedTensor& t : tensors) n += t.bytes.size();
    return n;
  }

  std::vector<OwnedTensor> tensors;
  std::map<std::string, std::string> aliases;
  std::string objects;
  std::optional<int64_t> step;
  std::string metadata_json = "{}";
};

// Many dtypes, odd sizes, an empty tensor, scalars, several tensors larger than a 64 KiB window,
// about 1 MiB in all.
inline TestState mixed_state(uint64_t seed = 1) {
  TestState s;
  s.add("model.embed.weight", "F32", {300, 100}, seed + 1);   // 120000 bytes
  s.add("model.layer0.weight", "BF16", {70001}, seed + 2);    // 140002 bytes
  s.add("model.layer0.bias", "F16", {3, 5, 7}, seed + 3);     // 210 bytes
  s.add("optimizer.step_counts", "I64", {20000}, seed + 4);   // 160000 bytes
  s.add("model.layer1.weight", "F32", {257, 129}, seed + 5);  // 132612 bytes
  s.add("model.layer1.bias", "F32", {129}, seed + 6);         // 516 bytes
  s.add("tokens", "U8", {99999}, seed + 7);                   // 99999 bytes
  s.add("mask.small", "BOOL", {13}, seed + 8);                // 13 bytes
  s.add("mask.large", "BOOL", {77777}, seed + 9);             // 77777 bytes
  s.add("empty", "F32", {0}, seed + 10);                      // 0 bytes
  s.add("empty2d", "U8", {0, 5}, seed + 11);                  // 0 bytes
  s.add("scalar.i64", "I64", {}, seed + 12);                  // 8 bytes
  s.add("scalar.f16", "F16", {}, seed + 13);                  // 2 bytes
  s.add("odd.f16", "F16", {33333}, seed + 14);                // 66666 bytes
  s.add("odd.u8", "U8", {4097}, seed + 15);                   // 4097 bytes
  s.add("model.head.weight", "F64", {17, 1000}, seed + 16);   // 136000 bytes
  s.add("i32.vec", "I32", {5}, seed + 17);                    // 20 bytes
  s.aliases = {{"model.lm_head.weight", "model.embed.weight"}, {"tied.bias", "model.layer1.bias"}};
  static constexpr char kPickle[] = "\x80\x04\x95objects-sidecar\0with nul";
  s.objects = std::string(kPickle, sizeof(kPickle) - 1) + std::string(10000, 'o');
  s.step = 1234;
  s.metadata_json = R"({"run":"unit-test","lr":0.001,"nested":{"a":[1,2,3]}})";
  return s;
}

// Small windows and files so that a ~1 MiB state makes several files; not durable (fast).
inline CheckpointOptions small_options() {
  CheckpointOptions o;
  o.staging_window_bytes = 64 * kKiB;
  o.target_file_bytes = 256 * kKiB;
  o.min_file_bytes = 64 * kKiB;
  o.max_parallel_files = 3;
  o.lock_staging_memory = false;
  o.durable = false;
  return o;
}

inline std::shared_ptr<IoEngine> make_engine() {
  auto e = IoEngine::create(EngineOptions{});
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  if (!e.is_ok()) return nullptr;
  return std::shared_ptr<IoEngine>(std::move(e).value());
}

inline std::string read_text(const std::string& path) {
  auto bytes = read_whole_file(path);
  if (!bytes.is_ok()) return "<" + bytes.status().to_string() + ">";
  return std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
}

inline void write_text(const std::string& path, const std::string& text) {
  Status st = write_whole_file(
      path,
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()), text.size()));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
}

// XORs one byte of a file in place.
inline void flip_byte(const std::string& path, uint64_t offset, unsigned char mask = 0x5a) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  unsigned char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1) << path;
  b = static_cast<unsigned char>(b ^ mask);
  ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1) << path;
  ::close(fd);
}

inline bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Names in `dir` starting with `prefix`.
inline std::vector<std::string> names_with_prefix(const std::string& dir,
                                                  const std::string& prefix) {
  std::vector<std::string> out;
  auto names = checkpoint::list_dir(dir);
  if (!names.is_ok()) return out;
  for (const std::string& n : *names) {
    if (n.rfind(prefix, 0) == 0) out.push_back(n);
  }
  return out;
}

inline std::vector<std::string> tags_of(const std::vector<CheckpointInfo>& infos) {
  std::vector<std::string> out;
  for (const CheckpointInfo& i : infos) out.push_back(i.tag);
  return out;
}

inline std::vector<std::string> listed_tags(const std::string& root) {
  auto l = list_checkpoints(root);
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  return l.is_ok() ? tags_of(*l) : std::vector<std::string>{};
}

inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "\n";
  return s;
}

inline bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const std::string& x : v) {
    if (x.find(needle) != std::string::npos) return true;
  }
  return false;
}

// Saves `state` as `tag` and waits for the commit; returns the base it referenced ("" for a full
// checkpoint, "?" when the save failed, which is also reported as a test failure).
inline std::string save_and_wait(CheckpointManager& mgr, const std::string& tag,
                                 const TestState& state) {
  auto pending = mgr.save_async(tag, state.content());
  EXPECT_TRUE(pending.is_ok()) << pending.status().to_string();
  if (!pending.is_ok()) return "?";
  Status st = pending->wait();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return st.is_ok() ? pending->base_tag() : "?";
}

// verify_checkpoint finds nothing wrong with the checkpoint in `dir`.
inline void expect_verifies(const std::string& dir) {
  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(dir, *engine));
  EXPECT_TRUE(report.ok()) << joined(report.problems);
}

// Reads every tensor of the checkpoint in `dir` (into reader spans) and compares with `state`:
// the manifest lists exactly the state's tensors, in the state's order, with its bytes.
inline void expect_checkpoint_matches(const std::string& dir, const TestState& state,
                                      bool verify = true) {
  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(dir, engine));
  const Manifest& m = reader->manifest();
  ASSERT_EQ(m.tensors.size(), state.tensors.size());
  std::vector<TensorReadRequest> requests;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    EXPECT_EQ(m.tensors[i].name, state.tensors[i].name) << "manifest keeps the caller's order";
    requests.push_back({i, nullptr});
  }
  FP_ASSERT_OK_AND_ASSIGN(auto result, reader->read(requests, verify));
  ASSERT_EQ(result.data.size(), requests.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const ManifestTensor& t = m.tensors[i];
    const OwnedTensor* want = state.find(t.name);
    ASSERT_NE(want, nullptr) << t.name;
    EXPECT_EQ(t.dtype, want->dtype) << t.name;
    EXPECT_EQ(t.shape, want->shape) << t.name;
    ASSERT_EQ(t.length, want->bytes.size()) << t.name;
    if (t.length == 0) continue;
    ASSERT_NE(result.data[i], nullptr) << t.name;
    EXPECT_EQ("",
              first_difference(want->bytes, std::span<const std::byte>(result.data[i], t.length)))
        << t.name;
  }
  FP_ASSERT_OK_AND_ASSIGN(std::string objects, reader->read_objects());
  EXPECT_EQ(objects, state.objects);
  EXPECT_EQ(m.aliases, state.aliases);
  EXPECT_EQ(m.step, state.step);
}

}  // namespace fastpersist::testing
