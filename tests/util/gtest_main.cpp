// main() for every gtest program registered by pagedkv_add_test (tests/CMakeLists.txt): runs the
// tests, then returns 1 when any failed, kSkipExitCode when none failed but any was skipped
// (GTEST_SKIP), else 0. ctest maps kSkipExitCode to "Not Run (Skipped)" through the test's
// SKIP_RETURN_CODE, so a program whose checks did not all run is never reported as passed.
// Linked as a static library: a program that defines its own main() keeps it.
#include <gtest/gtest.h>

#include <cstdio>

namespace {
constexpr int kSkipExitCode = 77;  // keep in sync with SKIP_RETURN_CODE in tests/CMakeLists.txt
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (RUN_ALL_TESTS() != 0) return 1;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (unit.skipped_test_count() > 0) {
    std::fprintf(stderr,
                 "pagedkv: %d of %d tests SKIPPED (see the [  SKIPPED ] lines above): reported "
                 "to ctest as skipped, not passed\n",
                 unit.skipped_test_count(), unit.test_to_run_count());
    return kSkipExitCode;
  }
  return 0;
}
