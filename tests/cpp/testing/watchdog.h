// SPDX-License-Identifier: Apache-2.0
// Turns a hang into a test failure: runs `body` on its own thread and, if it has not returned
// within `limit`, reports which step hung and ends the process (a hung engine thread cannot be
// cancelled, and waiting for it would hang the test run).
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace fastpersist::testing {

void run_with_watchdog(std::chrono::milliseconds limit, const std::string& what,
                       const std::function<void()>& body);

}  // namespace fastpersist::testing
