#include "coordinator/scrape_targets.h"

#include <nlohmann/json.hpp>

namespace flashdraft {

std::string ScrapeTargetsJson(const std::string& job_name,
                              const std::vector<ScrapeTarget>& targets) {
  nlohmann::json groups = nlohmann::json::array();
  for (const ScrapeTarget& t : targets) {
    nlohmann::json labels = {{"flashdraft_job", job_name}, {"role", t.role}};
    if (!t.id.empty()) labels[t.role] = t.id;
    groups.push_back({{"targets", {t.address}}, {"labels", labels}});
  }
  return groups.dump(2) + "\n";
}

}  // namespace flashdraft
