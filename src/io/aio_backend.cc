// SPDX-License-Identifier: Apache-2.0
// Linux native AIO backend (libaio). One io_context per worker; iocbs come from a free list so
// an iocb is reused only after its completion was reaped and checked.
#include <cerrno>
#include <cstring>
#include <vector>

#include "io/backends.h"

#ifdef FASTPERSIST_HAVE_AIO
#include <libaio.h>
#endif

namespace fastpersist::io {

#ifdef FASTPERSIST_HAVE_AIO
namespace {

class AioBackend final : public IoBackend {
 public:
  explicit AioBackend(unsigned capacity)
      : capacity_(capacity), iocbs_(capacity), events_(capacity) {
    free_.reserve(capacity);
    for (unsigned i = capacity; i > 0; --i) free_.push_back(&iocbs_[i - 1]);
  }
  ~AioBackend() override {
    if (ctx_ != nullptr) io_destroy(ctx_);
  }

  Status init() {
    int rc = io_setup(static_cast<int>(capacity_), &ctx_);
    if (rc < 0) {
      ctx_ = nullptr;
      return Status::from_errno(-rc, "io_setup(" + std::to_string(capacity_) + ")");
    }
    return Status::ok();
  }

  std::string_view name() const override { return "libaio"; }
  unsigned capacity() const override { return capacity_; }

  Status submit(std::span<const IoOp> ops, size_t* accepted) override {
    *accepted = 0;
    std::vector<iocb*> batch;
    batch.reserve(ops.size());
    for (const IoOp& op : ops) {
      if (free_.empty()) {
        for (iocb* cb : batch) free_.push_back(cb);
        return Status(StatusCode::kInternal, "libaio queue full");
      }
      iocb* cb = free_.back();
      free_.pop_back();
      if (op.is_write) {
        io_prep_pwrite(cb, op.fd, op.buffer, op.length, static_cast<long long>(op.file_offset));
      } else {
        io_prep_pread(cb, op.fd, op.buffer, op.length, static_cast<long long>(op.file_offset));
      }
      cb->data = reinterpret_cast<void*>(static_cast<uintptr_t>(op.tag));
      batch.push_back(cb);
    }
    size_t& done = *accepted;
    while (done < batch.size()) {
      int rc = io_submit(ctx_, static_cast<long>(batch.size() - done), batch.data() + done);
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc <= 0) {
        for (size_t i = done; i < batch.size(); ++i) free_.push_back(batch[i]);
        if (rc == 0) return Status(StatusCode::kInternal, "io_submit accepted nothing");
        return Status::from_errno(-rc, "io_submit");
      }
      done += static_cast<size_t>(rc);
    }
    return Status::ok();
  }

  Result<size_t> reap(std::span<IoCompletion> out, size_t min_complete) override {
    auto max = static_cast<long>(std::min<size_t>(out.size(), events_.size()));
    timespec zero{0, 0};
    for (;;) {
      int rc = io_getevents(ctx_, static_cast<long>(min_complete), max, events_.data(),
                            min_complete == 0 ? &zero : nullptr);
      if (rc == -EINTR) continue;
      if (rc < 0) return Status::from_errno(-rc, "io_getevents");
      for (int i = 0; i < rc; ++i) {
        const io_event& ev = events_[static_cast<size_t>(i)];
        out[static_cast<size_t>(i)].tag =
            static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ev.obj->data));
        // res is unsigned long: a negative errno shows up as a huge value.
        out[static_cast<size_t>(i)].result = static_cast<int64_t>(static_cast<long>(ev.res));
        free_.push_back(ev.obj);
      }
      return static_cast<size_t>(rc);
    }
  }

 private:
  unsigned capacity_;
  io_context_t ctx_ = nullptr;
  std::vector<iocb> iocbs_;
  std::vector<iocb*> free_;
  std::vector<io_event> events_;
};

}  // namespace

Result<std::unique_ptr<IoBackend>> make_aio_backend(unsigned queue_depth) {
  auto backend = std::make_unique<AioBackend>(queue_depth);
  FP_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<IoBackend>(std::move(backend));
}

BackendProbe probe_aio() {
  BackendProbe p{Backend::kLibaio, true, false, "", ""};
  io_context_t ctx = nullptr;
  int rc = io_setup(1, &ctx);
  if (rc < 0) {
    int err = -rc;
    if (err == ENOSYS) {
      p.reason = "the kernel has no native AIO (ENOSYS; CONFIG_AIO off)";
      p.fix = "use a kernel built with CONFIG_AIO=y";
    } else if (err == EAGAIN) {
      p.reason = "the system-wide AIO context limit is exhausted (EAGAIN)";
      p.fix = "raise fs.aio-max-nr (sysctl -w fs.aio-max-nr=1048576)";
    } else if (err == EPERM) {
      p.reason = "io_setup is refused by a seccomp filter or container policy (EPERM)";
      p.fix = "allow io_setup/io_submit/io_getevents in the seccomp profile";
    } else {
      p.reason = std::string("io_setup failed: ") + std::strerror(err);
    }
    return p;
  }
  io_destroy(ctx);
  p.available = true;
  p.reason = "io_setup succeeded";
  return p;
}

#else  // !FASTPERSIST_HAVE_AIO

Result<std::unique_ptr<IoBackend>> make_aio_backend(unsigned) {
  return Status(StatusCode::kUnavailable, "fastpersist was built without libaio support");
}

BackendProbe probe_aio() {
  return {Backend::kLibaio, false, false, "not built in: libaio was not found at build time",
          "apt-get install libaio-dev (or dnf install libaio-devel) and rebuild"};
}

#endif

}  // namespace fastpersist::io
