"""Runs one pytest file for ctest.

Exit codes: 0 all collected tests passed; 77 (ctest SKIP_RETURN_CODE) at least one test was
skipped and none failed, so a skip never reads as a pass; anything else is a failure, including
pytest's 5 ("no tests collected").
"""

import sys

import pytest


class _Count:
    def __init__(self):
        self.passed = 0
        self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1
        elif report.passed and report.when == "call":
            self.passed += 1


def main():
    count = _Count()
    rc = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[count])
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("run_pytest: no tests collected: failing", flush=True)
        return 5
    if rc != 0:
        return int(rc)
    if count.skipped:
        print(f"run_pytest: {count.skipped} skipped, {count.passed} passed: reporting skipped",
              flush=True)
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
