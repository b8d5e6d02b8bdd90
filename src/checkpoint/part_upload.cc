// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/part_upload.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>

namespace fastpersist::checkpoint {

PartUploader::PartUploader(ObjectStore& store, uint64_t part_bytes, unsigned transfers)
    : store_(store), default_part_bytes_(part_bytes), pool_(std::max(1u, transfers)) {}

PartUploader::~PartUploader() { abort(); }

Status PartUploader::begin(const std::string& key, uint64_t size) {
  if (open_) return Status(StatusCode::kInvalidArgument, "an upload of " + key_ + " is still open");
  FP_RETURN_IF_ERROR(ObjectStore::check_key(key));
  key_ = key;
  size_ = size;
  fed_ = 0;
  // The smallest multiple of 1 MiB that keeps the object within kMaxPartsPerObject parts.
  const uint64_t needed = (size + kMaxPartsPerObject - 1) / kMaxPartsPerObject;
  const uint64_t mib = uint64_t{1} << 20;
  part_bytes_ = std::max(default_part_bytes_, (needed + mib - 1) / mib * mib);
  upload_id_.clear();
  next_part_ = 1;
  etags_.clear();
  error_ = Status::ok();
  open_ = true;
  filling_.reset();
  return Status::ok();
}

std::unique_ptr<PartUploader::Buffer> PartUploader::take_free_buffer() {
  std::unique_lock lock(mu_);
  // At most `transfers` parts in flight, one filling: the memory stays (transfers + 1) parts.
  cv_.wait(lock, [&] { return in_flight_ < pool_.threads(); });
  std::unique_ptr<Buffer> b;
  if (!free_.empty()) {
    b = std::move(free_.back());
    free_.pop_back();
  }
  lock.unlock();
  if (!b) b = std::make_unique<Buffer>();
  if (b->bytes.size() < part_bytes_) b->bytes.resize(part_bytes_);
  b->used = 0;
  return b;
}

Status PartUploader::feed(const std::byte* data, size_t bytes) {
  if (!open_) return Status(StatusCode::kInvalidArgument, "no upload is open");
  while (bytes > 0) {
    {
      std::lock_guard lock(mu_);
      if (!error_.is_ok()) return error_;
    }
    if (!filling_) filling_ = take_free_buffer();
    size_t n = std::min(bytes, static_cast<size_t>(part_bytes_ - filling_->used));
    std::memcpy(filling_->bytes.data() + filling_->used, data, n);
    filling_->used += n;
    fed_ += n;
    data += n;
    bytes -= n;
    // A full part goes now, unless it is the object's last bytes (finish() decides: a put or the
    // last part).
    if (filling_->used == part_bytes_ && fed_ < size_) FP_RETURN_IF_ERROR(send_full_buffer());
  }
  return Status::ok();
}

Status PartUploader::send_full_buffer() {
  if (upload_id_.empty()) {
    auto begun = store_.begin_upload(key_);
    if (!begun.is_ok()) return begun.status();
    upload_id_ = std::move(begun).value();
  }
  const int part = next_part_++;
  std::shared_ptr<Buffer> buffer(filling_.release());
  {
    std::lock_guard lock(mu_);
    ++in_flight_;
    etags_.resize(static_cast<size_t>(part));
  }
  pool_.submit([this, part, buffer]() mutable {
    auto sent = store_.upload_part(key_, upload_id_, part,
                                   std::span<const std::byte>(buffer->bytes.data(), buffer->used));
    std::lock_guard lock(mu_);
    if (sent.is_ok()) {
      etags_[static_cast<size_t>(part - 1)] = std::move(sent).value();
    } else if (error_.is_ok()) {
      error_ = Status(sent.status().code(), "uploading part " + std::to_string(part) + " of " + store_.url() + "/" +
                                                key_ + ": " + sent.status().message(),
                      sent.status().sys_errno());
    }
    free_.push_back(std::make_unique<Buffer>(std::move(*buffer)));
    --in_flight_;
    ++parts_sent_;
    cv_.notify_all();
  });
  return Status::ok();
}

void PartUploader::wait_in_flight() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
}

Status PartUploader::finish() {
  if (!open_) return Status(StatusCode::kInvalidArgument, "no upload is open");
  if (fed_ != size_) {
    abort();
    return Status(StatusCode::kInternal, "the upload of " + key_ + " was fed " + std::to_string(fed_) +
                                             " bytes, not " + std::to_string(size_));
  }
  Status st;
  if (upload_id_.empty()) {
    // The whole object fits one part: one put, no multipart upload.
    std::span<const std::byte> whole;
    if (filling_) whole = std::span<const std::byte>(filling_->bytes.data(), filling_->used);
    st = store_.put(key_, whole);
    if (!st.is_ok()) {
      st = Status(st.code(), "uploading " + store_.url() + "/" + key_ + ": " + st.message(), st.sys_errno());
    }
  } else {
    if (filling_ && filling_->used > 0) st = send_full_buffer();
    wait_in_flight();
    {
      std::lock_guard lock(mu_);
      if (st.is_ok()) st = error_;
    }
    if (st.is_ok()) {
      st = store_.complete_upload(key_, upload_id_, etags_);
      if (!st.is_ok()) {
        st = Status(st.code(), "completing the upload of " + store_.url() + "/" + key_ + ": " + st.message(),
                    st.sys_errno());
      }
    }
  }
  if (!st.is_ok()) {
    abort();
    return st;
  }
  if (filling_) {
    std::lock_guard lock(mu_);
    free_.push_back(std::move(filling_));
  }
  open_ = false;
  return Status::ok();
}

void PartUploader::abort() {
  if (!open_) return;
  wait_in_flight();
  if (!upload_id_.empty()) (void)store_.abort_upload(key_, upload_id_);
  if (filling_) {
    std::lock_guard lock(mu_);
    free_.push_back(std::move(filling_));
  }
  open_ = false;
}

}  // namespace fastpersist::checkpoint
