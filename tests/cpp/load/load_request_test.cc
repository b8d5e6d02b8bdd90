// SPDX-License-Identifier: Apache-2.0
// CheckpointReader::load: selection and aliases, destinations checked before any read
// (capacity, shape, dtype, strides, writability), strict reports that list every problem with
// names of any character, dtype conversion, the memory budget's pieces, progress, verification.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/dtype.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

class LoadRequestTest : public ::testing::Test {
 protected:
  void save(const TestState& state) {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.file("ckpts"), small_options()));
    FP_ASSERT_OK(mgr->save("a", state.content()));
    FP_ASSERT_OK(mgr->close());
    auto engine = make_engine();
    ASSERT_NE(engine, nullptr);
    FP_ASSERT_OK_AND_ASSIGN(reader_, CheckpointReader::open(dir_.file("ckpts") + "/a", engine));
  }
  // The bytes of manifest tensor `name` in a result.
  std::span<const std::byte> bytes_of(const LoadResult& r, const std::string& name) {
    size_t i = reader_->manifest().find_tensor(name).value();
    long k = r.loaded_index.at(i);
    if (k < 0) return {};
    const LoadedTensor& t = r.tensors[static_cast<size_t>(k)];
    if (t.buffer == nullptr) return {};
    return {t.buffer->data() + t.offset, static_cast<size_t>(t.nbytes)};
  }
  TempDir dir_;
  std::unique_ptr<CheckpointReader> reader_;
};

LoadDestination destination(const std::string& name, std::vector<std::byte>& memory,
                            const std::string& dtype, std::vector<uint64_t> shape) {
  return {name, memory.data(), memory.size(), dtype, std::move(shape), {}};
}

TEST_F(LoadRequestTest, EverythingIntoNewMemoryMatchesTheSavedBytes) {
  TestState state = mixed_state(3);
  save(state);
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  LoadRequest req;
  req.progress = [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); };
  FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader_->load(req));
  ASSERT_EQ(r.tensors.size(), state.tensors.size());
  for (const OwnedTensor& t : state.tensors) {
    EXPECT_EQ("", first_difference(t.bytes, bytes_of(r, t.name))) << t.name;
    const LoadedTensor& lt =
        r.tensors[static_cast<size_t>(r.loaded_index[*reader_->manifest().find_tensor(t.name)])];
    EXPECT_EQ(lt.offset % find_dtype(t.dtype)->size, 0u) << t.name << " is aligned for its dtype";
  }
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.front(), std::make_pair(uint64_t{0}, state.total_bytes()));
  EXPECT_EQ(progress.back(), std::make_pair(state.total_bytes(), state.total_bytes()));
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
}

TEST_F(LoadRequestTest, DestinationsTooSmallForTheirShapeAreRefusedBeforeAnyRead) {
  TestState state;
  state.add("a:b", "F32", {1 << 16}, 1);
  save(state);
  // The crash of issue 10: a 16-element destination for a 65536-element tensor. Whether the
  // shape lies (claims the checkpoint's) or not, nothing past the 64 bytes is written.
  std::vector<std::byte> memory(64 + 4096, std::byte{0x5a});
  for (bool strict : {true, false}) {
    LoadRequest req;
    req.strict = strict;
    req.into = true;
    req.destinations.push_back({"a:b", memory.data(), 64, "F32", {1 << 16}, {}});
    auto r = reader_->load(req);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("destination of 'a:b' holds 64 bytes"), std::string::npos)
        << r.status().to_string();
    EXPECT_TRUE(std::all_of(memory.begin(), memory.end(),
                            [](std::byte b) { return b == std::byte{0x5a}; }));
  }
  // A destination of a smaller dtype size than its shape needs.
  LoadRequest req;
  req.destinations.push_back({"a:b", memory.data(), memory.size(), "F64", {1 << 16}, {}});
  EXPECT_EQ(reader_->load(req).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoadRequestTest, ReadRefusesADestinationSmallerThanItsTensorBeforeAnyRead) {
  TestState state;
  state.add("w", "F32", {1000}, 4);
  save(state);
  std::vector<std::byte> memory(4000, std::byte{0x11});
  auto r = reader_->read({{0, memory.data(), 3999}}, /*verify=*/true);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      std::all_of(memory.begin(), memory.end(), [](std::byte b) { return b == std::byte{0x11}; }));
  FP_EXPECT_OK(reader_->read({{0, memory.data(), 4000}}, /*verify=*/true).status());
  EXPECT_EQ("", first_difference(state.tensors[0].bytes, memory));
}

TEST_F(LoadRequestTest, StrictListsEveryProblemAndNonStrictLoadsWhatMatches) {
  TestState state;
  const std::string odd = "we|ird;na,me:\n\"q\" \xc3\xa9";
  state.add(odd, "F32", {4}, 1);
  state.add("ok", "F32", {8}, 2);
  state.add("extra", "I64", {2}, 3);
  save(state);
  std::vector<std::byte> small(16, std::byte{1}), ok(32, std::byte{2}), ghost(8, std::byte{3});
  LoadRequest req;
  req.into = true;
  req.destinations = {destination(odd, small, "F32", {2, 2}), destination("ok", ok, "F32", {8}),
                      destination("ghost:1", ghost, "F32", {2})};
  auto strict = reader_->load(req);
  ASSERT_FALSE(strict.is_ok());
  const std::string& msg = strict.status().message();
  EXPECT_NE(msg.find("missing from the checkpoint: ghost:1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in the checkpoint but not in into=: extra"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape mismatch: " + odd + ": checkpoint (4,), destination (2, 2)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(ok[0], std::byte{2}) << "strict failures happen before any read";

  req.strict = false;
  FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader_->load(req));
  EXPECT_EQ(r.destinations,
            (std::vector<DestinationState>{DestinationState::kUnused, DestinationState::kFilled,
                                           DestinationState::kUnused}));
  EXPECT_EQ(r.missing, std::vector<std::string>{"ghost:1"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"extra"});
  ASSERT_EQ(r.mismatched.size(), 1u);
  EXPECT_EQ("", first_difference(state.tensors[1].bytes, ok));
  EXPECT_TRUE(
      std::all_of(small.begin(), small.end(), [](std::byte b) { return b == std::byte{1}; }));
  EXPECT_EQ("", first_difference(state.tensors[0].bytes, bytes_of(r, odd)))
      << "loaded into new memory instead";
}

TEST_F(LoadRequestTest, SelectionByNameResolvesAliases) {
  TestState state = mixed_state(5);
  save(state);
  LoadRequest req;
  req.names = std::vector<std::string>{"model.lm_head.weight", "tokens", "no.such"};
  req.strict = false;
  FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader_->load(req));
  EXPECT_EQ(r.tensors.size(), 2u);
  EXPECT_EQ(r.missing, std::vector<std::string>{"no.such"});
  EXPECT_EQ("", first_difference(state.find("model.embed.weight")->bytes,
                                 bytes_of(r, "model.embed.weight")));
  EXPECT_EQ(r.loaded_index[*reader_->manifest().find_tensor("model.layer0.bias")], -1);
  req.strict = true;
  EXPECT_EQ(reader_->load(req).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoadRequestTest, DtypeConversionMatchesConvertElementsAndConflictsAreRejected) {
  TestState state = mixed_state(9);
  save(state);
  LoadRequest req;
  req.dtype = "BF16";
  req.dtype_by_name = {{"model.head.weight", "F16"}, {"optimizer.step_counts", "F32"}};
  FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader_->load(req));
  auto check = [&](const std::string& name, const std::string& want) {
    const OwnedTensor* t = state.find(name);
    const LoadedTensor& lt =
        r.tensors[static_cast<size_t>(r.loaded_index[*reader_->manifest().find_tensor(name)])];
    EXPECT_EQ(lt.dtype, want) << name;
    size_t count = t->bytes.size() / find_dtype(t->dtype)->size;
    std::vector<std::byte> expected(count * find_dtype(want)->size);
    FP_ASSERT_OK(convert_elements(t->dtype, t->bytes.data(), want, expected.data(), count));
    EXPECT_EQ("", first_difference(expected, bytes_of(r, name))) << name;
  };
  check("model.embed.weight", "BF16");  // blanket: floats only
  check("odd.f16", "BF16");
  check("model.head.weight", "F16");      // by name wins
  check("optimizer.step_counts", "F32");  // an integer converted by name
  check("tokens", "U8");                  // the blanket dtype leaves integers alone

  LoadRequest conflict;
  conflict.dtype_by_name = {{"model.embed.weight", "F16"}, {"model.lm_head.weight", "BF16"}};
  EXPECT_EQ(reader_->load(conflict).status().code(), StatusCode::kInvalidArgument);
  LoadRequest unknown;
  unknown.dtype_by_name = {{"nope", "F16"}};
  EXPECT_EQ(reader_->load(unknown).status().code(), StatusCode::kInvalidArgument);
  unknown.strict = false;
  FP_EXPECT_OK(reader_->load(unknown).status());
  LoadRequest unsupported;
  unsupported.dtype_by_name = {{"model.embed.weight", "I32"}};
  EXPECT_EQ(reader_->load(unsupported).status().code(), StatusCode::kInvalidArgument);
}

// A destination of a dtype its tensor cannot be converted to (F32 into I32) fails the load,
// unless unconvertible_to_caller: then it is left to the caller, with the tensor in new memory
// in its stored dtype, and the other destinations are filled as usual.
TEST_F(LoadRequestTest, UnconvertibleDestinationsCanBeLeftToTheCaller) {
  TestState state = mixed_state(4);
  save(state);
  const OwnedTensor* embed = state.find("model.embed.weight");  // F32 [300, 100]
  const OwnedTensor* bias = state.find("model.layer1.bias");    // F32 [129]
  std::vector<std::byte> as_int(embed->bytes.size(), std::byte{0x7f});
  std::vector<std::byte> as_double(bias->bytes.size() * 2);
  LoadRequest req;
  req.names = std::vector<std::string>{"model.embed.weight", "model.layer1.bias"};
  req.destinations = {destination("model.embed.weight", as_int, "I32", {300, 100}),
                      destination("model.layer1.bias", as_double, "F64", {129})};
  EXPECT_EQ(reader_->load(req).status().code(), StatusCode::kInvalidArgument);

  req.unconvertible_to_caller = true;
  FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader_->load(req));
  EXPECT_EQ(r.destinations, (std::vector<DestinationState>{DestinationState::kCallerCopies,
                                                           DestinationState::kFilled}));
  EXPECT_TRUE(std::all_of(as_int.begin(), as_int.end(), [](std::byte b) {
    return b == std::byte{0x7f};
  })) << "a destination left to the caller is not written";
  const LoadedTensor& left =
      r.tensors[static_cast<size_t>(r.loaded_index[*reader_->manifest().find_tensor(embed->name)])];
  EXPECT_EQ(left.dtype, "F32");
  EXPECT_EQ(left.destination, -1);
  EXPECT_EQ("", first_difference(embed->bytes, bytes_of(r, embed->name)));
  std::vector<std::byte> expected(as_double.size());
  FP_ASSERT_OK(convert_elements("F32", bias->bytes.data(), "F64", expected.data(), 129));
  EXPECT_EQ("", first_difference(expected, as_double));
}

TEST_F(LoadRequestTest, StridedDestinationGetsEveryElementAndNothingElse) {
  TestState state;
  state.add("m", "F32", {3, 5}, 11);
  save(state);
  // A 5x3 buffer viewed transposed (strides 1, 3) inside a larger block.
  std::vector<std::byte> memory(4 * 64, std::byte{0x77});
  std::byte* first = memory.data() + 4 * 8;
  LoadRequest req;
  req.destinations.push_back({"m", first, 4 * 15, "F32", {3, 5}, {1, 3}});
  FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader_->load(req));
  ASSERT_EQ(r.destinations[0], DestinationState::kFilled);
  const auto* src = reinterpret_cast<const float*>(state.tensors[0].bytes.data());
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 5; ++j) {
      float got;
      std::memcpy(&got, first + 4 * (i + 3 * j), 4);
      EXPECT_EQ(got, src[i * 5 + j]) << i << "," << j;
    }
  }
  for (size_t b = 0; b < memory.size(); ++b) {
    if (b < 32 || b >= 32 + 60) {
      EXPECT_EQ(memory[b], std::byte{0x77}) << b;
    }
  }
  // Overlapping strides are refused.
  req.destinations[0].strides = {1, 1};
  EXPECT_EQ(reader_->load(req).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoadRequestTest, ReadOnlyMemoryIsRefusedNotWritten) {
  TestState state;
  state.add("w", "F32", {1024}, 1);
  save(state);
  void* page = ::mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  LoadRequest req;
  req.destinations.push_back({"w", static_cast<std::byte*>(page), 4096, "F32", {1024}, {}});
  auto r = reader_->load(req);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not writable"), std::string::npos) << r.status().to_string();
  ::munmap(page, 4096);
}

TEST_F(LoadRequestTest, BudgetStreamsLargeConvertedTensorsInPiecesWithProgress) {
  TestState state;
  state.add("big", "F32", {300000}, 21);  // 1.2 MB, 4.6x the budget
  state.add("small", "F16", {1000}, 22);
  save(state);
  std::vector<std::byte> dest(300000 * 2);
  LoadRequest req;
  req.max_memory = 256 * kKiB;
  req.dtype = "F64";
  req.destinations.push_back(destination("big", dest, "BF16", {300000}));
  std::vector<uint64_t> done;
  req.progress = [&](uint64_t d, uint64_t) { done.push_back(d); };
  FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader_->load(req));
  std::vector<std::byte> want(dest.size());
  FP_ASSERT_OK(convert_elements("F32", state.tensors[0].bytes.data(), "BF16", want.data(), 300000));
  EXPECT_EQ("", first_difference(want, dest));
  std::vector<std::byte> small(1000 * 8);
  FP_ASSERT_OK(convert_elements("F16", state.tensors[1].bytes.data(), "F64", small.data(), 1000));
  EXPECT_EQ("", first_difference(small, bytes_of(r, "small")));
  EXPECT_EQ(done.back(), state.total_bytes());
}

TEST_F(LoadRequestTest, DamagedTensorIsDataLossNamingItOnEveryRoute) {
  TestState state;
  state.add("w", "F32", {100000}, 31);
  save(state);
  const Manifest& m = reader_->manifest();
  const ManifestTensor& t = m.tensors[0];
  flip_byte(dir_.file("ckpts") + "/a/" + t.file, t.offset + 1234);
  std::vector<std::byte> dest(400000);
  std::vector<LoadRequest> reqs(4);
  reqs[1].dtype = "F16";
  reqs[2].dtype = "F16";
  reqs[2].max_memory = 64 * kKiB;
  reqs[3].destinations.push_back(destination("w", dest, "F32", {100000}));
  for (const LoadRequest& req : reqs) {
    auto r = reader_->load(req);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("tensor 'w' in " + t.file), std::string::npos)
        << r.status().to_string();
  }
  LoadRequest unchecked;
  unchecked.verify = false;
  FP_EXPECT_OK(reader_->load(unchecked).status());
}

}  // namespace
}  // namespace fastpersist::testing
