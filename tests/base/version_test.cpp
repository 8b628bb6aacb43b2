#include "pagedkv/base/version.hpp"

#include <gtest/gtest.h>

#include <string>

#include "pagedkv/base/error.hpp"

TEST(Version, RuntimeMatchesHeaders) {
  EXPECT_EQ(pagedkv::version(), PAGEDKV_VERSION_STRING);
  const std::string expected = std::to_string(PAGEDKV_VERSION_MAJOR) + "." +
                               std::to_string(PAGEDKV_VERSION_MINOR) + "." +
                               std::to_string(PAGEDKV_VERSION_PATCH);
  EXPECT_EQ(pagedkv::version(), expected);
  EXPECT_EQ(PAGEDKV_VERSION, PAGEDKV_VERSION_MAJOR * 10000 + PAGEDKV_VERSION_MINOR * 100 +
                                 PAGEDKV_VERSION_PATCH);
}

TEST(Error, CarriesCodeAndMessage) {
  const pagedkv::Error e(pagedkv::ErrorCode::kNotFound, "request 7 is unknown");
  EXPECT_EQ(e.code(), pagedkv::ErrorCode::kNotFound);
  EXPECT_STREQ(e.what(), "request 7 is unknown");
  EXPECT_EQ(pagedkv::to_string(pagedkv::ErrorCode::kInvalidState), "invalid state");
  EXPECT_EQ(pagedkv::to_string(pagedkv::ErrorCode::kDeviceError), "device error");
}
