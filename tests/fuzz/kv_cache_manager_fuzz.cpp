// Fuzz harness: bytes -> a stream of KVCacheManager operations, valid and invalid.
//
// Properties checked after every operation: the library never crashes (sanitizers catch memory
// errors), check_invariants() holds, and an operation that throws pagedkv::Error leaves the
// manager's snapshot exactly as it was.
//
// Built two ways: with clang's -fsanitize=fuzzer (PAGEDKV_LIBFUZZER defined) as a libFuzzer
// target, and as a plain program (any compiler) that replays files and directories given on the
// command line, or `--random N` seeded random inputs; ctest runs the latter on tests/fuzz/corpus.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

namespace {

using namespace pagedkv;

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "kv_cache_manager_fuzz: %s %s\n", what, detail.c_str());
  std::abort();
}

// Runs `op`; on pagedkv::Error the state must be unchanged. Invariants must hold either way.
template <typename Op>
void step(KVCacheManager& m, Op op) {
  const KVCacheManagerSnapshot before = m.snapshot();
  try {
    op();
  } catch (const Error& e) {
    if (!(m.snapshot() == before)) fail("state changed by a rejected call:", e.what());
  }
  try {
    m.check_invariants();
  } catch (const Error& e) {
    fail("invariant broken:", e.what());
  }
}

void run_one(const std::uint8_t* data, std::size_t size) {
  Reader in(data, size);
  KVCacheManagerConfig cfg;
  cfg.num_blocks = 2 + in.u8() % 40;
  cfg.block_size = 1 + in.u8() % 8;
  const std::uint8_t flags = in.u8();
  cfg.enable_caching = (flags & 1) == 0;
  cfg.verify_cache_hits = (flags & 2) == 0;
  cfg.enable_kv_events = (flags & 4) != 0;
  cfg.hash_seed = "fuzz";
  if (flags & 8) {
    cfg.hasher = BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "fuzz", 1 + (flags >> 5));
  }
  if (flags & 16) cfg.max_model_len = in.u8();
  const std::uint8_t layout = in.u8();  // single group, full + sliding window, or window only
  if (layout % 3 == 1) {
    cfg.groups = {
        AttentionSpec::full(cfg.block_size),
        AttentionSpec::sliding(cfg.block_size * (1 + layout / 3 % 2), 1 + layout / 8 % 24)};
  } else if (layout % 3 == 2) {
    cfg.groups = {AttentionSpec::sliding(cfg.block_size, 1 + layout / 8 % 24)};
  }
  KVCacheManager m(cfg);
  std::vector<Request> reqs;
  std::optional<CacheHit> last_hit;
  RequestId next_id = 1;

  auto pick = [&]() -> Request* { return reqs.empty() ? nullptr : &reqs[in.u8() % reqs.size()]; };
  for (int ops = 0; !in.done() && ops < 4096; ++ops) {
    switch (in.u8() % 11) {
      case 0: {  // a new request; a negative token id is invalid
        std::vector<TokenId> tokens(in.u8() % 48);
        for (auto& t : tokens) t = static_cast<TokenId>(in.u8() % 5) - (in.u8() == 255 ? 9 : 0);
        RequestHashKeys keys;
        const std::uint8_t s = in.u8() % 4;
        if (s == 1) keys.cache_salt = "a";
        if (s == 2) keys.cache_salt = "b";
        if (s == 3) keys.cache_salt = "";  // invalid
        step(m, [&] {
          Request r = m.make_request(next_id++, tokens, keys);
          if (reqs.size() >= 12) reqs.erase(reqs.begin());
          reqs.push_back(std::move(r));
        });
        break;
      }
      case 1:
        if (Request* r = pick()) step(m, [&] { last_hit = m.get_computed_blocks(*r); });
        break;
      case 2:
      case 3: {  // allocate, with the last hit (possibly stale or foreign) or none
        Request* r = pick();
        if (!r) break;
        const std::size_t n = in.u8() % 24;
        const std::size_t lookahead = in.u8() % 4;
        CacheHit hit;
        const std::uint8_t mode = in.u8() % 4;
        if (mode == 1 && last_hit) hit = *last_hit;
        if (mode == 2 && last_hit && !last_hit->blocks.empty()) {
          hit = *last_hit;
          hit.blocks[in.u8() % hit.blocks.size()] = static_cast<BlockId>(in.u8() % 48) - 2;
        }
        step(m, [&] {
          const std::size_t before = r->num_computed_tokens() + hit.num_tokens;
          if (m.allocate_slots(*r, n, hit, lookahead)) r->set_num_computed_tokens(before + n);
        });
        break;
      }
      case 4:
        if (Request* r = pick()) step(m, [&] { m.free(*r); });
        break;
      case 5:
        if (Request* r = pick()) step(m, [&] { m.preempt(*r); });
        break;
      case 6:
        if (Request* r = pick()) {
          const TokenId t = static_cast<TokenId>(in.u8() % 6) - 1;  // -1 is invalid
          step(m, [&] { r->append_token(t); });
        }
        break;
      case 7:
        if (Request* r = pick()) {
          const std::size_t n = in.u8() % 64;
          step(m, [&] { r->set_num_computed_tokens(n); });
        }
        break;
      case 8:
        step(m, [&] { (void)m.reset_prefix_cache(); });
        break;
      case 9: {
        std::vector<BlockId> ids(in.u8() % 4);
        for (auto& id : ids) id = static_cast<BlockId>(in.u8() % 48) - 2;
        step(m, [&] { (void)m.evict_blocks(ids); });
        break;
      }
      case 10: {
        const RequestId id = in.u8() % 16;
        step(m, [&] {
          (void)m.block_ids(id);
          (void)m.num_common_prefix_blocks(id);
        });
        (void)m.take_events();
        break;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  run_one(data, size);
  return 0;
}

#ifndef PAGEDKV_LIBFUZZER
int main(int argc, char** argv) {
  std::size_t inputs = 0;
  auto replay = [&](const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
    run_one(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    ++inputs;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--random" && i + 1 < argc) {
      const long n = std::strtol(argv[++i], nullptr, 10);
      std::mt19937 rng(12345);
      for (long k = 0; k < n; ++k) {
        std::vector<std::uint8_t> bytes(64 + rng() % 2048);
        for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
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
      std::fprintf(stderr, "usage: %s [--random N] [FILE|DIR]...\n", argv[0]);
      return 2;
    }
  }
  std::printf("kv_cache_manager_fuzz: %zu inputs ran clean\n", inputs);
  return 0;
}
#endif
