// quickstart: why prefix caching works, and why it is fragile.
//
// Two chat requests share a long system prompt and differ only in the user's question. Their
// chained block hashes agree for every full block of the shared prefix and differ from the first
// block that contains a different token onward: that block and everything after it must be
// recomputed, and everything before it can be reused.
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/hash/request_hasher.hpp"

namespace {

// A stand-in tokenizer: one token per word (FNV-1a of the word, in a 32k vocabulary).
std::vector<pagedkv::TokenId> tokenize(const std::string& text) {
  std::vector<pagedkv::TokenId> tokens;
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    std::uint32_t h = 2166136261u;
    for (const char c : word) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
    tokens.push_back(static_cast<pagedkv::TokenId>(h % 32000));
  }
  return tokens;
}

}  // namespace

int main() {
  const std::string system_prompt =
      "You are a careful coding assistant. You answer in short paragraphs, you show code only "
      "when it helps, and you explain every change you propose. You never invent APIs: when you "
      "are unsure whether a function exists you say so and suggest how to check. You prefer the "
      "standard library, you keep functions small, and you name things after what they mean in "
      "the problem domain. When a question is ambiguous you state your assumption first. ";
  const auto a =
      tokenize(system_prompt + "How do I reverse a linked list in C++ without recursion?");
  const auto b =
      tokenize(system_prompt + "Why does my CMake build fail to find OpenSSL on Debian?");

  constexpr std::uint32_t kBlockSize = 16;
  // A fixed seed makes the hashes reproducible across runs and processes.
  const pagedkv::BlockHasher hasher(pagedkv::HashScheme::kSha256, "quickstart");
  pagedkv::RequestBlockHasher request_a(hasher, kBlockSize);
  pagedkv::RequestBlockHasher request_b(hasher, kBlockSize);
  request_a.append(a);
  request_b.append(b);

  std::printf("prompt A: %zu tokens, %zu full blocks of %u\n", a.size(),
              request_a.block_hashes().size(), kBlockSize);
  std::printf("prompt B: %zu tokens, %zu full blocks of %u\n\n", b.size(),
              request_b.block_hashes().size(), kBlockSize);
  std::printf("block  tokens     hash of A         hash of B\n");

  const auto ha = request_a.block_hashes();
  const auto hb = request_b.block_hashes();
  std::size_t shared = 0;
  bool diverged = false;
  for (std::size_t i = 0; i < ha.size() || i < hb.size(); ++i) {
    const std::string sa = i < ha.size() ? ha[i].to_hex().substr(0, 16) : "(partial)";
    const std::string sb = i < hb.size() ? hb[i].to_hex().substr(0, 16) : "(partial)";
    const bool same = i < ha.size() && i < hb.size() && ha[i] == hb[i];
    if (same && !diverged) ++shared;
    if (!same) diverged = true;
    std::printf("%5zu  %4zu-%-4zu  %-16s  %-16s  %s\n", i, i * kBlockSize, (i + 1) * kBlockSize - 1,
                sa.c_str(), sb.c_str(), same ? "shared" : "differs");
  }
  std::printf(
      "\nB can reuse %zu blocks (%zu tokens) of A's KV cache; block %zu is the first to "
      "differ,\nand the chain makes every later block differ too.\n",
      shared, shared * kBlockSize, shared);

  // ---- Part 2: the same two prompts through a KVCacheManager with a tiny pool ----
  std::printf(
      "\n== serving A, then B, then an unrelated prompt, then B again (pool of 12 blocks) ==\n");
  pagedkv::KVCacheManagerConfig config;
  config.num_blocks = 12;  // 11 usable blocks of 16 tokens, plus the null block
  config.block_size = kBlockSize;
  config.hash_seed = "quickstart";
  config.enable_kv_events = true;
  pagedkv::KVCacheManager manager(config);
  pagedkv::RequestId next_id = 1;

  auto serve = [&](const char* name, const std::vector<pagedkv::TokenId>& prompt) {
    pagedkv::Request request = manager.make_request(next_id++, prompt);
    const pagedkv::CacheHit hit = manager.get_computed_blocks(request);
    const auto blocks = manager.allocate_slots(request, request.num_tokens() - hit.num_tokens, hit);
    if (!blocks) {
      std::printf("%-9s does not fit\n", name);
      return;
    }
    request.set_num_computed_tokens(request.num_tokens());  // the model ran the new tokens
    std::printf(
        "%-9s %3zu tokens: %zu cached blocks hit (%3zu tokens not recomputed), %zu new "
        "blocks, usage %.0f%%\n",
        name, request.num_tokens(), hit.blocks.size(), hit.num_tokens, blocks->size(),
        100.0 * manager.usage());
    manager.free(request);  // its blocks stay cached until their memory is reused
  };
  serve("A", a);
  serve("B", b);
  std::vector<pagedkv::TokenId> unrelated(130);
  for (std::size_t i = 0; i < unrelated.size(); ++i) {
    unrelated[i] = static_cast<pagedkv::TokenId>(20000 + i);
  }
  serve("unrelated", unrelated);
  serve("B again", b);

  const pagedkv::PrefixCacheStats stats = manager.stats();
  std::printf("\nprefix cache: %llu lookups, hit rate %.1f%%, %llu cached blocks evicted\n",
              static_cast<unsigned long long>(stats.requests), 100.0 * stats.hit_rate(),
              static_cast<unsigned long long>(stats.evictions));
  std::size_t stored = 0, removed = 0;
  for (const pagedkv::KVEvent& e : manager.take_events()) {
    stored += std::holds_alternative<pagedkv::BlockStored>(e.data) ? 1 : 0;
    removed += std::holds_alternative<pagedkv::BlockRemoved>(e.data) ? 1 : 0;
  }
  std::printf("KV events for routers: %zu BlockStored, %zu BlockRemoved\n", stored, removed);
  std::printf(
      "The unrelated prompt needed the memory, so LRU evicted the tails of A's and B's\n"
      "chains first; B's second visit still hits the shared system-prompt blocks.\n");
  return 0;
}
