// tests/util/expect_error.hpp: the one check every test of bad input uses: a call throws
// pagedkv::Error whose message names the problem (contains `fragment`), optionally with a given
// code. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "pagedkv/base/error.hpp"

namespace pagedkv::testing {

// Expects fn() to throw pagedkv::Error with `code` and a message containing `fragment`.
template <typename Fn>
void expect_error(Fn&& fn, ErrorCode code, std::string_view fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected pagedkv::Error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string_view(e.what()).find(fragment), std::string_view::npos) << e.what();
  }
}

// Expects fn() to throw pagedkv::Error (any code) with a message containing `fragment`.
template <typename Fn>
void expect_error_containing(Fn&& fn, std::string_view fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected pagedkv::Error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string_view(e.what()).find(fragment), std::string_view::npos) << e.what();
  }
}

}  // namespace pagedkv::testing
