// SPDX-License-Identifier: Apache-2.0
// An object tier (object_tier.h) over a store whose listing and objects are any bytes: the
// sizes a listing claims, the manifests and the files are all untrusted. Listing, reading each
// manifest, verifying, pulling into a local root, retention and debris removal each return a
// Status, never crash, and never ask the store for more bytes than it holds (plus one first
// piece): memory follows what the objects hold, not what the listing claims.
//
// Input: records "<key> <claimed size> <body length>\n<body>", one after another (the corpus
// seeds are real tiers, tests/fuzz/make_object_listing_seeds.py). Parsing stops at the first
// record that does not parse; at most 16 objects.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/object_store.h"
#include "fuzz_target.h"
#include "tier/object_tier.h"

namespace {

using fastpersist::ObjectEntry;
using fastpersist::Result;
using fastpersist::Status;
using fastpersist::StatusCode;

constexpr uint64_t kFirstPieceSlack = uint64_t{1} << 20;  // the first piece of a manifest

struct StoredObject {
  uint64_t claimed = 0;  // what the listing says
  std::string bytes;     // what a get returns
};

// A store in memory whose listing reports each object's claimed size, not its real one.
class LyingStore final : public fastpersist::ObjectStore {
 public:
  explicit LyingStore(std::map<std::string, StoredObject> objects) : objects_(std::move(objects)) {}

  std::string url() const override { return "fuzz://bucket/run"; }

  Result<std::vector<ObjectEntry>> list(const std::string& prefix) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ObjectEntry> out;
    for (const auto& [key, object] : objects_) {
      if (key.compare(0, prefix.size(), prefix) == 0) out.push_back({key, object.claimed});
    }
    return out;
  }

  Status get(const std::string& key, uint64_t offset, std::span<std::byte> into) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return Status(StatusCode::kNotFound, "no such object").with_path(key);
    const std::string& bytes = it->second.bytes;
    // The property: a reader sizes what it asks for by what arrived, not by the listing.
    FUZZ_CHECK(into.size() <= bytes.size() + kFirstPieceSlack);
    if (offset > bytes.size() || into.size() > bytes.size() - offset) {
      return Status(StatusCode::kDataLoss, "the object ends first").with_path(key);
    }
    std::copy_n(reinterpret_cast<const std::byte*>(bytes.data()) + offset, into.size(),
                into.begin());
    return Status::ok();
  }

  Status put(const std::string& key, std::span<const std::byte> data) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string bytes(reinterpret_cast<const char*>(data.data()), data.size());
    objects_[key] = {bytes.size(), std::move(bytes)};
    return Status::ok();
  }
  // Nothing here uploads (no tier drains into this store): a multipart upload is refused.
  Result<std::string> begin_upload(const std::string& key) override { return refused(key); }
  Result<std::string> upload_part(const std::string& key, const std::string&, int,
                                  std::span<const std::byte>) override {
    return refused(key);
  }
  Status complete_upload(const std::string& key, const std::string&,
                         const std::vector<std::string>&) override {
    return refused(key);
  }
  Status abort_upload(const std::string&, const std::string&) override { return Status::ok(); }
  Result<uint64_t> abort_uploads(const std::string&) override { return uint64_t{0}; }

  Status remove(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& key : keys) objects_.erase(key);
    return Status::ok();
  }

 private:
  static Status refused(const std::string& key) {
    return Status(StatusCode::kUnavailable, "uploads are not part of this fuzz target")
        .with_path(key);
  }

  std::mutex mu_;
  std::map<std::string, StoredObject> objects_;
};

// The records of the input (see the file comment).
std::map<std::string, StoredObject> parse(std::string_view in) {
  std::map<std::string, StoredObject> out;
  while (!in.empty() && out.size() < 16) {
    size_t eol = in.find('\n');
    if (eol == std::string_view::npos) break;
    std::string header(in.substr(0, eol));
    in.remove_prefix(eol + 1);
    size_t a = header.find(' ');
    size_t b = a == std::string::npos ? a : header.find(' ', a + 1);
    if (b == std::string::npos || a == 0) break;
    char* end = nullptr;
    const std::string claimed_text = header.substr(a + 1, b - a - 1);
    const std::string length_text = header.substr(b + 1);
    if (claimed_text.empty() || length_text.empty()) break;
    unsigned long long claimed = std::strtoull(claimed_text.c_str(), &end, 10);
    if (*end != '\0') break;
    unsigned long long length = std::strtoull(length_text.c_str(), &end, 10);
    if (*end != '\0' || length > in.size()) break;
    out[header.substr(0, a)] = {claimed, std::string(in.substr(0, length))};
    in.remove_prefix(length);
  }
  return out;
}

// A private folder for the local root and the verify scratch, removed at exit.
struct ScratchRoot {
  std::string path;
  ScratchRoot() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fp-fuzz-objects-XXXXXX").string();
    FUZZ_CHECK(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~ScratchRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

const std::string& scratch_root() {
  static ScratchRoot root;
  return root.path;
}

fastpersist::IoEngine& engine() {
  static std::unique_ptr<fastpersist::IoEngine> e = [] {
    auto made = fastpersist::IoEngine::create(fastpersist::EngineOptions{});
    FUZZ_CHECK(made.is_ok());
    return std::move(made).value();
  }();
  return *e;
}

fastpersist::CheckpointOptions local_options() {
  fastpersist::CheckpointOptions o;
  o.staging_window_bytes = 64 << 10;
  o.target_file_bytes = 256 << 10;
  o.min_file_bytes = 64 << 10;
  o.lock_staging_memory = false;
  o.durable = false;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  auto store = std::make_shared<LyingStore>(parse({reinterpret_cast<const char*>(data), size}));
  fastpersist::checkpoint::ObjectTier tier(store, {uint64_t{64} << 10, 2});

  const fs::path work = fs::path(scratch_root()) / "run";
  fs::remove_all(work);
  fs::create_directories(work / "scratch");
  auto scan = tier.scan();
  if (scan.is_ok()) {
    std::vector<std::string> tags;
    for (const auto& info : scan->committed) tags.push_back(info.tag);
    for (const auto& damaged : scan->damaged) (void)tier.read_manifest(damaged.tag);
    auto local = fastpersist::CheckpointManager::open((work / "local").string(), local_options());
    if (!local.is_ok())
      std::fprintf(stderr, "cannot open the local root: %s\n", local.status().to_string().c_str());
    FUZZ_CHECK(local.is_ok());
    for (const std::string& tag : tags) {
      auto manifest = tier.read_manifest(tag);
      auto report = fastpersist::checkpoint::verify_object_checkpoint(
          tier, tag, (work / "scratch").string(), engine());
      auto pulled = tier.download(tag, **local, engine());
      // A checkpoint the pull committed locally verifies there: nothing unchecked got in. (A
      // tensor in an encoding this build cannot decode is copied as stored, every file's
      // checksum checked, and verify names it as unsupported.)
      if (pulled.is_ok() && pulled->copied) {
        auto verified = fastpersist::verify_checkpoint((work / "local" / tag).string(), engine());
        FUZZ_CHECK(verified.is_ok());
        for (const std::string& problem : verified->problems) {
          if (problem.find("is not supported by this fastpersist") == std::string::npos) {
            std::fprintf(stderr, "pulled %s does not verify: %s\n", tag.c_str(), problem.c_str());
          }
          FUZZ_CHECK(problem.find("is not supported by this fastpersist") != std::string::npos);
        }
      }
      (void)manifest;
      (void)report;
    }
    FUZZ_CHECK((*local)->close().is_ok());
  }
  (void)tier.apply_retention(1, std::nullopt);
  (void)tier.remove_debris();
  fs::remove_all(work);
  return 0;
}
