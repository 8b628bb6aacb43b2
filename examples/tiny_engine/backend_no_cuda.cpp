// The tiny engine built without CUDA (no nvcc found): --device cuda is a clear error.
#include "backend.hpp"

namespace tiny_engine {

std::unique_ptr<ForwardBackend> make_cuda_backend(const Model&, const EngineConfig&) {
  throw NoCudaDevice(
      "--device cuda: this build of pagedkv has no CUDA support (nvcc was not found when it was "
      "configured); rebuild with the CUDA Toolkit, or use --device cpu");
}

bool cuda_backend_built() noexcept {
  return false;
}

}  // namespace tiny_engine
