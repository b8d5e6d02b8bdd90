// SPDX-License-Identifier: Apache-2.0
#include "tier/tier_drain.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "checkpoint/retention.h"
#include "common/guarded.h"
#include "fastpersist/checkpoint_reader.h"

namespace fastpersist::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxNewErrors = 32;
constexpr double kMaxBackoffSeconds = 60;

bool selected(const CheckpointInfo& c, const TierOptions& options) {
  if (!options.every) return true;
  return c.step.has_value() && *c.step % *options.every == 0;
}

Status in_tier(const TierOptions& tier, const Status& st) {
  return Status(st.code(), "tier " + tier.path + ": " + st.message(), st.sys_errno())
      .with_path(st.path());
}

}  // namespace

std::vector<std::string> plan_drain(const std::vector<CheckpointInfo>& local,
                                    const std::vector<CheckpointInfo>& tier,
                                    const TierOptions& options) {
  std::unordered_set<std::string> present;
  double newest = -1;
  for (const CheckpointInfo& c : tier) {
    present.insert(c.tag);
    newest = std::max(newest, c.created_unix);
  }
  std::vector<CheckpointInfo> wanted;
  for (const CheckpointInfo& c : local) {
    if (selected(c, options) && c.created_unix > newest && present.count(c.tag) == 0)
      wanted.push_back(c);
  }
  // What the tier's retention would remove once these arrived is not worth sending.
  std::vector<CheckpointInfo> after = tier;
  after.insert(after.end(), wanted.begin(), wanted.end());
  std::stable_sort(after.begin(), after.end(),
                   [](const CheckpointInfo& a, const CheckpointInfo& b) {
                     return a.created_unix < b.created_unix;
                   });
  std::vector<std::string> dropped =
      select_for_removal(after, options.keep_last, options.keep_every);
  std::unordered_set<std::string> drop(dropped.begin(), dropped.end());
  std::unordered_map<std::string, const CheckpointInfo*> by_tag;
  for (const CheckpointInfo& c : local) by_tag.emplace(c.tag, &c);
  std::vector<std::string> plan;
  std::unordered_set<std::string> planned;
  for (const CheckpointInfo& c : wanted) {
    if (drop.count(c.tag) != 0) continue;
    for (const std::string& base : c.references) {
      if (present.count(base) == 0 && planned.count(base) == 0 && by_tag.count(base) != 0) {
        plan.push_back(base);
        planned.insert(base);
      }
    }
    if (planned.insert(c.tag).second) plan.push_back(c.tag);
  }
  return plan;
}

Result<std::unique_ptr<CheckpointManager>> open_tier(const TierOptions& tier,
                                                     const CheckpointOptions& base) {
  CheckpointOptions o;
  o.engine = base.engine;
  o.durable = base.durable;
  o.lock_staging_memory = false;
  o.keep_last = tier.keep_last;
  o.keep_every = tier.keep_every;
  o.retention_by_creation = true;  // a base sent again arrives after newer checkpoints
  auto opened = CheckpointManager::open(tier.path, o);
  if (!opened.is_ok()) return in_tier(tier, opened.status());
  return opened;
}

TierPass drain_tier(const std::string& local_root, const std::vector<std::string>& plan,
                    const std::vector<CheckpointInfo>& local, IoEngine& read_engine,
                    TierTarget& tier, const TierPassHooks& hooks) {
  TierPass pass;
  std::unordered_map<std::string, const CheckpointInfo*> by_tag;
  for (const CheckpointInfo& c : local) by_tag.emplace(c.tag, &c);
  std::unordered_set<std::string> failed;
  TierOptions where;
  where.path = tier.where();
  for (const std::string& tag : plan) {
    auto info = by_tag.find(tag);
    std::string failed_base;
    if (info != by_tag.end()) {
      for (const std::string& base : info->second->references) {
        if (failed.count(base) != 0) failed_base = base;
      }
    }
    if (hooks.begin) hooks.begin(tag);
    Status outcome;
    if (!failed_base.empty()) {
      outcome =
          Status(StatusCode::kDataLoss, "checkpoint '" + tag + "' was not drained: its base '" +
                                            failed_base + "' could not be");
    } else {
      auto began = Clock::now();
      auto copied = tier.receive(local_root, tag, read_engine, hooks.pacer);
      if (copied.is_ok()) {
        if (copied->copied) {
          pass.drained.push_back(tag);
          pass.bytes += copied->bytes;
          pass.seconds += std::chrono::duration<double>(Clock::now() - began).count();
        }
      } else if (copied.status().code() == StatusCode::kNotFound) {
        pass.gone.push_back(tag);  // local retention or remove() was first: nothing to keep
      } else {
        outcome =
            Status(copied.status().code(),
                   "checkpoint '" + tag + "' could not be drained: " + copied.status().message(),
                   copied.status().sys_errno())
                .with_path(copied.status().path());
      }
    }
    if (!outcome.is_ok()) {
      failed.insert(tag);
      pass.failures.push_back(in_tier(where, outcome));
    }
    if (hooks.end) hooks.end(tag, outcome);
    // A damaged local copy can never be sent: the others go on. Any other failure (an I/O
    // error, a full tier, a cancelled pass) may pass: the rest wait, in order, for the retry.
    // Going on would put newer checkpoints in the tier first, and the next plan (only what is
    // newer than the tier's newest) would never send this one again.
    if (!outcome.is_ok() && outcome.code() != StatusCode::kDataLoss) break;
  }
  return pass;
}

TierDrainer::TierDrainer(Setup setup) : setup_(std::move(setup)) {
  for (const TierOptions& t : setup_.tiers) {
    Tier tier;
    tier.options = t;
    tier.state.path = t.path;
    tiers_.push_back(std::move(tier));
  }
}

Result<std::unique_ptr<TierDrainer>> TierDrainer::start(Setup setup) {
  std::unique_ptr<TierDrainer> d(new TierDrainer(std::move(setup)));
  FP_ASSIGN_OR_RETURN(d->read_engine_, IoEngine::create(d->setup_.base.engine));
  d->requested_ = 1;  // a first pass: what a previous manager left undrained
  TierDrainer* raw = d.get();
  d->thread_ = std::thread([raw] { raw->run(); });
  return d;
}

TierDrainer::~TierDrainer() { stop(); }

void TierDrainer::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cancel_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  for (Tier& t : tiers_) {
    if (t.target) (void)t.target->close();
    t.target.reset();
  }
}

void TierDrainer::committed(const std::string& tag) {
  std::lock_guard lock(mu_);
  if (setup_.pin_until_drained) fresh_.insert(tag);
  ++requested_;
  cv_.notify_all();
}

std::string TierDrainer::pin_reason(const std::string& tag) const {
  std::lock_guard lock(mu_);
  for (const Tier& t : tiers_) {
    if (t.state.draining == tag)
      return "checkpoint '" + tag + "' is being drained into tier " + t.options.path;
  }
  if (!setup_.pin_until_drained) return "";
  if (fresh_.count(tag) != 0)
    return "checkpoint '" + tag + "' was just committed and waits for its tiers";
  for (const Tier& t : tiers_) {
    if (std::find(t.state.waiting.begin(), t.state.waiting.end(), tag) != t.state.waiting.end()) {
      return "checkpoint '" + tag + "' waits to be drained into tier " + t.options.path;
    }
  }
  return "";
}

std::vector<Status> TierDrainer::take_new_errors() {
  std::lock_guard lock(mu_);
  std::vector<Status> out;
  out.swap(new_errors_);
  if (dropped_errors_ != 0) {
    out.push_back(Status(StatusCode::kIoError,
                         std::to_string(dropped_errors_) + " more drain failure(s) were not kept"));
    dropped_errors_ = 0;
  }
  return out;
}

Status TierDrainer::wait(std::optional<double> timeout_seconds) {
  std::unique_lock lock(mu_);
  if (stopping_) return Status(StatusCode::kInvalidArgument, "the tier drainer is stopped");
  const uint64_t target = ++requested_;
  cv_.notify_all();
  auto done = [&] { return completed_ >= target || stopping_; };
  if (timeout_seconds) {
    auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(std::max(0.0, *timeout_seconds)));
    if (!cv_.wait_until(lock, until, done)) {
      std::string left;
      for (const Tier& t : tiers_) {
        size_t n = t.state.waiting.size();
        if (n != 0)
          left += (left.empty() ? "" : ", ") + std::to_string(n) + " for " + t.options.path;
      }
      return Status(StatusCode::kBusy,
                    "the drains did not finish within " + std::to_string(*timeout_seconds) +
                        " s (checkpoints waiting: " + (left.empty() ? "none" : left) + ")");
    }
  } else {
    cv_.wait(lock, done);
  }
  if (pass_failures_.empty()) return Status::ok();
  const Status& first = pass_failures_.front();
  std::string more =
      pass_failures_.size() > 1
          ? " (and " + std::to_string(pass_failures_.size() - 1) + " more drain failure(s))"
          : "";
  return Status(first.code(), first.message() + more, first.sys_errno()).with_path(first.path());
}

std::vector<TierState> TierDrainer::states() const {
  std::lock_guard lock(mu_);
  std::vector<TierState> out;
  for (const Tier& t : tiers_) out.push_back(t.state);
  return out;
}

void TierDrainer::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    auto due = [&] {
      return stopping_ || requested_ > started_ || (retry_at_ && Clock::now() >= *retry_at_);
    };
    if (retry_at_) {
      cv_.wait_until(lock, *retry_at_, due);
    } else {
      cv_.wait(lock, due);
    }
    if (stopping_) break;
    if (!due()) continue;
    started_ = requested_;
    retry_at_.reset();
    lock.unlock();
    Status failed = run_guarded("a drain pass", [this] {
      pass();
      return Status::ok();
    });
    lock.lock();
    if (!failed.is_ok()) {  // thrown out of the pass (memory ran out): its failure, reported
      if (new_errors_.size() < kMaxNewErrors) new_errors_.push_back(failed);
      pass_failures_ = {failed};
    }
    completed_ = started_;
    if (!pass_failures_.empty()) {
      retry_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(backoff_seconds_));
      backoff_seconds_ = std::min(backoff_seconds_ * 2, kMaxBackoffSeconds);
    } else {
      backoff_seconds_ = 1;
    }
    cv_.notify_all();
  }
  completed_ = requested_;  // waiters return (stopping_)
  cv_.notify_all();
}

void TierDrainer::pass() {
  std::vector<Status> failures;
  {
    std::lock_guard lock(mu_);
    fresh_.clear();  // the scan below sees them: the plans pin them from now on
  }
  auto scanned = list_checkpoints(setup_.local_root);
  if (!scanned.is_ok()) {
    failures.push_back(
        Status(scanned.status().code(),
               "cannot list the local checkpoints to drain them: " + scanned.status().message(),
               scanned.status().sys_errno())
            .with_path(scanned.status().path()));
  }
  // Every tier's plan first, so that all of them are pinned before the first copy begins.
  std::vector<std::optional<std::vector<std::string>>> plans(tiers_.size());
  for (size_t i = 0; i < tiers_.size() && scanned.is_ok(); ++i) {
    Tier& tier = tiers_[i];
    Status st;
    if (!tier.target) {
      auto opened = open_tier_target(tier.options, setup_.base);
      if (opened.is_ok()) {
        tier.target = std::move(opened).value();
      } else {
        st = opened.status();
      }
    }
    if (st.is_ok()) {
      auto present = tier.target->list();
      if (present.is_ok()) {
        tier.listing = std::move(present).value();
        plans[i] = plan_drain(*scanned, tier.listing, tier.options);
      } else {
        st = in_tier(tier.options, present.status());
        (void)tier.target->close();
        tier.target.reset();  // opened again next time (the tier may come back)
      }
    }
    std::lock_guard lock(mu_);
    if (plans[i]) {
      tier.state.waiting = *plans[i];
    } else {
      // Unreachable: what it would need, judged by what it held when last seen, stays pinned.
      failures.push_back(st);
      tier.state.last_error = st;
      tier.state.waiting = plan_drain(*scanned, tier.listing, tier.options);
    }
  }
  bool drained_any = false;
  for (size_t i = 0; i < tiers_.size() && !cancel_; ++i) {
    if (!plans[i]) continue;
    Tier& tier = tiers_[i];
    TierPassHooks hooks;
    hooks.begin = [&](const std::string& tag) {
      std::lock_guard lock(mu_);
      tier.state.draining = tag;
    };
    hooks.end = [&](const std::string& tag, const Status& outcome) {
      std::lock_guard lock(mu_);
      tier.state.draining.clear();
      tier.state.last_error = outcome;
      if (outcome.is_ok()) {
        auto& w = tier.state.waiting;
        w.erase(std::remove(w.begin(), w.end(), tag), w.end());
      }
    };
    hooks.pacer = make_pacer(tier.options.bandwidth_bytes_per_second, &cancel_, setup_.pause);
    TierPass result =
        drain_tier(setup_.local_root, *plans[i], *scanned, *read_engine_, *tier.target, hooks);
    {
      std::lock_guard lock(mu_);
      tier.state.checkpoints_drained += result.drained.size();
      tier.state.bytes_drained += result.bytes;
      tier.state.seconds_draining += result.seconds;
      if (!result.drained.empty()) tier.state.last_drained = result.drained.back();
    }
    drained_any = drained_any || !result.drained.empty() || !result.gone.empty();
    failures.insert(failures.end(), result.failures.begin(), result.failures.end());
  }
  // Each tier's lock is held only during a pass, so that between passes other tools may use
  // the tier (prune it, open a manager on it to load).
  for (Tier& tier : tiers_) {
    if (!tier.target) continue;
    if (Status st = tier.target->close(); !st.is_ok())
      failures.push_back(in_tier(tier.options, st));
    tier.target.reset();
  }
  if (drained_any && setup_.after_drain) {
    if (Status st = setup_.after_drain(); !st.is_ok()) failures.push_back(st);
  }
  std::lock_guard lock(mu_);
  for (const Status& f : failures) {
    if (new_errors_.size() < kMaxNewErrors) {
      new_errors_.push_back(f);
    } else {
      ++dropped_errors_;
    }
  }
  pass_failures_ = std::move(failures);
}

}  // namespace fastpersist::checkpoint
