#include "pagedkv/manager/request.hpp"

#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

Request::Request(RequestId id, BlockHasher hasher, std::uint32_t block_size,
                 std::span<const TokenId> prompt, RequestHashKeys keys)
    : id_(id),
      seq_(std::move(hasher), block_size, std::move(keys)),
      num_prompt_tokens_(prompt.size()) {
  seq_.append(prompt);
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
