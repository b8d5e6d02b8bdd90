// SPDX-License-Identifier: Apache-2.0
#include "testing/watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <thread>

namespace fastpersist::testing {

void run_with_watchdog(std::chrono::milliseconds limit, const std::string& what,
                       const std::function<void()>& body) {
  std::packaged_task<void()> task(body);
  std::future<void> done = task.get_future();
  std::thread runner(std::move(task));
  if (done.wait_for(limit) == std::future_status::timeout) {
    std::fprintf(stderr, "watchdog: '%s' did not finish within %lld ms: the engine hung\n",
                 what.c_str(), static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(124);
  }
  runner.join();
  done.get();  // rethrows what the body threw
}

}  // namespace fastpersist::testing
