// SPDX-License-Identifier: Apache-2.0
#include "tier/part_upload.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>

namespace fastpersist::checkpoint {

uint64_t part_size_for(uint64_t object_bytes, uint64_t part_bytes) {
  const uint64_t needed = (object_bytes + kMaxPartsPerObject - 1) / kMaxPartsPerObject;
  const uint64_t mib = uint64_t{1} << 20;
  return std::max(part_bytes, (needed + mib - 1) / mib * mib);
}

PartUploader::PartUploader(ObjectStore& store, uint64_t part_bytes, unsigned transfers)
    : store_(store),
      default_part_bytes_(part_bytes),
      transfers_(std::max(1u, transfers)),
      pool_(std::max(1u, transfers)) {}

PartUploader::~PartUploader() { abort_all(); }

uint64_t PartUploader::parts_sent() const {
  std::lock_guard lock(mu_);
  return parts_sent_;
}

void PartUploader::record(Status st) {
  std::lock_guard lock(mu_);
  if (error_.is_ok() && !st.is_ok()) error_ = std::move(st);
  cv_.notify_all();
}

Status PartUploader::begin(const std::string& key, uint64_t size) {
  if (current_)
    return Status(StatusCode::kInvalidArgument,
                  "the upload of " + current_->key + " was not ended");
  FP_RETURN_IF_ERROR(ObjectStore::check_key(key));
  auto object = std::make_shared<Object>();
  object->key = key;
  {
    std::lock_guard lock(mu_);
    FP_RETURN_IF_ERROR(error_);
    objects_.push_back(object);
  }
  current_ = std::move(object);
  size_ = size;
  fed_ = 0;
  part_bytes_ = part_size_for(size, default_part_bytes_);
  next_part_ = 1;
  return Status::ok();
}

std::shared_ptr<PartUploader::Buffer> PartUploader::take_free_buffer() {
  std::unique_lock lock(mu_);
  // At most `transfers` in flight, one filling: the memory stays (transfers + 1) parts.
  cv_.wait(lock, [&] { return in_flight_ < transfers_ || !error_.is_ok(); });
  std::shared_ptr<Buffer> b;
  if (!free_.empty()) {
    b = std::move(free_.back());
    free_.pop_back();
  }
  lock.unlock();
  if (!b) b = std::make_shared<Buffer>();
  if (b->bytes.size() < part_bytes_) b->bytes.resize(part_bytes_);
  b->used = 0;
  return b;
}

Status PartUploader::feed(const std::byte* data, size_t bytes) {
  if (!current_) return Status(StatusCode::kInvalidArgument, "no object is being uploaded");
  while (bytes > 0) {
    {
      std::lock_guard lock(mu_);
      FP_RETURN_IF_ERROR(error_);
    }
    if (!filling_) filling_ = take_free_buffer();
    size_t n = std::min(bytes, static_cast<size_t>(part_bytes_ - filling_->used));
    std::memcpy(filling_->bytes.data() + filling_->used, data, n);
    filling_->used += n;
    fed_ += n;
    data += n;
    bytes -= n;
    // A full part goes now, unless it holds the object's last bytes (end() decides: a put or
    // the last part).
    if (filling_->used == part_bytes_ && fed_ < size_)
      FP_RETURN_IF_ERROR(send(std::move(filling_), false));
  }
  return Status::ok();
}

Status PartUploader::end() {
  if (!current_) return Status(StatusCode::kInvalidArgument, "no object is being uploaded");
  if (fed_ != size_) {
    return Status(StatusCode::kInternal, "the upload of " + current_->key + " was fed " +
                                             std::to_string(fed_) + " bytes, not " +
                                             std::to_string(size_));
  }
  if (!filling_) filling_ = take_free_buffer();  // an empty object, or one that ended on a part
  Status st = send(std::move(filling_), true);
  current_.reset();
  return st;
}

Status PartUploader::send(std::shared_ptr<Buffer> buffer, bool last) {
  std::shared_ptr<Object> object = current_;
  const bool single = last && object->upload_id.empty();  // the whole object is this buffer
  if (!single && object->upload_id.empty()) {
    auto begun = store_.begin_upload(object->key);
    if (!begun.is_ok()) {
      Status st(begun.status().code(),
                "starting the upload of " + store_.url() + "/" + object->key + ": " +
                    begun.status().message(),
                begun.status().sys_errno());
      record(st);
      return st;
    }
    object->upload_id = std::move(begun).value();
  }
  if (!single && last && buffer->used == 0) {
    // The object ended exactly on a part: no tail to send; it completes with the parts it has.
    bool complete_now = false;
    {
      std::lock_guard lock(mu_);
      object->ended = true;
      free_.push_back(std::move(buffer));
      complete_now = object->parts_pending == 0 && error_.is_ok();
      if (complete_now) ++in_flight_;
    }
    if (complete_now) {
      pool_.submit([this, object] {
        complete(object);
        std::lock_guard lock(mu_);
        --in_flight_;
        cv_.notify_all();
      });
    }
    return Status::ok();
  }
  const int part = single ? 0 : next_part_++;
  {
    std::lock_guard lock(mu_);
    ++in_flight_;
    if (!single) {
      ++object->parts_pending;
      object->etags.resize(static_cast<size_t>(part));
    }
    if (last) object->ended = true;
  }
  pool_.submit([this, object, buffer = std::move(buffer), part, single]() mutable {
    std::span<const std::byte> bytes(buffer->bytes.data(), buffer->used);
    Status st;
    std::string etag;
    if (single) {
      st = store_.put(object->key, bytes);
      if (!st.is_ok()) {
        st =
            Status(st.code(), "uploading " + store_.url() + "/" + object->key + ": " + st.message(),
                   st.sys_errno());
      }
    } else {
      auto sent = store_.upload_part(object->key, object->upload_id, part, bytes);
      if (sent.is_ok()) {
        etag = std::move(sent).value();
      } else {
        st = Status(sent.status().code(),
                    "uploading part " + std::to_string(part) + " of " + store_.url() + "/" +
                        object->key + ": " + sent.status().message(),
                    sent.status().sys_errno());
      }
    }
    bool complete_now = false;
    {
      std::lock_guard lock(mu_);
      free_.push_back(std::move(buffer));
      if (error_.is_ok() && !st.is_ok()) error_ = st;
      if (single) {
        object->done = st.is_ok();
      } else {
        ++parts_sent_;
        if (st.is_ok()) object->etags[static_cast<size_t>(part - 1)] = std::move(etag);
        --object->parts_pending;
        complete_now = object->ended && object->parts_pending == 0 && error_.is_ok();
      }
      if (!complete_now) {
        --in_flight_;
        cv_.notify_all();
        return;
      }
    }
    complete(object);  // on this thread, still counted in flight
    std::lock_guard lock(mu_);
    --in_flight_;
    cv_.notify_all();
  });
  return Status::ok();
}

void PartUploader::complete(const std::shared_ptr<Object>& object) {
  std::vector<std::string> etags;
  {
    std::lock_guard lock(mu_);
    etags = object->etags;
  }
  Status st = store_.complete_upload(object->key, object->upload_id, etags);
  std::lock_guard lock(mu_);
  if (st.is_ok()) {
    object->done = true;
  } else if (error_.is_ok()) {
    error_ =
        Status(st.code(),
               "completing the upload of " + store_.url() + "/" + object->key + ": " + st.message(),
               st.sys_errno());
  }
  cv_.notify_all();
}

Status PartUploader::finish_all() {
  if (current_) {
    abort_all();
    return Status(StatusCode::kInternal, "finish_all() with an object not ended");
  }
  Status st;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
    st = error_;
    for (const auto& o : objects_) {
      if (st.is_ok() && !o->done)
        st = Status(StatusCode::kInternal, "the upload of " + o->key + " never completed");
    }
  }
  if (!st.is_ok()) {
    abort_all();
    return st;
  }
  std::lock_guard lock(mu_);
  objects_.clear();
  return Status::ok();
}

void PartUploader::abort_all() {
  std::vector<std::shared_ptr<Object>> objects;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
    objects.swap(objects_);
    if (filling_) free_.push_back(std::move(filling_));
  }
  current_.reset();
  for (const auto& o : objects) {
    if (!o->done && !o->upload_id.empty()) (void)store_.abort_upload(o->key, o->upload_id);
  }
}

}  // namespace fastpersist::checkpoint
