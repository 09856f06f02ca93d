// Whether a joining worker computes with the same bits as the job's other workers (a worker whose
// BLAS picked another kernel would make the job drift without a word). The first admitted worker's
// numeric environment becomes the group's while it has members; a later worker must match it, and
// the job's pinned kernel (train.blas_kernel) when there is one. When every member has left, the
// next first worker sets it anew (a fleet replaced by other machines goes on, and it is said). With
// cluster.mixed_numerics: admit a differing worker is let in, and the job is marked mixed for good:
// its records stop claiming bitwise reproducibility.
//
// Not thread-safe: the coordinator calls it under its own lock.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/numeric_env.h"

namespace flashdraft {

struct NumericsDecision {
  bool admit = false;
  std::string refusal;      // why not (admit false)
  std::string blas_kernel;  // refused for its kernel: the one to start again with
  bool first = false;       // admitted as the first: its environment is now the group's
  std::string mixed;        // admitted although it differs: the difference (the job is mixed)
  // The first worker differs from the workers before it (the checkpoint's after a resume, or those
  // of this run before all of them left): the difference, and whose.
  std::string differs_from_previous;
  std::string previous;  // "the checkpoint's workers" or "the earlier workers"
};

// checkpoint.json's "numerics": the group's (workers') and the coordinator's environments when it
// was written and whether the run was mixed (the record also holds the precision and intra-op
// threads it ran with, for people; a resume reads these three).
struct RecordedNumerics {
  std::optional<NumericEnv> workers, coordinator;
  bool mixed = false;
};
std::string RecordNumerics(const std::optional<NumericEnv>& workers, const NumericEnv& coordinator,
                           bool mixed, const std::string& precision, int intra_op_threads);
// `json` as RecordNumerics writes it (empty: nothing recorded); `what` names the file in errors.
absl::StatusOr<RecordedNumerics> ParseRecordedNumerics(const std::string& json,
                                                       const std::string& what);

class NumericsGroup {
 public:
  // `pinned_kernel`: train.blas_kernel ("" none); `admit_mixed`: cluster.mixed_numerics admit;
  // `checkpoint`: the workers' environment recorded in the checkpoint this run resumes from, and
  // whether that run was already mixed.
  NumericsGroup(std::string pinned_kernel, bool admit_mixed,
                std::optional<NumericEnv> checkpoint = std::nullopt, bool checkpoint_mixed = false);

  // What to do with a worker of environment `env` (its device as the job computes: "cpu" or
  // "cuda <model>"); nothing changes until Commit.
  NumericsDecision Consider(const NumericEnv& env) const;
  // The worker was admitted: a first one sets the group's environment, a differing one marks the
  // job mixed.
  void Commit(const NumericEnv& env, const NumericsDecision& decision);
  // Every member left: the next worker admitted sets the group's environment again.
  void GroupEmptied();

  const std::optional<NumericEnv>& group() const { return group_; }
  bool mixed() const { return mixed_; }

 private:
  std::string pinned_kernel_;
  bool admit_mixed_;
  std::optional<NumericEnv> previous_;  // the checkpoint's, then the last group's
  std::string previous_name_;
  std::optional<NumericEnv> group_;
  bool mixed_;
};

}  // namespace flashdraft
