// SPDX-License-Identifier: Apache-2.0
#include "testing/fault_backend.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <string>
#include <utility>

#include "common/unique_fd.h"

namespace fastpersist::testing {
namespace {

// A multiple of every O_DIRECT alignment Linux filesystems ask for; a shortened O_DIRECT
// operation of this granularity is one the real kernel could have returned.
constexpr uint64_t kDirectGranule = 4096;

uint64_t short_length(const FaultSpec& spec, uint64_t length) {
  return spec.short_bytes != 0 ? std::min(spec.short_bytes, length - 1) : length / 2;
}

// The first part of `op` moved with plain pread/pwrite through a descriptor without O_DIRECT,
// for short transfers that end where O_DIRECT cannot (the engine must then finish the rest
// through the page cache, which is what this exercises).
int64_t transfer_buffered(const IoOp& op) {
  int fl = ::fcntl(op.fd, F_GETFL);
  if (fl < 0) return -errno;
  std::string proc = "/proc/self/fd/" + std::to_string(op.fd);
  UniqueFd fd(::open(proc.c_str(), (fl & O_ACCMODE) | O_CLOEXEC));
  if (!fd.valid()) return -errno;
  for (;;) {
    ssize_t n = op.is_write
                    ? ::pwrite(fd.get(), op.buffer, op.length, static_cast<off_t>(op.file_offset))
                    : ::pread(fd.get(), op.buffer, op.length, static_cast<off_t>(op.file_offset));
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? -errno : n;
  }
}

class FaultBackend final : public IoBackend {
 public:
  FaultBackend(std::unique_ptr<IoBackend> inner, std::shared_ptr<FaultInjector> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)) {}

  std::string_view name() const override { return "fault"; }
  unsigned capacity() const override { return inner_->capacity(); }

  Status submit(std::span<const IoOp> ops, size_t* accepted) override {
    *accepted = 0;
    // Pass-through operations are batched so the inner backend sees the engine's batching;
    // the batch is flushed before each injected fault to keep completions in submission order.
    std::vector<IoOp> batch;
    auto flush = [&]() -> Status {
      size_t taken = 0;
      Status st = batch.empty() ? Status::ok() : inner_->submit(batch, &taken);
      *accepted += taken;
      batch.clear();
      return st;
    };
    for (const IoOp& op : ops) {
      FaultSpec spec = faults_->decide(op);
      InjectedFault fault{spec.kind, op.fd, op.file_offset, op.length, op.is_write, 0};
      switch (spec.kind) {
        case FaultKind::kNone:
          batch.push_back(op);
          continue;
        case FaultKind::kSubmitError:
          FP_RETURN_IF_ERROR(flush());
          faults_->record(fault);
          return Status::from_errno(spec.error, "injected submit failure");
        case FaultKind::kError:
        case FaultKind::kNoProgress:
          FP_RETURN_IF_ERROR(flush());
          fault.result = spec.kind == FaultKind::kError ? -static_cast<int64_t>(spec.error) : 0;
          synthetic_.push_back({op.tag, fault.result});
          ++*accepted;
          break;
        case FaultKind::kShort: {
          IoOp part = op;
          part.length = short_length(spec, op.length);
          int fl = ::fcntl(op.fd, F_GETFL);
          bool direct = fl >= 0 && (fl & O_DIRECT) != 0;
          if (!direct || part.length % kDirectGranule == 0) {
            // The real backend moves the shortened operation; its completion (the short count,
            // or a real error) goes back to the engine unchanged.
            batch.push_back(part);
            fault.result = static_cast<int64_t>(part.length);
          } else {
            FP_RETURN_IF_ERROR(flush());
            fault.result = transfer_buffered(part);
            synthetic_.push_back({op.tag, fault.result});
            ++*accepted;
          }
          break;
        }
      }
      faults_->record(fault);
    }
    return flush();
  }

  Result<size_t> reap(std::span<IoCompletion> out, size_t min_complete) override {
    size_t n = 0;
    while (n < out.size() && !synthetic_.empty()) {
      out[n++] = synthetic_.front();
      synthetic_.pop_front();
    }
    if (n == out.size()) return n;
    size_t still_needed = min_complete > n ? min_complete - n : 0;
    FP_ASSIGN_OR_RETURN(size_t more, inner_->reap(out.subspan(n), still_needed));
    return n + more;
  }

 private:
  std::unique_ptr<IoBackend> inner_;
  std::shared_ptr<FaultInjector> faults_;
  std::deque<IoCompletion> synthetic_;  // completions of injected faults, not yet reaped
};

bool matches(FaultOps ops, const IoOp& op) {
  switch (ops) {
    case FaultOps::kAll:
      return true;
    case FaultOps::kWrites:
      return op.is_write;
    case FaultOps::kReads:
      return !op.is_write;
  }
  return false;
}

}  // namespace

FaultInjector::FaultInjector(FaultSpec spec, BackendFactory inner)
    : inner_(std::move(inner)), spec_(spec) {}

Result<std::shared_ptr<FaultInjector>> FaultInjector::create(FaultSpec spec, Backend inner) {
  FP_ASSIGN_OR_RETURN(BackendFactory factory, backend_factory(inner));
  return create(spec, std::move(factory));
}

std::shared_ptr<FaultInjector> FaultInjector::create(FaultSpec spec, BackendFactory inner) {
  return std::shared_ptr<FaultInjector>(new FaultInjector(spec, std::move(inner)));
}

BackendFactory FaultInjector::factory() {
  std::shared_ptr<FaultInjector> self = shared_from_this();
  return [self](unsigned queue_depth) -> Result<std::unique_ptr<IoBackend>> {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> inner, self->inner_(queue_depth));
    return std::unique_ptr<IoBackend>(std::make_unique<FaultBackend>(std::move(inner), self));
  };
}

void FaultInjector::arm(FaultSpec spec) {
  std::lock_guard lock(mu_);
  spec_ = spec;
  matching_ = 0;
  injected_.clear();
}

uint64_t FaultInjector::matching_ops() const {
  std::lock_guard lock(mu_);
  return matching_;
}

std::vector<InjectedFault> FaultInjector::injected() const {
  std::lock_guard lock(mu_);
  return injected_;
}

FaultSpec FaultInjector::decide(const IoOp& op) {
  std::lock_guard lock(mu_);
  if (spec_.kind == FaultKind::kNone || !matches(spec_.ops, op)) return FaultSpec{};
  if (spec_.kind == FaultKind::kShort && op.length < 2) return FaultSpec{};  // cannot be shortened
  uint64_t index = ++matching_;
  bool hit = spec_.repeat ? index >= spec_.nth : index == spec_.nth;
  return hit ? spec_ : FaultSpec{};
}

void FaultInjector::record(const InjectedFault& fault) {
  std::lock_guard lock(mu_);
  injected_.push_back(fault);
}

}  // namespace fastpersist::testing
