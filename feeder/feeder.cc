#include "feeder/feeder.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/call_retry.h"
#include "common/clock.h"
#include "common/cuda_util.h"
#include "common/file_util.h"
#include "common/grpc_options.h"
#include "common/job_config.h"
#include "common/net_util.h"
#include "common/numeric_env.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "common/target_fingerprint.h"
#include "coordinator/sources/regeneration_cache.h"
#include "coordinator/sources/target_features.h"
#include "feeder/feeder_metrics.h"
#include "feeder/feeder_service.h"
#include "feeder/shard_builder.h"
#include "feeder/shard_store.h"
#include "flashdraft/v1/feeder.grpc.pb.h"
#include "glog/logging.h"
#include "model/chat_data.h"
#include "model/numeric_probe.h"

namespace flashdraft {
namespace {

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

class FeederProcess {
 public:
  explicit FeederProcess(const FeederOptions& o) : o_(o) {}

  absl::Status Run() {
    FD_RETURN_IF_ERROR(Serve());
    FD_RETURN_IF_ERROR(JoinJob());
    FD_ASSIGN_OR_RETURN(const int64_t expected, CheckMemory());
    FD_RETURN_IF_ERROR(ServeMetrics());
    FD_RETURN_IF_ERROR(OpenTarget());
    const absl::Status result = Feed();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    LOG(INFO) << "peak memory: " << (PeakResidentBytes() >> 20) << " MiB"
              << (expected > 0 ? absl::StrCat(" (expected ", expected >> 20, " MiB)") : "");
    return result;
  }

 private:
  using FeedStream = grpc::ClientReaderWriter<v1::FeederMessage, v1::FeedMessage>;

  absl::Status Serve();
  absl::Status JoinJob();
  // This process's expected peak memory for the job (0: not known), refused where this host
  // cannot hold it, before the target loads.
  absl::StatusOr<int64_t> CheckMemory() const;
  // The /metrics the job (or --metrics-listen) asks for, once the job is known.
  absl::Status ServeMetrics();
  absl::Status OpenTarget();
  absl::Status Feed();
  // The Feed stream's messages until a Shutdown (OK), the stream's end or a bad assignment.
  absl::Status ReadWork();
  void Compute();
  // data.regenerate: answers the lines the Feed stream sends (RegenerateWork) until the stop.
  void RegenerateLines() ABSL_LOCKS_EXCLUDED(stop_mu_);
  absl::StatusOr<v1::RegeneratedLine> RegenerateLine(std::unique_ptr<ChatLineReader>& reader,
                                                     const v1::RegenerateWork& work);
  // Marks a computation (a shard or a line) as running since now, for FeederStatus; the returned
  // mark ends it (EndComputing).
  std::multiset<double>::iterator StartComputing(double now) ABSL_LOCKS_EXCLUDED(computing_mu_);
  void EndComputing(std::multiset<double>::iterator mark) ABSL_LOCKS_EXCLUDED(computing_mu_);
  // How long the oldest shard in computation has been computing (0: none is).
  double ComputingSeconds() ABSL_LOCKS_EXCLUDED(computing_mu_);
  // A computation failed: the coordinator hears why, and the stream ends (its work goes to the
  // other feeders).
  void Fail(const absl::Status& error) ABSL_LOCKS_EXCLUDED(stop_mu_);
  void ReportStatus(bool first) ABSL_LOCKS_EXCLUDED(write_mu_);
  void ReportLoop() ABSL_LOCKS_EXCLUDED(stop_mu_);
  void SendError(const std::string& error) ABSL_LOCKS_EXCLUDED(write_mu_);

  const FeederOptions& o_;
  TargetFingerprintValue fingerprint_;
  std::string gpu_;  // GPU 0's name; empty: none
  NumericEnv numerics_;
  std::unique_ptr<ServerSecurity> server_security_;
  std::unique_ptr<ShardStore> store_;
  // Made before the service (which counts the bytes it sends); it serves once the job is known.
  std::unique_ptr<FeederMetrics> metrics_;
  std::string metrics_address_;  // where Prometheus reaches it; empty: not served
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string advertise_;
  std::unique_ptr<v1::FeederControl::Stub> stub_;
  std::string token_;
  JobConfig job_;
  std::unique_ptr<TargetFeatures> features_;
  FeatureLayout layout_;
  grpc::ClientContext feed_ctx_;
  std::unique_ptr<FeedStream> stream_;
  absl::Mutex write_mu_;  // one writer at a time on stream_
  absl::Mutex computing_mu_;
  // When each computation in progress started (one per busy compute thread).
  std::multiset<double> computing_ ABSL_GUARDED_BY(computing_mu_);
  absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  absl::Status compute_error_ ABSL_GUARDED_BY(stop_mu_);
  std::deque<v1::RegenerateWork> lines_ ABSL_GUARDED_BY(stop_mu_);  // to regenerate
};

// The FetchShard service first, so that the join can say where it is.
absl::Status FeederProcess::Serve() {
  FD_ASSIGN_OR_RETURN(fingerprint_, FingerprintTarget(o_.target_path));
  if (o_.security.tls() && (o_.serve_tls_cert.empty() || o_.serve_tls_key.empty())) {
    return absl::InvalidArgumentError(
        "the job uses TLS: the feeder's service needs --serve-tls-cert and --serve-tls-key "
        "(deploy/make-certs.sh issues them)");
  }
  SecurityConfig serve;
  serve.tls_cert = o_.serve_tls_cert;
  serve.tls_key = o_.serve_tls_key;
  serve.tls_ca = o_.security.tls_ca;
  serve.client_auth = !o_.security.tls_cert.empty();  // workers present their client certificate
  serve.token_file = o_.security.token_file;
  FD_ASSIGN_OR_RETURN(server_security_, ServerSecurity::Create(serve, RealClock::Get()));
  store_ = std::make_unique<ShardStore>(o_.max_bytes);
  // Its GPU's name whether or not the job runs the target there: the coordinator, which knows
  // target.device, compares it with its own.
  gpu_ = CudaDeviceCount() > 0 ? CudaDeviceName(0) : "";
  numerics_ = ProbeNumericEnv(gpu_);
  metrics_ =
      std::make_unique<FeederMetrics>(gpu_.empty() ? "cpu" : "cuda", NumericEnvLabels(numerics_));
  service_ = NewFeederService(*store_, *server_security_, metrics_.get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(o_.listen, server_security_->credentials(), &port);
  ConfigureServer(builder);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o_.listen));
  advertise_ = o_.advertise;
  if (advertise_.empty()) {
    advertise_ = ScrapeAddress(o_.listen, port, LocalAddressToward(o_.coordinator).value_or(""));
  } else if (advertise_.find(':') == std::string::npos) {  // a host: with the bound port
    advertise_ = absl::StrCat(advertise_, ":", port);
  }
  if (!o_.port_file.empty()) {
    FD_RETURN_IF_ERROR(WriteFileAtomically(o_.port_file, absl::StrCat(port, "\n")));
  }
  LOG(INFO) << "FetchShard on " << o_.listen << ", port " << port << " (workers reach it at "
            << advertise_ << "); security: " << server_security_->description();
  return absl::OkStatus();
}

absl::Status FeederProcess::JoinJob() {
  FD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                      CreateSecureChannel(o_.coordinator, o_.security));
  stub_ = v1::FeederControl::NewStub(channel);
  v1::FeederJoinRequest join;
  join.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  join.set_feeder_id(o_.feeder_id.empty() ? absl::StrCat(HostName(), ":", getpid()) : o_.feeder_id);
  join.mutable_capability()->set_hostname(HostName());
  join.mutable_capability()->set_device(
      gpu_.empty() ? "cpu" : "cuda x" + std::to_string(CudaDeviceCount()));
  NumericEnvToProto(numerics_, join.mutable_capability()->mutable_numerics());
  join.set_serve_address(advertise_);
  join.mutable_target()->set_config_sha256(fingerprint_.config_sha256);
  join.mutable_target()->set_tensors_sha256(fingerprint_.tensors_sha256);
  // Its tokenizer (none: not set): a job that regenerates its replies admits only its own.
  const absl::StatusOr<uint32_t> tokenizer = FileCrc32c(o_.target_path + "/tokenizer.json");
  if (tokenizer.ok()) join.set_tokenizer_crc32c(*tokenizer);
  v1::FeederJoinReply reply;
  const grpc::Status s = *CallUntilReachable(
      RealClock::Get(), o_.connect_timeout_seconds,
      [&](grpc::ClientContext& ctx) { return stub_->JoinFeeder(&ctx, join, &reply); },
      [] { return false; });
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot join the coordinator at ", o_.coordinator, ": ", s.error_message()));
  }
  if (!reply.accepted()) {
    return absl::FailedPreconditionError(
        absl::StrCat("refused by the coordinator: ", reply.reason()));
  }
  token_ = reply.session_token();
  FD_ASSIGN_OR_RETURN(job_, ParseJobConfig(reply.job_config_yaml(), "the coordinator's job"));
  LOG(INFO) << "joined job '" << job_.name << "' as " << join.feeder_id();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FeederProcess::CheckMemory() const {
  JobConfig job = job_;
  job.target.path = o_.target_path;
  absl::StatusOr<MemoryInputs> inputs = MemoryInputsForJob(job);
  if (!inputs.ok()) return 0;  // opening the target names what is missing
  // --max-bytes is at most 2^50 (main.cc's check): it fits an int64_t.
  JobMemory memory = EstimateJobMemory(job, *inputs, job.cluster.max_workers, 1,
                                       static_cast<int64_t>(o_.max_bytes));
  memory.coordinator.parts.clear();  // this process only
  memory.workers = 0;
  LOG(INFO) << "expected peak memory: " << (memory.feeder.HostBytes() >> 20) << " MiB";
  FD_RETURN_IF_ERROR(CheckJobFits(memory, AvailableHostMemory(), "this host"));
  return memory.feeder.HostBytes();
}

absl::Status FeederProcess::ServeMetrics() {
  const bool from_flag = !o_.metrics_listen.empty();
  const std::string listen = from_flag ? o_.metrics_listen : job_.metrics.worker_listen;
  if (!job_.metrics.enabled || listen.empty() || listen == "off") return absl::OkStatus();
  absl::StatusOr<int> port =
      metrics_->Serve(listen, from_flag ? "--metrics-listen" : "metrics.worker_listen");
  if (!port.ok()) return absl::FailedPreconditionError(port.status().message());
  metrics_address_ = ScrapeAddress(listen, *port, LocalAddressToward(o_.coordinator).value_or(""));
  if (!o_.metrics_port_file.empty()) {
    FD_RETURN_IF_ERROR(WriteFileAtomically(o_.metrics_port_file, absl::StrCat(*port, "\n")));
  }
  LOG(INFO) << "/metrics on " << listen << ", port " << *port;
  return absl::OkStatus();
}

absl::Status FeederProcess::OpenTarget() {
  // The job's thread count, as the coordinator computes the target with it: a feeder in a container
  // of another core count computes the same bits (--threads computes that many shards at once).
  PinComputeThreads(job_.train.intra_op_threads);
  FD_ASSIGN_OR_RETURN(features_,
                      TargetFeatures::Open(TargetFeatureOptionsFor(job_, o_.target_path)));
  layout_ = {features_->feature_size(), features_->feature_dtype(), job_.data.max_seq_len,
             features_->teacher_size()};
  return absl::OkStatus();
}

absl::Status FeederProcess::Feed() {
  stream_ = stub_->Feed(&feed_ctx_);
  ReportStatus(/*first=*/true);
  metrics_->health().Ready(true, absl::StrCat("feeding job '", job_.name, "'"));
  std::vector<std::thread> computing;
  for (int i = 0; i < std::max(1, o_.threads); ++i) computing.emplace_back([this] { Compute(); });
  // One generation at a time: each holds a KV cache (the memory estimate counts one).
  if (job_.data.regenerate) computing.emplace_back([this] { RegenerateLines(); });
  std::thread reporting([this] { ReportLoop(); });
  absl::Status result = ReadWork();
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
    if (result.ok() && !compute_error_.ok()) result = compute_error_;
  }
  store_->Shutdown(result.ok() ? absl::CancelledError("the job is over") : result);
  for (std::thread& t : computing) t.join();
  reporting.join();
  {
    absl::MutexLock lock(&write_mu_);
    stream_->WritesDone();
  }
  feed_ctx_.TryCancel();
  stream_->Finish();
  return result;
}

absl::Status FeederProcess::ReadWork() {
  v1::FeedMessage m;
  bool regenerating = false;
  while (stream_->Read(&m)) {
    switch (m.kind_case()) {
      case v1::FeedMessage::kWork: {
        absl::StatusOr<uint64_t> bytes = ShardFeatureBytes(m.work(), layout_);
        absl::Status s =
            bytes.ok() ? store_->Assign(std::move(*m.mutable_work()), *bytes) : bytes.status();
        if (!s.ok()) {
          SendError(std::string(s.message()));
          return s;
        }
        break;
      }
      case v1::FeedMessage::kRelease:
        store_->Release(m.release().committed_steps());
        break;
      case v1::FeedMessage::kRegenerate: {
        if (!regenerating) LOG(INFO) << "regenerating the replies of data lines (data.regenerate)";
        regenerating = true;
        absl::MutexLock lock(&stop_mu_);
        lines_.push_back(std::move(*m.mutable_regenerate()));
        break;
      }
      case v1::FeedMessage::kShutdown:
        LOG(INFO) << "shut down by the coordinator: " << m.shutdown().reason();
        return absl::OkStatus();
      default:
        break;
    }
  }
  absl::MutexLock lock(&stop_mu_);
  if (!compute_error_.ok()) return compute_error_;
  return absl::UnavailableError(
      absl::StrCat("the coordinator at ", o_.coordinator, " ended the Feed stream"));
}

std::multiset<double>::iterator FeederProcess::StartComputing(double now) {
  absl::MutexLock lock(&computing_mu_);
  return computing_.insert(now);
}

void FeederProcess::EndComputing(std::multiset<double>::iterator mark) {
  absl::MutexLock lock(&computing_mu_);
  computing_.erase(mark);
}

double FeederProcess::ComputingSeconds() {
  absl::MutexLock lock(&computing_mu_);
  return computing_.empty() ? 0 : RealClock::Get().Now() - *computing_.begin();
}

void FeederProcess::Fail(const absl::Status& error) {
  SendError(std::string(error.message()));
  {
    absl::MutexLock lock(&stop_mu_);
    if (compute_error_.ok()) compute_error_ = error;
  }
  feed_ctx_.TryCancel();
}

void FeederProcess::Compute() {
  const ComputeFeatures compute = [this](const std::vector<int64_t>& ids) {
    return features_->Compute(ids);
  };
  while (std::optional<ShardStore::Pending> p = store_->NextToCompute()) {
    const double started = RealClock::Get().Now();
    const auto mark = StartComputing(started);
    absl::StatusOr<std::vector<grpc::ByteBuffer>> chunks = BuildShard(p->work, layout_, compute);
    if (o_.slow_ms_per_sample > 0) {  // FLASHDRAFT_FAULT=slow-feeder: a slower device
      absl::SleepFor(absl::Milliseconds(o_.slow_ms_per_sample * p->work.samples_size()) -
                     absl::Seconds(RealClock::Get().Now() - started));
    }
    if (chunks.ok()) {
      int64_t tokens = 0;
      for (const v1::FeedSample& sample : p->work.samples()) tokens += sample.length();
      metrics_->RecordShard(p->work.samples_size(), tokens, RealClock::Get().Now() - started);
    } else {
      // The feeder is broken (out of memory, a bad model).
      LOG(ERROR) << "step " << p->key.step << " shard " << p->key.shard << ": " << chunks.status();
      Fail(chunks.status());
    }
    EndComputing(mark);
    store_->Complete(p->key, std::move(chunks));
  }
}

absl::StatusOr<v1::RegeneratedLine> FeederProcess::RegenerateLine(
    std::unique_ptr<ChatLineReader>& reader, const v1::RegenerateWork& work) {
  const std::string tokenizer = o_.target_path + "/tokenizer.json";
  if (reader == nullptr) {  // every line of a job has the job's max_new_tokens and chat options
    reader = std::make_unique<ChatLineReader>(
        ChatDataOptions{o_.target_path, tokenizer, work.max_new_tokens(),
                        ChatRenderOptions{!work.disable_thinking(), work.system_prompt()}},
        features_->model());
  }
  std::vector<int64_t> ids, mask;
  bool is_chat = false;
  const int64_t vocab = features_->model().config().vocab_size;
  if (absl::Status s = reader->Parse(work.text(), vocab, /*regenerate=*/true, ids, mask, &is_chat);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("line ", work.line(), ": ", s.message()));
  }
  v1::RegeneratedLine out;
  out.set_line(work.line());
  out.mutable_input_ids()->Assign(ids.begin(), ids.end());
  std::string* bytes = out.mutable_loss_mask();
  for (const int64_t m : mask) bytes->push_back(static_cast<char>(m));
  return out;
}

void FeederProcess::RegenerateLines() {
  std::unique_ptr<ChatLineReader> reader;  // its own: a reader is not thread-safe
  while (true) {
    v1::RegenerateWork work;
    {
      absl::MutexLock lock(&stop_mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(stop_mu_) { return stop_ || !lines_.empty(); };
      stop_mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      work = std::move(lines_.front());
      lines_.pop_front();
    }
    // Not a computation the stall watch times (FeederStatus.computing_seconds): a long chat's
    // replies may rightly take longer than any shard.
    const double started = RealClock::Get().Now();
    absl::StatusOr<v1::RegeneratedLine> line = RegenerateLine(reader, work);
    if (o_.slow_ms_per_sample > 0) {  // FLASHDRAFT_FAULT=slow-feeder: a slower device
      absl::SleepFor(absl::Milliseconds(o_.slow_ms_per_sample) -
                     absl::Seconds(RealClock::Get().Now() - started));
    }
    if (!line.ok()) {
      LOG(ERROR) << "regenerating: " << line.status();
      Fail(line.status());
      return;
    }
    int64_t reply_tokens = 0;
    for (const char m : line->loss_mask()) reply_tokens += m != 0;
    metrics_->RecordRegenerated(reply_tokens, RealClock::Get().Now() - started);
    v1::FeederMessage m;
    m.set_session_token(token_);
    *m.mutable_regenerated() = std::move(*line);
    absl::MutexLock lock(&write_mu_);
    stream_->Write(m);
  }
}

void FeederProcess::ReportStatus(bool first) {
  const ShardStore::Stats stats = store_->stats();
  v1::FeederMessage m;
  m.set_session_token(token_);
  v1::FeederStatus* s = m.mutable_status();
  s->set_unix_millis(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  s->set_held_bytes(stats.held_bytes);
  s->set_shards_computed(stats.computed);
  s->set_shards_pending(stats.pending);
  if (const double computing = ComputingSeconds(); computing > 0) {
    s->set_computing_seconds(computing);
  }
  metrics_->SetStore(stats.held_bytes, o_.max_bytes, stats.pending);
  if (first) {
    m.set_feeder_id(o_.feeder_id);
    s->set_metrics_address(metrics_address_);
  }
  absl::MutexLock lock(&write_mu_);
  stream_->Write(m);
}

void FeederProcess::ReportLoop() {
  const double interval = std::max(0.05, job_.cluster.heartbeat_interval_seconds);
  const Clock& clock = RealClock::Get();
  while (true) {
    {
      absl::MutexLock lock(&stop_mu_);
      auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stop_mu_) { return stop_; };
      if (clock.AwaitUntil(stop_mu_, absl::Condition(&stopped), clock.Now() + interval)) return;
    }
    ReportStatus(/*first=*/false);
    // Live while this thread reports and no shard computes longer than the coordinator's stall
    // watch allows (it drops the feeder then; /healthz says why to whoever probes it).
    const double computing = ComputingSeconds();
    if (computing > job_.cluster.stall_timeout_seconds) {
      metrics_->health().Stuck(
          absl::StrFormat("a shard has been computing for %.0f s (cluster.stall_timeout_seconds: "
                          "%g)",
                          computing, job_.cluster.stall_timeout_seconds));
    } else {
      metrics_->health().Alive(job_.cluster.heartbeat_timeout_seconds,
                               "the feeder's status thread");
    }
  }
}

void FeederProcess::SendError(const std::string& error) {
  v1::FeederMessage m;
  m.set_session_token(token_);
  m.set_error(error);
  absl::MutexLock lock(&write_mu_);
  stream_->Write(m);
}

}  // namespace

absl::Status RunFeeder(const FeederOptions& options) {
  if (options.target_path.empty()) {
    return absl::InvalidArgumentError("--target is required: the job's target folder on this host");
  }
  FeederProcess process(options);
  return process.Run();
}

}  // namespace flashdraft
