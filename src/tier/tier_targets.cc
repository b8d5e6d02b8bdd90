// SPDX-License-Identifier: Apache-2.0
// The two kinds of place a drain copies to (tier_drain.h): a directory tier, which is a
// checkpoint root with its own manager, and an object tier (object_tier.h).
#include <utility>

#include "fastpersist/checkpoint_reader.h"
#include "tier/object_tier.h"
#include "tier/tier_drain.h"

namespace fastpersist::checkpoint {
namespace {

class DirectoryTarget final : public TierTarget {
 public:
  DirectoryTarget(std::string path, std::unique_ptr<CheckpointManager> manager)
      : path_(std::move(path)), manager_(std::move(manager)) {}
  const std::string& where() const override { return path_; }
  Result<std::vector<CheckpointInfo>> list() override { return manager_->list(); }
  Result<CopyResult> receive(const std::string& local_root, const std::string& tag,
                             IoEngine& read_engine, const CopyPacer& pacer) override {
    return copy_checkpoint(local_root, tag, read_engine, *manager_,
                           pacer);  // its commit applies retention
  }
  Status close() override { return manager_->close(); }

 private:
  std::string path_;
  std::unique_ptr<CheckpointManager> manager_;
};

class ObjectTarget final : public TierTarget {
 public:
  ObjectTarget(TierOptions options, std::unique_ptr<ObjectTier> tier)
      : options_(std::move(options)), tier_(std::move(tier)) {}
  const std::string& where() const override { return options_.path; }
  Result<std::vector<CheckpointInfo>> list() override { return tier_->list(); }
  Result<CopyResult> receive(const std::string& local_root, const std::string& tag,
                             IoEngine& read_engine, const CopyPacer& pacer) override {
    return tier_->upload(local_root, tag, read_engine, pacer);
  }
  Status close() override {
    if (!options_.keep_last && !options_.keep_every) return Status::ok();
    auto removed = tier_->apply_retention(options_.keep_last, options_.keep_every);
    if (removed.is_ok()) return Status::ok();
    return Status(removed.status().code(),
                  "the tier's retention failed: " + removed.status().message(),
                  removed.status().sys_errno());
  }

 private:
  TierOptions options_;
  std::unique_ptr<ObjectTier> tier_;
};

}  // namespace

Result<std::unique_ptr<TierTarget>> open_tier_target(const TierOptions& tier,
                                                     const CheckpointOptions& base) {
  if (!tier.is_object_store()) {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointManager> manager, open_tier(tier, base));
    return std::unique_ptr<TierTarget>(
        std::make_unique<DirectoryTarget>(tier.path, std::move(manager)));
  }
  FP_ASSIGN_OR_RETURN(std::unique_ptr<ObjectTier> objects, open_object_tier(tier));
  // Only one drainer writes to a tier, and none is in a pass now: whatever is not committed
  // there is what a drain that died left.
  if (auto removed = objects->remove_debris(); !removed.is_ok()) {
    const Status& st = removed.status();
    return Status(st.code(), "tier " + tier.path + ": " + st.message(), st.sys_errno())
        .with_path(st.path());
  }
  return std::unique_ptr<TierTarget>(std::make_unique<ObjectTarget>(tier, std::move(objects)));
}

Result<std::vector<CheckpointInfo>> list_tier(const TierOptions& tier) {
  if (!tier.is_object_store()) return list_checkpoints(tier.path);
  FP_ASSIGN_OR_RETURN(std::unique_ptr<ObjectTier> objects, open_object_tier(tier));
  return objects->list();
}

}  // namespace fastpersist::checkpoint
