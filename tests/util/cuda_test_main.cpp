// main() of the GPU test programs (instead of gtest_main): exits 1 when a test failed, 77 when
// none failed but some were skipped (no device), 0 when all ran and passed. ctest's
// SKIP_RETURN_CODE 77 then shows a program whose device tests skipped as "skipped", while a
// failure is never hidden behind a skip.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  if (::testing::UnitTest::GetInstance()->skipped_test_count() > 0) return 77;
  return 0;
}
