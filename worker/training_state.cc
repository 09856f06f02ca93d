#include "worker/training_state.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/crc32c.h"
#include "common/dtype.h"
#include "common/grpc_status.h"
#include "common/raw_client_stream.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "model/wire_tensor.h"

namespace flashdraft {
namespace {

// The key of a parameter's AdamW state, as LibTorch's AdamW keys it: the parameter's TensorImpl
// address printed as a string in LibTorch 1.x, the address itself in 2.x.
using AdamWStateKey =
    std::decay_t<decltype(std::declval<torch::optim::AdamW&>().state())>::key_type;
template <typename Key = AdamWStateKey>
Key StateKey(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // what c10::guts::to_string, LibTorch 1.x's own key, writes
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// Every parameter's AdamW state, created as AdamW itself creates it on its first step (step 0,
// zero moments) where it is missing, so that every member has the same tensors to compare and
// to broadcast.
void EnsureOptimizerState(DrafterImpl& drafter, torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  for (auto& p : drafter.parameters()) {
    const auto key = StateKey(p);
    if (optimizer.state().count(key)) continue;
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(0);
    state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    optimizer.state()[key] = std::move(state);
  }
}

// The training state a member holds: parameters, AdamW moments and steps, in parameter order.
std::vector<torch::Tensor> TrainingState(DrafterImpl& drafter, torch::optim::AdamW& optimizer,
                                         torch::Tensor* steps) {
  EnsureOptimizerState(drafter, optimizer);
  std::vector<torch::Tensor> out;
  std::vector<int64_t> step_values;
  for (auto& p : drafter.parameters()) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(StateKey(p)));
    out.push_back(p.detach());
    out.push_back(state.exp_avg());
    out.push_back(state.exp_avg_sq());
    step_values.push_back(state.step());
  }
  *steps = torch::tensor(step_values, torch::kInt64);
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, torch::Tensor>> FetchTensors(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
    double timeout_seconds) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  v1::FetchTensorsRequest request;
  request.set_session_token(token);
  // Read raw, so that each chunk goes from gRPC's buffers straight into its tensor.
  RawClientStream call(channel, "/flashdraft.v1.Coordinator/FetchTensors", &ctx);
  call.Write(MessageToBuffer(request));
  call.WritesDone();
  std::map<std::string, torch::Tensor> out;
  TorchTensorSink sink;
  TensorAssembler assembler(sink.allocator());
  grpc::ByteBuffer buffer;
  ReceivedChunk chunk;
  auto fail = [&](absl::Status why) {
    ctx.TryCancel();
    call.Finish();
    return why;
  };
  while (call.Read(&buffer)) {
    if (!ParseChunkBuffer(buffer, 0, &chunk)) {
      return fail(
          absl::DataLossError("FetchTensors: the coordinator sent a malformed TensorChunk"));
    }
    if (absl::Status s = assembler.Add(chunk.header, chunk.data); !s.ok()) return fail(s);
    if (assembler.complete()) {
      out[assembler.spec().name] = sink.tensor;
      assembler.Reset();
    }
  }
  if (grpc::Status s = call.Finish(); !s.ok()) {
    absl::Status status = FromGrpcStatus(s);
    return absl::Status(status.code(), absl::StrCat("FetchTensors: ", status.message()));
  }
  if (assembler.started()) return absl::DataLossError("FetchTensors ended inside a tensor");
  return out;
}

// Sets the drafter's frozen tensors and its starting weights from what FetchTensors sent: every
// parameter must come, with its shape, and nothing else under the weight prefix.
absl::Status LoadFetchedModel(DrafterImpl& drafter,
                              const std::map<std::string, torch::Tensor>& fetched) {
  auto embed = fetched.find("embed_tokens.weight");
  if (embed == fetched.end())
    return absl::DataLossError("the coordinator sent no embed_tokens.weight");
  auto head = fetched.find("lm_head.weight");
  drafter.SetFrozen(embed->second, head != fetched.end() ? head->second : embed->second);
  torch::NoGradGuard no_grad;
  auto params = drafter.named_parameters();
  for (auto& item : params) {
    const std::string name = kDrafterWeightPrefix + item.key();
    auto it = fetched.find(name);
    if (it == fetched.end()) {
      return absl::DataLossError(
          absl::StrCat("the coordinator sent no starting weight '", name, "'"));
    }
    if (!it->second.sizes().equals(item.value().sizes())) {
      return absl::DataLossError(absl::StrCat("the coordinator's starting weight '", name,
                                              "' has shape ", ShapeString(it->second.sizes().vec()),
                                              ", the drafter's parameter ",
                                              ShapeString(item.value().sizes().vec())));
    }
    item.value().copy_(it->second);
  }
  for (const auto& [name, tensor] : fetched) {
    if (absl::StartsWith(name, kDrafterWeightPrefix) &&
        !params.contains(name.substr(std::strlen(kDrafterWeightPrefix)))) {
      return absl::DataLossError(
          absl::StrCat("the coordinator sent a starting weight '", name,
                       "' that the drafter does not have (another drafter shape?)"));
    }
  }
  return absl::OkStatus();
}

// A resumed job's optimizer state (kOptimizerStatePrefix tensors) into `optimizer`; nothing when
// the coordinator sent none (a fresh start).
absl::Status LoadOptimizerState(DrafterImpl& drafter,
                                const std::map<std::string, torch::Tensor>& fetched,
                                torch::optim::AdamW& optimizer) {
  const std::string prefix = kOptimizerStatePrefix;
  auto step = fetched.find(prefix + "step");
  if (step == fetched.end()) return absl::OkStatus();
  if (step->second.numel() != 1 || step->second.scalar_type() != torch::kInt64) {
    return absl::DataLossError("the coordinator's adamw.step is not one int64");
  }
  for (auto& item : drafter.named_parameters()) {
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(step->second.item<int64_t>());
    for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
      const std::string name = prefix + item.key() + moment;
      auto it = fetched.find(name);
      if (it == fetched.end()) {
        return absl::DataLossError(absl::StrCat("the coordinator sent no '", name, "'"));
      }
      if (!it->second.sizes().equals(item.value().sizes()) ||
          it->second.scalar_type() != torch::kFloat32) {
        return absl::DataLossError(absl::StrCat("the coordinator's '", name, "' is not F32 ",
                                                ShapeString(item.value().sizes().vec())));
      }
      // On the parameter's device (cuda with worker.device: cuda).
      torch::Tensor moment_state = it->second.to(item.value().device()).clone();
      if (std::string(moment) == ".exp_avg") {
        state->exp_avg(moment_state);
      } else {
        state->exp_avg_sq(moment_state);
      }
    }
    optimizer.state()[StateKey(item.value())] = std::move(state);
  }
  return absl::OkStatus();
}

// After a new group formed: with `sync`, rank 0 (a member that trained) sends its parameters and
// optimizer state to everyone (a worker that joined a running job gets them so); then every
// member proves it holds the same state as rank 0 — a CRC-32C of every byte, all-gathered.
absl::Status SyncTrainingState(DrafterImpl& drafter, torch::optim::AdamW& optimizer,
                               Collective& collective, bool sync, const AbortCheck& abort) {
  torch::NoGradGuard no_grad;
  torch::Tensor steps;
  std::vector<torch::Tensor> state = TrainingState(drafter, optimizer, &steps);
  if (sync) {
    std::vector<std::unique_ptr<CollectiveWork>> works;
    for (torch::Tensor& t : state) works.push_back(collective.StartBroadcast(t, 0));
    works.push_back(collective.StartBroadcast(steps, 0));
    for (auto& w : works) FD_RETURN_IF_ERROR(w->Wait(abort));
    const auto step_values = steps.accessor<int64_t, 1>();
    int64_t i = 0;
    for (auto& p : drafter.parameters()) {
      static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(StateKey(p)))
          .step(step_values[i++]);
    }
  }
  uint32_t crc = 0;
  for (const torch::Tensor& t : state) {
    const torch::Tensor c = t.to(torch::kCPU).contiguous();  // a device tensor's bytes: copied
    crc = Crc32cExtend(crc, c.data_ptr(), c.nbytes());
  }
  crc = Crc32cExtend(crc, steps.data_ptr(), steps.nbytes());
  torch::Tensor mine = torch::full({1}, static_cast<int64_t>(crc), torch::kInt64);
  torch::Tensor all = torch::zeros({collective.world_size()}, torch::kInt64);
  std::vector<torch::Tensor> outputs;
  for (int r = 0; r < collective.world_size(); ++r) outputs.push_back(all.narrow(0, r, 1));
  FD_RETURN_IF_ERROR(collective.StartAllGather(outputs, mine)->Wait(abort));
  const auto crcs = all.accessor<int64_t, 1>();
  for (int r = 1; r < collective.world_size(); ++r) {
    if (crcs[r] != crcs[0]) {
      return absl::DataLossError(absl::StrCat(
          "after re-forming the group, rank ", r, "'s training state (CRC-32C ", crcs[r],
          ") differs from rank 0's (", crcs[0], "): the members would train apart"));
    }
  }
  return absl::OkStatus();
}

NamedTensors SnapshotState(DrafterImpl& drafter, torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  EnsureOptimizerState(drafter, optimizer);
  NamedTensors tensors;
  int64_t step = 0;
  for (auto& item : drafter.named_parameters()) {
    const torch::Tensor& p = item.value();
    auto& state = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(StateKey(p)));
    step = std::max<int64_t>(step, state.step());
    const std::string prefix = kOptimizerStatePrefix + item.key();
    // Host copies (the upload reads their bytes; training goes on meanwhile).
    auto host_copy = [](const torch::Tensor& t) {
      return t.is_cpu() ? t.detach().clone() : t.detach().to(torch::kCPU);
    };
    tensors.emplace_back(kDrafterWeightPrefix + item.key(), host_copy(p));
    tensors.emplace_back(prefix + ".exp_avg", host_copy(state.exp_avg()));
    tensors.emplace_back(prefix + ".exp_avg_sq", host_copy(state.exp_avg_sq()));
  }
  tensors.emplace_back(std::string(kOptimizerStatePrefix) + "step",
                       torch::full({1}, step, torch::kInt64));
  return tensors;
}

absl::Status SendCheckpoint(const NamedTensors& tensors, uint64_t completed_steps,
                            const std::function<bool(v1::WorkerMessage&)>& write,
                            const std::function<void()>& after_first_tensor) {
  const absl::Status closed = absl::UnavailableError("the coordinator closed the Train stream");
  v1::WorkerMessage announce;
  announce.mutable_checkpoint()->set_completed_steps(completed_steps);
  announce.mutable_checkpoint()->set_num_tensors(static_cast<uint32_t>(tensors.size()));
  if (!write(announce)) return closed;
  v1::TensorChunk chunk;
  for (const auto& [name, t] : tensors) {
    FD_ASSIGN_OR_RETURN(const DType dtype, FromTorchDType(t.scalar_type()));
    FD_RETURN_IF_ERROR(EncodeTensor({name, dtype, t.sizes().vec()}, t.data_ptr(), t.nbytes(),
                                    kDefaultMaxChunkBytes, chunk, [&](v1::TensorChunk& c) {
                                      // The data moves into the message; the header is copied,
                                      // since `c` carries it on to the tensor's next chunk (a swap
                                      // left every chunk after the first without one).
                                      v1::WorkerMessage m;
                                      std::string data = std::move(*c.mutable_data());
                                      c.clear_data();
                                      *m.mutable_tensor_chunk() = c;
                                      *m.mutable_tensor_chunk()->mutable_data() = std::move(data);
                                      return write(m) ? absl::OkStatus() : closed;
                                    }));
    if (&name == &tensors.front().first) after_first_tensor();
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
