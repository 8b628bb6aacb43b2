#include "pagedkv/manager/request.hpp"

#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

Request::Request(RequestId id, BlockHasher hasher, std::uint32_t block_size,
                 std::span<const TokenId> prompt, RequestHashKeys keys)
    : id_(id),
      seq_(std::move(hasher), block_size, std::move(keys)),
      num_prompt_tokens_(prompt.size()),
      identity_(std::make_shared<const char>('\0')) {
  seq_.append(prompt);
}

Request::Request(const Request& other)
    : skip_reading_prefix_cache(other.skip_reading_prefix_cache),
      id_(other.id_),
      seq_(other.seq_),
      num_prompt_tokens_(other.num_prompt_tokens_),
      num_computed_tokens_(other.num_computed_tokens_),
      retention_(other.retention_),
      identity_(std::make_shared<const char>('\0')),
      finished_(other.finished_) {}

Request& Request::operator=(const Request& other) {
  if (this != &other) {
    Request copy(other);  // strong guarantee: build first, then swap in
    *this = std::move(copy);
  }
  return *this;
}

void Request::set_retention(std::optional<RetentionConfig> config) {
  if (config) config->validate(num_prompt_tokens_);  // throws before any change
  retention_ = std::move(config);
}

void Request::set_num_computed_tokens(std::size_t n) {
  if (n > num_tokens()) {
    throw Error(ErrorCode::kOutOfRange, "request " + std::to_string(id_) + ": " +
                                            std::to_string(n) + " computed tokens but only " +
                                            std::to_string(num_tokens()) + " are known");
  }
  num_computed_tokens_ = n;
}

}  // namespace pagedkv
