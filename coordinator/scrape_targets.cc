#include "coordinator/scrape_targets.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace flashdraft {

std::string ScrapeTargetsJson(const std::string& job_name,
                              const std::vector<ScrapeTarget>& targets) {
  nlohmann::json groups = nlohmann::json::array();
  for (const ScrapeTarget& t : targets) {
    nlohmann::json labels = {{"flashdraft_job", job_name}, {"role", t.role}};
    if (!t.worker_id.empty()) labels["worker"] = t.worker_id;
    groups.push_back({{"targets", {t.address}}, {"labels", labels}});
  }
  return groups.dump(2) + "\n";
}

std::string ScrapeAddress(const std::string& listen, int port) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host = name;
  }
  if (host.find(':') != std::string::npos) host = "[" + host + "]";  // IPv6
  return absl::StrCat(host, ":", port);
}

}  // namespace flashdraft
