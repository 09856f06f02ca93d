#include "common/blocking_queue.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace flashdraft {
namespace {

TEST(BlockingQueueTest, DeliversInOrderAcrossThreadsWithinCapacity) {
  BlockingQueue<int> q(/*capacity=*/2);
  std::thread producer([&] {
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q.Push(i));
    q.Close();
  });
  std::vector<int> got;
  while (std::optional<int> v = q.Pop()) got.push_back(*v);
  producer.join();
  ASSERT_EQ(got.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(got[i], i);
}

TEST(BlockingQueueTest, CloseWakesABlockedProducerAndDrainsTheRest) {
  BlockingQueue<int> q(/*capacity=*/1);
  ASSERT_TRUE(q.Push(1));
  bool pushed = true;
  std::thread producer([&] { pushed = q.Push(2); });  // blocks: full
  q.Close();
  producer.join();
  EXPECT_FALSE(pushed);
  EXPECT_EQ(q.Pop(), std::optional<int>(1));
  EXPECT_EQ(q.Pop(), std::nullopt);
  EXPECT_FALSE(q.Push(3));
}

}  // namespace
}  // namespace flashdraft
