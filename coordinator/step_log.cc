#include "coordinator/step_log.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "model/dflash_math.h"

namespace flashdraft {

std::vector<double> StepRecord::SlotAccuracy() const {
  return flashdraft::SlotAccuracy(slot_correct, slot_total);
}

double StepRecord::TauEstimate() const { return flashdraft::TauEstimate(SlotAccuracy()); }

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

absl::StatusOr<StepLog> StepLog::Open(const std::string& path, int64_t resume_step) {
  if (resume_step > 0) {
    std::string kept;
    if (absl::StatusOr<std::string> text = ReadFile(path); text.ok()) {
      for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
        const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
        if (!record.is_object()) continue;
        // Events are the job's history (a worker lost, the coordinator restarted): they stay.
        const bool event = record.contains("event");
        const bool kept_step = record.contains("step") && record["step"].is_number_unsigned() &&
                               record["step"].get<int64_t>() < resume_step;
        if (event || kept_step) absl::StrAppend(&kept, line, "\n");
      }
    }
    FD_RETURN_IF_ERROR(WriteFileAtomically(path, kept));
  }
  std::ofstream file(path, resume_step > 0 ? std::ios::app : std::ios::trunc);
  if (!file) return absl::InternalError(absl::StrCat("cannot write ", path));
  StepLog log(path, std::move(file));
  if (resume_step > 0) {
    log.WriteEvent(
        {{"event", "resumed"}, {"next_step", resume_step}, {"unix_time", UnixSeconds()}});
  }
  return log;
}

void StepLog::WriteLine(const std::string& line) {
  absl::MutexLock lock(mu_.get());
  file_ << line << "\n";
  file_.flush();
}

void StepLog::WriteEvent(const nlohmann::json& event) { WriteLine(event.dump()); }

void StepLog::Write(const StepRecord& r) {
  nlohmann::json j = {{"step", r.step},
                      {"membership_epoch", r.membership_epoch},
                      {"loss", r.loss},
                      {"tokens", r.tokens},
                      {"world_size", r.world_size},
                      {"tau_estimate", r.TauEstimate()},
                      {"slot_accuracy", r.SlotAccuracy()},
                      {"weight_sum", r.weight_sum},
                      {"collective_bytes", r.collective_bytes},
                      {"learning_rate", r.learning_rate},
                      {"step_seconds", r.step_seconds},
                      {"unix_time", UnixSeconds()},
                      {"timings",
                       {{"wait", r.wait_seconds},
                        {"max_wait", r.max_wait_seconds},
                        {"forward", r.forward_seconds},
                        {"backward", r.backward_seconds},
                        {"allreduce", r.allreduce_seconds},
                        {"optimizer", r.optimizer_seconds}}}};
  if (r.distilled) j["kl"] = r.Kl();
  if (r.numerics_mixed) j["reproducible"] = false;
  WriteLine(j.dump());
}

}  // namespace flashdraft
