// extend_dump_inspect FILE...: for each dump a GPU extend-attention test wrote when its per-row
// check failed (PAGEDKV_TEST_DUMP_DIR; scripts/gpu-check run brings them back as dumps.tgz),
// regenerates the case, computes its reference on the CPU and prints the case, the fingerprint of
// what the GPU got wrong (tests/util/attention_fingerprint.hpp) and the log-sum-exp check.
// Exit status: 0 when every dump was read (whether or not its output passes), 2 when one could
// not be (the message names the file and the problem), 1 on usage errors.
#include <cstdio>
#include <exception>
#include <iostream>

#include "attention_dump.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DUMP...\n", argv[0]);
    return 1;
  }
  int status = 0;
  for (int i = 1; i < argc; ++i) {
    try {
      const auto dump = pagedkv::testing::read_extend_dump(argv[i]);
      std::cout << "== " << argv[i] << "\n";
      const bool pass = pagedkv::testing::inspect_extend_dump(dump, std::cout);
      std::cout << (pass ? "verdict: the dumped output passes the check\n"
                         : "verdict: the dumped output fails the check\n");
    } catch (const std::exception& e) {
      std::cerr << argv[i] << ": " << e.what() << "\n";
      status = 2;
    }
  }
  return status;
}
