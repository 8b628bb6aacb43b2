# cmake -DMESSAGE=... -P fail.cmake: a ctest test that fails with MESSAGE (a check that cannot
# run in this build must fail, never disappear).
message(FATAL_ERROR "${MESSAGE}")
