#include "worker/worker.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/blocking_queue.h"
#include "common/chunk_wire.h"
#include "common/crc32c.h"
#include "common/dtype.h"
#include "common/grpc_status.h"
#include "common/job_config.h"
#include "common/shard_tree.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"
#include "glog/logging.h"
#include "model/export.h"
#include "model/trainer.h"
#include "model/wire_tensor.h"
#include "worker/collective/gloo_collective.h"
#include "worker/gradient_reducer.h"
#include "worker/grpc_store.h"

namespace flashdraft {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// What the reader thread hands the training thread.
struct Item {
  enum Kind { kBatch, kCommit, kReform, kShutdown, kError } kind;
  v1::Microbatch header;
  std::map<std::string, torch::Tensor> tensors;
  uint64_t step = 0;
  std::string text;
  bool job_finished = false;  // kShutdown: the job trained all its steps
  bool checkpoint = false;    // kCommit: rank 0 uploads its state after applying the step
  uint64_t epoch = 0;         // kCommit: the membership epoch it belongs to
  v1::Reform reform;          // kReform
};

using ItemQueue = BlockingQueue<Item>;

// The Train and FetchTensors streams are read as raw ByteBuffers so that tensor chunks go from
// gRPC's receive buffers straight into tensors (common/chunk_wire.h); the wire format is the
// protobuf one, under the generated method names.
std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, grpc::ByteBuffer>> OpenTrainStream(
    const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx) {
  const grpc::internal::RpcMethod method("/flashdraft.v1.Coordinator/Train",
                                         grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  return std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, grpc::ByteBuffer>>(
      grpc::internal::ClientReaderWriterFactory<v1::WorkerMessage, grpc::ByteBuffer>::Create(
          channel.get(), method, ctx));
}

absl::StatusOr<std::map<std::string, torch::Tensor>> FetchTensors(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  grpc::ClientContext ctx;
  v1::FetchTensorsRequest request;
  request.set_session_token(token);
  const grpc::internal::RpcMethod method("/flashdraft.v1.Coordinator/FetchTensors",
                                         grpc::internal::RpcMethod::SERVER_STREAMING, channel);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                    request));
  std::map<std::string, torch::Tensor> out;
  TorchTensorSink sink;
  TensorAssembler assembler(sink.allocator());
  grpc::ByteBuffer buffer;
  ReceivedChunk chunk;
  while (reader->Read(&buffer)) {
    if (!ParseChunkBuffer(buffer, 0, &chunk)) {
      ctx.TryCancel();
      reader->Finish();
      return absl::DataLossError("FetchTensors: the coordinator sent a malformed TensorChunk");
    }
    FD_RETURN_IF_ERROR(assembler.Add(chunk.header, chunk.data));
    if (assembler.complete()) {
      out[assembler.spec().name] = sink.tensor;
      assembler.Reset();
    }
  }
  FD_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
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

// The AdamW state of a parameter, as LibTorch's AdamW keys it.
std::string StateKey(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
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
      if (std::string(moment) == ".exp_avg") {
        state->exp_avg(it->second.clone());
      } else {
        state->exp_avg_sq(it->second.clone());
      }
    }
    optimizer.state()[StateKey(item.value())] = std::move(state);
  }
  return absl::OkStatus();
}

// Fault injection for the fault tests: FLASHDRAFT_FAULT="<point>:step=<s>:rank=<r>" makes the
// worker that is rank r kill itself with SIGKILL (as `kill -9` would) at that point of step s:
// forward (after its first shard's forward), reduce (while its gradient exchange runs), upload
// (inside the checkpoint upload of the state after s steps, after its first tensor). Unset: nothing
// happens; a malformed value stops the worker at start rather than being ignored.
struct FaultPlan {
  std::string point;
  uint64_t step = 0;
  int rank = 0;
  bool armed = false;
};

absl::StatusOr<FaultPlan> ParseFault(const char* env) {
  FaultPlan plan;
  if (env == nullptr || *env == 0) return plan;
  const std::vector<std::string> parts = absl::StrSplit(env, ':');
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "FLASHDRAFT_FAULT='", env, "': expected <forward|reduce|upload>:step=<n>:rank=<r>"));
  };
  if (parts.size() != 3 || !absl::StartsWith(parts[1], "step=") ||
      !absl::StartsWith(parts[2], "rank=") ||
      (parts[0] != "forward" && parts[0] != "reduce" && parts[0] != "upload") ||
      !absl::SimpleAtoi(parts[1].substr(5), &plan.step) ||
      !absl::SimpleAtoi(parts[2].substr(5), &plan.rank)) {
    return bad();
  }
  plan.point = parts[0];
  plan.armed = true;
  return plan;
}

void MaybeFault(const FaultPlan& plan, const char* point, uint64_t step, int rank, uint64_t epoch) {
  if (!plan.armed || plan.point != point || plan.step != step || plan.rank != rank || epoch != 1) {
    return;
  }
  LOG(WARNING) << "FLASHDRAFT_FAULT: killing this worker (rank " << rank << ") at " << point
               << " of step " << step;
  google::FlushLogFiles(google::GLOG_INFO);
  raise(SIGKILL);
}

// Rank 0's state after `completed_steps` steps to the coordinator, for a checkpoint: the
// parameters, the AdamW moments and step (CheckpointUpload in the protocol).
template <typename Write>
absl::Status UploadCheckpoint(DrafterImpl& drafter, torch::optim::AdamW& optimizer,
                              uint64_t completed_steps, const Write& write,
                              const std::function<void()>& after_first_tensor) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  int64_t step = 0;
  for (auto& item : drafter.named_parameters()) {
    const torch::Tensor& p = item.value();
    tensors.emplace_back(kDrafterWeightPrefix + item.key(), p.detach().contiguous());
    auto it = optimizer.state().find(StateKey(p));
    const std::string prefix = kOptimizerStatePrefix + item.key();
    if (it == optimizer.state().end()) {
      tensors.emplace_back(prefix + ".exp_avg", torch::zeros_like(p));
      tensors.emplace_back(prefix + ".exp_avg_sq", torch::zeros_like(p));
      continue;
    }
    auto& state = static_cast<torch::optim::AdamWParamState&>(*it->second);
    step = state.step();
    tensors.emplace_back(prefix + ".exp_avg", state.exp_avg().contiguous());
    tensors.emplace_back(prefix + ".exp_avg_sq", state.exp_avg_sq().contiguous());
  }
  tensors.emplace_back(std::string(kOptimizerStatePrefix) + "step",
                       torch::full({1}, step, torch::kInt64));
  v1::WorkerMessage announce;
  announce.mutable_checkpoint()->set_completed_steps(completed_steps);
  announce.mutable_checkpoint()->set_num_tensors(static_cast<uint32_t>(tensors.size()));
  if (!write(announce)) return absl::UnavailableError("the coordinator closed the Train stream");
  v1::TensorChunk chunk;
  for (const auto& [name, t] : tensors) {
    FD_ASSIGN_OR_RETURN(const DType dtype, FromTorchDType(t.scalar_type()));
    FD_RETURN_IF_ERROR(EncodeTensor(
        {name, dtype, t.sizes().vec()}, t.data_ptr(), t.nbytes(), kDefaultMaxChunkBytes, chunk,
        [&](v1::TensorChunk& c) {
          v1::WorkerMessage m;
          m.mutable_tensor_chunk()->Swap(&c);
          return write(m) ? absl::OkStatus()
                          : absl::UnavailableError("the coordinator closed the Train stream");
        }));
    if (&name == &tensors.front().first) after_first_tensor();
  }
  return absl::OkStatus();
}

// The local address this host uses to reach `coordinator` ("host:port" or "[v6]:port"): where
// the Gloo device binds when cluster.collective_interface is empty, so that workers on several
// hosts reach each other instead of each offering its loopback address. A UDP connect sends no
// packet; it only asks the kernel for the route.
absl::StatusOr<std::string> LocalAddressToward(const std::string& coordinator) {
  const size_t colon = coordinator.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator '", coordinator, "' is not host:port"));
  }
  std::string host = coordinator.substr(0, colon);
  const std::string port = coordinator.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve the coordinator host '", host, "': ", gai_strerror(rc)));
  }
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {0};
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat("no route to the coordinator host '", host, "'"));
  }
  return out;
}

// Every parameter's AdamW state, created as AdamW itself creates it on its first step (step 0,
// zero moments) where it is missing, so that every member has the same tensors to compare and
// to broadcast.
void EnsureOptimizerState(DrafterImpl& drafter, torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  for (auto& p : drafter.parameters()) {
    const std::string key = StateKey(p);
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
    const torch::Tensor c = t.contiguous();
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

// The shard layout a step's first Microbatch announces must be the job's: K virtual shards
// (train.virtual_shards) with the deterministic reduction, one shard per rank without it, laid out
// over the ranks as the scheduler lays them (ShardOffsets).
absl::Status CheckShardLayout(const v1::Microbatch& h, const std::vector<int64_t>& offsets,
                              int rank, int world, int64_t virtual_shards) {
  const int64_t want = virtual_shards > 0 ? virtual_shards : world;
  if (h.num_shards() != want || offsets != ShardOffsets(want, world) ||
      h.rank() != static_cast<uint32_t>(rank) || h.world_size() != static_cast<uint32_t>(world) ||
      h.shard() != static_cast<uint32_t>(offsets[rank])) {
    return absl::DataLossError(absl::StrCat(
        "step ", h.step(), ": the coordinator's shard layout (shard ", h.shard(), " of ",
        h.num_shards(), ", offsets [", absl::StrJoin(offsets, ", "), "], rank ", h.rank(), "/",
        h.world_size(), ") is not this job's (", want, " shards, rank ", rank, "/", world, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// One session with one coordinator process: join, fetch, train until the job ends. UNAVAILABLE
// when the coordinator could not be reached or went away (RunWorker joins again).
absl::Status RunSession(const WorkerOptions& o) {
  FD_ASSIGN_OR_RETURN(const FaultPlan fault, ParseFault(std::getenv("FLASHDRAFT_FAULT")));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  auto channel = grpc::CreateCustomChannel(o.coordinator, grpc::InsecureChannelCredentials(), args);
  std::shared_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(channel);

  // --- Join: admission and the job; the rank comes with the first epoch's Reform ---
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  v1::JoinRequest join;
  join.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  join.set_worker_id(o.worker_id.empty() ? absl::StrCat(host, ":", getpid()) : o.worker_id);
  join.mutable_capability()->set_hostname(host);
  join.mutable_capability()->set_device("cpu");
  join.mutable_capability()->set_backend("gloo");
  v1::JoinReply reply;
  {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(o.connect_timeout_seconds * 1000)));
    grpc::Status s = stub->Join(&ctx, join, &reply);
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot join the coordinator at ", o.coordinator, ": ", s.error_message()));
    }
  }
  if (!reply.accepted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("refused by the coordinator: ", reply.reason()));
  }
  FD_ASSIGN_OR_RETURN(JobConfig job,
                      ParseJobConfig(reply.job_config_yaml(), "the coordinator's job"));
  FD_ASSIGN_OR_RETURN(
      DrafterModelConfig config,
      ParseDrafterConfig(reply.drafter_config_json(), "the coordinator's drafter config"));
  const std::string token = reply.session_token();
  // One thread count for the whole job (train.intra_op_threads): some reductions split by it.
  torch::set_num_threads(job.train.intra_op_threads);
  LOG(INFO) << "joined as '" << join.worker_id() << "' with " << job.train.intra_op_threads
            << " intra-op thread(s)";

  // --- Model: frozen target tensors and the starting weights, both from the coordinator ---
  FD_ASSIGN_OR_RETURN(auto fetched, FetchTensors(channel, token));
  Drafter drafter(config);
  FD_RETURN_IF_ERROR(LoadFetchedModel(*drafter, fetched));
  std::vector<torch::Tensor> params = drafter->parameters();
  OptimizerOptions opt;
  opt.learning_rate = job.train.learning_rate;
  opt.beta1 = job.train.adam_beta1;
  opt.beta2 = job.train.adam_beta2;
  opt.eps = job.train.adam_eps;
  opt.weight_decay = job.train.weight_decay;
  opt.grad_clip_norm = job.train.grad_clip_norm;
  DrafterTrainer trainer(drafter, opt);
  FD_RETURN_IF_ERROR(LoadOptimizerState(*drafter, fetched, trainer.optimizer()));
  fetched.clear();
  GradientReducerOptions reduction;
  reduction.bucket_bytes = static_cast<size_t>(job.cluster.allreduce_bucket_mib * (1 << 20));
  reduction.ordered = job.train.deterministic_reduction;
  const int64_t virtual_shards = EffectiveVirtualShards(job);
  const double gamma = job.drafter.loss_decay_gamma > 0
                           ? job.drafter.loss_decay_gamma
                           : DefaultLossDecayGamma(job.drafter.block_size).value_or(7.0);
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(job.cluster.collective_timeout_seconds * 1000));
  auto store = c10::make_intrusive<GrpcStore>(stub, token, timeout);
  GlooOptions gloo;
  gloo.timeout = timeout;
  gloo.interface = job.cluster.collective_interface;
  if (gloo.interface.empty()) {
    FD_ASSIGN_OR_RETURN(gloo.address, LocalAddressToward(o.coordinator));
    LOG(INFO) << "collective traffic on " << gloo.address
              << " (the address that reaches the coordinator; cluster.collective_interface "
                 "names another)";
  }

  // --- The Train stream: a reader thread, a heartbeat thread, this training thread ---
  grpc::ClientContext stream_ctx;
  auto stream = OpenTrainStream(channel, &stream_ctx);
  std::mutex write_mu;
  auto write = [&](v1::WorkerMessage m) {
    m.set_worker_id(join.worker_id());
    m.set_session_token(token);
    std::lock_guard<std::mutex> lock(write_mu);
    return stream->Write(m);
  };
  {
    v1::WorkerMessage hello;
    hello.mutable_heartbeat()->set_unix_millis(0);
    if (!write(hello)) return absl::UnavailableError("the coordinator closed the Train stream");
  }
  // The newest membership epoch announced: a collective of an older one is abandoned at once.
  std::atomic<uint64_t> newest_epoch{0};
  // The reader thread receives, parses and assembles tensors (CRC + one copy straight out of
  // gRPC's buffers, while they are still in this core's cache); the training thread consumes whole
  // microbatches. (A separate decoder thread measured slower: the chunk's bytes had to move to
  // another core first.)
  ItemQueue queue;
  std::thread reader([&] {
    auto fail = [&](std::string why) {
      Item item;
      item.kind = Item::kError;
      item.text = std::move(why);
      queue.Push(std::move(item));
    };
    grpc::ByteBuffer buffer;
    v1::CoordinatorMessage msg;
    ReceivedChunk chunk;
    Item pending;
    uint32_t remaining = 0;
    TorchTensorSink sink;
    TensorAssembler assembler(sink.allocator());
    // Adds one chunk (`add_to` feeds it to the assembler) to the pending microbatch; false after a
    // failure.
    auto add = [&](const auto& add_to) {
      if (remaining == 0) {
        fail("a tensor chunk arrived outside a microbatch");
        return false;
      }
      absl::Status s = add_to(assembler);
      if (!s.ok()) {
        fail(std::string(s.message()));
        return false;
      }
      if (assembler.complete()) {
        pending.tensors[assembler.spec().name] = sink.tensor;
        assembler.Reset();
        if (--remaining == 0) queue.Push(std::move(pending));
      }
      return true;
    };
    while (stream->Read(&buffer)) {
      if (ParseChunkBuffer(buffer, kCoordinatorMessageChunkField, &chunk)) {
        if (!add([&](TensorAssembler& a) { return a.Add(chunk.header, chunk.data); })) return;
        continue;
      }
      if (!BufferToMessage(buffer, &msg)) {
        return fail("the coordinator sent a malformed CoordinatorMessage");
      }
      Item item;
      switch (msg.kind_case()) {
        case v1::CoordinatorMessage::kMicrobatch:
          if (remaining != 0) return fail("a microbatch began before the previous one ended");
          pending = Item();
          pending.kind = Item::kBatch;
          pending.header = msg.microbatch();
          pending.step = msg.microbatch().step();
          remaining = msg.microbatch().num_tensors();
          if (remaining == 0) queue.Push(std::move(pending));
          break;
        case v1::CoordinatorMessage::kTensorChunk:  // another protobuf encoder's field order
          if (!add([&](TensorAssembler& a) { return a.Add(msg.tensor_chunk()); })) return;
          break;
        case v1::CoordinatorMessage::kCommit:
          item.kind = Item::kCommit;
          item.step = msg.commit().step();
          item.epoch = msg.commit().membership_epoch();
          item.checkpoint = msg.commit().checkpoint();
          queue.Push(std::move(item));
          break;
        case v1::CoordinatorMessage::kReform:
          if (remaining != 0) return fail("a Reform arrived inside a microbatch");
          newest_epoch = std::max<uint64_t>(newest_epoch, msg.reform().membership_epoch());
          item.kind = Item::kReform;
          item.reform = msg.reform();
          queue.Push(std::move(item));
          break;
        case v1::CoordinatorMessage::kShutdown:
          item.kind = Item::kShutdown;
          item.text = msg.shutdown().reason();
          item.job_finished = msg.shutdown().job_finished();
          queue.Push(std::move(item));
          return;
        default:
          break;
      }
    }
    fail("the coordinator closed the Train stream");
  });
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop = false;
  std::thread heartbeat([&] {
    const auto interval = std::chrono::milliseconds(
        static_cast<int64_t>(job.cluster.heartbeat_interval_seconds * 1000));
    std::unique_lock<std::mutex> lock(stop_mu);
    while (!stop_cv.wait_for(lock, interval, [&] { return stop; })) {
      v1::WorkerMessage m;
      m.mutable_heartbeat()->set_unix_millis(
          std::chrono::duration_cast<std::chrono::milliseconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count());
      write(m);
    }
  });

  // --- Membership: the collective of the current epoch ---
  uint64_t epoch = 0;  // 0: not a member yet
  int rank = -1, world = 0;
  bool broken = false;  // this epoch's collective failed: its steps are dropped until a Reform
  std::unique_ptr<GlooCollective> collective;
  std::unique_ptr<GradientReducer> reducer;
  const AbortCheck superseded = [&] { return newest_epoch.load() > epoch; };
  // Leaves the current group: uncommitted gradients are dropped (every member is then exactly
  // "after the last committed step"). The old group is never destroyed: it may be stuck in a
  // collective with a vanished peer, and its threads give up by themselves at the collective
  // timeout.
  auto leave_group = [&] {
    trainer.DiscardGradients();
    reducer.reset();
    (void)collective.release();
  };
  auto report_collective_failure = [&](uint64_t step, const absl::Status& why) {
    LOG(WARNING) << "epoch " << epoch << " step " << step << ": " << why.message()
                 << "; waiting for the coordinator to re-form the group";
    v1::WorkerMessage m;
    v1::CollectiveFailure* f = m.mutable_collective_failure();
    f->set_step(step);
    f->set_membership_epoch(epoch);
    f->set_error(std::string(why.message()));
    write(m);
    broken = true;
  };
  // Joins the group of a new epoch. OK, ABORTED (a newer epoch came meanwhile), UNAVAILABLE (the
  // group could not form: reported, the coordinator re-forms) or a fatal error.
  auto reform = [&](const v1::Reform& r) -> absl::Status {
    leave_group();
    epoch = r.membership_epoch();
    rank = static_cast<int>(r.rank());
    world = static_cast<int>(r.world_size());
    broken = false;
    const auto start = Clock::now();
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(r.store_prefix(), store);
    absl::StatusOr<std::unique_ptr<GlooCollective>> formed =
        GlooCollective::Create(prefixed, rank, world, gloo, superseded);
    if (!formed.ok()) return formed.status();
    collective = *std::move(formed);
    reducer = std::make_unique<GradientReducer>(params, collective.get(), reduction);
    FD_RETURN_IF_ERROR(
        SyncTrainingState(*drafter, trainer.optimizer(), *collective, r.sync_state(), superseded));
    LOG(INFO) << absl::StrFormat(
        "membership epoch %d: rank %d of %d from step %d%s (group formed in %.2f s)", epoch, rank,
        world, r.next_step(), r.sync_state() ? ", state synchronized from rank 0" : "",
        Since(start));
    return absl::OkStatus();
  };
  // Handles a Reform: true to go on, false with `result` set when the worker must stop.
  absl::Status result;
  auto handle_reform = [&](const v1::Reform& r) {
    absl::Status s = reform(r);
    if (s.ok() || absl::IsAborted(s)) return true;  // aborted: the newer Reform is queued
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
      report_collective_failure(r.next_step(), s);
      return true;
    }
    result = s;
    return false;
  };

  std::deque<Item> batches;  // items that arrived while waiting for a commit
  auto next_item = [&] {
    if (batches.empty()) return *queue.Pop();
    Item item = std::move(batches.front());
    batches.pop_front();
    return item;
  };
  // The end of the job (or of this worker's part in it): rank 0 exports a finished job's drafter.
  auto shutdown = [&](const Item& item) -> absl::Status {
    LOG(INFO) << "shutdown: " << item.text;
    if (!item.job_finished || rank != 0) return absl::OkStatus();
    const std::string dir = job.output_dir + "/drafter";
    FD_RETURN_IF_ERROR(ExportDrafter(*drafter, dir));
    LOG(INFO) << "exported the drafter to " << dir;
    return absl::OkStatus();
  };
  double last_optimizer_seconds = 0;
  bool done = false;
  while (!done && result.ok()) {
    auto wait_start = Clock::now();
    Item item = next_item();
    double wait = Since(wait_start);
    if (item.kind == Item::kShutdown) {
      result = shutdown(item);
      break;
    }
    if (item.kind == Item::kError) {
      result = absl::UnavailableError(item.text);
      break;
    }
    if (item.kind == Item::kReform) {
      if (!handle_reform(item.reform)) break;
      continue;
    }
    // A step of another epoch, or of one whose collective failed, is dropped: the coordinator
    // sends it again in the next epoch.
    if (item.kind != Item::kBatch || item.header.membership_epoch() != epoch || broken ||
        !reducer) {
      continue;
    }
    // The step's layout, from its first shard: this rank computes [offsets[rank],
    // offsets[rank+1]) in order.
    const v1::Microbatch first = item.header;
    const std::vector<int64_t> offsets(first.shard_offsets().begin(), first.shard_offsets().end());
    result = CheckShardLayout(first, offsets, rank, world, virtual_shards);
    if (!result.ok()) break;
    if (reduction.ordered) {
      result = reducer->BeginStep(first.num_shards(), offsets);
      if (!result.ok()) break;
    }
    v1::StepAck ack;
    ack.set_step(first.step());
    ack.set_membership_epoch(first.membership_epoch());
    double forward = 0, backward = 0;
    std::optional<Item> interrupt;  // a Reform, Shutdown or error that arrived mid-step
    for (int64_t shard = offsets[rank]; shard < offsets[rank + 1] && result.ok(); ++shard) {
      if (shard > offsets[rank]) {
        wait_start = Clock::now();
        item = next_item();
        wait += Since(wait_start);
        if (item.kind != Item::kBatch) {
          interrupt = std::move(item);
          break;
        }
      }
      const v1::Microbatch& h = item.header;
      if (h.step() != first.step() || h.shard() != shard ||
          h.membership_epoch() != first.membership_epoch()) {
        result = absl::DataLossError(absl::StrCat("expected shard ", shard, " of step ",
                                                  first.step(), ", the coordinator sent shard ",
                                                  h.shard(), " of step ", h.step()));
        break;
      }
      v1::ShardResult* out = ack.add_shards();
      out->set_shard(static_cast<uint32_t>(shard));
      for (int k = 1; k < job.drafter.block_size; ++k) {
        out->add_slot_correct(0);
        out->add_slot_total(0);
      }
      DrafterBatch batch{item.tensors["input_ids"], item.tensors["loss_mask"],
                         item.tensors["hidden_states"], item.tensors["anchors"]};
      // Gradients accumulate into the reducer's buckets, whose exchanges start during the last
      // shard's backward.
      reducer->Prepare();
      if (!batch.input_ids.defined() || batch.input_ids.size(0) == 0) continue;
      try {
        auto t = Clock::now();
        DrafterLossResult r = drafter->Loss(batch, gamma, h.global_weight_sum());
        forward += Since(t);
        if (shard == offsets[rank]) MaybeFault(fault, "forward", first.step(), rank, epoch);
        t = Clock::now();
        r.loss.backward();
        backward += Since(t);
        out->set_weighted_loss_sum(r.weighted_ce_sum);
        out->set_weight_sum(r.weight_sum);
        out->set_tokens(r.tokens);
        for (size_t k = 0;
             k < r.slot_total.size() && k < static_cast<size_t>(out->slot_total_size()); ++k) {
          out->set_slot_correct(static_cast<int>(k), r.slot_correct[k]);
          out->set_slot_total(static_cast<int>(k), r.slot_total[k]);
        }
      } catch (const std::exception& e) {
        result = absl::InternalError(absl::StrCat("step ", first.step(), " shard ", shard,
                                                  ": forward/backward failed: ", e.what()));
      }
    }
    if (!result.ok()) break;
    if (interrupt) {
      // The step cannot finish in this epoch: drop it and handle what interrupted it.
      trainer.DiscardGradients();
      batches.push_front(std::move(*interrupt));
      continue;
    }
    // Every rank takes part in every reduction. What is timed is the part of the exchange that
    // backward did not hide.
    auto t = Clock::now();
    MaybeFault(fault, "reduce", first.step(), rank, epoch);  // its buckets are in flight
    absl::Status reduced = reducer->Finish(superseded);
    if (!reduced.ok()) {
      trainer.DiscardGradients();
      if (!absl::IsAborted(reduced)) report_collective_failure(first.step(), reduced);
      continue;
    }
    v1::PhaseTimings* timings = ack.mutable_timings();
    timings->set_wait_seconds(wait);
    timings->set_forward_seconds(forward);
    timings->set_backward_seconds(backward);
    timings->set_allreduce_seconds(Since(t));
    timings->set_optimizer_seconds(last_optimizer_seconds);  // the previous step's
    ack.set_collective_bytes(reducer->bytes_sent());
    v1::WorkerMessage m;
    *m.mutable_ack() = ack;
    if (!write(m)) {
      // The coordinator ended the stream; a Shutdown it sent before says whether that is the end
      // (a step computed while the job was stopping is simply not acked).
      while (true) {
        Item next = next_item();
        if (next.kind == Item::kShutdown) {
          result = shutdown(next);
          break;
        }
        if (next.kind == Item::kError) {
          result = absl::UnavailableError(next.text);
          break;
        }
      }
      break;
    }
    // Only the commit makes the step real (DESIGN.md §2): until then gradients stay aside.
    while (true) {
      Item next = *queue.Pop();
      if (next.kind == Item::kBatch) {
        batches.push_back(std::move(next));
      } else if (next.kind == Item::kCommit && next.step == first.step() && next.epoch == epoch) {
        t = Clock::now();
        trainer.ApplyWithLearningRate(first.learning_rate());
        last_optimizer_seconds = Since(t);
        if (next.checkpoint && rank == 0) {
          result = UploadCheckpoint(*drafter, trainer.optimizer(), first.step() + 1, write, [&] {
            MaybeFault(fault, "upload", first.step() + 1, rank, epoch);
          });
        }
        break;
      } else if (next.kind == Item::kCommit) {
        continue;  // of another epoch
      } else if (next.kind == Item::kReform) {
        // The step will not commit in this epoch: every member drops it (leaving the group
        // discards its gradients).
        batches.clear();  // all of older epochs
        if (!handle_reform(next.reform)) done = true;
        break;
      } else if (next.kind == Item::kShutdown) {
        trainer.DiscardGradients();
        LOG(INFO) << "shutdown before commit of step " << first.step() << ": " << next.text;
        done = true;
        break;
      } else if (next.kind == Item::kError) {
        result = absl::UnavailableError(next.text);
        break;
      }
    }
  }
  if (!result.ok()) {
    v1::WorkerMessage m;
    m.set_error(std::string(result.message()));
    write(m);
  }
  {
    std::lock_guard<std::mutex> lock(stop_mu);
    stop = true;
  }
  stop_cv.notify_all();
  heartbeat.join();
  {
    std::lock_guard<std::mutex> lock(write_mu);
    stream->WritesDone();
  }
  if (!result.ok()) stream_ctx.TryCancel();
  reader.join();
  stream->Finish();
  // A group that may be stuck with a vanished peer is left to its own threads.
  reducer.reset();
  (void)collective.release();
  return result;
}

}  // namespace

absl::Status RunWorker(const WorkerOptions& o) {
  // A coordinator that goes away (crashed, restarted with --resume, or this worker was dropped
  // as hung) is joined again, with back-off, until reconnect_timeout_seconds pass without a
  // session; the new session starts from what the coordinator serves (its checkpoint).
  double backoff = 0.5;
  auto lost_at = std::chrono::steady_clock::now();
  while (true) {
    const auto started = std::chrono::steady_clock::now();
    absl::Status s = RunSession(o);
    if (!absl::IsUnavailable(s)) return s;
    const auto now = std::chrono::steady_clock::now();
    if (now - started > std::chrono::seconds(5)) {  // it trained: a fresh loss
      lost_at = now;
      backoff = 0.5;
    }
    const double waited = std::chrono::duration<double>(now - lost_at).count();
    if (waited + backoff > o.reconnect_timeout_seconds) return s;
    LOG(WARNING) << s.message() << "; joining again in " << backoff << " s (for up to "
                 << o.reconnect_timeout_seconds - waited << " s more)";
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, 8.0);
  }
}

}  // namespace flashdraft
