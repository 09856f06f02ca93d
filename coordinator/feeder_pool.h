// The job's target feeders (docs/ARCHITECTURE.md, "Feeders"): their admission, their Feed
// streams, which feeder computes which shard, the releases after commits, and their losses.
//
// Its own absl::Mutex; every send is queued on a feeder's FeedLink (never blocks), and the one
// callback (a feeder lost with work of uncommitted steps) runs outside the lock. Lock order: the
// pool, then a link's write lock. The step driver waits here for live feeders on the Clock.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "common/numeric_env.h"
#include "common/target_fingerprint.h"
#include "coordinator/metrics.h"
#include "coordinator/scrape_targets.h"
#include "flashdraft/v1/feeder.pb.h"

namespace flashdraft {

// One feeder's Feed stream, as the pool sees it (FeedSession over gRPC; a fake in tests).
class FeedLink {
 public:
  virtual ~FeedLink() = default;
  // Queues a serialized FeedMessage; dropped once the stream is over.
  virtual void Send(grpc::ByteBuffer message) = 0;
  // Ends the stream with `status` after what is queued.
  virtual void Close(const grpc::Status& status) = 0;
};

struct FeederPoolOptions {
  TargetFingerprintValue target;  // the job's target: a feeder must hold the same
  NumericEnv numerics;            // the coordinator's: a feeder must compute the same bits
  bool on_gpu = false;            // target.device: cuda (a feeder's device is then its GPU)
  // A live feeder that sends nothing (its status comes every heartbeat interval) this long is
  // lost, its stream closed (cluster.heartbeat_timeout_seconds; 0: never).
  double heartbeat_timeout_seconds = 0;
  // A feeder whose status says one shard's computation has run this long is lost too, its
  // stream closed: a stuck compute thread (cluster.stall_timeout_seconds; 0: never).
  double stall_timeout_seconds = 0;
  std::string job_config_yaml;  // FeederJoinReply
  // With data.regenerate: the CRC-32C of the job's tokenizer.json, which a feeder's must match.
  std::optional<uint32_t> tokenizer_crc32c;
};

// Why a feeder may not join (empty: it may), from its request alone.
std::string FeederRefusal(const v1::FeederJoinRequest& request, const FeederPoolOptions& options);

// A feeder's answer as the line's tokens and loss mask, or why it cannot be one (no tokens, a mask
// of another length or with values other than 0 and 1, negative ids); checked before anything is
// copied. The vocabulary is the source's to check (DeferredReplies::Complete).
absl::Status RegeneratedTokens(const v1::RegeneratedLine& answer, std::vector<int64_t>& ids,
                               std::vector<int64_t>& mask);

class FeederPool {
 public:
  // With a heartbeat timeout, a thread of its own drops silent feeders (and joined ones that never
  // open their Feed stream) as the Clock passes their deadlines.
  FeederPool(FeederPoolOptions options, const Clock& clock);
  ~FeederPool();
  // The pool of `job` (cluster.min_feeders > 0), whose feeders must compute the bits of a process
  // with `numerics`: the target's fingerprint read from target.path.
  static absl::StatusOr<std::unique_ptr<FeederPool>> ForJob(const JobConfig& job,
                                                            const NumericEnv& numerics,
                                                            const Clock& clock);

  // --- reactions (gRPC threads); never block ---
  void Join(const v1::FeederJoinRequest& request, v1::FeederJoinReply* reply)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The first message of a Feed stream: NOT_FOUND for an unknown token, ALREADY_EXISTS when it
  // has a stream. The feeder is live from here until Lost.
  absl::Status Bind(const std::string& token, FeedLink* link) ABSL_LOCKS_EXCLUDED(mu_);
  // Its status; a stuck computation (stall_timeout_seconds) makes it Lost.
  void OnStatus(const std::string& token, const v1::FeederStatus& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Its stream ended or it reported an error: its link is forgotten before this returns.
  void Lost(const std::string& token, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Called (outside the lock) when a lost feeder held shards of steps not committed yet: they
  // must be sent again.
  void SetOnLostWork(std::function<void(const std::string& why)> on_lost_work);
  // Live and missing feeders into `metrics` (flashdraft_feeders, flashdraft_feeders_missing);
  // before the server starts.
  void ReportTo(CoordinatorMetrics* metrics) { metrics_ = metrics; }
  // The /metrics of the bound feeders that serve one (role "feeder", their ids), in join order.
  std::vector<ScrapeTarget> ScrapeTargets() const ABSL_LOCKS_EXCLUDED(mu_);
  // Called (outside the lock) when ScrapeTargets may have changed.
  void SetOnScrapeTargetsChanged(std::function<void()> changed);
  // One row per feeder, in join order, for `flashdraft status`.
  void Fill(v1::StatusReply* reply) const ABSL_LOCKS_EXCLUDED(mu_);

  // --- the step driver ---
  int live() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `count` feeders are live: OK; DEADLINE_EXCEEDED at `deadline` (the Clock's
  // seconds); the reason of Abort. `waiting` is called once when it has to wait.
  absl::Status AwaitLive(int count, double deadline, const std::function<void()>& waiting)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `work` to a live feeder: the one it went to before while that one lives (it holds the
  // computed features), otherwise the one with the fewest shards outstanding (ties: the earliest
  // joined). The feeder's service address; nothing when no feeder is live.
  std::optional<std::string> Assign(const v1::ShardWork& work) ABSL_LOCKS_EXCLUDED(mu_);
  // The steps below `committed_steps` are committed: every feeder may free them.
  void Release(uint64_t committed_steps) ABSL_LOCKS_EXCLUDED(mu_);
  // --- regeneration (data.regenerate: the feeders answer the data set's chats; the
  // implementation is feeder_regeneration.cc) ---
  // Sends every line to a live feeder (a few at a time each, to the least loaded) and hands each
  // answer to `answered` on this thread until all are accepted: OK. A lost feeder's lines go to
  // the others; an answer `answered` refuses drops the feeder that sent it and its line goes to
  // another; a line whose feeders were lost or refused 3 times: ABORTED, naming it. No feeder live
  // for `no_feeder_timeout_seconds`: DEADLINE_EXCEEDED; Abort: its reason. `lines` must outlive
  // the call (each is encoded when sent).
  // `progress` is told how many lines are accepted so far, after each.
  absl::Status Regenerate(const std::vector<v1::RegenerateWork>& lines,
                          double no_feeder_timeout_seconds,
                          const std::function<absl::Status(v1::RegeneratedLine&)>& answered,
                          const std::function<void(size_t accepted)>& progress)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A feeder's answer (gRPC threads): kept for Regenerate when the feeder holds that line,
  // otherwise dropped.
  void OnRegenerated(const std::string& token, v1::RegeneratedLine line) ABSL_LOCKS_EXCLUDED(mu_);

  // Every wait ends with `why`.
  void Abort(absl::Status why) ABSL_LOCKS_EXCLUDED(mu_);
  // The job is over: every feeder gets a Shutdown and its stream ends.
  void Finish(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Feeder {
    std::string id;
    std::string address;
    uint64_t joined = 0;       // join order
    FeedLink* link = nullptr;  // null until its stream binds
    double heard = 0;          // when it joined, bound or last sent anything
    std::set<std::pair<uint64_t, uint32_t>> outstanding;  // (step, shard) not released
    std::set<uint64_t> lines;  // regeneration lines sent to it, not answered
    v1::FeederStatus status;
    std::string metrics_address;  // from its first status; empty: none
  };
  bool LiveLocked(int count) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<const Feeder*> ByJoinLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int CountLiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReportLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The silence watch: drops the feeders past their deadline, waits for the next one.
  void WatchSilence() ABSL_LOCKS_EXCLUDED(mu_);
  // The feeders silent past the timeout as of `now` (since their join when they never bound; the
  // streams of bound ones closed); `next` is the next deadline of the others.
  std::vector<std::string> SilentLocked(double now, double* next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PickLocked(const std::pair<uint64_t, uint32_t>& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A regeneration in progress: the lines not accepted yet, those not sent, the answers in.
  struct Regeneration {
    const std::vector<v1::RegenerateWork>* lines = nullptr;  // Regenerate's
    std::map<uint64_t, size_t> open;   // line number -> its work in `lines`, until accepted
    std::map<uint64_t, int> attempts;  // feeders lost (or refused) while they held the line
    std::deque<uint64_t> queue;        // to send
    std::deque<std::pair<std::string, v1::RegeneratedLine>> answers;  // (feeder token, answer)
    absl::Status failure;  // a line that failed on too many feeders
  };
  // Puts back a line whose feeder was lost (`why`) for another; a line that failed so on
  // kMaxLineAttempts feeders fails the regeneration instead.
  void RequeueLineLocked(uint64_t line, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live feeder with room for another line (the fewest out, ties: the earliest joined).
  Feeder* RoomForLineLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendLinesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefuseAnswer(const std::string& token, uint64_t line, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the answers in, or fails: what Regenerate waits for, with `none_since` the Clock's time
  // since when no feeder is live (< 0: one is).
  absl::Status AwaitAnswersLocked(double no_feeder_timeout_seconds, double& none_since,
                                  std::deque<std::pair<std::string, v1::RegeneratedLine>>& answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FeederPoolOptions options_;
  const Clock& clock_;
  std::function<void(const std::string&)> on_lost_work_;
  std::function<void()> on_targets_changed_;
  CoordinatorMetrics* metrics_ = nullptr;
  mutable absl::Mutex mu_;
  std::map<std::string, Feeder> feeders_ ABSL_GUARDED_BY(mu_);  // by session token
  // Who computes each shard not released yet (a re-sent shard goes back there).
  std::map<std::pair<uint64_t, uint32_t>, std::string> owner_ ABSL_GUARDED_BY(mu_);
  uint64_t joins_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;  // joins and binds: a new deadline for the watch
  bool stop_watch_ ABSL_GUARDED_BY(mu_) = false;
  int awaited_ ABSL_GUARDED_BY(mu_) = 0;  // live feeders a wait needs (0: none waits)
  std::unique_ptr<Regeneration> regeneration_ ABSL_GUARDED_BY(mu_);  // null: none in progress
  std::thread watch_;
};

}  // namespace flashdraft
