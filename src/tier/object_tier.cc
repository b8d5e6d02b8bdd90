// SPDX-License-Identifier: Apache-2.0
// An object tier's listing, removal and retention (object_tier.h); uploads and downloads are in
// object_upload.cc and object_download.cc.
#include "tier/object_tier.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "checkpoint/retention.h"
#include "fastpersist/layout.h"
#include "fastpersist/manifest.h"

namespace fastpersist::checkpoint {
namespace {

// The first piece of a manifest fetched (most manifests are smaller: one request).
constexpr uint64_t kFirstManifestPieceBytes = uint64_t{1} << 20;

std::string manifest_key(const std::string& tag) {
  return tag + "/" + std::string(kManifestFileName);
}

// The tag a key belongs to ("" when the key is not under a tag's name).
std::string tag_of(const std::string& key) {
  size_t slash = key.find('/');
  if (slash == std::string::npos) return "";
  std::string tag = key.substr(0, slash);
  return check_tag_syntax(tag).is_ok() ? tag : "";
}

// Where file `f` of checkpoint TAG lives in the store: TAG/name, or base/name for a reference.
std::string file_key(const std::string& tag, const ManifestFile& f) {
  return referenced_checkpoint(f).empty() ? tag + "/" + f.name : f.name;
}

}  // namespace

ObjectTier::ObjectTier(std::shared_ptr<ObjectStore> store, ObjectTransfer transfer)
    : store_(std::move(store)), transfer_(transfer), url_(store_->url()) {}

Result<Manifest> ObjectTier::read_manifest(const std::string& tag) {
  FP_ASSIGN_OR_RETURN(std::string json, read_manifest_bytes(tag));
  return decode_manifest(json, url_ + "/" + manifest_key(tag));
}

Result<std::string> ObjectTier::read_manifest_bytes(const std::string& tag) {
  FP_RETURN_IF_ERROR(check_tag_syntax(tag));
  const std::string key = manifest_key(tag);
  FP_ASSIGN_OR_RETURN(std::vector<ObjectEntry> found, store_->list(key));
  auto it =
      std::find_if(found.begin(), found.end(), [&](const ObjectEntry& e) { return e.key == key; });
  if (it == found.end()) {
    return Status(StatusCode::kNotFound, "checkpoint '" + tag + "' is not in " + url_)
        .with_path(url_ + "/" + key);
  }
  return fetch_manifest(tag, it->size);
}

Result<std::string> ObjectTier::fetch_manifest(const std::string& tag, uint64_t size) {
  const std::string key = manifest_key(tag);
  if (size > kMaxManifestBytes) {
    return Status(StatusCode::kDataLoss, "the manifest is " + std::to_string(size) +
                                             " bytes, more than any fastpersist writes")
        .with_path(url_ + "/" + key);
  }
  // The listing's size is untrusted: the bytes are fetched in pieces that double only once the
  // bytes before them arrived, so memory follows what the object holds, not what it claims.
  std::string json;
  uint64_t piece = kFirstManifestPieceBytes;
  while (json.size() < size) {
    const size_t at = json.size();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece, size - at));
    json.resize(at + n);
    Status st = store_->get(key, at, std::as_writable_bytes(std::span<char>(json).subspan(at)));
    if (st.code() == StatusCode::kDataLoss) {
      return Status(StatusCode::kDataLoss,
                    "the listing says the manifest is " + std::to_string(size) +
                        " bytes, but the object ends before " + std::to_string(at + n))
          .with_path(url_ + "/" + key);
    }
    if (!st.is_ok()) return st;
    piece *= 2;
  }
  return json;
}

Result<RootScan> ObjectTier::scan() {
  FP_ASSIGN_OR_RETURN(std::vector<ObjectEntry> entries, store_->list(""));
  std::map<std::string, uint64_t> sizes;
  std::set<std::string> tags;
  for (ObjectEntry& e : entries) {
    std::string tag = tag_of(e.key);
    if (!tag.empty() && e.key == manifest_key(tag)) tags.insert(tag);
    sizes.emplace(std::move(e.key), e.size);
  }
  RootScan scan;
  for (const std::string& tag : tags) {
    const std::string mkey = manifest_key(tag);
    Result<std::string> json = fetch_manifest(tag, sizes.at(mkey));
    Result<Manifest> m =
        json.is_ok() ? decode_manifest(*json, url_ + "/" + mkey) : Result<Manifest>(json.status());
    if (!m.is_ok() && m.status().code() == StatusCode::kNotFound) continue;  // removed meanwhile
    std::string problem;
    if (!m.is_ok()) {
      if (m.status().code() != StatusCode::kDataLoss) return m.status();  // the store failed
      problem = m.status().to_string();
    } else {
      for (const ManifestFile& f : m->files) {
        auto it = sizes.find(file_key(tag, f));
        if (it == sizes.end()) {
          problem = f.name + ": missing";
        } else if (it->second != f.size) {
          problem = f.name + ": " + std::to_string(it->second) + " bytes, the manifest says " +
                    std::to_string(f.size);
        }
        if (!problem.empty()) break;
      }
    }
    if (problem.empty()) {
      scan.committed.push_back(info_of(tag, *m));
      continue;
    }
    scan.damaged.push_back(damaged_of(tag, problem, m));
  }
  // By creation time first: the manifests keep the sequence numbers of the roots they were saved
  // in, and a root that was lost and begun anew counts from 1 again.
  std::sort(scan.committed.begin(), scan.committed.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) {
              if (a.created_unix != b.created_unix) return a.created_unix < b.created_unix;
              return a.sequence != b.sequence ? a.sequence < b.sequence : a.tag < b.tag;
            });
  return scan;
}

Result<std::vector<CheckpointInfo>> ObjectTier::list() {
  FP_ASSIGN_OR_RETURN(RootScan scan, this->scan());
  return std::move(scan.committed);
}

Status ObjectTier::clear_uncommitted(const std::string& tag) {
  FP_ASSIGN_OR_RETURN(std::vector<ObjectEntry> left, store_->list(tag + "/"));
  std::vector<std::string> keys;
  for (ObjectEntry& e : left) {
    if (e.key == manifest_key(tag)) {
      return Status(StatusCode::kAlreadyExists, "checkpoint '" + tag + "' is committed in " + url_);
    }
    keys.push_back(std::move(e.key));
  }
  if (!keys.empty()) FP_RETURN_IF_ERROR(store_->remove(keys));
  return store_->abort_uploads(tag + "/").status();
}

Status ObjectTier::remove(const std::string& tag) {
  FP_ASSIGN_OR_RETURN(RootScan scan, this->scan());
  auto committed = std::find_if(scan.committed.begin(), scan.committed.end(),
                                [&](const CheckpointInfo& c) { return c.tag == tag; });
  auto damaged = std::find_if(scan.damaged.begin(), scan.damaged.end(),
                              [&](const DamagedCheckpoint& d) { return d.tag == tag; });
  if (committed == scan.committed.end() && damaged == scan.damaged.end()) {
    return Status(StatusCode::kNotFound, "checkpoint '" + tag + "' is not in " + url_);
  }
  std::vector<std::string> users = referencing(scan, tag);
  if (!users.empty()) {
    std::string names;
    for (const std::string& u : users) names += (names.empty() ? "" : ", ") + u;
    return Status(StatusCode::kBusy, "checkpoint '" + tag + "' in " + url_ + " is the base of " +
                                         names + " (incremental): remove those first");
  }
  return remove_all({tag});
}

Result<std::vector<std::string>> ObjectTier::apply_retention(std::optional<unsigned> keep_last,
                                                             std::optional<int64_t> keep_every) {
  FP_ASSIGN_OR_RETURN(RootScan scan, this->scan());
  RetentionDecision decision = decide_retention(scan, keep_last, keep_every);
  if (!decision.remove.empty()) FP_RETURN_IF_ERROR(remove_all(decision.remove));
  return decision.remove;
}

Status ObjectTier::remove_all(const std::vector<std::string>& tags) {
  for (const std::string& tag : tags) {
    // The manifest first: from then on nobody lists it, whatever happens to the rest.
    FP_RETURN_IF_ERROR(store_->remove({manifest_key(tag)}));
    FP_ASSIGN_OR_RETURN(std::vector<ObjectEntry> files, store_->list(tag + "/"));
    std::vector<std::string> keys;
    for (ObjectEntry& e : files) keys.push_back(std::move(e.key));
    if (!keys.empty()) FP_RETURN_IF_ERROR(store_->remove(keys));
  }
  return write_latest();
}

Result<uint64_t> ObjectTier::remove_debris() {
  FP_ASSIGN_OR_RETURN(std::vector<ObjectEntry> entries, store_->list(""));
  std::set<std::string> committed;
  for (const ObjectEntry& e : entries) {
    std::string tag = tag_of(e.key);
    if (!tag.empty() && e.key == manifest_key(tag)) committed.insert(tag);
  }
  std::vector<std::string> keys;
  for (ObjectEntry& e : entries) {
    std::string tag = tag_of(e.key);
    if (!tag.empty() && committed.count(tag) == 0) keys.push_back(std::move(e.key));
  }
  if (!keys.empty()) FP_RETURN_IF_ERROR(store_->remove(keys));
  FP_RETURN_IF_ERROR(store_->abort_uploads("").status());
  return static_cast<uint64_t>(keys.size());
}

Status ObjectTier::write_latest() {
  FP_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> committed, list());
  if (committed.empty()) return store_->remove({kObjectLatestKey});
  const std::string& tag = committed.back().tag;
  return store_->put(kObjectLatestKey,
                     std::as_bytes(std::span<const char>(tag.data(), tag.size())));
}

Result<std::unique_ptr<ObjectTier>> open_object_tier(const TierOptions& tier) {
  std::shared_ptr<ObjectStore> store = tier.store;
  if (store == nullptr) {
    auto opened = open_object_store(tier.path);
    if (!opened.is_ok()) {
      const Status& st = opened.status();
      return Status(st.code(), "tier " + tier.path + ": " + st.message(), st.sys_errno())
          .with_path(st.path());
    }
    store = std::move(opened).value();
  }
  return std::make_unique<ObjectTier>(std::move(store),
                                      ObjectTransfer{tier.part_bytes, tier.transfers});
}

}  // namespace fastpersist::checkpoint
