#include "coordinator/rendezvous_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

TEST(RendezvousStoreTest, SetGetAddCheckDelete) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("epoch/1/rank0", "addr").ok());
  std::string value;
  ASSERT_TRUE(store.Get("epoch/1/rank0", &value));
  EXPECT_EQ(value, "addr");
  EXPECT_EQ(*store.Add("epoch/1/count", 2), 2);
  EXPECT_EQ(*store.Add("epoch/1/count", 3), 5);
  EXPECT_TRUE(store.Check({"epoch/1/rank0", "epoch/1/count"}));
  EXPECT_FALSE(store.Check({"epoch/1/rank1"}));
  EXPECT_TRUE(store.Delete("epoch/1/rank0"));
  EXPECT_FALSE(store.Delete("epoch/1/rank0"));
  EXPECT_EQ(store.NumKeys(), 1);
}

TEST(RendezvousStoreTest, KeysValuesAndTotalsAreBounded) {
  StoreLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_keys = 3;
  limits.max_total_bytes = 40;
  RendezvousStore store(limits);
  EXPECT_THAT(std::string(store.Set("123456789", "v").message()), HasSubstr("store key of 9"));
  EXPECT_THAT(std::string(store.Set("", "v").message()), HasSubstr("store key of 0"));
  EXPECT_THAT(std::string(store.Set("k", std::string(17, 'x')).message()),
              HasSubstr("store value of 17 bytes"));
  ASSERT_TRUE(store.Set("a", std::string(16, 'x')).ok());  // 17 bytes
  ASSERT_TRUE(store.Set("b", std::string(16, 'x')).ok());  // 34
  EXPECT_EQ(store.Set("c", std::string(16, 'x')).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.Set("a", "small").ok());  // replacing frees room
  ASSERT_TRUE(store.Set("c", "x").ok());
  EXPECT_EQ(store.Set("d", "x").code(), absl::StatusCode::kResourceExhausted);  // 3 keys
  EXPECT_TRUE(store.Delete("c"));
  EXPECT_TRUE(store.Set("d", "x").ok());
}

TEST(RendezvousStoreTest, CountersRefuseOverflowAndText) {
  RendezvousStore store;
  ASSERT_TRUE(store.Add("n", std::numeric_limits<int64_t>::max()).ok());
  EXPECT_THAT(std::string(store.Add("n", 1).status().message()), HasSubstr("would overflow"));
  EXPECT_EQ(*store.Add("n", -1), std::numeric_limits<int64_t>::max() - 1);
  ASSERT_TRUE(store.Set("t", "text").ok());
  EXPECT_THAT(std::string(store.Add("t", 1).status().message()), HasSubstr("not hold an integer"));
}

TEST(RendezvousStoreTest, AnEpochsKeysGoTogether) {
  RendezvousStore store;
  for (const char* key : {"epoch/1/a", "epoch/1/b", "epoch/10/a", "epoch/2/a"}) {
    ASSERT_TRUE(store.Set(key, "v").ok());
  }
  EXPECT_EQ(store.DeletePrefix("epoch/1/"), 2u);
  EXPECT_EQ(store.NumKeys(), 2);
  EXPECT_TRUE(store.Check({"epoch/10/a", "epoch/2/a"}));
}

}  // namespace
}  // namespace flashdraft
