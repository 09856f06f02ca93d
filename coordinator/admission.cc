#include "coordinator/admission.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/numeric_env.h"
#include "common/security.h"

namespace flashdraft {

std::string ModelShapeDifference(const v1::ModelShape& s, const DrafterModelConfig& d) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"hidden_size", {s.hidden_size(), d.hidden_size}},
      {"num_hidden_layers", {s.num_hidden_layers(), d.num_hidden_layers}},
      {"num_attention_heads", {s.num_attention_heads(), d.num_attention_heads}},
      {"num_key_value_heads", {s.num_key_value_heads(), d.num_key_value_heads}},
      {"head_dim", {s.head_dim(), d.head_dim}},
      {"intermediate_size", {s.intermediate_size(), d.intermediate_size}},
      {"vocab_size", {s.vocab_size(), d.vocab_size}},
      {"block_size", {s.block_size(), d.block_size}},
  };
  for (const auto& [name, values] : fields) {
    if (values.first != values.second) {
      return absl::StrCat(name, " ", values.first, " != ", values.second);
    }
  }
  if (!std::equal(s.target_layer_ids().begin(), s.target_layer_ids().end(),
                  d.target_layer_ids.begin(), d.target_layer_ids.end())) {
    return "target_layer_ids";
  }
  return "";
}

std::string CapabilityRefusal(const v1::JoinRequest& request, const std::string& backend,
                              const DrafterModelConfig& drafter) {
  // The id and host are shown in logs, status and steps.jsonl: short printable text only.
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"worker_id", &request.worker_id()},
        {"hostname", &request.capability().hostname()},
        {"device", &request.capability().device()}}) {
    if (value->size() > kMaxPeerNameChars || !IsPrintableAscii(*value)) {
      return absl::StrCat(field, " '", Untrusted(*value), "' must be at most ", kMaxPeerNameChars,
                          " printable ASCII characters");
    }
  }
  if (request.protocol_version() != v1::PROTOCOL_VERSION_CURRENT) {
    return absl::StrCat("protocol version ", request.protocol_version(),
                        " is not this coordinator's version ",
                        static_cast<int>(v1::PROTOCOL_VERSION_CURRENT));
  }
  // A worker tells the collectives it was built with ("gloo" or "gloo,nccl"; none said: gloo).
  const std::string& offered =
      request.capability().backend().empty() ? "gloo" : request.capability().backend();
  if (!OffersBackend(offered, backend)) {
    return absl::StrCat(
        "the job sums gradients over ", backend, " (cluster.backend) and this worker has only '",
        Untrusted(offered), "'",
        backend == "nccl" ? ": build it with -DFLASHDRAFT_WITH_CUDA=ON on a GPU machine" : "");
  }
  if (request.has_model_shape()) {
    if (std::string d = ModelShapeDifference(request.model_shape(), drafter); !d.empty()) {
      return absl::StrCat("model shape differs from the job's: ", d);
    }
  }
  if (!request.capability().has_numerics()) {
    return "the worker did not report its numeric environment (Capability.numerics)";
  }
  return "";
}

}  // namespace flashdraft
