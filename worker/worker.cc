#include "worker/worker.h"

#include <grpcpp/grpcpp.h>
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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/blocking_queue.h"
#include "common/chunk_wire.h"
#include "common/grpc_options.h"
#include "common/job_config.h"
#include "common/net_util.h"
#include "common/raw_client_stream.h"
#include "common/shard_tree.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"
#include "glog/logging.h"
#include "model/export.h"
#include "model/trainer.h"
#include "model/wire_tensor.h"
#include "worker/collective/gloo_collective.h"
#include "worker/fault.h"
#include "worker/gradient_reducer.h"
#include "worker/grpc_store.h"
#include "worker/training_state.h"

namespace flashdraft {
namespace {

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

// What the training thread is doing, for the heartbeats (Heartbeat.progress/phase/step/busy): the
// counter grows at every phase change, so the coordinator sees a thread that stopped moving.
struct Progress {
  std::atomic<uint64_t> counter{0};
  std::atomic<const char*> phase{"idle"};
  std::atomic<uint64_t> step{0};
  std::atomic<bool> busy{false};

  // `busy`: computing on its own; waits (for the coordinator, for peers) are not busy.
  void Enter(const char* name, uint64_t at_step, bool is_busy) {
    phase = name;
    step = at_step;
    busy = is_busy;
    ++counter;
  }
};

// Set by RequestLeave (SIGTERM): leave the job at the next step boundary.
std::atomic<bool> g_leave_requested{false};

// Sleeps up to `seconds`, waking early when asked to leave.
void SleepUnlessLeaving(double seconds) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(seconds));
  while (!g_leave_requested && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
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

// One session with one coordinator process: join, fetch, train until the job ends. UNAVAILABLE
// when the coordinator could not be reached or went away (RunWorker joins again).
absl::Status RunSession(const WorkerOptions& o) {
  FD_ASSIGN_OR_RETURN(const FaultPlan fault, ParseFault(std::getenv("FLASHDRAFT_FAULT")));
  auto channel = grpc::CreateCustomChannel(o.coordinator, grpc::InsecureChannelCredentials(),
                                           ClientChannelArguments());
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
  // Short attempts up to connect_timeout_seconds, so that a SIGTERM meanwhile is seen.
  const auto join_start = Clock::now();
  while (true) {
    if (g_leave_requested) {
      LOG(INFO) << "asked to leave before joining";
      return absl::OkStatus();
    }
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc::Status s = stub->Join(&ctx, join, &reply);
    if (s.ok()) break;
    const bool retry = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                       s.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!retry || Since(join_start) > o.connect_timeout_seconds) {
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
  FD_ASSIGN_OR_RETURN(auto fetched, FetchTensors(channel, token, o.fetch_timeout_seconds));
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
  RawClientStream stream(channel, "/flashdraft.v1.Coordinator/Train", &stream_ctx);
  // From the training, heartbeat and upload threads; one message at a time.
  const std::function<bool(v1::WorkerMessage&)> write = [&](v1::WorkerMessage& m) {
    m.set_worker_id(join.worker_id());
    m.set_session_token(token);
    return stream.Write(MessageToBuffer(m));
  };
  {
    v1::WorkerMessage hello;
    hello.mutable_heartbeat()->set_unix_millis(0);
    if (!write(hello)) return absl::UnavailableError("the coordinator closed the Train stream");
  }
  // The newest membership epoch announced: a collective of an older one is abandoned at once
  // (the maximum once the session is over: a Shutdown came or the stream broke).
  std::atomic<uint64_t> newest_epoch{0};
  constexpr uint64_t kSessionOver = ~uint64_t{0};
  std::atomic<bool> stream_lost{false};  // the stream ended without a Shutdown
  // The reader thread receives, parses and assembles tensors (CRC + one copy straight out of
  // gRPC's buffers, while they are still in this core's cache); the training thread consumes whole
  // microbatches. (A separate decoder thread measured slower: the chunk's bytes had to move to
  // another core first.)
  ItemQueue queue;
  std::thread reader([&] {
    auto fail = [&](std::string why) {
      newest_epoch = kSessionOver;
      stream_lost = true;
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
    while (stream.Read(&buffer)) {
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
          newest_epoch = kSessionOver;
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
  Progress progress;
  // Heartbeats with the training thread's progress, the leave request (SIGTERM), and a watchdog:
  // once the stream is gone, a training thread that makes no progress for
  // cluster.stall_timeout_seconds is stuck for good (a hung kernel or collective it cannot be
  // pulled out of), and the only safe way out is to exit, so that a supervisor starts this worker
  // again and it joins as new.
  std::thread heartbeat([&] {
    const double interval = job.cluster.heartbeat_interval_seconds;
    auto next = Clock::now();
    bool leave_sent = false, write_failed = false;
    std::optional<std::pair<uint64_t, Clock::time_point>> stalled;  // progress when the stream died
    std::unique_lock<std::mutex> lock(stop_mu);
    while (!stop_cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop; })) {
      lock.unlock();
      if (g_leave_requested && !leave_sent) {
        LOG(INFO) << "asked to leave: leaving at the next step boundary";
        v1::WorkerMessage m;
        m.mutable_leave()->set_reason("SIGTERM");
        write(m);
        leave_sent = true;
      }
      if (stream_lost) {
        if (!stalled || stalled->first != progress.counter) {
          stalled.emplace(progress.counter.load(), Clock::now());
        } else if (progress.busy && Since(stalled->second) > job.cluster.stall_timeout_seconds) {
          LOG(ERROR) << "the training thread is stuck in " << progress.phase.load() << " of step "
                     << progress.step << " and the coordinator is gone; exiting (code 3) so that "
                     << "a supervisor starts this worker again";
          google::FlushLogFiles(google::GLOG_INFO);
          _exit(3);
        }
      }
      if (Clock::now() >= next) {
        next = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(interval * 1000));
        v1::WorkerMessage m;
        v1::Heartbeat* h = m.mutable_heartbeat();
        h->set_unix_millis(std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count());
        h->set_progress(progress.counter);
        h->set_phase(progress.phase.load());
        h->set_step(progress.step);
        h->set_busy(progress.busy);
        if (!write(m) && !write_failed) {
          LOG(WARNING) << "a heartbeat could not be written: the Train stream is gone";
          write_failed = true;
        }
      }
      lock.lock();
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
    progress.Enter("reform", r.next_step(), /*is_busy=*/false);
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
  // A Shutdown or the end of the stream ends the session: true, with `result` set.
  auto session_ends = [&](const Item& item) {
    if (item.kind == Item::kShutdown) {
      result = shutdown(item);
      return true;
    }
    if (item.kind == Item::kError) {
      result = absl::UnavailableError(item.text);
      return true;
    }
    return false;
  };
  // The checkpoint being sent (rank 0 sends its snapshot while training goes on).
  std::thread upload;
  auto finish_upload = [&] {
    if (upload.joinable()) upload.join();
  };
  double last_optimizer_seconds = 0;
  uint64_t last_step = 0;
  bool done = false;
  while (!done && result.ok()) {
    progress.Enter("idle", last_step, /*is_busy=*/false);
    auto wait_start = Clock::now();
    Item item = next_item();
    double wait = Since(wait_start);
    if (session_ends(item)) break;
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
    last_step = first.step();
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
        progress.Enter("forward", first.step(), true);
        DrafterLossResult r = drafter->Loss(batch, gamma, h.global_weight_sum());
        forward += Since(t);
        if (shard == offsets[rank]) MaybeFault(fault, "forward", first.step(), rank, epoch);
        t = Clock::now();
        progress.Enter("backward", first.step(), true);
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
    progress.Enter("reduce", first.step(), false);           // waits for its peers
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
      while (!session_ends(next_item())) {
      }
      break;
    }
    // Only the commit makes the step real (DESIGN.md §2): until then gradients stay aside.
    progress.Enter("idle", first.step(), false);
    while (true) {
      Item next = *queue.Pop();
      if (next.kind == Item::kBatch) {
        batches.push_back(std::move(next));
      } else if (next.kind == Item::kCommit && next.step == first.step() && next.epoch == epoch) {
        t = Clock::now();
        progress.Enter("optimizer", first.step(), true);
        trainer.ApplyWithLearningRate(first.learning_rate());
        last_optimizer_seconds = Since(t);
        if (next.checkpoint && rank == 0) {
          finish_upload();  // one at a time
          progress.Enter("snapshot", first.step(), true);
          upload = std::thread([&, snapshot = SnapshotState(*drafter, trainer.optimizer()),
                                completed = first.step() + 1, at_epoch = epoch, at_rank = rank] {
            absl::Status sent = SendCheckpoint(snapshot, completed, write, [&] {
              MaybeFault(fault, "upload", completed, at_rank, at_epoch);
            });
            if (!sent.ok()) {
              LOG(WARNING) << "checkpoint upload after step " << completed << ": "
                           << sent.message();
            }
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
  if (!result.ok()) stream_ctx.TryCancel();
  finish_upload();
  stream.WritesDone();
  reader.join();
  stream.Finish();
  // A group that may be stuck with a vanished peer is left to its own threads.
  reducer.reset();
  (void)collective.release();
  return result;
}

}  // namespace

void RequestLeave() { g_leave_requested = true; }

absl::Status RunWorker(const WorkerOptions& o) {
  // A coordinator that goes away (crashed, restarted with --resume, or this worker was dropped
  // as hung) is joined again, with back-off, until reconnect_timeout_seconds pass without a
  // session; the new session starts from what the coordinator serves (its checkpoint).
  double backoff = 0.5;
  auto lost_at = std::chrono::steady_clock::now();
  while (true) {
    const auto started = std::chrono::steady_clock::now();
    absl::Status s = RunSession(o);
    if (g_leave_requested && (s.ok() || absl::IsUnavailable(s))) {
      LOG(INFO) << "left the job (SIGTERM)";
      return absl::OkStatus();
    }
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
    SleepUnlessLeaving(backoff);
    backoff = std::min(backoff * 2, 8.0);
  }
}

}  // namespace flashdraft
