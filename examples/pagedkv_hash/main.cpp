// pagedkv-hash: "why did my prompt miss the cache?"
//
// Prints the chained hash of every full block of a token sequence, one lowercase hex digest per
// line and nothing else on stdout; with --diff, names the first block where two prompts diverge.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/base/version.hpp"

namespace {

constexpr std::string_view kUsage =
    "usage: pagedkv-hash --block-size B --tokens T1,T2,... [options]\n"
    "       pagedkv-hash --diff --block-size B --tokens A1,A2,... --tokens-b B1,B2,... [options]\n"
    "\n"
    "Prints one lowercase hex digest per full block (the partial tail is never hashed).\n"
    "\n"
    "options:\n"
    "  --scheme S          sha256 (default), sha256_cbor_vllm or xxh3_128\n"
    "  --seed STR          NONE_HASH seed (default for sha256_cbor_vllm: vllm-none-hash;\n"
    "                      sha256/xxh3_128 without a seed use a random one, so set it to compare\n"
    "                      across runs)\n"
    "  --block-size B      tokens per block, >= 1 (required)\n"
    "  --tokens LIST       comma-separated non-negative token ids (required)\n"
    "  --tokens-b LIST     the second prompt, with --diff\n"
    "  --salt S            cache_salt (block 0 extra key)\n"
    "  --lora NAME         LoRA adapter name (extra key of every block)\n"
    "  --mm ID:OFFSET:LENGTH  a multimodal item's placeholder tokens; repeatable, sorted\n"
    "  --diff              compare --tokens with --tokens-b\n"
    "  --version, --help\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "pagedkv-hash: " << message << "\n\n" << kUsage;
  std::exit(2);
}

std::int64_t parse_int(std::string_view text, std::string_view what, std::int64_t min,
                       std::int64_t max) {
  if (text.empty()) usage_error(std::string(what) + ": empty number");
  std::int64_t value = 0;
  bool negative = false;
  std::size_t i = 0;
  if (text[0] == '-') {
    negative = true;
    i = 1;
  }
  if (i == text.size()) usage_error(std::string(what) + ": '" + std::string(text) + "' is not a number");
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9' || value > (INT64_MAX - 9) / 10) {
      usage_error(std::string(what) + ": '" + std::string(text) + "' is not a number in range");
    }
    value = value * 10 + (c - '0');
  }
  if (negative) value = -value;
  if (value < min || value > max) {
    usage_error(std::string(what) + ": " + std::to_string(value) + " is outside [" +
                std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return value;
}

std::vector<pagedkv::TokenId> parse_tokens(std::string_view list, std::string_view flag) {
  std::vector<pagedkv::TokenId> tokens;
  std::size_t start = 0;
  std::size_t index = 0;
  while (start <= list.size()) {
    const std::size_t comma = list.find(',', start);
    const std::size_t end = comma == std::string_view::npos ? list.size() : comma;
    const std::string what = std::string(flag) + " element " + std::to_string(index);
    tokens.push_back(
        static_cast<pagedkv::TokenId>(parse_int(list.substr(start, end - start), what, 0, INT32_MAX)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
    ++index;
  }
  return tokens;
}

pagedkv::MultiModalItem parse_mm(std::string_view spec) {
  const std::size_t last = spec.rfind(':');
  const std::size_t mid = last == std::string_view::npos ? last : spec.rfind(':', last - 1);
  if (last == std::string_view::npos || mid == std::string_view::npos || mid == 0) {
    usage_error("--mm '" + std::string(spec) + "': expected ID:OFFSET:LENGTH");
  }
  pagedkv::MultiModalItem item;
  item.identifier = std::string(spec.substr(0, mid));
  item.offset = parse_int(spec.substr(mid + 1, last - mid - 1), "--mm offset", 0, INT64_MAX / 2);
  item.length = parse_int(spec.substr(last + 1), "--mm length", 1, INT64_MAX / 2);
  return item;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::string> scheme_name, seed, tokens_a, tokens_b;
  std::optional<std::int64_t> block_size;
  pagedkv::RequestHashKeys keys;
  bool diff = false;

  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(std::string(arg) + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--version") {
      std::cout << "pagedkv-hash " << pagedkv::version() << "\n";
      return 0;
    } else if (arg == "--scheme") {
      scheme_name = value();
    } else if (arg == "--seed") {
      seed = value();
    } else if (arg == "--block-size") {
      block_size = parse_int(value(), "--block-size", 1, UINT32_MAX);
    } else if (arg == "--tokens") {
      tokens_a = value();
    } else if (arg == "--tokens-b") {
      tokens_b = value();
    } else if (arg == "--salt") {
      keys.cache_salt = value();
    } else if (arg == "--lora") {
      keys.lora_name = value();
    } else if (arg == "--mm") {
      keys.mm_items.push_back(parse_mm(value()));
    } else if (arg == "--diff") {
      diff = true;
    } else {
      usage_error("unknown argument '" + std::string(arg) + "'");
    }
  }
  if (!block_size) usage_error("--block-size is required");
  if (!tokens_a) usage_error("--tokens is required");
  if (diff != tokens_b.has_value()) usage_error("--diff and --tokens-b go together");

  try {
    const auto scheme =
        scheme_name ? pagedkv::parse_hash_scheme(*scheme_name) : pagedkv::HashScheme::kSha256;
    if (!seed && scheme != pagedkv::HashScheme::kSha256CborVllm) {
      std::cerr << "pagedkv-hash: note: no --seed, so " << pagedkv::to_string(scheme)
                << " uses a random seed and these hashes differ from run to run\n";
    }
    const pagedkv::BlockHasher hasher(scheme, seed);
    const auto bs = static_cast<std::uint32_t>(*block_size);
    const auto a = pagedkv::hash_request_blocks(hasher, bs, parse_tokens(*tokens_a, "--tokens"), keys);
    if (!diff) {
      for (const auto& h : a) std::cout << h.to_hex() << "\n";
      return 0;
    }
    const auto b =
        pagedkv::hash_request_blocks(hasher, bs, parse_tokens(*tokens_b, "--tokens-b"), keys);
    std::size_t shared = 0;
    while (shared < a.size() && shared < b.size() && a[shared] == b[shared]) ++shared;
    std::cout << "full blocks: a " << a.size() << ", b " << b.size() << "\n";
    std::cout << "shared blocks: " << shared << " (" << shared * bs << " tokens reusable)\n";
    if (shared < a.size() && shared < b.size()) {
      std::cout << "first divergent block: " << shared << " (tokens " << shared * bs << ".."
                << (shared + 1) * bs - 1 << ")\n";
      std::cout << "  a " << a[shared].to_hex() << "\n  b " << b[shared].to_hex() << "\n";
    } else {
      std::cout << "no divergent block: the shorter prompt's full blocks are a prefix of the "
                   "longer one's\n";
    }
    return 0;
  } catch (const pagedkv::Error& e) {
    std::cerr << "pagedkv-hash: " << e.what() << "\n";
    return 2;
  }
}
