// SPDX-License-Identifier: Apache-2.0
// seal_folder / check_sealed_folder: a sealed folder checks as sealed; a folder without a seal
// is unsealed; a file removed, grown, or changed in place (same size), or a broken marker, is
// damaged and named; subfolders are refused.
#include "fastpersist/folder_seal.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "fastpersist/checksum.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

void fill(const TempDir& dir) {
  FP_ASSERT_OK(write_whole_file(dir.file("model.safetensors"), random_bytes(100000, 1)));
  FP_ASSERT_OK(write_whole_file(dir.file("optimizer.pt"), random_bytes(9 << 20, 2)));
  FP_ASSERT_OK(write_whole_file(dir.file("trainer_state.json"), random_bytes(10, 3)));
}

SealState state_of(const TempDir& dir, bool checksums, std::string* problem = nullptr) {
  Result<SealCheck> c = check_sealed_folder(dir.path(), checksums);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  if (problem != nullptr) *problem = c.value().problem;
  return c.value().state;
}

TEST(FolderSeal, ASealedFolderChecksAndListsEveryFile) {
  TempDir dir;
  fill(dir);
  EXPECT_EQ(state_of(dir, true), SealState::kUnsealed);
  FP_ASSERT_OK_AND_ASSIGN(std::vector<SealedFile> files, seal_folder(dir.path(), true));
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].name, "model.safetensors");
  EXPECT_EQ(files[1].name, "optimizer.pt");
  EXPECT_EQ(files[1].size, uint64_t{9} << 20);
  std::vector<std::byte> bytes = random_bytes(9 << 20, 2);
  EXPECT_EQ(files[1].checksum, xxh3_64(bytes.data(), bytes.size()));
  EXPECT_EQ(state_of(dir, true), SealState::kSealed);
  EXPECT_EQ(state_of(dir, false), SealState::kSealed);
  EXPECT_EQ(list_dir(dir.path()).size(), 4u);  // the marker, and no temporary left
}

TEST(FolderSeal, AChangedMissingOrGrownFileIsDamagedAndNamed) {
  TempDir dir;
  fill(dir);
  FP_ASSERT_OK(seal_folder(dir.path(), false).status());
  std::string problem;
  // Changed in place, same size: only the checksum sees it.
  FP_ASSERT_OK(write_whole_file(dir.file("trainer_state.json"), random_bytes(10, 4)));
  EXPECT_EQ(state_of(dir, false), SealState::kSealed);
  EXPECT_EQ(state_of(dir, true, &problem), SealState::kDamaged);
  EXPECT_NE(problem.find("trainer_state.json differs"), std::string::npos) << problem;
  // Grown: the size says it.
  FP_ASSERT_OK(write_whole_file(dir.file("trainer_state.json"), random_bytes(11, 3)));
  EXPECT_EQ(state_of(dir, false, &problem), SealState::kDamaged);
  EXPECT_NE(problem.find("trainer_state.json has 11 bytes"), std::string::npos) << problem;
  // Missing.
  ASSERT_EQ(::unlink(dir.file("optimizer.pt").c_str()), 0);
  FP_ASSERT_OK(write_whole_file(dir.file("trainer_state.json"), random_bytes(10, 3)));
  EXPECT_EQ(state_of(dir, true, &problem), SealState::kDamaged);
  EXPECT_NE(problem.find("optimizer.pt"), std::string::npos) << problem;
}

TEST(FolderSeal, ABrokenOrHostileMarkerIsDamaged) {
  TempDir dir;
  fill(dir);
  for (const char* text : {"{", "[]", R"({"format":"other","files":[]})",
                           R"({"format":"fastpersist-sealed-folder","files":[{"name":"../x",)"
                           R"("size":1,"checksum":"0000000000000000"}]})",
                           R"({"format":"fastpersist-sealed-folder","files":[{"name":"a"}]})"}) {
    std::string s(text);
    FP_ASSERT_OK(write_whole_file(
        dir.file(kFolderSealName),
        std::vector<std::byte>(reinterpret_cast<const std::byte*>(s.data()),
                               reinterpret_cast<const std::byte*>(s.data()) + s.size())));
    EXPECT_EQ(state_of(dir, true), SealState::kDamaged) << text;
  }
}

TEST(FolderSeal, KnownRecordsAreTakenNotReadAgain) {
  TempDir dir;
  fill(dir);
  // The caller's record of optimizer.pt (as its writer hashed it while writing): taken as is.
  std::vector<std::byte> bytes = random_bytes(9 << 20, 2);
  SealedFile known{"optimizer.pt", bytes.size(), xxh3_64(bytes.data(), bytes.size())};
  FP_ASSERT_OK_AND_ASSIGN(std::vector<SealedFile> files, seal_folder(dir.path(), true, {known}));
  EXPECT_EQ(files[1].checksum, known.checksum);
  EXPECT_EQ(state_of(dir, true), SealState::kSealed);
  // A record whose size is wrong, or of a file that is not there, is refused.
  known.size += 1;
  EXPECT_EQ(seal_folder(dir.path(), true, {known}).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(seal_folder(dir.path(), true, {{"gone.pt", 1, 0}}).status().code(),
            StatusCode::kNotFound);
}

TEST(FolderSeal, SubfoldersAreRefused) {
  TempDir dir;
  fill(dir);
  ASSERT_EQ(::mkdir(dir.file("tokenizer").c_str(), 0755), 0);
  EXPECT_EQ(seal_folder(dir.path(), false).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(state_of(dir, true), SealState::kUnsealed);  // nothing was written
}

}  // namespace
}  // namespace fastpersist::testing
