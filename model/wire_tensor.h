// torch::Tensor <-> the common/ codec and safetensors views. The only place where LibTorch meets
// the torch-free tensor plumbing in common/.
#pragma once

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "common/tensor_codec.h"

namespace flashdraft {

absl::StatusOr<DType> FromTorchDType(torch::ScalarType type);
torch::ScalarType ToTorchDType(DType dtype);

// The spec of a contiguous CPU tensor (error otherwise) for EncodeTensor.
absl::StatusOr<TensorSpec> SpecOf(const std::string& name, const torch::Tensor& tensor);

// Encodes a tensor (made contiguous on the CPU if needed) as chunks appended by `add_chunk`.
absl::Status AppendTorchTensorChunks(const std::string& name, const torch::Tensor& tensor,
                                     size_t max_chunk_bytes,
                                     std::function<v1::TensorChunk*()> add_chunk);

// An allocator for TensorAssembler that creates a CPU tensor of the announced spec and remembers
// it.
struct TorchTensorSink {
  torch::Tensor tensor;
  // Page-locked host memory (a CUDA LibTorch only), so that copies to a GPU run asynchronously.
  bool pinned = false;
  TensorAssembler::Allocate allocator();
};

// Copies a safetensors view into a new CPU tensor of the same dtype and shape.
torch::Tensor ToTorch(const TensorView& view);

// A float weight (F32, BF16 or F16 in the file) of exactly `shape`, as `dtype`; errors name the
// model path, the tensor and what differs.
absl::StatusOr<torch::Tensor> LoadFloatWeight(const SafetensorsModel& weights,
                                              const std::string& name,
                                              const std::vector<int64_t>& shape,
                                              torch::ScalarType dtype = torch::kFloat32);

}  // namespace flashdraft
