// SPDX-License-Identifier: Apache-2.0
// Temporaries of dead FastFileWriters: found by their lock, removed by the next writer of the
// same path and by remove_stale_temp_files(); a living writer's temporary is never touched.
#include "stream/stale_files.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "fastpersist/fast_file_writer.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist {
namespace {

using testing::list_dir;
using testing::TempDir;

size_t count_temps(const std::string& dir, const std::string& target = "") {
  size_t n = 0;
  for (const std::string& name : list_dir(dir)) {
    std::string t;
    if (is_writer_temp_name(name, &t) && (target.empty() || t == target)) ++n;
  }
  return n;
}

// A child process opens a writer on `path`, writes `bytes` (through a small staging buffer, so
// they reach the file) and dies without closing it, as a SIGKILL would leave it: no destructor,
// no abort. Its temporary stays behind.
void die_while_writing(const std::string& path, size_t bytes) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    FastFileWriterOptions o;
    o.io_buffer_bytes = 64 << 10;
    auto w = FastFileWriter::open(path, o);
    if (!w.is_ok()) _exit(2);
    auto data = testing::random_bytes(bytes, 3);
    if (!(*w)->write(data.data(), data.size()).is_ok()) _exit(3);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
}

Status save(const std::string& path, std::span<const std::byte> data) {
  FP_ASSIGN_OR_RETURN(auto w, FastFileWriter::open(path));
  FP_RETURN_IF_ERROR(w->write(data.data(), data.size()));
  return w->close();
}

TEST(WriterTempName, RecognisesParallelSets) {
  std::string target;
  EXPECT_TRUE(is_parallel_set_name(".ckpt.pt.fp-partial", &target));
  EXPECT_EQ(target, "ckpt.pt");
  EXPECT_FALSE(is_parallel_set_name("..fp-partial"));
  EXPECT_FALSE(is_parallel_set_name("ckpt.pt.fp-partial"));
  EXPECT_FALSE(is_parallel_set_name(".ckpt.pt.fp-partial.done"));
  EXPECT_FALSE(is_parallel_set_name(".ckpt.pt.fp-partial.lock"));
}

TEST(WriterTempName, RecognisesOnlyWriterTemporaries) {
  std::string target;
  EXPECT_TRUE(is_writer_temp_name(".ckpt.pt.fp-tmp-a1B2c3", &target));
  EXPECT_EQ(target, "ckpt.pt");
  EXPECT_TRUE(is_writer_temp_name("..hidden.fp-tmp-XXXXXX", &target));
  EXPECT_EQ(target, ".hidden");
  EXPECT_FALSE(is_writer_temp_name("ckpt.pt.fp-tmp-a1B2c3"));    // no leading dot
  EXPECT_FALSE(is_writer_temp_name(".ckpt.pt.fp-tmp-a1B2c"));    // suffix too short
  EXPECT_FALSE(is_writer_temp_name(".ckpt.pt.fp-tmp-a1B2c3d"));  // suffix too long
  EXPECT_FALSE(is_writer_temp_name("..fp-tmp-a1B2c3"));          // no target name
  EXPECT_FALSE(is_writer_temp_name(".ckpt.pt.fp-partial"));
  EXPECT_FALSE(is_writer_temp_name(".ckpt.pt"));
}

TEST(StaleTempFiles, TheNextWriterOfThePathRemovesADeadWritersTemporary) {
  TempDir dir;
  const std::string path = dir.file("model.pt");
  die_while_writing(path, (5 << 20) + 7);
  die_while_writing(dir.file("other.pt"), 100);
  ASSERT_EQ(count_temps(dir.path(), "model.pt"), 1u);
  die_while_writing(path, 100);  // its open removed the first one's temporary; its own stays
  ASSERT_EQ(count_temps(dir.path(), "model.pt"), 1u);

  auto data = testing::random_bytes((3 << 20) + 1, 9);
  ASSERT_TRUE(save(path, data).is_ok());
  EXPECT_EQ(count_temps(dir.path(), "model.pt"), 0u);
  EXPECT_EQ(count_temps(dir.path(), "other.pt"), 1u)
      << "another target's debris is left to its own writer";
  auto back = testing::read_whole_file(path);
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(data, *back));
}

TEST(StaleTempFiles, ALivingWritersTemporaryIsNeverRemoved) {
  TempDir dir;
  // The dead writer first: forking while the live writer's threads run would leave the child
  // to start threads in a copy of a multi-threaded process (which ThreadSanitizer refuses).
  die_while_writing(dir.file("dead.pt"), 4096);
  auto live = FastFileWriter::open(dir.file("live.pt"));
  ASSERT_TRUE(live.is_ok());
  auto data = testing::random_bytes(1 << 20, 4);
  ASSERT_TRUE((*live)->write(data.data(), data.size()).is_ok());

  auto report = remove_stale_temp_files(dir.path());
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  ASSERT_EQ(report->in_use.size(), 1u);
  EXPECT_EQ(report->in_use[0], (*live)->temp_path());
  ASSERT_EQ(report->removed.size(), 1u);
  EXPECT_EQ(count_temps(dir.path(), "dead.pt"), 0u);
  EXPECT_TRUE(report->failed.empty());

  // A second writer of the same path leaves the first one's temporary alone too.
  auto second = FastFileWriter::open(dir.file("live.pt"));
  ASSERT_TRUE(second.is_ok());
  EXPECT_EQ(count_temps(dir.path(), "live.pt"), 2u);
  (*second)->abort();

  ASSERT_TRUE((*live)->close().is_ok());
  auto back = testing::read_whole_file(dir.file("live.pt"));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ("", testing::first_difference(data, *back));
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"live.pt"});
}

TEST(StaleTempFiles, DryRunListsAndRemovesNothing) {
  TempDir dir;
  die_while_writing(dir.file("a.pt"), 1 << 20);
  die_while_writing(dir.file("b.pt"), 1 << 20);
  auto before = list_dir(dir.path());
  StaleFileOptions dry;
  dry.dry_run = true;
  auto report = remove_stale_temp_files(dir.path(), dry);
  ASSERT_TRUE(report.is_ok());
  EXPECT_EQ(report->removed.size(), 2u);
  EXPECT_GT(report->removed_bytes, 0u);
  EXPECT_EQ(list_dir(dir.path()), before);

  StaleFileOptions a;
  a.target_name = "a.pt";
  auto only_a = remove_stale_temp_files(dir.path(), a);
  ASSERT_TRUE(only_a.is_ok());
  EXPECT_EQ(only_a->removed.size(), 1u);
  EXPECT_EQ(count_temps(dir.path(), "a.pt"), 0u);
  EXPECT_EQ(count_temps(dir.path(), "b.pt"), 1u);
}

TEST(StaleTempFiles, OtherFilesAreLeftAloneAndOddOnesReported) {
  TempDir dir;
  ASSERT_TRUE(testing::write_whole_file(dir.file("ckpt.pt"), testing::random_bytes(10, 1)).is_ok());
  ASSERT_TRUE(
      testing::write_whole_file(dir.file(".ckpt.pt.fp-partial"), testing::random_bytes(10, 1))
          .is_ok());
  ASSERT_EQ(mkdir(dir.file(".x.fp-tmp-abcdef").c_str(), 0755), 0);
  ASSERT_EQ(symlink("ckpt.pt", dir.file(".y.fp-tmp-abcdef").c_str()), 0);
  auto report = remove_stale_temp_files(dir.path());
  ASSERT_TRUE(report.is_ok());
  EXPECT_TRUE(report->removed.empty());
  EXPECT_EQ(report->failed.size(), 2u) << "a directory and a symlink with a temporary's name";
  EXPECT_EQ(report->too_recent, std::vector<std::string>{dir.file(".ckpt.pt.fp-partial")});
  EXPECT_EQ(list_dir(dir.path()).size(), 4u);
}

TEST(StaleTempFiles, RecursiveVisitsSubfoldersButNotSymlinks) {
  TempDir dir;
  ASSERT_EQ(mkdir(dir.file("rank0").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dir.file("rank0/deep").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dir.file("elsewhere").c_str(), 0755), 0);
  die_while_writing(dir.file("top.pt"), 1 << 20);
  die_while_writing(dir.file("rank0/a.pt"), 1 << 20);
  die_while_writing(dir.file("rank0/deep/b.pt"), 1 << 20);
  die_while_writing(dir.file("elsewhere/c.pt"), 1 << 20);
  ASSERT_EQ(symlink(dir.file("elsewhere").c_str(), dir.file("rank0/link").c_str()), 0);

  auto flat = remove_stale_temp_files(dir.path());
  ASSERT_TRUE(flat.is_ok());
  EXPECT_EQ(flat->removed.size(), 1u) << "not recursive by default";
  StaleFileOptions r;
  r.recursive = true;
  r.dry_run = true;
  auto listed = remove_stale_temp_files(dir.file("rank0"), r);
  ASSERT_TRUE(listed.is_ok());
  ASSERT_EQ(listed->removed.size(), 2u) << "rank0 and rank0/deep, not the symlinked folder";
  EXPECT_EQ(listed->removed[0].rfind(dir.file("rank0/.a.pt.fp-tmp-"), 0), 0u) << listed->removed[0];
  EXPECT_EQ(listed->removed[1].rfind(dir.file("rank0/deep/.b.pt.fp-tmp-"), 0), 0u)
      << listed->removed[1];
  r.dry_run = false;
  auto all = remove_stale_temp_files(dir.path(), r);
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(all->removed.size(), 3u);
  EXPECT_EQ(count_temps(dir.file("rank0")) + count_temps(dir.file("rank0/deep")) +
                count_temps(dir.file("elsewhere")),
            0u);
}

TEST(StaleTempFiles, AMissingDirectoryIsAnError) {
  TempDir dir;
  auto report = remove_stale_temp_files(dir.file("nope"));
  ASSERT_FALSE(report.is_ok());
  EXPECT_NE(report.status().to_string().find("nope"), std::string::npos);
}

// Parallel writers' sets: 3 ranks, rank 2 dies mid-write (a child process), ranks 0 and 1 close
// without waiting (commit_timeout 0), so the set can never complete and stays as
// .p.pt.fp-partial + .done + .lock. It is kept while young or held, removed once old enough.
TEST(StaleTempFiles, AnAbandonedParallelSetGoesOnlyWhenNoWriterHoldsItAndItIsOldEnough) {
  TempDir dir;
  const std::string path = dir.file("p.pt");
  auto data = testing::random_bytes((3 << 20) + 5, 8);
  FastFileWriterOptions o;
  o.num_writers = 3;
  o.stripe_bytes = 256 << 10;
  o.io_buffer_bytes = 64 << 10;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    FastFileWriterOptions mine = o;
    mine.writer_rank = 2;
    auto w = FastFileWriter::open(path, mine);
    if (!w.is_ok() || !(*w)->write(data.data(), data.size()).is_ok()) _exit(2);
    _exit(0);  // dies without close or abort
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::vector<std::unique_ptr<FastFileWriter>> live;
  for (unsigned r = 0; r < 2; ++r) {
    FastFileWriterOptions mine = o;
    mine.writer_rank = r;
    auto w = FastFileWriter::open(path, mine);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE((*w)->write(data.data(), data.size()).is_ok());
    live.push_back(std::move(w).value());
  }
  const std::string partial = dir.file(".p.pt.fp-partial");
  StaleFileOptions now;
  now.parallel_set_min_age_seconds = 0;
  // Ranks 0 and 1 are still open: the set is in use.
  auto held = remove_stale_temp_files(dir.path(), now);
  ASSERT_TRUE(held.is_ok());
  EXPECT_EQ(held->in_use, std::vector<std::string>{partial});
  for (auto& w : live) {
    ASSERT_TRUE(w->close().is_ok());
    EXPECT_FALSE(w->file_committed());
  }
  EXPECT_EQ(list_dir(dir.path()),
            (std::vector<std::string>{".p.pt.fp-partial", ".p.pt.fp-partial.done",
                                      ".p.pt.fp-partial.lock"}));
  auto young = remove_stale_temp_files(dir.path());  // default minimum age: one hour
  ASSERT_TRUE(young.is_ok());
  EXPECT_EQ(young->too_recent, std::vector<std::string>{partial});
  StaleFileOptions dry = now;
  dry.dry_run = true;
  auto listed = remove_stale_temp_files(dir.path(), dry);
  ASSERT_TRUE(listed.is_ok());
  EXPECT_EQ(listed->removed, std::vector<std::string>{partial});
  EXPECT_EQ(list_dir(dir.path()).size(), 3u);
  auto removed = remove_stale_temp_files(dir.path(), now);
  ASSERT_TRUE(removed.is_ok());
  EXPECT_EQ(removed->removed, std::vector<std::string>{partial});
  EXPECT_GT(removed->removed_bytes, 0u);
  EXPECT_TRUE(list_dir(dir.path()).empty()) << list_dir(dir.path())[0];
}

// A remover running in a loop next to writers never costs a save: it cannot take a living
// writer's lock, and a writer whose fresh temporary was taken makes another one.
TEST(StaleTempFiles, ARemoverRacingWritersNeverBreaksASave) {
  TempDir dir;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> passes{0};
  std::thread remover([&] {
    while (!stop) {
      auto r = remove_stale_temp_files(dir.path());
      EXPECT_TRUE(r.is_ok());
      ++passes;
    }
  });
  for (int i = 0; i < 200; ++i) {
    auto data = testing::random_bytes(4096 * (1 + i % 5) + static_cast<size_t>(i),
                                      static_cast<uint64_t>(i));
    std::string path = dir.file("f" + std::to_string(i % 7) + ".pt");
    Status st = save(path, data);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    auto back = testing::read_whole_file(path);
    ASSERT_TRUE(back.is_ok());
    ASSERT_EQ("", testing::first_difference(data, *back));
  }
  stop = true;
  remover.join();
  EXPECT_GT(passes.load(), 10u);
  EXPECT_EQ(count_temps(dir.path()), 0u);
}

}  // namespace
}  // namespace fastpersist
