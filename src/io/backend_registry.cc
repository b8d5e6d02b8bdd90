// SPDX-License-Identifier: Apache-2.0
// Probing, AUTO selection and construction of the built-in backends.
#include <mutex>

#include "fastpersist/io_backend.h"
#include "io/backends.h"

namespace fastpersist {

BackendProbe probe_backend(Backend backend) {
  switch (backend) {
    case Backend::kIoUring:
      return probe_all_backends()[0];
    case Backend::kLibaio:
      return probe_all_backends()[1];
    case Backend::kThreads:
      return probe_all_backends()[2];
    case Backend::kAuto:
      break;
  }
  std::string why;
  Result<Backend> chosen = resolve_backend(Backend::kAuto, &why);
  BackendProbe p = probe_backend(chosen.is_ok() ? *chosen : Backend::kThreads);
  p.backend = Backend::kAuto;
  p.reason = why;
  return p;
}

std::array<BackendProbe, 3> probe_all_backends() {
  // Probing creates kernel objects; the answer cannot change while the process runs.
  static std::once_flag once;
  static std::array<BackendProbe, 3> probes;
  std::call_once(once, [] {
    probes = {io::probe_uring(), io::probe_aio(), io::probe_thread_pool()};
  });
  return probes;
}

Result<Backend> resolve_backend(Backend requested, std::string* why) {
  if (requested != Backend::kAuto) {
    BackendProbe p = probe_backend(requested);
    if (!p.available) {
      std::string msg = std::string(backend_name(requested)) + " backend unavailable: " + p.reason;
      if (!p.fix.empty()) msg += " (fix: " + p.fix + ")";
      return Status(StatusCode::kUnavailable, msg);
    }
    if (why) *why = std::string(backend_name(requested)) + " requested explicitly";
    return requested;
  }
  std::string skipped;
  for (const BackendProbe& p : probe_all_backends()) {
    if (p.available) {
      if (why) {
        *why = "auto chose " + std::string(backend_name(p.backend)) +
               (skipped.empty() ? " (the preferred backend)" : " because " + skipped);
      }
      return p.backend;
    }
    if (!skipped.empty()) skipped += "; ";
    skipped += std::string(backend_name(p.backend)) + " is unavailable: " + p.reason;
  }
  return Status(StatusCode::kUnavailable, "no I/O backend available: " + skipped);
}

Result<BackendFactory> backend_factory(Backend backend) {
  FP_ASSIGN_OR_RETURN(Backend resolved, resolve_backend(backend));
  switch (resolved) {
    case Backend::kIoUring:
      return BackendFactory(io::make_uring_backend);
    case Backend::kLibaio:
      return BackendFactory(io::make_aio_backend);
    case Backend::kThreads:
      return BackendFactory(io::make_thread_pool_backend);
    case Backend::kAuto:
      break;
  }
  return Status(StatusCode::kInternal, "backend did not resolve");
}

}  // namespace fastpersist
