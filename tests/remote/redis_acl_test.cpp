// Tenant isolation in a shared Redis (issue 41, item 7): namespaces are key prefixes, and only
// Redis ACL users keep one tenant out of another's. A redis-server on 127.0.0.1 (started by the
// test, tests/util/redis_servers.hpp) gets two users, each allowed only its own keys
// ("~<namespace>/*") and only the commands RedisStore sends (GET, SET, EXISTS; AUTH is always
// allowed): the minimal ACL that redis_store.hpp documents. Each tenant's RedisStore reads and
// writes its own namespace; pointed at the other's namespace, every op is refused by Redis and
// completes kError (a miss, a failed put), counted, promptly, never thrown, and the other
// tenant's values stay as they were. Without redis-server every test reports SKIPPED.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "pagedkv/remote/redis_store.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "redis_servers.hpp"
#include "remote_test_util.hpp"

namespace pagedkv {
namespace {

using namespace std::chrono_literals;
using namespace test;  // remote_test_util.hpp: block_bytes, block_key, collect, count_result
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBlock = 4096;
constexpr std::size_t kBlocks = 4;
const std::string kAdminPassword = "admin-pw";

RedisStore open_store(std::uint16_t port, const std::string& user, const std::string& password,
                      const std::string& ns) {
  RedisStoreConfig c = RedisStoreConfig::from_url("redis://" + user + ":" + password +
                                                  "@127.0.0.1:" + std::to_string(port) + "/" + ns);
  c.layout_fingerprint = layout_fingerprint("acl-test,bf16,block16");
  c.op_timeout = 2000ms;
  c.connect_timeout = 500ms;
  return RedisStore(c);
}

// The ACL of one tenant: its own keys, and the given commands only.
std::vector<std::string> tenant_acl(const std::string& user, const std::string& password,
                                    const std::string& ns, const std::vector<std::string>& cmds) {
  std::vector<std::string> argv = {
      "ACL",           "SETUSER",       user,   "reset", "on", ">" + password,
      "~" + ns + "/*", "resetchannels", "-@all"};
  for (const std::string& c : cmds) argv.push_back("+" + c);
  return argv;
}

class RedisAclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::RedisServer::binary().empty()) {
      GTEST_SKIP() << "redis-server not installed (Debian: redis-server): remote tests skipped";
    }
  }

  // Puts blocks 0..kBlocks-1 (bytes seeded from `seed`); returns the results.
  static std::vector<RemoteCompletion> put_all(RedisStore& s, std::uint64_t seed,
                                               std::vector<std::vector<std::byte>>& keep) {
    keep.clear();
    std::vector<RemotePut> ops;
    for (std::size_t i = 0; i < kBlocks; ++i) keep.push_back(block_bytes(kBlock, seed + i));
    for (std::size_t i = 0; i < kBlocks; ++i) ops.push_back({block_key(i), keep[i]});
    if (!s.put(ops)) return {};
    return collect(s, kBlocks, 10000ms);
  }

  // Gets blocks 0..kBlocks-1 into `out` (prefilled with 0x5a); returns the results.
  static std::vector<RemoteCompletion> get_all(RedisStore& s,
                                               std::vector<std::vector<std::byte>>& out) {
    out.assign(kBlocks, std::vector<std::byte>(kBlock, std::byte{0x5a}));
    std::vector<RemoteGet> ops;
    for (std::size_t i = 0; i < kBlocks; ++i) ops.push_back({block_key(i), out[i]});
    if (!s.get(ops)) return {};
    return collect(s, kBlocks, 10000ms);
  }

  static std::vector<RemoteCompletion> exists_all(RedisStore& s) {
    std::vector<BlockHash> keys;
    for (std::size_t i = 0; i < kBlocks; ++i) keys.push_back(block_key(i));
    if (!s.exists(keys)) return {};
    return collect(s, kBlocks, 10000ms);
  }
};

TEST_F(RedisAclTest, TwoKeyRestrictedTenantsEachReachOnlyTheirOwnNamespace) {
  test::RedisServer server({}, kAdminPassword);
  ASSERT_TRUE(server.start());
  test::Client admin(server.port(), kAdminPassword);
  const std::vector<std::string> cmds = {"get", "set", "exists"};
  ASSERT_EQ(admin.command(tenant_acl("tenant-a", "pw-a", "tenant-a", cmds)), "OK");
  ASSERT_EQ(admin.command(tenant_acl("tenant-b", "pw-b", "tenant-b", cmds)), "OK");

  // Each tenant in its own namespace: the minimal ACL is enough for everything the store does.
  RedisStore a = open_store(server.port(), "tenant-a", "pw-a", "tenant-a");
  RedisStore b = open_store(server.port(), "tenant-b", "pw-b", "tenant-b");
  std::vector<std::vector<std::byte>> bytes_a, bytes_b, out;
  EXPECT_EQ(count_result(put_all(a, 0, bytes_a), RemoteResult::kStored), kBlocks);
  EXPECT_EQ(count_result(put_all(b, 100, bytes_b), RemoteResult::kStored), kBlocks);
  EXPECT_EQ(count_result(exists_all(a), RemoteResult::kHit), kBlocks);
  EXPECT_EQ(count_result(get_all(a, out), RemoteResult::kHit), kBlocks);
  EXPECT_TRUE(out == bytes_a);
  EXPECT_EQ(count_result(get_all(b, out), RemoteResult::kHit), kBlocks);
  EXPECT_TRUE(out == bytes_b);  // same block keys, the tenant's own values
  for (RedisStore* s : {&a, &b}) {
    const RemoteStoreStats st = s->stats();
    EXPECT_EQ(st.errors + st.timeouts + st.connect_failures, 0u);
  }

  // Each tenant's credentials on the other's namespace: Redis refuses every command (NOPERM).
  // Probes and gets are misses (kError, the buffer untouched), puts fail; counted, prompt.
  struct Intrusion {
    std::string user, password, victim_ns;
    const std::vector<std::vector<std::byte>>* victim_bytes;
  };
  for (const Intrusion& x : {Intrusion{"tenant-b", "pw-b", "tenant-a", &bytes_a},
                             Intrusion{"tenant-a", "pw-a", "tenant-b", &bytes_b}}) {
    SCOPED_TRACE(x.user + " on " + x.victim_ns);
    RedisStore intruder = open_store(server.port(), x.user, x.password, x.victim_ns);
    const auto start = Clock::now();
    const auto probes = exists_all(intruder);
    const auto gets = get_all(intruder, out);
    std::vector<std::vector<std::byte>> garbage;
    const auto puts = put_all(intruder, 999, garbage);
    EXPECT_LT(Clock::now() - start, 10s);  // no hang: far below the ops' timeouts added up
    ASSERT_EQ(probes.size(), kBlocks);
    ASSERT_EQ(gets.size(), kBlocks);
    ASSERT_EQ(puts.size(), kBlocks);
    EXPECT_EQ(count_result(probes, RemoteResult::kError), kBlocks);
    EXPECT_EQ(count_result(gets, RemoteResult::kError), kBlocks);
    EXPECT_EQ(count_result(puts, RemoteResult::kError), kBlocks);
    for (const auto& o : out) {
      for (std::byte v : o) ASSERT_EQ(v, std::byte{0x5a});
    }
    const RemoteStoreStats st = intruder.stats();
    EXPECT_EQ(st.errors, 3 * kBlocks);
    EXPECT_EQ(st.hits + st.probe_hits + st.stored, 0u);
    EXPECT_EQ(st.connect_failures, 0u);  // authenticated fine: refused per command
    // The victim's values are untouched.
    RedisStore victim = x.victim_ns == "tenant-a"
                            ? open_store(server.port(), "tenant-a", "pw-a", "tenant-a")
                            : open_store(server.port(), "tenant-b", "pw-b", "tenant-b");
    EXPECT_EQ(count_result(get_all(victim, out), RemoteResult::kHit), kBlocks);
    EXPECT_TRUE(out == *x.victim_bytes);
  }
}

// The ACL documented in redis_store.hpp is minimal: without any one of GET, SET and EXISTS the
// op that needs it is refused (kError, counted); the others still work.
TEST_F(RedisAclTest, EachOfGetSetExistsIsNeededAndNothingElse) {
  test::RedisServer server({}, kAdminPassword);
  ASSERT_TRUE(server.start());
  test::Client admin(server.port(), kAdminPassword);
  // A full user fills the namespace first.
  ASSERT_EQ(admin.command(tenant_acl("full", "pw", "ns", {"get", "set", "exists"})), "OK");
  std::vector<std::vector<std::byte>> keep, out;
  {
    RedisStore full = open_store(server.port(), "full", "pw", "ns");
    ASSERT_EQ(count_result(put_all(full, 0, keep), RemoteResult::kStored), kBlocks);
  }
  const std::vector<std::string> all = {"get", "set", "exists"};
  for (const std::string& missing : all) {
    SCOPED_TRACE("without " + missing);
    std::vector<std::string> cmds;
    for (const std::string& c : all) {
      if (c != missing) cmds.push_back(c);
    }
    ASSERT_EQ(admin.command(tenant_acl("partial", "pw", "ns", cmds)), "OK");
    RedisStore s = open_store(server.port(), "partial", "pw", "ns");
    std::vector<std::vector<std::byte>> again;
    const auto probes = exists_all(s);
    const auto gets = get_all(s, out);
    const auto puts = put_all(s, 0, again);  // the same bytes: a successful put changes nothing
    EXPECT_EQ(count_result(probes, missing == "exists" ? RemoteResult::kError : RemoteResult::kHit),
              kBlocks);
    EXPECT_EQ(count_result(gets, missing == "get" ? RemoteResult::kError : RemoteResult::kHit),
              kBlocks);
    EXPECT_EQ(count_result(puts, missing == "set" ? RemoteResult::kError : RemoteResult::kStored),
              kBlocks);
    EXPECT_EQ(s.stats().errors, kBlocks);
  }
}

}  // namespace
}  // namespace pagedkv
