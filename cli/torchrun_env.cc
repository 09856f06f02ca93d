#include "cli/torchrun_env.h"

#include <climits>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flashdraft {
namespace {

// `name` as an integer in [low, high]; `fallback` where unset (required: no fallback).
absl::StatusOr<int> IntVariable(const std::function<const char*(const char*)>& getenv,
                                const char* name, int low, int high,
                                std::optional<int> fallback = std::nullopt) {
  const char* value = getenv(name);
  if (value == nullptr || *value == '\0') {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(name, " is not set"));
  }
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < low || parsed > high) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value, "' must be an integer in [", low, ", ", high, "]"));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<TorchrunEnv> ReadTorchrunEnv(const std::function<const char*(const char*)>& getenv) {
  if (getenv("RANK") == nullptr) {
    return absl::InvalidArgumentError(
        "RANK is not set: run-rank is started by torchrun (or what sets its environment: "
        "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");
  }
  TorchrunEnv env;
  absl::StatusOr<int> world = IntVariable(getenv, "WORLD_SIZE", 1, 100000);
  if (!world.ok()) return world.status();
  env.world_size = *world;
  struct Field {
    const char* name;
    int* out;
    int low, high;
    std::optional<int> fallback;
  };
  const Field fields[] = {
      {"RANK", &env.rank, 0, env.world_size - 1, std::nullopt},
      // Unset: one process per node or pod, as PyTorchJob starts them.
      {"LOCAL_WORLD_SIZE", &env.local_world_size, 1, env.world_size, 1},
      {"GROUP_RANK", &env.group_rank, 0, env.world_size - 1, 0},
      {"TORCHELASTIC_RESTART_COUNT", &env.restart_count, 0, INT_MAX, 0},
      {"MASTER_PORT", &env.master_port, 1, 65535, std::nullopt},
  };
  for (const Field& f : fields) {
    absl::StatusOr<int> v = IntVariable(getenv, f.name, f.low, f.high, f.fallback);
    if (!v.ok()) return v.status();
    *f.out = *v;
  }
  absl::StatusOr<int> local = IntVariable(getenv, "LOCAL_RANK", 0, env.local_world_size - 1, 0);
  if (!local.ok()) return local.status();
  env.local_rank = *local;
  const char* addr = getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') return absl::InvalidArgumentError("MASTER_ADDR is not set");
  env.master_addr = addr;
  const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
  env.agent_store = agent != nullptr && std::string(agent) == "True";
  const char* run_id = getenv("TORCHELASTIC_RUN_ID");
  env.run_id = run_id != nullptr && *run_id != '\0' ? run_id : "none";
  return env;
}

std::string CoordinatorKey(const TorchrunEnv& env) {
  return absl::StrCat("flashdraft/", env.run_id, "/attempt_", env.restart_count, "/coordinator");
}

}  // namespace flashdraft
