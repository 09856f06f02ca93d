#include "coordinator/feeder_pool.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/chunk_wire.h"
#include "common/random_token.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "coordinator/sources/regeneration_cache.h"
#include "glog/logging.h"

namespace flashdraft {
namespace {

constexpr size_t kMaxIdBytes = 256;
constexpr size_t kMaxAddressBytes = 512;

grpc::ByteBuffer Encode(const v1::FeedMessage& m) { return MessageToBuffer(m); }

}  // namespace

std::string FeederRefusal(const v1::FeederJoinRequest& r, const FeederPoolOptions& o) {
  if (r.protocol_version() != v1::PROTOCOL_VERSION_CURRENT) {
    return absl::StrCat("protocol version ", r.protocol_version(), " (this coordinator speaks ",
                        v1::PROTOCOL_VERSION_CURRENT, ")");
  }
  if (r.feeder_id().empty() || r.feeder_id().size() > kMaxIdBytes) {
    return absl::StrCat("a feeder id of 1..", kMaxIdBytes, " bytes is required");
  }
  if (r.serve_address().empty()) {
    return "no serve_address: workers could not reach its FetchShard service";
  }
  if (r.serve_address().size() > kMaxAddressBytes) {
    return absl::StrCat("serve_address of ", r.serve_address().size(), " bytes (at most ",
                        kMaxAddressBytes, ")");
  }
  if (r.target().config_sha256() != o.target.config_sha256) {
    return absl::StrCat("its target's config.json (sha256 ", Untrusted(r.target().config_sha256()),
                        ") is not the job's (", o.target.config_sha256, ")");
  }
  if (r.target().tensors_sha256() != o.target.tensors_sha256) {
    return absl::StrCat("its target's tensors (names, dtypes, shapes; sha256 ",
                        Untrusted(r.target().tensors_sha256()), ") are not the job's (",
                        o.target.tensors_sha256, ")");
  }
  if (o.tokenizer_crc32c &&
      (!r.has_tokenizer_crc32c() || r.tokenizer_crc32c() != *o.tokenizer_crc32c)) {
    return absl::StrCat("the job regenerates its replies and the feeder's tokenizer.json (",
                        r.has_tokenizer_crc32c()
                            ? absl::StrCat("crc32c ", absl::Hex(r.tokenizer_crc32c()))
                            : "none",
                        ") is not the job's (crc32c ", absl::Hex(*o.tokenizer_crc32c),
                        "): its replies would be other tokens");
  }
  // The features must be the bits the coordinator's own target would compute.
  const NumericEnv theirs = NumericEnvFromProto(r.capability().numerics(), o.on_gpu);
  if (absl::Status valid = ValidateNumericEnv(theirs, "its numerics"); !valid.ok()) {
    return std::string(valid.message());
  }
  const std::vector<std::string> differences = NumericDifferences(o.numerics, theirs);
  if (!differences.empty()) {
    return absl::StrCat("its numeric environment differs from the coordinator's (",
                        absl::StrJoin(differences, "; "),
                        "): its features would not be the same bits");
  }
  return "";
}

FeederPool::FeederPool(FeederPoolOptions options, const Clock& clock)
    : options_(std::move(options)), clock_(clock) {
  if (options_.heartbeat_timeout_seconds > 0) watch_ = std::thread([this] { WatchSilence(); });
}

FeederPool::~FeederPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_watch_ = true;
  }
  if (watch_.joinable()) watch_.join();
}

absl::StatusOr<std::unique_ptr<FeederPool>> FeederPool::ForJob(const JobConfig& job,
                                                               const NumericEnv& numerics,
                                                               const Clock& clock) {
  FeederPoolOptions o;
  FD_ASSIGN_OR_RETURN(o.target, FingerprintTarget(job.target.path));
  o.numerics = numerics;
  o.on_gpu = job.target.device == "cuda";
  o.heartbeat_timeout_seconds = job.cluster.heartbeat_timeout_seconds;
  o.stall_timeout_seconds = job.cluster.stall_timeout_seconds;
  o.job_config_yaml = JobConfigToYaml(job);
  if (job.data.regenerate) {  // none there: no chat can be regenerated (the source says so)
    absl::StatusOr<uint32_t> crc = FileCrc32c(job.target.path + "/tokenizer.json");
    if (crc.ok()) o.tokenizer_crc32c = *crc;
  }
  LOG(INFO) << "target feeders: the job waits for " << job.cluster.min_feeders
            << "; every shard's features are computed by a feeder";
  return std::make_unique<FeederPool>(std::move(o), clock);
}

std::vector<std::string> FeederPool::SilentLocked(double now, double* next) {
  std::vector<std::string> silent;
  *next = std::numeric_limits<double>::infinity();
  for (auto& [token, f] : feeders_) {
    // A feeder that joined and never opened its Feed stream counts from its join.
    const double due = f.heard + options_.heartbeat_timeout_seconds;
    if (now >= due) {
      silent.push_back(token);
      if (f.link != nullptr) {
        f.link->Close(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "silent feeder"));
      }
    } else {
      *next = std::min(*next, due);
    }
  }
  return silent;
}

void FeederPool::WatchSilence() {
  const std::string why = absl::StrCat("sent nothing for ", options_.heartbeat_timeout_seconds,
                                       " s (cluster.heartbeat_timeout_seconds)");
  while (true) {
    std::vector<std::string> silent;
    {
      absl::MutexLock lock(&mu_);
      double next = 0;
      silent = SilentLocked(clock_.Now(), &next);
      if (silent.empty()) {
        const uint64_t arrivals = arrivals_;
        auto wake = [this, arrivals]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_watch_ || arrivals_ != arrivals;
        };
        clock_.AwaitUntil(mu_, absl::Condition(&wake), next);
        if (stop_watch_) return;
        continue;
      }
    }
    for (const std::string& token : silent) Lost(token, why);
  }
}

void FeederPool::SetOnLostWork(std::function<void(const std::string&)> on_lost_work) {
  on_lost_work_ = std::move(on_lost_work);
}

void FeederPool::Join(const v1::FeederJoinRequest& request, v1::FeederJoinReply* reply) {
  std::string refusal = FeederRefusal(request, options_);
  absl::MutexLock lock(&mu_);
  if (refusal.empty() && finished_) refusal = "the job is over";
  for (auto it = feeders_.begin(); refusal.empty() && it != feeders_.end(); ++it) {
    if (it->second.id != request.feeder_id()) continue;
    if (it->second.link != nullptr) {
      refusal = absl::StrCat("feeder id '", Untrusted(it->second.id), "' is already in the job");
    } else {
      feeders_.erase(it);  // it joined and never opened its stream (restarted): this is it again
      break;
    }
  }
  if (!refusal.empty()) {
    LOG(WARNING) << "refused feeder '" << Untrusted(request.feeder_id()) << "': " << refusal;
    reply->set_accepted(false);
    reply->set_reason(refusal);
    return;
  }
  const std::string token = RandomToken();
  Feeder& f = feeders_[token];
  f.id = request.feeder_id();
  f.address = request.serve_address();
  f.joined = ++joins_;
  f.heard = clock_.Now();
  ++arrivals_;  // a new deadline for the watch
  reply->set_accepted(true);
  reply->set_session_token(token);
  reply->set_job_config_yaml(options_.job_config_yaml);
  LOG(INFO) << "feeder '" << Untrusted(f.id) << "' joined (serving at " << Untrusted(f.address)
            << ")";
}

absl::Status FeederPool::Bind(const std::string& token, FeedLink* link) {
  absl::MutexLock lock(&mu_);
  auto it = feeders_.find(token);
  if (it == feeders_.end()) return absl::NotFoundError("unknown feeder session token");
  if (it->second.link != nullptr) return absl::AlreadyExistsError("the feeder has a stream");
  if (finished_) return absl::FailedPreconditionError("the job is over");
  it->second.link = link;
  it->second.heard = clock_.Now();
  ++arrivals_;
  ReportLocked();
  if (released_ > 0) {  // a newcomer frees nothing of the past, but knows where the job is
    v1::FeedMessage release;
    release.mutable_release()->set_committed_steps(released_);
    link->Send(Encode(release));
  }
  LOG(INFO) << "feeder '" << Untrusted(it->second.id) << "' is live";
  return absl::OkStatus();
}

void FeederPool::OnStatus(const std::string& token, const v1::FeederStatus& status) {
  bool targets_changed = false;
  std::string stuck;
  {
    absl::MutexLock lock(&mu_);
    auto it = feeders_.find(token);
    if (it == feeders_.end()) return;
    Feeder& f = it->second;
    f.status = status;
    f.heard = clock_.Now();
    if (options_.stall_timeout_seconds > 0 &&
        status.computing_seconds() >= options_.stall_timeout_seconds && f.link != nullptr) {
      stuck = absl::StrFormat(
          "a shard's computation has run for %.0f s (cluster.stall_timeout_seconds)",
          status.computing_seconds());
      f.link->Close(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, stuck));
    }
    // In its first status only; a host:port (Prometheus is told to scrape it, as is).
    if (!status.metrics_address().empty() && f.metrics_address.empty() &&
        status.metrics_address().size() <= 256) {
      f.metrics_address = status.metrics_address();
      targets_changed = true;
    }
  }
  if (targets_changed && on_targets_changed_) on_targets_changed_();
  if (!stuck.empty()) Lost(token, stuck);
}

void FeederPool::Lost(const std::string& token, const std::string& why) {
  std::string lost_work;
  bool targets_changed = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = feeders_.find(token);
    if (it == feeders_.end()) return;
    const Feeder& f = it->second;
    if (!f.outstanding.empty() && !finished_) {
      lost_work = absl::StrCat("feeder '", Untrusted(f.id), "' was lost (", why, ") with ",
                               f.outstanding.size(), " shard(s) of uncommitted steps");
    }
    LOG(WARNING) << "feeder '" << Untrusted(f.id) << "' lost: " << why;
    targets_changed = !f.metrics_address.empty();
    for (const auto& key : f.outstanding) owner_.erase(key);
    if (regeneration_ != nullptr && !f.lines.empty()) {
      LOG(WARNING) << "the " << f.lines.size()
                   << " line(s) it was regenerating go to the other feeders";
      for (auto line = f.lines.rbegin(); line != f.lines.rend(); ++line) {
        RequeueLineLocked(*line, why);
      }
    }
    feeders_.erase(it);
    ReportLocked();
  }
  if (targets_changed && on_targets_changed_) on_targets_changed_();
  if (!lost_work.empty() && on_lost_work_) on_lost_work_(lost_work);
}

int FeederPool::live() const {
  absl::MutexLock lock(&mu_);
  return CountLiveLocked();
}

int FeederPool::CountLiveLocked() const {
  int n = 0;
  for (const auto& [token, f] : feeders_) n += f.link != nullptr;
  return n;
}

bool FeederPool::LiveLocked(int count) const { return CountLiveLocked() >= count; }

void FeederPool::ReportLocked() {
  const int live = CountLiveLocked();
  if (metrics_ != nullptr) metrics_->SetFeeders(live, std::max(0, awaited_ - live));
}

std::vector<const FeederPool::Feeder*> FeederPool::ByJoinLocked() const {
  std::vector<const Feeder*> by_join;
  for (const auto& [token, f] : feeders_) by_join.push_back(&f);
  std::sort(by_join.begin(), by_join.end(),
            [](const Feeder* a, const Feeder* b) { return a->joined < b->joined; });
  return by_join;
}

std::vector<ScrapeTarget> FeederPool::ScrapeTargets() const {
  absl::MutexLock lock(&mu_);
  std::vector<ScrapeTarget> targets;
  for (const Feeder* f : ByJoinLocked()) {
    if (f->link != nullptr && !f->metrics_address.empty()) {
      targets.push_back({f->metrics_address, "feeder", f->id});
    }
  }
  return targets;
}

void FeederPool::SetOnScrapeTargetsChanged(std::function<void()> changed) {
  on_targets_changed_ = std::move(changed);
}

void FeederPool::Fill(v1::StatusReply* reply) const {
  absl::MutexLock lock(&mu_);
  const double now = clock_.Now();
  for (const Feeder* f : ByJoinLocked()) {
    v1::FeederRow* row = reply->add_feeders();
    row->set_feeder_id(f->id);
    row->set_serve_address(f->address);
    row->set_seconds_since_heard(f->link != nullptr ? now - f->heard : -1);
    row->set_held_bytes(f->status.held_bytes());
    row->set_shards_computed(f->status.shards_computed());
    row->set_shards_pending(f->status.shards_pending());
    row->set_shards_outstanding(static_cast<uint32_t>(f->outstanding.size()));
  }
}

absl::Status FeederPool::AwaitLive(int count, double deadline,
                                   const std::function<void()>& waiting) {
  auto done = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !failure_.ok() || LiveLocked(count);
  };
  bool ready;
  {
    absl::MutexLock lock(&mu_);
    ready = done();
  }
  if (!ready && waiting) waiting();  // outside the lock: it logs and sets the job's state
  absl::MutexLock lock(&mu_);
  if (!ready) {
    awaited_ = count;
    ReportLocked();
    clock_.AwaitUntil(mu_, absl::Condition(&done), deadline);
    awaited_ = 0;
    ReportLocked();
  }
  if (!failure_.ok()) return failure_;
  if (!LiveLocked(count)) {
    return absl::DeadlineExceededError(absl::StrCat("waited cluster.join_timeout_seconds for ",
                                                    count, " feeder(s) (cluster.min_feeders)"));
  }
  return absl::OkStatus();
}

std::string FeederPool::PickLocked(const std::pair<uint64_t, uint32_t>& key) const {
  if (auto owner = owner_.find(key); owner != owner_.end()) {
    auto it = feeders_.find(owner->second);
    if (it != feeders_.end() && it->second.link != nullptr) return owner->second;
  }
  std::string best;
  size_t best_load = std::numeric_limits<size_t>::max();
  uint64_t best_joined = 0;
  for (const auto& [token, f] : feeders_) {
    if (f.link == nullptr) continue;
    if (f.outstanding.size() < best_load ||
        (f.outstanding.size() == best_load && f.joined < best_joined)) {
      best = token;
      best_load = f.outstanding.size();
      best_joined = f.joined;
    }
  }
  return best;
}

std::optional<std::string> FeederPool::Assign(const v1::ShardWork& work) {
  const std::pair<uint64_t, uint32_t> key{work.header().step(), work.header().shard()};
  v1::FeedMessage m;
  *m.mutable_work() = work;
  grpc::ByteBuffer bytes = Encode(m);
  absl::MutexLock lock(&mu_);
  const std::string token = PickLocked(key);
  if (token.empty()) return std::nullopt;
  Feeder& f = feeders_.at(token);
  f.outstanding.insert(key);
  owner_[key] = token;
  f.link->Send(std::move(bytes));
  return f.address;
}

void FeederPool::Release(uint64_t committed_steps) {
  v1::FeedMessage m;
  m.mutable_release()->set_committed_steps(committed_steps);
  const grpc::ByteBuffer bytes = Encode(m);
  absl::MutexLock lock(&mu_);
  released_ = std::max(released_, committed_steps);
  for (auto it = owner_.begin(); it != owner_.end() && it->first.first < committed_steps;) {
    it = owner_.erase(it);
  }
  for (auto& [token, f] : feeders_) {
    for (auto it = f.outstanding.begin();
         it != f.outstanding.end() && it->first < committed_steps;) {
      it = f.outstanding.erase(it);
    }
    if (f.link != nullptr) f.link->Send(bytes);
  }
}

void FeederPool::Abort(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = std::move(why);
}

void FeederPool::Finish(const std::string& reason) {
  v1::FeedMessage m;
  m.mutable_shutdown()->set_reason(reason);
  const grpc::ByteBuffer bytes = Encode(m);
  absl::MutexLock lock(&mu_);
  finished_ = true;
  for (auto& [token, f] : feeders_) {
    if (f.link == nullptr) continue;
    f.link->Send(bytes);
    f.link->Close(grpc::Status::OK);
  }
}

}  // namespace flashdraft
