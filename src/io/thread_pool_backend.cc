// SPDX-License-Identifier: Apache-2.0
// Portable backend: a small pool of threads running pread/pwrite. Works on every POSIX system and
// in sandboxes that refuse io_uring and AIO; each op is one blocking syscall on a pool thread.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "io/backends.h"

namespace fastpersist::io {

int64_t run_op_blocking(const IoOp& op) {
  for (;;) {
    ssize_t n = op.is_write
                    ? ::pwrite(op.fd, op.buffer, op.length, static_cast<off_t>(op.file_offset))
                    : ::pread(op.fd, op.buffer, op.length, static_cast<off_t>(op.file_offset));
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? -errno : n;
  }
}

namespace {

// More threads than this only add contention: the device queue, not the thread count, limits
// throughput, and each worker of the engine has its own pool.
constexpr unsigned kMaxPoolThreads = 8;

class ThreadPoolBackend final : public IoBackend {
 public:
  explicit ThreadPoolBackend(unsigned capacity) : capacity_(capacity) {
    unsigned threads = std::clamp(capacity, 1u, kMaxPoolThreads);
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~ThreadPoolBackend() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::string_view name() const override { return "threads"; }
  unsigned capacity() const override { return capacity_; }

  Status submit(std::span<const IoOp> ops, size_t* accepted) override {
    {
      std::lock_guard lock(mu_);
      for (const IoOp& op : ops) work_.push_back(op);
    }
    if (ops.size() == 1) {
      work_cv_.notify_one();
    } else {
      work_cv_.notify_all();
    }
    *accepted = ops.size();
    return Status::ok();
  }

  Result<size_t> reap(std::span<IoCompletion> out, size_t min_complete) override {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_.size() >= min_complete; });
    size_t n = std::min(out.size(), done_.size());
    for (size_t i = 0; i < n; ++i) {
      out[i] = done_.front();
      done_.pop_front();
    }
    return n;
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
      if (work_.empty()) return;  // stop_ and nothing left
      IoOp op = work_.front();
      work_.pop_front();
      lock.unlock();
      IoCompletion c{op.tag, run_op_blocking(op)};
      lock.lock();
      done_.push_back(c);
      done_cv_.notify_one();
    }
  }

  unsigned capacity_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<IoOp> work_;
  std::deque<IoCompletion> done_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

Result<std::unique_ptr<IoBackend>> make_thread_pool_backend(unsigned queue_depth) {
  return std::unique_ptr<IoBackend>(std::make_unique<ThreadPoolBackend>(queue_depth));
}

BackendProbe probe_thread_pool() {
  return {Backend::kThreads, true, true, "pread/pwrite on a thread pool; always available", ""};
}

}  // namespace fastpersist::io
