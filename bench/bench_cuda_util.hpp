// Helpers shared by the kernel benchmarks (bench_decode_attention, bench_extend_attention):
// random device data, a per-row comparison with a CPU reference, and the machine-readable lines
// that scripts/gpu-check collects. Host code over the CUDA runtime API; benchmarks only.
//
// Machine-readable output: every figure is also printed as one line
//   RESULT <bench> key=value key=value ...
// and each performance target as
//   TARGET <name> value=<ratio> target=<ratio> met=<yes|no> <details>
// and each correctness check run before timing as
//   CHECK <what> max_row_error=<e> tolerance=<t> <PASS|FAIL>
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "pagedkv/device/kv_dtype.hpp"

namespace bench {

inline void cuda_check(cudaError_t err, const char* what, const char* program) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program, what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// SplitMix64: cheap, seedable, portable.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-range, range).
  float uniform(float range) {
    return static_cast<float>((static_cast<double>(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * range);
  }

 private:
  std::uint64_t state_;
};

inline std::vector<std::uint16_t> random_values(pagedkv::KVDtype dtype, std::size_t n, Random& rng,
                                                float range = 1.0f) {
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = pagedkv::float_to_dtype_bits(dtype, rng.uniform(range));
  return v;
}

// Fills `bytes` (a multiple of 2) of device memory with random 16-bit values of `dtype` in
// [-range, range): a fresh host-made chunk of up to 64 MiB, copied over the rest by doubling
// device-to-device copies (so multi-GiB pools fill in milliseconds; the chunk is larger than
// the L2 cache, and each launch reads other addresses anyway). Synchronous.
inline void fill_random(void* device, std::size_t bytes, pagedkv::KVDtype dtype, std::uint64_t seed,
                        const char* program, float range = 1.0f) {
  constexpr std::size_t kChunk = std::size_t{64} << 20;
  Random rng(seed);
  const std::size_t first = std::min(bytes, kChunk);
  const std::vector<std::uint16_t> chunk = random_values(dtype, first / 2, rng, range);
  auto* base = static_cast<unsigned char*>(device);
  cuda_check(cudaMemcpy(base, chunk.data(), first, cudaMemcpyHostToDevice), "fill_random", program);
  for (std::size_t done = first; done < bytes;) {
    const std::size_t n = std::min(done, bytes - done);
    cuda_check(cudaMemcpy(base + done, base, n, cudaMemcpyDeviceToDevice), "fill_random", program);
    done += n;
  }
  cuda_check(cudaDeviceSynchronize(), "fill_random", program);
}

// Worst per-row relative error ||out_row - ref_row|| / ||ref_row|| over rows of `row_len`
// values (infinity when an output value is not finite); the GPU tests' check.
inline double max_row_error(const std::vector<double>& out, const std::vector<double>& ref,
                            std::size_t row_len) {
  double worst = 0.0;
  for (std::size_t r = 0; r + row_len <= ref.size(); r += row_len) {
    double diff = 0.0;
    double norm = 0.0;
    for (std::size_t i = r; i < r + row_len; ++i) {
      if (!std::isfinite(out[i])) return INFINITY;
      diff += (out[i] - ref[i]) * (out[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    worst = std::max(worst, norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff));
  }
  return worst;
}

inline std::vector<double> to_doubles(pagedkv::KVDtype dtype,
                                      const std::vector<std::uint16_t>& bits) {
  std::vector<double> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    out[i] = pagedkv::dtype_bits_to_float(dtype, bits[i]);
  }
  return out;
}

// The blocks ids[0], ..., ids[n - 1] of a device plane of 16-bit values (blocks of block_elems
// values), copied to the host in that order: the packed plane an identity block table reads.
inline std::vector<std::uint16_t> download_blocks(const void* plane, std::size_t block_elems,
                                                  const std::int32_t* ids, std::size_t n,
                                                  const char* program) {
  std::vector<std::uint16_t> host(n * block_elems);
  const auto* values = static_cast<const std::uint16_t*>(plane);
  for (std::size_t b = 0; b < n; ++b) {
    cuda_check(cudaMemcpy(host.data() + b * block_elems,
                          values + static_cast<std::size_t>(ids[b]) * block_elems,
                          block_elems * sizeof(std::uint16_t), cudaMemcpyDeviceToHost),
               "download_blocks", program);
  }
  return host;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace bench
