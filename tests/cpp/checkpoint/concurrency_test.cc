// SPDX-License-Identifier: Apache-2.0
// The manager and the reader from many threads at once: saves queued from several threads all
// commit with distinct sequence numbers; one reader shared by threads reads consistent bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/watchdog.h"

namespace fastpersist::testing {
namespace {

using std::chrono::seconds;

TEST(ConcurrencyTest, SavesFromManyThreads) {
  TempDir dir;
  TestState state = mixed_state(61);
  CheckpointOptions o = small_options();
  o.max_in_flight = 2;
  o.staging_budget_bytes = 4 * o.staging_window_bytes;
  o.keep_last = 6;
  run_with_watchdog(seconds(120), "saves from many threads", [&] {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), o));
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 4; ++i) {
          std::string tag = "t" + std::to_string(t) + "-" + std::to_string(i);
          auto p = mgr->save_async(tag, state.content());
          if (!p.is_ok() || !p->wait().is_ok()) ++failures;
          if (i == 2) {
            if (!mgr->wait_snapshots().is_ok()) ++failures;
            if (!mgr->list().is_ok()) ++failures;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    FP_ASSERT_OK(mgr->wait_all());
    FP_ASSERT_OK_AND_ASSIGN(auto infos, mgr->list());
    ASSERT_EQ(infos.size(), 6u);  // keep_last
    std::set<uint64_t> seqs;
    for (const CheckpointInfo& i : infos) seqs.insert(i.sequence);
    EXPECT_EQ(seqs.size(), infos.size());
    EXPECT_EQ(*seqs.rbegin(), 16u);
    FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(dir.path()));
    EXPECT_EQ(latest, std::optional<std::string>(infos.back().tag));
    for (const CheckpointInfo& i : infos) expect_checkpoint_matches(dir.file(i.tag), state);
    EXPECT_TRUE(names_with_prefix(dir.path(), ".trash-").empty());
    EXPECT_TRUE(names_with_prefix(dir.path(), ".tmp-").empty());
  });
}

TEST(ConcurrencyTest, CloseFromSeveralThreadsAtOnce) {
  TestState state = mixed_state(63);
  run_with_watchdog(seconds(120), "concurrent close", [&] {
    for (int round = 0; round < 20; ++round) {
      TempDir dir;
      CheckpointOptions o = small_options();
      o.max_in_flight = 2;
      FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), o));
      FP_ASSERT_OK_AND_ASSIGN(PendingSave a, mgr->save_async("a", state.content()));
      FP_ASSERT_OK_AND_ASSIGN(PendingSave b, mgr->save_async("b", state.content()));
      std::atomic<int> failures{0};
      std::vector<std::thread> closers;
      for (int t = 0; t < 3; ++t) {
        closers.emplace_back([&] {
          if (!mgr->close().is_ok()) ++failures;
        });
      }
      for (auto& th : closers) th.join();
      EXPECT_EQ(failures.load(), 0);
      EXPECT_TRUE(a.done() && b.done());
      EXPECT_EQ(listed_tags(dir.path()), (std::vector<std::string>{"a", "b"}));
      // The lock is released exactly once: the root can be opened again.
      FP_ASSERT_OK_AND_ASSIGN(auto again, CheckpointManager::open(dir.path(), o));
    }
  });
}

TEST(ConcurrencyTest, OneReaderSharedByThreads) {
  TempDir dir;
  TestState state = mixed_state(62);
  {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
    FP_ASSERT_OK(mgr->save("r", state.content()));
  }
  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(dir.file("r"), engine));
  run_with_watchdog(seconds(60), "threads sharing a reader", [&] {
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 5; ++round) {
          const Manifest& m = reader->manifest();
          std::vector<TensorReadRequest> req;
          std::vector<std::vector<std::byte>> dest(m.tensors.size());
          for (size_t i = 0; i < m.tensors.size(); ++i) {
            if ((i + static_cast<size_t>(t)) % 2 == 0) {
              dest[i].resize(std::max<uint64_t>(m.tensors[i].length, 1));
              req.push_back({i, dest[i].data(), dest[i].size()});
            } else {
              req.push_back({i, nullptr});
            }
          }
          auto r = reader->read(req, /*verify=*/true, 64 * kKiB);
          if (!r.is_ok()) {
            ++bad;
            continue;
          }
          for (size_t i = 0; i < m.tensors.size(); ++i) {
            const OwnedTensor* want = state.find(m.tensors[i].name);
            if (want->bytes.empty()) continue;
            if (std::memcmp(r->data[i], want->bytes.data(), want->bytes.size()) != 0) ++bad;
          }
          if (!reader->read_objects().is_ok()) ++bad;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(bad.load(), 0);
  });
}

}  // namespace
}  // namespace fastpersist::testing
