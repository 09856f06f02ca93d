// Observability checked with Prometheus's own tools: the alert rules pass `promtool check rules`
// and their unit tests (`promtool test rules`), and a live scrape of a training coordinator passes
// `promtool check metrics` (exit 3 means lint problems: a failure here); `flashdraft status` shows
// the job at a glance, as JSON and until it ends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::CoordinatorProcess;
using ::flashdraft::testing::HttpGet;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kSource = FLASHDRAFT_SOURCE_DIR;
const std::string kPromtool = "/usr/bin/promtool";

#define FD_SKIP_WITHOUT_PROMTOOL()                                                  \
  if (access(kPromtool.c_str(), X_OK) != 0) {                                       \
    GTEST_SKIP() << "needs promtool (package prometheus, --no-install-recommends; " \
                    "scripts/setup.sh installs it)";                                \
  }

// Synthetic shards and a job of `steps` steps on them in `dir` (with `extra` YAML); its path, or ""
// when the shards could not be made.
std::string WriteJob(const TempDir& dir, const std::string& name, int steps,
                     const std::string& extra) {
  auto made = RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", dir.Join("shards"),
                                      " --samples 24 --seq 64 --vocab 48 --hidden 32 --seed 2"));
  EXPECT_EQ(made.exit_code, 0) << made.output;
  const std::string job = dir.Join("job.yaml");
  ::flashdraft::testing::SmallJob small;
  small.name = name;
  small.output_dir = dir.Join("out");
  small.shards_dir = dir.Join("shards");
  small.max_steps = steps;
  small.extra = extra;
  const absl::Status written = WriteFileAtomically(job, ::flashdraft::testing::SmallJobYaml(small));
  return made.exit_code == 0 && written.ok() ? job : "";
}

TEST(PrometheusTest, AlertRulesPassPromtoolAndTheirUnitTests) {
  FD_SKIP_WITHOUT_PROMTOOL();
  const std::string dir = kSource + "/deploy/prometheus";
  auto check = RunCommand(absl::StrCat("cd ", dir, " && ", kPromtool, " check rules alerts.yml"));
  EXPECT_EQ(check.exit_code, 0) << check.output;
  // Every rule in the file is read (none lost to a YAML slip).
  const auto rules = ReadFile(dir + "/alerts.yml");
  ASSERT_TRUE(rules.ok());
  int alerts = 0;
  for (absl::string_view line : absl::StrSplit(*rules, '\n')) {
    alerts += absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "- alert:") ? 1 : 0;
  }
  EXPECT_GE(alerts, 10);
  EXPECT_THAT(check.output, HasSubstr(absl::StrCat("SUCCESS: ", alerts, " rules found")));
  auto test =
      RunCommand(absl::StrCat("cd ", dir, " && ", kPromtool, " test rules alerts_test.yml"));
  EXPECT_EQ(test.exit_code, 0) << test.output;
  EXPECT_THAT(test.output, HasSubstr("SUCCESS"));
}

// The value of the first sample of `name` (with its labels, if any) in exposition `text`; -1 if
// none.
double Sample(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::strtod(text.c_str() + at + key.size(), nullptr);
}

// A scrape of /metrics on `port` once `counter` reached `at_least` (polled); "" if it never did.
std::string ScrapeOnce(int port, const std::string& counter, double at_least) {
  for (int i = 0; i < 600; ++i) {
    auto scrape = HttpGet(port, "/metrics");
    if (scrape.ok() && Sample("\n" + scrape->body, counter) >= at_least) return scrape->body;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

TEST(PrometheusTest, LiveScrapesOfTheCoordinatorAndAWorkerPassPromtoolCheckMetrics) {
  FD_SKIP_WITHOUT_PROMTOOL();
  TempDir dir;
  const std::string job =
      WriteJob(dir, "metrics", 100000, "metrics: {enabled: true, listen: '127.0.0.1:0'}\n");
  ASSERT_FALSE(job.empty());
  CoordinatorProcess coordinator(kBin, job, dir.Join("coordinator.log"));
  ASSERT_GT(coordinator.port(), 0) << *ReadFile(dir.Join("coordinator.log"));
  const int metrics_port = testing::WaitForPortFile(dir.Join("out/metrics.port"));
  ASSERT_GT(metrics_port, 0);
  const int worker = StartProcess(
      {kBin + "/flashdraft-worker", "--coordinator", absl::StrCat("127.0.0.1:", coordinator.port()),
       "--metrics-port-file", dir.Join("worker.port")},
      dir.Join("worker.log"));
  // Scraped while it trains, after a few steps: every family has samples (histograms included).
  const std::string text = ScrapeOnce(metrics_port, "flashdraft_steps_total", 5);
  const int worker_port = testing::WaitForPortFile(dir.Join("worker.port"));
  const std::string worker_text =
      worker_port > 0 ? ScrapeOnce(worker_port, "flashdraft_worker_steps_total", 5) : "";
  kill(worker, SIGKILL);
  waitpid(worker, nullptr, 0);
  ASSERT_FALSE(text.empty()) << *ReadFile(dir.Join("coordinator.log"));
  ASSERT_FALSE(worker_text.empty()) << *ReadFile(dir.Join("worker.log"));
  for (const auto& [name, body] :
       {std::pair<std::string, std::string>{"coordinator", text}, {"worker", worker_text}}) {
    ASSERT_TRUE(WriteFileAtomically(dir.Join(name + ".txt"), body).ok());
    auto lint = RunCommand(absl::StrCat(kPromtool, " check metrics < ", dir.Join(name + ".txt")));
    EXPECT_EQ(lint.exit_code, 0) << name << ": " << lint.output;
    EXPECT_EQ(lint.output, "") << name;
  }
  // What a worker tells: its phases, what it received and sent, its queue, its memory.
  EXPECT_GE(
      Sample(worker_text, "flashdraft_worker_phase_duration_seconds_count{phase=\"forward\"}"), 5);
  EXPECT_GT(Sample(worker_text, "flashdraft_worker_stream_bytes_total{direction=\"received\"}"), 0);
  EXPECT_EQ(Sample(worker_text, "flashdraft_worker_rank"), 0);
  EXPECT_EQ(Sample(worker_text, "flashdraft_worker_collective_errors_total"), 0);
  EXPECT_GE(Sample(worker_text, "flashdraft_worker_queued_microbatches"), 0);
  EXPECT_GT(Sample(worker_text, "process_resident_memory_bytes"), 50e6);  // LibTorch alone
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 0);
  EXPECT_THAT(worker_text, HasSubstr("flashdraft_build_info{backend=\"gloo\""));

  // The Grafana dashboard asks only for metrics this scrape has (no list in the test to go stale);
  // a feeder's (flashdraft_feeder_*) are checked against a feeder's scrape in feeder_test.cc.
  std::set<std::string> exported;
  for (absl::string_view line : absl::StrSplit(text + worker_text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    exported.insert(std::string(line.substr(0, line.find_first_of("{ "))));
  }
  const nlohmann::json dashboard =
      nlohmann::json::parse(*ReadFile(kSource + "/deploy/grafana/flashdraft.json"), nullptr, false);
  ASSERT_TRUE(dashboard.is_object()) << "deploy/grafana/flashdraft.json is not JSON";
  std::vector<std::string> queries;
  ASSERT_FALSE(dashboard["panels"].empty());
  for (const nlohmann::json& panel : dashboard["panels"]) {
    EXPECT_FALSE(panel.value("title", "").empty());
    if (panel["type"] == "row") continue;  // a heading
    EXPECT_FALSE(panel["targets"].empty()) << panel.value("title", "");
    for (const nlohmann::json& target : panel["targets"]) queries.push_back(target["expr"]);
  }
  for (const nlohmann::json& annotation : dashboard["annotations"]["list"]) {
    queries.push_back(annotation["expr"]);
  }
  const std::regex metric("flashdraft_[a-z_]+");
  int names = 0;
  const std::regex selector("\\{[^}]*\\}");  // label matchers name labels, not metrics
  for (const std::string& query : queries) {
    const std::string names_only = std::regex_replace(query, selector, "");
    for (std::sregex_iterator it(names_only.begin(), names_only.end(), metric), end; it != end;
         ++it) {
      if (absl::StartsWith(it->str(), "flashdraft_feeder_")) continue;
      ++names;
      EXPECT_TRUE(exported.count(it->str()))
          << it->str() << " (in `" << query << "`) is not in a live scrape";
    }
  }
  EXPECT_GT(names, 25);
}

// The first answer of GET `path` on `port` whose status is `status`, polled for up to `seconds`
// (status 0 when none came).
testing::HttpResponse AwaitProbe(int port, const std::string& path, int status, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    auto answer = HttpGet(port, path);
    if (answer.ok() && answer->status == status) return *answer;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return {};
}

// /healthz and /readyz beside /metrics: the coordinator is ready once it serves, a worker once it
// has trained a step; a worker whose training thread stops for good inside forward (the injected
// stall) is no longer live once cluster.stall_timeout_seconds pass, and says where it stopped.
TEST(HealthTest, ProbesFollowAWorkerFromItsJoinToAStall) {
  TempDir dir;
  const std::string job =
      WriteJob(dir, "health", 100000,
               "metrics: {enabled: true, listen: '127.0.0.1:0'}\ncluster: {stall_timeout_seconds: "
               "5}\n");
  ASSERT_FALSE(job.empty());
  CoordinatorProcess coordinator(kBin, job, dir.Join("coordinator.log"));
  ASSERT_GT(coordinator.port(), 0) << *ReadFile(dir.Join("coordinator.log"));
  const int metrics_port = testing::WaitForPortFile(dir.Join("out/metrics.port"));
  ASSERT_GT(metrics_port, 0);
  const testing::HttpResponse serving = AwaitProbe(metrics_port, "/readyz", 200, 10);
  EXPECT_EQ(serving.body, absl::StrCat("ok: serving on port ", coordinator.port(), "\n"));
  EXPECT_EQ(AwaitProbe(metrics_port, "/healthz", 200, 10).body, "ok\n");

  const int worker = StartProcess(
      {kBin + "/flashdraft-worker", "--coordinator", absl::StrCat("127.0.0.1:", coordinator.port()),
       "--metrics-port-file", dir.Join("worker.port")},
      dir.Join("worker.log"), {"FLASHDRAFT_FAULT=stall:step=6:rank=0"});
  const int worker_port = testing::WaitForPortFile(dir.Join("worker.port"));
  const testing::HttpResponse trained =
      worker_port > 0 ? AwaitProbe(worker_port, "/readyz", 200, 60) : testing::HttpResponse{};
  const testing::HttpResponse live =
      worker_port > 0 ? AwaitProbe(worker_port, "/healthz", 200, 10) : testing::HttpResponse{};
  const testing::HttpResponse stuck =
      worker_port > 0 ? AwaitProbe(worker_port, "/healthz", 503, 60) : testing::HttpResponse{};
  // `flashdraft probe` (the container HEALTHCHECK) says the same, by its exit code.
  const auto probe_stuck = RunCommand(
      absl::StrCat(kBin, "/flashdraft probe --port-file ", dir.Join("worker.port"), " 2>&1"));
  const testing::HttpResponse coordinator_live = AwaitProbe(metrics_port, "/healthz", 200, 10);
  kill(worker, SIGKILL);
  waitpid(worker, nullptr, 0);
  ASSERT_GT(worker_port, 0) << *ReadFile(dir.Join("worker.log"));
  EXPECT_THAT(trained.body, ::testing::StartsWith("ok: trained step "))
      << *ReadFile(dir.Join("worker.log"));
  EXPECT_EQ(live.body, "ok\n");
  EXPECT_THAT(stuck.body,
              HasSubstr("the training thread has made no progress in forward of step 6 for "))
      << *ReadFile(dir.Join("worker.log"));
  EXPECT_THAT(stuck.body, HasSubstr("(cluster.stall_timeout_seconds: 5)"));
  EXPECT_EQ(coordinator_live.body, "ok\n");
  EXPECT_EQ(probe_stuck.exit_code, 1) << probe_stuck.output;
  EXPECT_THAT(probe_stuck.output, HasSubstr("/healthz answered 503: the training thread has made "
                                            "no progress in forward of step 6"));
  const auto probe_ready =
      RunCommand(absl::StrCat(kBin, "/flashdraft probe /readyz --port ", metrics_port));
  EXPECT_EQ(probe_ready.exit_code, 0);
  EXPECT_EQ(probe_ready.output, absl::StrCat("ok: serving on port ", coordinator.port(), "\n"));
}

// The job's file_sd target file follows membership: each worker is listed (with the port it wrote
// to its --metrics-port-file) once it serves /metrics, a killed worker disappears, the same worker
// started again comes back with its new port; `flashdraft status --json` names the same endpoints.
TEST(PrometheusTest, TheTargetFileFollowsWorkersThatJoinAreLostAndComeBack) {
  TempDir dir;
  const std::string job = WriteJob(dir, "follow", 100000,
                                   "cluster: {min_workers: 1, max_workers: 2}\n"
                                   "metrics: {enabled: true, worker_listen: '127.0.0.1:0'}\n");
  ASSERT_FALSE(job.empty());
  CoordinatorProcess coordinator(kBin, job, dir.Join("coordinator.log"));
  ASSERT_GT(coordinator.port(), 0) << *ReadFile(dir.Join("coordinator.log"));
  const std::string address = absl::StrCat("127.0.0.1:", coordinator.port());
  int started = 0;
  auto start = [&](const std::string& id) {
    std::filesystem::remove(dir.Join(id + ".port"));
    return StartProcess({kBin + "/flashdraft-worker", "--coordinator", address, "--id", id,
                         "--metrics-port-file", dir.Join(id + ".port")},
                        dir.Join(absl::StrCat(id, "-", ++started, ".log")));
  };
  // worker id -> scrape address, as the target file lists them; polled until `want` holds.
  using Targets = std::map<std::string, std::string>;
  auto targets = [&] {
    Targets out;
    auto text = ReadFile(dir.Join("out/prometheus/targets.json"));
    const nlohmann::json groups = nlohmann::json::parse(text.ok() ? *text : "", nullptr, false);
    if (!groups.is_array()) return out;
    for (const nlohmann::json& g : groups) {
      EXPECT_EQ(g["labels"]["flashdraft_job"], "follow");
      out[g["labels"].value("worker", "(" + g["labels"]["role"].get<std::string>() + ")")] =
          g["targets"][0];
    }
    return out;
  };
  auto wait_for = [&](const std::function<bool(const Targets&)>& want) {
    for (int i = 0; i < 600; ++i) {
      if (want(targets())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  const int w0 = start("w0");
  int w1 = start("w1");
  ASSERT_TRUE(wait_for([](const Targets& t) { return t.size() == 3; }))
      << *ReadFile(dir.Join("coordinator.log"));
  Targets listed = targets();
  ASSERT_TRUE(listed.count("(coordinator)"));
  const int w1_port = testing::WaitForPortFile(dir.Join("w1.port"));
  EXPECT_EQ(listed["w0"],
            absl::StrCat("127.0.0.1:", testing::WaitForPortFile(dir.Join("w0.port"))));
  EXPECT_EQ(listed["w1"], absl::StrCat("127.0.0.1:", w1_port));
  auto status = RunCommand(absl::StrCat(kBin, "/flashdraft status ", address, " --json"));
  const nlohmann::json reply = nlohmann::json::parse(status.output, nullptr, false);
  ASSERT_TRUE(reply.is_object()) << status.output;
  for (const nlohmann::json& w : reply["workers"]) {
    EXPECT_EQ(w["metrics_address"], listed[w["worker_id"].get<std::string>()]);
  }

  kill(w1, SIGKILL);  // lost: its stream breaks, it leaves the file
  waitpid(w1, nullptr, 0);
  EXPECT_TRUE(wait_for([](const Targets& t) { return t.size() == 2 && !t.count("w1"); }));
  w1 = start("w1");  // back, on a new port
  ASSERT_TRUE(wait_for([](const Targets& t) { return t.count("w1") > 0; }));
  const int new_port = testing::WaitForPortFile(dir.Join("w1.port"));
  EXPECT_EQ(targets()["w1"], absl::StrCat("127.0.0.1:", new_port));
  EXPECT_NE(new_port, w1_port);
  // The worker answers where the file says.
  EXPECT_FALSE(ScrapeOnce(new_port, "flashdraft_worker_joins_total", 1).empty());
  for (int pid : {w0, w1}) kill(pid, SIGKILL);
  for (int pid : {w0, w1}) waitpid(pid, nullptr, 0);
}

// `flashdraft status`: a table at a glance (progress, ETA, loss, τ, tokens/s, the last checkpoint
// and its age, each worker's state, heartbeat and step time), --json for scripts, --watch until
// the job ends, and a clear message once its coordinator is gone.
TEST(StatusTest, ShowsTheJobAtAGlanceAsJsonAndFollowsItToTheEnd) {
  TempDir dir;
  const std::string job = WriteJob(dir, "glance", 400, "checkpoint: {every_steps: 50}\n");
  ASSERT_FALSE(job.empty());
  CoordinatorProcess coordinator(kBin, job, dir.Join("coordinator.log"));
  ASSERT_GT(coordinator.port(), 0) << *ReadFile(dir.Join("coordinator.log"));
  const std::string status =
      absl::StrCat(kBin, "/flashdraft status 127.0.0.1:", coordinator.port());
  const int worker = StartProcess({kBin + "/flashdraft-worker", "--coordinator",
                                   absl::StrCat("127.0.0.1:", coordinator.port()), "--id", "w0"},
                                  dir.Join("worker.log"));
  nlohmann::json reply;
  for (int i = 0; i < 600; ++i) {
    auto r = RunCommand(status + " --json");
    reply = nlohmann::json::parse(r.output, nullptr, false);
    if (reply.is_object() && reply.value("last_checkpoint_step", "0") != "0") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(reply.is_object()) << reply.dump();
  EXPECT_EQ(reply["job_name"], "glance");
  EXPECT_EQ(reply["state"], "training");
  EXPECT_EQ(reply["world_size"], 1);
  EXPECT_EQ(reply["total_steps"], "400");  // 64-bit integers are strings in proto3 JSON
  EXPECT_GT(reply["eta_seconds"].get<double>(), 0);
  EXPECT_GT(reply["tokens_per_second"].get<double>(), 0);
  EXPECT_GE(reply["last_checkpoint_age_seconds"].get<double>(), 0);
  ASSERT_EQ(reply["workers"].size(), 1u);
  EXPECT_EQ(reply["workers"][0]["worker_id"], "w0");
  EXPECT_GT(reply["workers"][0]["step_seconds"].get<double>(), 0);

  auto table = RunCommand(status);
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("job glance  state training  step "));
  EXPECT_THAT(table.output, HasSubstr("% done, ETA "));
  EXPECT_THAT(table.output, HasSubstr("tok/s"));
  EXPECT_THAT(table.output, ::testing::ContainsRegex("last checkpoint: step [0-9]+, [0-9]+s ago"));
  EXPECT_THAT(table.output, HasSubstr("WORKER"));
  EXPECT_THAT(table.output, ::testing::ContainsRegex("w0 +active +0 "));

  // --watch (not a terminal: one block per refresh) follows the job until its coordinator goes.
  auto watched = RunCommand(status + " --watch 0.2");
  EXPECT_EQ(watched.exit_code, 0) << watched.output;
  EXPECT_THAT(watched.output, HasSubstr("is gone: the job ended or it was stopped"));
  EXPECT_EQ(coordinator.Wait(60), 0);
  waitpid(worker, nullptr, 0);
  auto after = RunCommand(status);
  EXPECT_EQ(after.exit_code, 1);
  EXPECT_THAT(after.output, HasSubstr("a finished job's coordinator exits"));
}

// The shipped prometheus.yml is valid; a real Prometheus server, pointed at the job's own file_sd
// target file, scrapes a training coordinator and loads the alert rules.
TEST(PrometheusTest, ARealPrometheusScrapesTheJobFromItsTargetFile) {
  FD_SKIP_WITHOUT_PROMTOOL();
  if (access("/usr/bin/prometheus", X_OK) != 0) {
    GTEST_SKIP() << "needs /usr/bin/prometheus (package prometheus; scripts/setup.sh --tests)";
  }
  auto shipped = RunCommand(absl::StrCat("cd ", kSource, "/deploy/prometheus && ", kPromtool,
                                         " check config prometheus.yml"));
  EXPECT_EQ(shipped.exit_code, 0) << shipped.output;
  EXPECT_THAT(shipped.output, HasSubstr("SUCCESS: prometheus.yml is valid"));

  TempDir dir;
  const std::string job =
      WriteJob(dir, "prom", 100000, "metrics: {enabled: true, listen: '127.0.0.1:0'}\n");
  ASSERT_FALSE(job.empty());
  CoordinatorProcess coordinator(kBin, job, dir.Join("coordinator.log"));
  ASSERT_GT(coordinator.port(), 0) << *ReadFile(dir.Join("coordinator.log"));
  const std::string targets = dir.Join("out/prometheus/targets.json");
  // Written by the coordinator's own writer thread once it serves /metrics: it may come just
  // after the port file (a loaded CI machine saw it 2 s in and not yet there).
  ASSERT_TRUE(::flashdraft::testing::Eventually([&] { return std::filesystem::exists(targets); }))
      << *ReadFile(dir.Join("coordinator.log"));
  const std::string config = dir.Join("prometheus.yml");
  ASSERT_TRUE(WriteFileAtomically(config, absl::StrCat("global: {scrape_interval: 1s, "
                                                       "evaluation_interval: 1s}\nrule_files: [",
                                                       kSource, "/deploy/prometheus/alerts.yml]\n",
                                                       "scrape_configs:\n  - job_name: flashdraft\n"
                                                       "    file_sd_configs: [{files: ['",
                                                       targets, "'], refresh_interval: 1s}]\n"))
                  .ok());
  auto checked = RunCommand(absl::StrCat(kPromtool, " check config ", config));
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  const int port = testing::FreeTcpPort();
  const int prometheus = StartProcess(
      {"/usr/bin/prometheus", "--config.file=" + config, "--storage.tsdb.path=" + dir.Join("tsdb"),
       absl::StrCat("--web.listen-address=127.0.0.1:", port)},
      dir.Join("prometheus.log"));
  const int worker = StartProcess({kBin + "/flashdraft-worker", "--coordinator",
                                   absl::StrCat("127.0.0.1:", coordinator.port()), "--id", "w0"},
                                  dir.Join("worker.log"));
  // `metric` as Prometheus stored it, with the target file's labels; -1 until it has one.
  auto stored = [&](const std::string& metric, const std::string& role) -> double {
    auto r = HttpGet(port, "/api/v1/query?query=" + metric);
    if (!r.ok()) return -1;
    const nlohmann::json reply = nlohmann::json::parse(r->body, nullptr, false);
    if (!reply.is_object() || !reply.contains("data") || reply["data"]["result"].empty()) return -1;
    const nlohmann::json& series = reply["data"]["result"][0];
    EXPECT_EQ(series["metric"]["flashdraft_job"], "prom");
    EXPECT_EQ(series["metric"]["role"], role);
    if (role == "worker") {
      EXPECT_EQ(series["metric"]["worker"], "w0");
    }
    return std::stod(series["value"][1].get<std::string>());
  };
  // The first samples take ~6 s even at a 1 s interval: poll, then see them advance. The worker
  // is found through the target file, which the coordinator rewrote when it joined.
  for (const auto& [metric, role] :
       {std::pair<std::string, std::string>{"flashdraft_step", "coordinator"},
        {"flashdraft_worker_steps_total", "worker"}}) {
    double first = -1, later = -1;
    for (int i = 0; i < 600 && first <= 0; ++i) {
      first = stored(metric, role);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (int i = 0; i < 600 && later <= first; ++i) {
      later = stored(metric, role);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_GT(first, 0) << metric << "\n" << *ReadFile(dir.Join("prometheus.log"));
    EXPECT_GT(later, first) << metric;
  }
  auto rules = HttpGet(port, "/api/v1/rules");
  ASSERT_TRUE(rules.ok()) << rules.status();
  EXPECT_THAT(rules->body, HasSubstr("FlashdraftNoStepCommitted"));
  for (int pid : {worker, prometheus}) {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
}

// `flashdraft report`: one self-contained page of a real (short) job, rendered by headless
// Chromium: the screenshot is not blank and the charts exist as SVG in the DOM the page's own
// script built (--dump-dom runs it). Bad input is refused by name.
TEST(ReportTest, AJobsReportRendersInHeadlessChromium) {
  TempDir dir;
  const std::string job = WriteJob(dir, "report", 40, "");
  ASSERT_FALSE(job.empty());
  auto run = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", job, " --workers 2"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string html = dir.Join("report.html");
  auto made =
      RunCommand(absl::StrCat(kBin, "/flashdraft report --job ", dir.Join("out"), " --out ", html));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string page = *ReadFile(html);
  EXPECT_THAT(page, HasSubstr("<title>report"));
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg"))
      << "the page fetches nothing";
  EXPECT_EQ(page.find("https://"), std::string::npos);

  auto missing = RunCommand(
      absl::StrCat(kBin, "/flashdraft report --job ", dir.path(), " --out ", dir.Join("x.html")));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr(dir.Join("steps.jsonl") + ": cannot open"));
  auto bad_eval = RunCommand(absl::StrCat(kBin, "/flashdraft report --job ", dir.Join("out"),
                                          " --eval ", job, " --out ", dir.Join("x.html")));
  EXPECT_EQ(bad_eval.exit_code, 1);
  EXPECT_THAT(bad_eval.output, HasSubstr("not the JSON of `flashdraft eval --json`"));

  if (access("/usr/bin/chromium", X_OK) != 0) {
    GTEST_SKIP()
        << "rendering needs /usr/bin/chromium (package chromium; scripts/setup.sh --tests)";
  }
  const std::string chromium =
      "chromium --headless --no-sandbox --disable-gpu --window-size=1200,900 ";
  auto shot = RunCommand(absl::StrCat("cd ", dir.path(), " && ", chromium,
                                      "--screenshot=", dir.Join("report.png"), " file://", html));
  ASSERT_TRUE(std::filesystem::exists(dir.Join("report.png"))) << shot.output;
  // A blank 1200x900 page compresses to a few KB; four charts, text and colours do not.
  EXPECT_GT(std::filesystem::file_size(dir.Join("report.png")), 40000u);
  auto dom = RunCommand(absl::StrCat("cd ", dir.path(), " && ", chromium, "--dump-dom file://",
                                     html, " 2>/dev/null"));
  int charts = 0;
  for (size_t at = 0; (at = dom.output.find("<svg class=\"chart\"", at)) != std::string::npos;
       ++at) {
    ++charts;
  }
  EXPECT_EQ(charts, 6) << "loss, tau, learning rate, accuracy, phases, workers";
  EXPECT_THAT(dom.output, HasSubstr(">learning rate</text>"));
  EXPECT_THAT(dom.output, HasSubstr("class=\"bar\""));
  EXPECT_THAT(dom.output, HasSubstr("class=\"area\""));
  EXPECT_THAT(dom.output, HasSubstr(">loss (weighted CE, nats)</text>"));
  EXPECT_THAT(dom.output, HasSubstr(">milliseconds per step</text>"));
}

}  // namespace
}  // namespace flashdraft
