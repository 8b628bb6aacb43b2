// Test driver for tests/events/decode_stream.py: a real KVCacheManager (sha256_cbor_vllm, block
// size 4, 3 usable blocks) publishing through KVEventPublisher on loopback. Prints its endpoints,
// waits for "go" on stdin, runs a fixed scenario (3 batches), then waits for "quit".
//
//   batch 0: R1 = tokens 0..9, cache salt "s1", LoRA "ad"  -> BlockStored (2 blocks)
//   batch 1: R2 = tokens 100..111 evicts R1's blocks       -> BlockRemoved x2, BlockStored (3)
//   batch 2: reset_prefix_cache()                          -> AllBlocksCleared
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>

#include "pagedkv/events/publisher.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

int main(int argc, char** argv) {
  using namespace pagedkv;
  events::KVEventPublisherConfig config;
  config.endpoint = "tcp://127.0.0.1:*";
  config.replay_endpoint = "tcp://127.0.0.1:*";
  config.topic = "kv@test";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--map") config.wire.encoding = events::EventEncoding::kMap;
    if (a == "--bytes") config.wire.hash_format = events::HashFormat::kBytes;
  }
  KVCacheManagerConfig mc;
  mc.num_blocks = 4;
  mc.block_size = 4;
  mc.hash_scheme = HashScheme::kSha256CborVllm;
  mc.enable_kv_events = true;
  KVCacheManager manager(mc);
  config.probe_hasher = manager.hasher();
  events::KVEventPublisher publisher(config);
  std::printf("%s %s\n", publisher.endpoint().c_str(), publisher.replay_endpoint()->c_str());
  std::fflush(stdout);

  std::string line;
  if (!std::getline(std::cin, line) || line != "go") return 2;
  auto run = [&](RequestId id, std::vector<TokenId> tokens, RequestHashKeys keys) {
    Request r = manager.make_request(id, tokens, std::move(keys));
    const CacheHit hit = manager.get_computed_blocks(r);
    if (!manager.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit)) std::exit(3);
    manager.free(r);
  };
  std::vector<TokenId> t1(10), t2(12);
  std::iota(t1.begin(), t1.end(), 0);
  std::iota(t2.begin(), t2.end(), 100);
  RequestHashKeys k1;
  k1.cache_salt = "s1";
  k1.lora_name = "ad";
  run(1, t1, k1);
  publisher.publish(manager.take_events());
  run(2, t2, {});
  publisher.publish(manager.take_events());
  if (!manager.reset_prefix_cache()) return 4;
  publisher.publish(manager.take_events());
  if (!publisher.flush(std::chrono::seconds(10))) return 5;
  std::printf("published\n");
  std::fflush(stdout);
  while (std::getline(std::cin, line) && line != "quit") {
  }
  return 0;
}
