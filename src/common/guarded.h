// SPDX-License-Identifier: Apache-2.0
// The body of a thread of fastpersist's own (a manager's save worker, a tier drainer), where an
// exception has nowhere to go but std::terminate: run_guarded turns std::bad_alloc (memory ran
// out) and any other std::exception into the Status the thread reports instead, so the process
// goes on and the caller hears of the failure through the usual channel.
#pragma once

#include <cerrno>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "fastpersist/status.h"

namespace fastpersist {

// `body` returns a Status; `what` names the work in the message ("a save", "a drain pass").
template <class Body>
Status run_guarded(const char* what, Body&& body) noexcept {
  try {
    return std::forward<Body>(body)();
  } catch (const std::bad_alloc&) {
    return Status::from_errno(ENOMEM, std::string(what) + " ran out of memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string(what) + " failed: " + e.what());
  }
}

}  // namespace fastpersist
