// SPDX-License-Identifier: Apache-2.0
// The maintenance calls (maintenance.h) on top of the private pieces that a manager uses too:
// root scans, retention decisions, object tiers and drain passes.
#include "fastpersist/maintenance.h"

#include <cstdlib>
#include <set>
#include <utility>

#include "checkpoint/path_kind.h"
#include "checkpoint/retention.h"
#include "checkpoint/root_scan.h"
#include "fastpersist/object_store.h"
#include "tier/object_tier.h"
#include "tier/tier_drain.h"

namespace fastpersist {
namespace {

// Where object-store checkpoints are fetched to be verified: $TMPDIR, else /tmp.
std::string scratch_folder() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? std::string(tmp) : std::string("/tmp");
}

// The plan for `scan` (already demoted by verification, when asked): what goes, what stays.
PrunePlan plan_for(const RootScan& scan, const RetentionPolicy& policy,
                   std::vector<std::string> damaged) {
  checkpoint::RetentionDecision decision =
      checkpoint::decide_retention(scan, policy.keep_last, policy.keep_every);
  PrunePlan plan;
  std::set<std::string> gone(decision.remove.begin(), decision.remove.end());
  for (const CheckpointInfo& c : scan.committed) {
    if (gone.count(c.tag) == 0) plan.kept.push_back(c.tag);
  }
  plan.remove = std::move(decision.remove);
  plan.kept_because = std::move(decision.kept);
  plan.damaged = std::move(damaged);
  return plan;
}

}  // namespace

Result<RootScan> scan_any_root(const std::string& root) {
  if (!is_object_store_url(root)) return scan_root(root);
  FP_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStoreRoot> objects, ObjectStoreRoot::open(root));
  return objects->scan();
}

Result<PrunePlan> plan_prune(const std::string& root, const RetentionPolicy& policy,
                             IoEngine* verify_engine) {
  FP_ASSIGN_OR_RETURN(RootScan scan, scan_root(root));
  std::vector<std::string> damaged;
  if (verify_engine != nullptr) {
    damaged = checkpoint::demote_damaged(&scan, policy.keep_last.value_or(0), root, *verify_engine);
  }
  return plan_for(scan, policy, std::move(damaged));
}

// ---------------------------------------------------------------------------- object stores

struct ObjectStoreRoot::Impl {
  std::unique_ptr<checkpoint::ObjectTier> tier;
};

ObjectStoreRoot::ObjectStoreRoot(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ObjectStoreRoot::~ObjectStoreRoot() = default;

Result<std::unique_ptr<ObjectStoreRoot>> ObjectStoreRoot::open(const std::string& url) {
  TierOptions options;
  options.path = url;
  auto impl = std::make_unique<Impl>();
  FP_ASSIGN_OR_RETURN(impl->tier, checkpoint::open_object_tier(options));
  return std::unique_ptr<ObjectStoreRoot>(new ObjectStoreRoot(std::move(impl)));
}

const std::string& ObjectStoreRoot::url() const { return impl_->tier->url(); }

Result<RootScan> ObjectStoreRoot::scan() { return impl_->tier->scan(); }

Result<VerifyReport> ObjectStoreRoot::verify(const std::string& tag, IoEngine& engine) {
  return checkpoint::verify_object_checkpoint(*impl_->tier, tag, scratch_folder(), engine);
}

Result<PrunePlan> ObjectStoreRoot::prune(const RetentionPolicy& policy, bool dry_run,
                                         IoEngine* verify_engine) {
  FP_ASSIGN_OR_RETURN(RootScan scan, impl_->tier->scan());
  std::vector<std::string> damaged;
  if (verify_engine != nullptr) {
    damaged = checkpoint::demote_damaged(
        &scan, policy.keep_last.value_or(0), [&](const CheckpointInfo& c) -> std::string {
          auto report = verify(c.tag, *verify_engine);
          if (!report.is_ok()) return "cannot be verified: " + report.status().to_string();
          return report->ok() ? "" : report->problems.front();
        });
  }
  PrunePlan plan = plan_for(scan, policy, std::move(damaged));
  if (!dry_run && !plan.remove.empty()) {
    FP_RETURN_IF_ERROR(impl_->tier->remove_all(plan.remove));
  }
  return plan;
}

// ---------------------------------------------------------------------------- drains

namespace {

// The committed checkpoints of the tier, for a plan made without opening it for a pass: a
// directory that is not there yet holds none.
Result<std::vector<CheckpointInfo>> tier_listing_for_plan(const TierOptions& tier) {
  if (tier.is_object_store()) return checkpoint::list_tier(tier);
  PathInfo t = classify_path(tier.path);
  if (t.kind == PathKind::kMissing) return std::vector<CheckpointInfo>{};
  if (t.kind != PathKind::kRoot) {
    return Status(StatusCode::kInvalidArgument,
                  tier.path + " is " + std::string(describe_path_kind(t.kind)) +
                      ", not a checkpoint root (or a path to create one at)");
  }
  return list_checkpoints(tier.path);
}

}  // namespace

Status validate_tiers(const std::string& root, const std::vector<TierOptions>& tiers) {
  return checkpoint::check_tiers(root, tiers);
}

Result<std::vector<std::string>> plan_drain_into(const std::string& root, const TierOptions& tier) {
  FP_RETURN_IF_ERROR(checkpoint::check_tiers(root, {tier}));
  FP_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> local, list_checkpoints(root));
  FP_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> present, tier_listing_for_plan(tier));
  return checkpoint::plan_drain(local, present, tier);
}

Result<DrainReport> drain_into(const std::string& root, const TierOptions& tier,
                               const EngineOptions& engine,
                               const std::function<void(const std::string& tag)>& on_begin) {
  FP_RETURN_IF_ERROR(checkpoint::check_tiers(root, {tier}));
  FP_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> local, list_checkpoints(root));
  CheckpointOptions base;
  base.engine = engine;
  base.tiers = {tier};
  FP_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::TierTarget> target,
                      checkpoint::open_tier_target(tier, base));
  auto present = target->list();
  if (!present.is_ok()) {
    (void)target->close();
    return present.status();
  }
  DrainReport report;
  report.planned = checkpoint::plan_drain(local, *present, tier);
  auto read_engine = IoEngine::create(engine);
  if (!read_engine.is_ok()) {
    (void)target->close();
    return read_engine.status();
  }
  checkpoint::TierPassHooks hooks;
  hooks.pacer = checkpoint::make_pacer(tier.bandwidth_bytes_per_second);
  hooks.begin = on_begin;
  checkpoint::TierPass pass =
      checkpoint::drain_tier(root, report.planned, local, **read_engine, *target, hooks);
  if (Status st = target->close(); !st.is_ok()) pass.failures.push_back(st);
  report.drained = std::move(pass.drained);
  report.gone = std::move(pass.gone);
  report.failures = std::move(pass.failures);
  report.bytes = pass.bytes;
  report.seconds = pass.seconds;
  return report;
}

std::vector<CheckpointPlace> locate_checkpoints(const std::string& root,
                                                const std::vector<CheckpointInfo>& local,
                                                const std::vector<std::string>& tier_paths,
                                                std::vector<std::string>* unreachable) {
  std::vector<TierOptions> tiers(tier_paths.size());
  for (size_t i = 0; i < tier_paths.size(); ++i) tiers[i].path = tier_paths[i];
  return checkpoint::locate_in_tiers(root, local, tiers, unreachable);
}

}  // namespace fastpersist
