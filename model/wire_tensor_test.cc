#include "model/wire_tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "flashdraft/v1/tensor.pb.h"

namespace flashdraft {
namespace {

TEST(WireTensorTest, TorchTensorsRoundTripThroughChunks) {
  torch::manual_seed(0);
  const std::vector<torch::Tensor> tensors = {
      torch::randn({3, 17, 40}).to(torch::kBFloat16),
      torch::randn({5}),
      torch::randint(0, 151936, {2, 9}, torch::kInt64),
      torch::randn({4, 4}).gt(0),
      torch::randn({6, 8}).t(),  // non-contiguous: encoded as its contiguous copy
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<v1::TensorChunk> chunks;
    ASSERT_TRUE(AppendTorchTensorChunks("t", tensors[i], 1000, [&] {
                  chunks.emplace_back();
                  return &chunks.back();
                }).ok());
    TorchTensorSink sink;
    TensorAssembler assembler(sink.allocator());
    for (const auto& c : chunks) ASSERT_TRUE(assembler.Add(c).ok());
    ASSERT_TRUE(assembler.complete());
    EXPECT_EQ(sink.tensor.scalar_type(), tensors[i].scalar_type());
    EXPECT_TRUE(torch::equal(sink.tensor, tensors[i])) << i;
  }
}

TEST(WireTensorTest, UnsupportedDTypeIsNamed) {
  auto status = AppendTorchTensorChunks("z", torch::zeros({2}, torch::kComplexFloat), 1000,
                                        [] { return static_cast<v1::TensorChunk*>(nullptr); });
  EXPECT_THAT(status.message(), ::testing::HasSubstr("tensor 'z'"));
  EXPECT_THAT(status.message(), ::testing::HasSubstr("has no wire/safetensors equivalent"));
}

TEST(WireTensorTest, SafetensorsViewToTorch) {
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("w", DType::kF32, {2, 3}, values.data(), 24).ok());
  auto file = SafetensorsFile::FromBytes("w.safetensors", writer.Serialize());
  ASSERT_TRUE(file.ok());
  torch::Tensor t = ToTorch(*(*file)->Get("w"));
  EXPECT_TRUE(torch::equal(t, torch::arange(1, 7, torch::kFloat32).view({2, 3})));
}

}  // namespace
}  // namespace flashdraft
