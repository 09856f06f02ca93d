#include "coordinator/sources/target_features.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/drafter_config.h"
#include "model/target_model.h"

namespace flashdraft {
namespace {

// Moves the target to cuda:0 when it fits: its weights, every layer's output kept for the features,
// one layer's fp32 attention scores and MLP activations, and the logits (regeneration) at
// data.max_seq_len. Otherwise an error naming what it needs and what is free.
absl::Status PlaceOnGpu(TargetModel& model, const TargetFeatureOptions& o) {
  const TargetModelConfig& c = model.config();
  const int64_t s = o.max_seq_len, elem = o.feature_dtype == DType::kBF16 ? 2 : 4;
  const int64_t weights = model.WeightBytes();
  const int64_t activations = c.num_hidden_layers * s * c.hidden_size * elem +
                              2 * c.num_attention_heads * s * s * 4 +
                              3 * s * c.intermediate_size * elem + s * c.vocab_size * 4;
  const auto gib = [](int64_t b) { return absl::StrFormat("%.2f GiB", b / double(1 << 30)); };
  absl::StatusOr<CudaMemory> memory = CudaMemoryInfo(0);
  if (memory.ok() && weights + activations > memory->free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "target ", o.target_dir, " does not fit cuda:0: it needs about ",
        gib(weights + activations), " (weights ", gib(weights), " + activations ", gib(activations),
        " at data.max_seq_len ", s, ") and ", gib(memory->free_bytes), " of ",
        gib(memory->total_bytes), " are free; use a smaller target or shards"));
  }
  model.MoveTo(torch::Device(torch::kCUDA, 0));
  LOG(INFO) << "target on cuda:0 (" << gib(weights) << " of weights"
            << (memory.ok() ? absl::StrCat(", ", gib(memory->free_bytes), " were free") : "")
            << ")";
  return absl::OkStatus();
}

}  // namespace

TargetFeatureOptions TargetFeatureOptionsFor(const JobConfig& job, const std::string& target_dir) {
  TargetFeatureOptions o;
  o.target_dir = target_dir;
  o.layer_ids = job.target.layer_ids;
  o.num_features = job.drafter.num_target_features;
  o.max_seq_len = job.data.max_seq_len;
  o.feature_dtype = job.target.dtype == "float32" ? DType::kF32 : DType::kBF16;
  o.device = job.target.device;
  o.teacher = LossNeedsTeacher(job.train);
  return o;
}

absl::StatusOr<std::unique_ptr<TargetFeatures>> TargetFeatures::Open(
    const TargetFeatureOptions& o) {
  if (o.feature_dtype != DType::kBF16 && o.feature_dtype != DType::kF32) {
    return absl::InvalidArgumentError("target features travel as BF16 or F32");
  }
  if (o.device != "cpu" && o.device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("target.device '", o.device, "'"));
  }
  const bool gpu = o.device == "cuda";
  if (gpu && !o.without_layers && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "target.device is cuda, but this process's LibTorch has no CUDA device (Debian's "
        "libtorch is CPU-only: build against a CUDA LibTorch, see docs/GPU.md)");
  }
  std::unique_ptr<TargetFeatures> f(new TargetFeatures());
  f->options_ = o;
  FD_ASSIGN_OR_RETURN(
      f->model_,
      TargetModel::Load(o.target_dir,
                        gpu && o.feature_dtype == DType::kBF16 ? torch::kBFloat16 : torch::kFloat32,
                        o.without_layers));
  const TargetModelConfig& t = f->model_->config();
  // Without layers, in the dtype the GPU would hold (the frozen tensors are the same bits).
  if (gpu && !o.without_layers) FD_RETURN_IF_ERROR(PlaceOnGpu(*f->model_, o));
  f->layers_ = o.layer_ids.empty()
                   ? DefaultTargetLayerIds(static_cast<int>(t.num_hidden_layers), o.num_features)
                   : o.layer_ids;
  for (int id : f->layers_) {
    if (id < 0 || id >= t.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target.layer_ids: ", id, " is outside the target's ", t.num_hidden_layers, " layers"));
    }
  }
  f->computed_layers_ =
      LayersWithTeacher(f->layers_, static_cast<int>(t.num_hidden_layers), o.teacher);
  f->teacher_size_ = o.teacher ? t.hidden_size : 0;
  f->feature_size_ = static_cast<int64_t>(f->computed_layers_.size()) * t.hidden_size;
  return f;
}

TargetFeatures::~TargetFeatures() = default;

absl::StatusOr<std::vector<uint8_t>> TargetFeatures::Compute(
    const std::vector<int64_t>& input_ids) const {
  const torch::Tensor input = torch::tensor(input_ids, torch::kInt64).unsqueeze(0);
  FD_ASSIGN_OR_RETURN(TargetOutput out,
                      model_->Forward(input, computed_layers_, /*with_logits=*/false));
  const torch::Tensor f =
      out.features.squeeze(0)
          .to(options_.feature_dtype == DType::kBF16 ? torch::kBFloat16 : torch::kFloat32)
          .to(torch::kCPU)
          .contiguous();
  const uint8_t* p = static_cast<const uint8_t*>(f.data_ptr());
  return std::vector<uint8_t>(p, p + f.nbytes());
}

}  // namespace flashdraft
