#include "pagedkv/remote/remote_store.hpp"

namespace pagedkv {

std::string_view to_string(RemoteOpKind kind) noexcept {
  switch (kind) {
    case RemoteOpKind::kExists:
      return "exists";
    case RemoteOpKind::kGet:
      return "get";
    case RemoteOpKind::kPut:
      return "put";
  }
  return "unknown";
}

std::string_view to_string(RemoteResult result) noexcept {
  switch (result) {
    case RemoteResult::kHit:
      return "hit";
    case RemoteResult::kMiss:
      return "miss";
    case RemoteResult::kInvalidValue:
      return "invalid_value";
    case RemoteResult::kStored:
      return "stored";
    case RemoteResult::kSkippedFull:
      return "skipped_full";
    case RemoteResult::kTimeout:
      return "timeout";
    case RemoteResult::kError:
      return "error";
  }
  return "unknown";
}

}  // namespace pagedkv
