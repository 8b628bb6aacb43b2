#include "pagedkv/manager/attention_spec.hpp"

namespace pagedkv {

std::string AttentionSpec::describe() const {
  std::string s = kind == AttentionKind::kFull ? "full attention" : "sliding window";
  if (kind == AttentionKind::kSlidingWindow)
    s += " of " + std::to_string(sliding_window) + " tokens";
  return s + ", block size " + std::to_string(block_size);
}

}  // namespace pagedkv
