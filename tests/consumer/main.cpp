// Links against pagedkv through the umbrella header, checks a known vLLM block hash and runs one
// manager step, so a broken export fails loudly.
#include <pagedkv/pagedkv.hpp>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#if CONSUMER_HAS_CUDA
#include <pagedkv/cuda/device.hpp>
#include <pagedkv/cuda/head_dims.hpp>

#include <string>
#endif
#if CONSUMER_HAS_EVENTS
#include <pagedkv/events/publisher.hpp>
#endif
#if CONSUMER_HAS_REMOTE
#include <pagedkv/remote/redis_store.hpp>
#include <pagedkv/remote/remote_value.hpp>
#endif

int main() {
  std::vector<pagedkv::TokenId> tokens(16);
  std::iota(tokens.begin(), tokens.end(), 0);
  const pagedkv::BlockHasher hasher(pagedkv::HashScheme::kSha256CborVllm);
  const auto hash = pagedkv::hash_block_tokens(hasher, nullptr, tokens);
  std::printf("pagedkv %s block 0 %s\n", std::string(pagedkv::version()).c_str(),
              hash.to_hex().c_str());
#if CONSUMER_HAS_EVENTS
  // Links libzmq through the package: a publisher on an in-process endpoint sends one batch.
  pagedkv::events::KVEventPublisherConfig publisher_config;
  publisher_config.endpoint = "inproc://consumer";
  pagedkv::events::KVEventPublisher publisher(publisher_config);
  pagedkv::KVEvent event;
  event.data = pagedkv::BlockRemoved{{hash}, 0};
  if (publisher.publish({event}) != 0u || !publisher.flush(std::chrono::seconds(5))) return 1;
  std::printf("events: published 1 batch\n");
#endif
#if CONSUMER_HAS_CUDA
  std::printf("cuda devices: %d\n", pagedkv::cuda_device_count());
  {
    // The library's kernels cover exactly the head dimensions its build was given.
    const std::string configured = "," CONSUMER_CUDA_HEAD_DIMS ",";
    for (const int head_dim : {64, 128, 256}) {
      const bool listed =
          configured.find("," + std::to_string(head_dim) + ",") != std::string::npos;
      if (pagedkv::cuda_head_dim_compiled(head_dim) != listed) {
        std::printf("cuda head_dim %d: compiled %d, configured %s\n", head_dim,
                    static_cast<int>(!listed), CONSUMER_CUDA_HEAD_DIMS);
        return 1;
      }
    }
    std::printf("cuda head dims: %s\n", CONSUMER_CUDA_HEAD_DIMS);
  }
#endif
#if CONSUMER_HAS_REMOTE
  {
    // Links hiredis through the export; connects lazily, so no server is needed here.
    pagedkv::RedisStore store(pagedkv::RedisStoreConfig::from_url("redis://127.0.0.1:1/consumer"));
    const std::byte payload[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
    const pagedkv::RemoteValueBinding block{
        pagedkv::BlockHash::from_hex(std::string(64, 'a')), {}, 0};
    const auto header = pagedkv::encode_remote_value_header(7, block, payload);
    std::printf("remote store namespace %s, header %zu bytes\n",
                std::string(store.name_space()).c_str(), header.size());
  }
#endif
  pagedkv::KVCacheManagerConfig config;
  config.num_blocks = 8;
  config.block_size = 4;
  pagedkv::KVCacheManager kv(config);
  pagedkv::Request req = kv.make_request(1, tokens);
  if (!kv.allocate_slots(req, req.num_tokens(), kv.get_computed_blocks(req))) return 1;
  kv.free(req);
  return hash.to_hex() == "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749" ? 0
                                                                                             : 1;
}
