// tests/util/stress_flags.hpp: main() of a randomized model test that CI also runs as a stress
// run: gtest's flags, then --pagedkv_<count>=N (how many operations or episodes) and
// --pagedkv_seconds=S (a time budget, 0: none). Any other argument is an error (exit 2).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace pagedkv::testing_util {

inline int run_with_stress_flags(int argc, char** argv, const std::string& count_flag,
                                 std::uint64_t& count, double& seconds) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string count_prefix = "--pagedkv_" + count_flag + "=";
  const std::string seconds_prefix = "--pagedkv_seconds=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(count_prefix, 0) == 0) {
      count = std::strtoull(arg.c_str() + count_prefix.size(), nullptr, 10);
    } else if (arg.rfind(seconds_prefix, 0) == 0) {
      seconds = std::strtod(arg.c_str() + seconds_prefix.size(), nullptr);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}

}  // namespace pagedkv::testing_util
