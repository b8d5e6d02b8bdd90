// SPDX-License-Identifier: Apache-2.0
// io_uring backend (liburing). One ring per worker, sized to the queue depth; the completion
// ring is twice the submission ring, so it never overflows while we respect capacity().
#include <cerrno>
#include <cstring>
#include <vector>

#include "io/backends.h"

#ifdef FASTPERSIST_HAVE_URING
#include <liburing.h>
#endif

namespace fastpersist::io {

#ifdef FASTPERSIST_HAVE_URING
namespace {

class UringBackend final : public IoBackend {
 public:
  explicit UringBackend(unsigned capacity) : capacity_(capacity) {}
  ~UringBackend() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  Status init() {
    unsigned entries = 1;
    while (entries < capacity_) entries <<= 1;
    int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0)
      return Status::from_errno(-rc, "io_uring_queue_init(" + std::to_string(entries) + ")");
    initialized_ = true;
    return Status::ok();
  }

  std::string_view name() const override { return "io_uring"; }
  unsigned capacity() const override { return capacity_; }

  Status submit(std::span<const IoOp> ops, size_t* accepted) override {
    *accepted = 0;
    for (const IoOp& op : ops) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        return Status(StatusCode::kInternal, "io_uring submission queue full");
      }
      auto len = static_cast<unsigned>(op.length);
      if (op.is_write) {
        io_uring_prep_write(sqe, op.fd, op.buffer, len, op.file_offset);
      } else {
        io_uring_prep_read(sqe, op.fd, op.buffer, len, op.file_offset);
      }
      io_uring_sqe_set_data64(sqe, op.tag);
    }
    while (*accepted < ops.size()) {
      int rc = io_uring_submit(&ring_);
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) return Status::from_errno(-rc, "io_uring_submit");
      if (rc == 0) return Status(StatusCode::kInternal, "io_uring_submit accepted nothing");
      *accepted += static_cast<size_t>(rc);
    }
    return Status::ok();
  }

  Result<size_t> reap(std::span<IoCompletion> out, size_t min_complete) override {
    if (min_complete > 0) {
      io_uring_cqe* cqe = nullptr;
      for (;;) {
        int rc = io_uring_wait_cqe_nr(&ring_, &cqe, static_cast<unsigned>(min_complete));
        if (rc == -EINTR || rc == -EAGAIN) continue;
        if (rc < 0) return Status::from_errno(-rc, "io_uring_wait_cqe_nr");
        break;
      }
    }
    size_t n = 0;
    io_uring_cqe* cqe = nullptr;
    while (n < out.size() && io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
      out[n].tag = io_uring_cqe_get_data64(cqe);
      out[n].result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      ++n;
    }
    return n;
  }

 private:
  unsigned capacity_;
  io_uring ring_{};
  bool initialized_ = false;
};

}  // namespace

Result<std::unique_ptr<IoBackend>> make_uring_backend(unsigned queue_depth) {
  auto backend = std::make_unique<UringBackend>(queue_depth);
  FP_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<IoBackend>(std::move(backend));
}

BackendProbe probe_uring() {
  BackendProbe p{Backend::kIoUring, true, false, "", ""};
  io_uring ring{};
  int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) {
    int err = -rc;
    if (err == ENOSYS) {
      p.reason = "the kernel has no io_uring (ENOSYS)";
      p.fix = "use Linux 5.6 or newer";
    } else if (err == EPERM || err == EACCES) {
      p.reason = std::string("io_uring is refused by this process (") + std::strerror(err) +
                 "): the kernel.io_uring_disabled sysctl, a seccomp filter or a container policy";
      p.fix =
          "set sysctl kernel.io_uring_disabled=0 or allow io_uring_setup in the seccomp profile";
    } else {
      p.reason = std::string("io_uring_queue_init failed: ") + std::strerror(err);
      p.fix = err == ENOMEM ? "raise the memlock limit (ulimit -l)" : "";
    }
    return p;
  }
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  bool ok = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ) &&
            io_uring_opcode_supported(probe, IORING_OP_WRITE);
  if (probe != nullptr) io_uring_free_probe(probe);
  io_uring_queue_exit(&ring);
  if (!ok) {
    p.reason = "the kernel's io_uring lacks IORING_OP_READ/WRITE";
    p.fix = "use Linux 5.6 or newer";
    return p;
  }
  p.available = true;
  p.reason = "io_uring rings can be created; READ and WRITE opcodes supported";
  return p;
}

#else  // !FASTPERSIST_HAVE_URING

Result<std::unique_ptr<IoBackend>> make_uring_backend(unsigned) {
  return Status(StatusCode::kUnavailable, "fastpersist was built without io_uring support");
}

BackendProbe probe_uring() {
  return {Backend::kIoUring, false, false, "not built in: liburing was not found at build time",
          "apt-get install liburing-dev (or dnf install liburing-devel) and rebuild"};
}

#endif

}  // namespace fastpersist::io
