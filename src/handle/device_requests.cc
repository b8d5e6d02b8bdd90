// SPDX-License-Identifier: Apache-2.0
#include "handle/device_requests.h"

#include "buffer/device_copy.h"

namespace fastpersist::handle {

Status DeviceRequests::Done::wait() {
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return finished; });
  return status;
}

DeviceRequests::~DeviceRequests() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status DeviceRequests::ready(int device) {
  if (device < 0) {
    return Status(StatusCode::kInvalidArgument, "invalid CUDA device " + std::to_string(device));
  }
  {
    std::lock_guard lock(mu_);
    if (auto it = readiness_.find(device); it != readiness_.end()) return it->second;
  }
  Status st = buffer::device_copy_ready(device);
  if (!st.is_ok()) {
    st = Status(StatusCode::kUnavailable, "AioHandle cannot move the memory of CUDA device " +
                                              std::to_string(device) + ": " + st.message());
  }
  std::lock_guard lock(mu_);
  readiness_.emplace(device, st);
  return st;
}

std::shared_ptr<DeviceRequests::Done> DeviceRequests::submit(StagedTransfer transfer,
                                                             bool collected_by_wait) {
  auto done = std::make_shared<Done>();
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    queue_.push_back({std::move(transfer), done});
    if (collected_by_wait) uncollected_.push_back(done);
  }
  cv_.notify_one();
  return done;
}

Result<size_t> DeviceRequests::wait() {
  std::vector<std::shared_ptr<Done>> batch;
  {
    std::lock_guard lock(mu_);
    batch.swap(uncollected_);
  }
  Status first;
  for (const auto& d : batch) {
    Status st = d->wait();
    if (first.is_ok()) first = st;
  }
  if (!first.is_ok()) return first;
  return batch.size();
}

void DeviceRequests::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to do
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Status st = run_staged_transfer(engine_, pool_, job.transfer);
    {
      std::lock_guard lock(job.done->mu);
      job.done->status = std::move(st);
      job.done->finished = true;
    }
    job.done->cv.notify_all();
  }
}

}  // namespace fastpersist::handle
