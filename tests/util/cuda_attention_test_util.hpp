// Device copies of the host attention problems of kv_test_util.hpp, shared by the GPU attention
// tests (cuda_decode_attention_test, cuda_extend_attention_test, cuda_broken_kernel_test).
// Output buffers start NaN-poisoned (DeviceBuffer), so a row the kernel never writes fails the
// per-row check.
#pragma once

#include <cstdint>

#include "cuda_test_util.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::testing {

// The decode problem's buffers on the device.
struct DeviceDecodeProblem {
  DeviceBuffer k;
  DeviceBuffer v;  // empty for kInterleaved (V lives in k)
  DeviceBuffer q;
  DeviceBuffer table;
  DeviceBuffer lens;
  DeviceBuffer out;

  explicit DeviceDecodeProblem(const HostDecodeProblem& pb)
      : k(upload(pb.k_buffer)),
        v(upload(pb.v_buffer)),
        q(upload(pb.q)),
        table(upload(pb.table.block_ids)),
        lens(upload(pb.shape.seq_lens)),
        out(pb.q.size() * sizeof(std::uint16_t)) {}

  PagedDecodeParams params(const HostDecodeProblem& pb) const {
    PagedDecodeParams p = pb.params(out.get());
    p.q = q.get();
    p.k_cache = k.get<std::uint16_t>();
    p.v_cache = (pb.shape.kind == LayoutKind::kInterleaved ? k.get<std::uint16_t>()
                                                           : v.get<std::uint16_t>()) +
                pb.v_plane_offset;
    p.block_table = table.get<std::int32_t>();
    p.seq_lens = lens.get<std::int32_t>();
    return p;
  }
};

// The extend problem's buffers on the device.
struct DeviceExtendProblem {
  DeviceBuffer k;
  DeviceBuffer v;  // empty for kInterleaved (V lives in k)
  DeviceBuffer q;
  DeviceBuffer q_indptr;
  DeviceBuffer table;
  DeviceBuffer lens;
  DeviceBuffer out;
  DeviceBuffer lse;

  explicit DeviceExtendProblem(const HostExtendProblem& pb)
      : k(upload(pb.cache.k_buffer)),
        v(upload(pb.cache.v_buffer)),
        q(upload(pb.q)),
        q_indptr(upload(pb.q_indptr)),
        table(upload(pb.cache.table.block_ids)),
        lens(upload(pb.shape.cache.seq_lens)),
        out(pb.q.size() * sizeof(std::uint16_t)),
        lse(static_cast<std::size_t>(pb.num_q_tokens()) *
            static_cast<std::size_t>(pb.shape.cache.num_q_heads) * sizeof(float)) {}

  void* v_plane(const HostExtendProblem& pb) const {
    return (pb.shape.cache.kind == LayoutKind::kInterleaved ? k.get<std::uint16_t>()
                                                            : v.get<std::uint16_t>()) +
           pb.cache.v_plane_offset;
  }

  PagedExtendParams params(const HostExtendProblem& pb, bool with_lse = true) const {
    PagedExtendParams p = pb.params(out.get(), with_lse ? lse.get<float>() : nullptr);
    p.q = q.get();
    p.q_indptr = q_indptr.get<std::int32_t>();
    p.k_cache = k.get();
    p.v_cache = v_plane(pb);
    p.block_table = table.get<std::int32_t>();
    p.seq_lens = lens.get<std::int32_t>();
    return p;
  }
};

}  // namespace pagedkv::testing
