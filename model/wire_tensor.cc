#include "model/wire_tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace flashdraft {

absl::StatusOr<DType> FromTorchDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32:
      return DType::kF32;
    case torch::kFloat16:
      return DType::kF16;
    case torch::kBFloat16:
      return DType::kBF16;
    case torch::kInt64:
      return DType::kI64;
    case torch::kInt32:
      return DType::kI32;
    case torch::kBool:
      return DType::kBool;
    case torch::kUInt8:
      return DType::kU8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("torch dtype ", c10::toString(type), " has no wire/safetensors equivalent"));
  }
}

torch::ScalarType ToTorchDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return torch::kFloat32;
    case DType::kF16:
      return torch::kFloat16;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kI64:
      return torch::kInt64;
    case DType::kI32:
      return torch::kInt32;
    case DType::kBool:
      return torch::kBool;
    case DType::kU8:
      return torch::kUInt8;
  }
  return torch::kFloat32;
}

absl::StatusOr<TensorSpec> SpecOf(const std::string& name, const torch::Tensor& tensor) {
  if (!tensor.device().is_cpu() || !tensor.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' must be a contiguous CPU tensor"));
  }
  absl::StatusOr<DType> dtype = FromTorchDType(tensor.scalar_type());
  if (!dtype.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", dtype.status().message()));
  return TensorSpec{name, *dtype, tensor.sizes().vec()};
}

absl::Status AppendTorchTensorChunks(const std::string& name, const torch::Tensor& tensor,
                                     size_t max_chunk_bytes,
                                     std::function<v1::TensorChunk*()> add_chunk) {
  const torch::Tensor cpu = tensor.to(torch::kCPU).contiguous();
  absl::StatusOr<TensorSpec> spec = SpecOf(name, cpu);
  if (!spec.ok()) return spec.status();
  return AppendTensorChunks(*spec, cpu.data_ptr(), cpu.nbytes(), max_chunk_bytes,
                            std::move(add_chunk));
}

TensorAssembler::Allocate TorchTensorSink::allocator() {
  return [this](const TensorSpec& spec, uint64_t) -> absl::StatusOr<void*> {
    tensor = torch::empty(
        spec.shape, torch::TensorOptions().dtype(ToTorchDType(spec.dtype)).pinned_memory(pinned));
    return tensor.data_ptr();
  };
}

torch::Tensor ToTorch(const TensorView& view) {
  torch::Tensor out =
      torch::empty(view.shape, torch::TensorOptions().dtype(ToTorchDType(view.dtype)));
  if (view.nbytes > 0) std::memcpy(out.data_ptr(), view.data, view.nbytes);
  return out;
}

absl::StatusOr<torch::Tensor> LoadFloatWeight(const SafetensorsModel& weights,
                                              const std::string& name,
                                              const std::vector<int64_t>& shape,
                                              torch::ScalarType dtype) {
  absl::StatusOr<TensorView> view = weights.Get(name);
  if (!view.ok()) return view.status();
  if (view->dtype != DType::kF32 && view->dtype != DType::kBF16 && view->dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(weights.path(), ": tensor '", name, "': dtype ",
                                                   DTypeName(view->dtype), " is not a float type"));
  }
  if (view->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(weights.path(), ": tensor '", name, "': shape ",
                                                   ShapeString(view->shape), ", expected ",
                                                   ShapeString(shape)));
  }
  return ToTorch(*view).to(dtype);
}

}  // namespace flashdraft
