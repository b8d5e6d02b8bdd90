// SPDX-License-Identifier: Apache-2.0
// GoogleTest assertions for Status and Result<T> that print the whole error (code, errno, path,
// range) when they fail, instead of "false is not true".
#pragma once

#include <gtest/gtest.h>

#include "fastpersist/status.h"

namespace fastpersist::testing {

inline const Status& status_of(const Status& s) { return s; }
template <typename T>
const Status& status_of(const Result<T>& r) {
  return r.status();
}

}  // namespace fastpersist::testing

#define FP_EXPECT_OK(expr)                                                          \
  do {                                                                              \
    const auto& fp_val_ = (expr);                                                   \
    EXPECT_TRUE(::fastpersist::testing::status_of(fp_val_).is_ok())                 \
        << #expr << ": " << ::fastpersist::testing::status_of(fp_val_).to_string(); \
  } while (0)

#define FP_ASSERT_OK(expr)                                                          \
  do {                                                                              \
    const auto& fp_val_ = (expr);                                                   \
    ASSERT_TRUE(::fastpersist::testing::status_of(fp_val_).is_ok())                 \
        << #expr << ": " << ::fastpersist::testing::status_of(fp_val_).to_string(); \
  } while (0)

// `FP_ASSERT_OK_AND_ASSIGN(auto n, engine->run(req));`
#define FP_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  FP_ASSERT_OK_AND_ASSIGN_IMPL_(FP_CONCAT_(fp_test_res_, __LINE__), lhs, expr)
#define FP_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)                    \
  auto tmp = (expr);                                                     \
  ASSERT_TRUE(tmp.is_ok()) << #expr << ": " << tmp.status().to_string(); \
  lhs = std::move(tmp).value()
