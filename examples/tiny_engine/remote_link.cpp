#include "remote_link.hpp"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "engine.hpp"
#include "kv_driver.hpp"
#include "model.hpp"

#include "pagedkv/base/error.hpp"
#include "pagedkv/remote/disk_store.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "pagedkv/tier/remote_tier.hpp"
#if TINY_ENGINE_HAS_REMOTE
#include "pagedkv/remote/redis_store.hpp"
#endif

namespace tiny_engine {

namespace {
constexpr std::string_view kFilePrefix = "file://";
}  // namespace

struct RemoteLink::Impl {
  Impl(std::unique_ptr<pagedkv::RemoteStore> s, KVDriver& driver, pagedkv::RemoteTierConfig rc)
      : store(std::move(s)), remote(*driver.tier(), *store, driver.host_buffer(), rc) {}
  std::unique_ptr<pagedkv::RemoteStore> store;
  pagedkv::RemoteTier remote;  // destroyed first: drains its ops, clears the tier's hooks
  const pagedkv::DiskStore* disk = nullptr;  // the store, when it is a DiskStore
};

std::string RemoteLink::check_url(const std::string& url) {
  if (url.starts_with(kFilePrefix)) {
    return url.size() > kFilePrefix.size() ? "" : "file:// needs a directory";
  }
#if TINY_ENGINE_HAS_REMOTE
  try {
    (void)pagedkv::RedisStoreConfig::from_url(url);
    return "";
  } catch (const pagedkv::Error& e) {
    return e.what();
  }
#else
  return "this build has no RedisStore (configure with libhiredis-dev installed); file://DIR "
         "(--disk DIR) works";
#endif
}

namespace {

// FP8 with per-tensor scales: the scales decide what a block's codes mean, so they are part of the
// fingerprint (empty otherwise, which keeps the other formats' fingerprints as they were).
std::string per_tensor_scales(const EngineConfig& config) {
  if (!pagedkv::is_fp8(config.kv_dtype) ||
      config.kv_scale_mode != pagedkv::KVScaleMode::kPerTensor) {
    return "";
  }
  std::string s = ",scales=per_tensor";
  for (std::size_t l = 0; l < config.k_scales.size(); ++l) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ",%a/%a", static_cast<double>(config.k_scales[l]),
                  static_cast<double>(config.v_scales[l]));
    s += buf;
  }
  return s;
}

}  // namespace

std::unique_ptr<RemoteLink> RemoteLink::open(const EngineConfig& config, const ModelConfig& model,
                                             KVDriver& driver) {
  if (driver.tier() == nullptr) throw std::invalid_argument("the remote tier needs a host tier");
  const std::string problem = check_url(config.remote_url);
  if (!problem.empty()) throw std::invalid_argument("--remote: " + problem);
  // Everything that makes the bytes of a block differ for the same tokens.
  const std::string layout =
      "pagedkv-tiny-engine/v1,layers=" + std::to_string(model.num_layers) +
      ",d_model=" + std::to_string(model.d_model) +
      ",q_heads=" + std::to_string(model.num_q_heads) +
      ",kv_heads=" + std::to_string(model.num_kv_heads) +
      ",head_dim=" + std::to_string(model.head_dim) + ",ffn=" + std::to_string(model.ffn_dim) +
      ",vocab=" + std::to_string(model.vocab_size) + ",rope=" + std::to_string(model.rope_theta) +
      ",eps=" + std::to_string(model.rms_eps) + ",seed=" + std::to_string(model.seed) +
      ",kv=" + std::string(pagedkv::to_string(config.kv_dtype)) + per_tensor_scales(config) +
      ",block_size=" + std::to_string(config.block_size) + ",nhd,layer-first K0 V0 K1 V1";
  const std::uint64_t fingerprint = pagedkv::layout_fingerprint(layout);
  std::unique_ptr<pagedkv::RemoteStore> store;
  const pagedkv::DiskStore* disk = nullptr;
  if (config.remote_url.starts_with(kFilePrefix)) {  // --disk DIR: a DiskStore
    pagedkv::DiskStoreConfig dc;
    dc.directory = config.remote_url.substr(kFilePrefix.size());
    dc.name_space = "pagedkv-tiny-engine";  // the fingerprint tells models apart
    dc.layout_fingerprint = fingerprint;
    dc.value_bytes = driver.host_block_bytes();
    dc.capacity_bytes = config.disk_bytes;
    dc.op_timeout = kOpTimeout;
    try {
      auto d = std::make_unique<pagedkv::DiskStore>(dc);
      disk = d.get();
      store = std::move(d);
    } catch (const pagedkv::Error& e) {
      throw std::invalid_argument(std::string("--disk: ") + e.what());
    }
  } else {
#if TINY_ENGINE_HAS_REMOTE
    pagedkv::RedisStoreConfig sc = pagedkv::RedisStoreConfig::from_url(config.remote_url);
    sc.layout_fingerprint = fingerprint;
    sc.op_timeout = kOpTimeout;
    sc.connect_timeout = kOpTimeout;
    store = std::make_unique<pagedkv::RedisStore>(sc);
#endif
  }
  pagedkv::RemoteTierConfig rc;
  rc.policy = pagedkv::PrefetchPolicy::kTimeout;
  rc.timeout = kTimeout;
  rc.bytes_per_block = driver.host_block_bytes();
  rc.drain_timeout = kDrainTimeout;
  // The values' KV format (remote value header): another engine's format is a counted miss even
  // where two engines share a fingerprint.
  rc.kv_dtype = static_cast<std::uint8_t>(config.kv_dtype);
  rc.kv_scale_mode = pagedkv::is_fp8(config.kv_dtype)
                         ? static_cast<std::uint8_t>(config.kv_scale_mode)
                         : pagedkv::kKVScaleNone;
  auto impl = std::make_unique<Impl>(std::move(store), driver, rc);
  impl->disk = disk;
  return std::unique_ptr<RemoteLink>(new RemoteLink(std::move(impl)));
}

void RemoteLink::add_request(const pagedkv::Request& request) {
  impl_->remote.add_request(request, Clock::now());
}

void RemoteLink::poll() {
  impl_->remote.poll(Clock::now());
}

bool RemoteLink::ready(pagedkv::RequestId id) const {
  return impl_->remote.ready(id, Clock::now());
}

void RemoteLink::remove_request(pagedkv::RequestId id) noexcept {
  impl_->remote.remove_request(id);
}

RemoteRunStats RemoteLink::finish() {
  pagedkv::RemoteTier& r = impl_->remote;
  const auto end = Clock::now() + kDrainTimeout;
  RemoteRunStats s;
  for (;;) {
    r.poll(Clock::now());
    if (r.in_flight() == 0 && r.pinned_for_puts() == 0) break;
    if (Clock::now() >= end) {
      s.drained = false;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const pagedkv::RemoteTierStats t = r.stats();
  const pagedkv::RemoteStoreStats st = impl_->store->stats();
  s.name_space = std::string(impl_->store->name_space());
  if (impl_->disk != nullptr) {
    const pagedkv::DiskStoreOpenStats& o = impl_->disk->open_stats();
    s.disk = true;
    s.disk_recovered = o.recovered;
    s.disk_invalid = o.invalid;
    s.disk_truncated = o.truncated;
  }
  s.requests = t.requests;
  s.probed_blocks = t.probed_blocks;
  s.probe_hit_blocks = t.probe_hit_blocks;
  s.loaded_blocks = t.loaded_blocks;
  s.remote_hit_tokens = t.remote_hit_tokens;
  s.loaded_bytes = t.loaded_bytes;
  s.load_misses = t.load_misses;
  s.fills_no_slot = t.fills_no_slot;
  s.ready_by_timeout = t.ready_by_timeout;
  s.puts = t.puts;
  s.stored_blocks = t.stored_blocks;
  s.stored_bytes = t.stored_bytes;
  s.puts_skipped = t.puts_skipped;
  s.puts_failed = t.puts_failed;
  s.store_errors = st.errors;
  s.store_timeouts = st.timeouts;
  s.rejected_values =
      st.checksum_failures + st.header_mismatches + st.binding_mismatches + st.format_mismatches;
  s.binding_mismatches = st.binding_mismatches;
  s.connect_failures = st.connect_failures;
  return s;
}

RemoteLink::RemoteLink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteLink::~RemoteLink() = default;

}  // namespace tiny_engine
