// tests/fuzz/fuzz_replay_main.hpp: main() of a fuzz harness built as a plain program (without
// libFuzzer): replays the files and directories given on the command line, or `--random N`
// seeded random inputs (`--seed S`, `--save DIR` to keep them), through the harness's run_one.
// PAGEDKV_FUZZ_ENTRY_POINTS defines a harness's entry points: libFuzzer's, and main() unless
// built as a libFuzzer target (PAGEDKV_LIBFUZZER).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace pagedkv::fuzz {

// Random inputs are 64 + [0, max_random_extra) bytes long.
template <typename RunOne>
int replay_main(int argc, char** argv, const char* name, RunOne run_one,
                std::size_t max_random_extra) {
  std::size_t inputs = 0;
  auto replay = [&](const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
    run_one(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    ++inputs;
  };
  unsigned long seed = 12345;
  std::string save_dir;  // --save DIR: write each random input there before running it
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoul(argv[++i], nullptr, 10);
    } else if (arg == "--save" && i + 1 < argc) {
      save_dir = argv[++i];
    } else if (arg == "--random" && i + 1 < argc) {
      const long n = std::strtol(argv[++i], nullptr, 10);
      std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
      for (long k = 0; k < n; ++k) {
        std::vector<std::uint8_t> bytes(64 + rng() % max_random_extra);
        for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
        if (!save_dir.empty()) {
          std::ofstream(save_dir + "/random-" + std::to_string(seed) + "-" + std::to_string(k),
                        std::ios::binary)
              .write(reinterpret_cast<const char*>(bytes.data()),
                     static_cast<std::streamsize>(bytes.size()));
        }
        run_one(bytes.data(), bytes.size());
        ++inputs;
      }
    } else if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) replay(entry.path());
      }
    } else if (std::filesystem::is_regular_file(arg)) {
      replay(arg);
    } else {
      std::fprintf(stderr, "usage: %s [--seed S] [--save DIR] [--random N] [FILE|DIR]...\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("%s: %zu inputs ran clean\n", name, inputs);
  return 0;
}

}  // namespace pagedkv::fuzz

// LLVMFuzzerTestOneInput calling run_one(data, size), and without PAGEDKV_LIBFUZZER a main()
// replaying files and random inputs (replay_main above) under `name`.
#ifdef PAGEDKV_LIBFUZZER
#define PAGEDKV_FUZZ_MAIN(name, run_one, max_random_extra)
#else
#define PAGEDKV_FUZZ_MAIN(name, run_one, max_random_extra)                          \
  int main(int argc, char** argv) {                                                 \
    return pagedkv::fuzz::replay_main(argc, argv, name, run_one, max_random_extra); \
  }
#endif
#define PAGEDKV_FUZZ_ENTRY_POINTS(name, run_one, max_random_extra)                    \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { \
    run_one(data, size);                                                              \
    return 0;                                                                         \
  }                                                                                   \
  PAGEDKV_FUZZ_MAIN(name, run_one, max_random_extra)
