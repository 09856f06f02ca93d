// deploy/kubernetes as a cluster would take it, checked offline (no cluster runs here): each
// overlay renders (`kubectl kustomize`), every object validates against the Kubernetes API's
// schemas (tests/reference/kubernetes/validate.mjs), and what the pods run fits the binaries of
// this build: each flag a container passes is one its binary has, the job file (the ConfigMap)
// passes `flashdraft config check`, the files it names are where the pods mount them, the probes,
// the Service and the scrape annotations use the ports the processes serve on, and each pod's
// memory request covers the process's expected peak.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RunCommand;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kSource = FLASHDRAFT_SOURCE_DIR;
const std::string kReference = kSource + "/tests/reference/kubernetes";

std::string ValidatorUnavailable() {
  if (RunCommand("node --version >/dev/null 2>&1").exit_code != 0) return "needs Node.js (node)";
  for (const char* p :
       {"kubernetes-models", "@kubernetes-models/prometheus-operator", "typescript", "yaml"}) {
    if (!std::filesystem::exists(kReference + "/node_modules/" + p)) {
      return absl::StrCat("needs the npm packages of tests/reference/kubernetes (", p,
                          " is missing; scripts/setup.sh runs npm ci there)");
    }
  }
  return "";
}

#define SKIP_WITHOUT_VALIDATOR() \
  if (const std::string why = ValidatorUnavailable(); !why.empty()) GTEST_SKIP() << why

testing::CommandResult Validate(const std::string& files) {
  return RunCommand(absl::StrCat("node ", kReference, "/validate.mjs ", files, " 2>&1"));
}

// The validator can fail: what a cluster's API server would refuse, it refuses, naming it.
TEST(KubernetesTest, TheValidatorRefusesWhatTheApiServerWould) {
  SKIP_WITHOUT_VALIDATOR();
  testing::TempDir dir;
  const std::string pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {pod + "    - {name: c, image: i, ports: [{containerPort: 80}]}\n", "1 of 1 object(s) valid"},
      {pod + "    - {name: c, image: i, ports: [{containerPort: http}]}\n", "must be integer"},
      {pod + "    - {name: c, image: i, imagePullPolicy: Sometimes}\n",
       "must be equal to one of the allowed values (Always, IfNotPresent, Never)"},
      {pod + "    - {name: c, image: i, livenessprobe: {}}\n",
       "'\"livenessprobe\"' does not exist in type 'IContainer'"},
      {pod + "    - {image: i}\n", "must have required property name"},
      {"apiVersion: v1\nkind: Widget\nmetadata: {name: w}\n", "unknown kind Widget of v1"},
      {"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: j}\nspec:\n"
       "  runPolicy: {backoffLimits: 3}\n",
       "/spec/runPolicy/backoffLimits: not in kubeflow.org/v1"},
      {"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: j}\nspec:\n"
       "  pytorchReplicaSpecs:\n    Master:\n      restartPolicy: OnFailure\n      template:\n"
       "        spec: {containers: [{name: pytorch, image: i, args: 3}]}\n",
       "PodTemplate/j Master in"},
  };
  for (const auto& [yaml, expected] : cases) {
    ASSERT_TRUE(WriteFileAtomically(dir.Join("object.yaml"), yaml).ok());
    const auto r = Validate(dir.Join("object.yaml"));
    EXPECT_THAT(r.output, HasSubstr(expected)) << yaml;
    EXPECT_EQ(r.exit_code, expected == "1 of 1 object(s) valid" ? 0 : 1) << r.output;
  }
}

// One rendered overlay: its objects by kind and name (a generated ConfigMap under its base name).
struct Rendered {
  std::map<std::string, YAML::Node> objects;  // "Kind/name"
  const YAML::Node& Get(const std::string& key) const {
    static const YAML::Node kNone;
    auto it = objects.find(key);
    EXPECT_NE(it, objects.end()) << key;
    return it == objects.end() ? kNone : it->second;
  }
};

Rendered Parse(const std::string& yaml) {
  Rendered out;
  for (const YAML::Node& o : YAML::LoadAll(yaml)) {
    std::string name = o["metadata"]["name"].as<std::string>();
    if (absl::StartsWith(name, "flashdraft-job-")) name = "flashdraft-job";  // the hash suffix
    out.objects[absl::StrCat(o["kind"].as<std::string>(), "/", name)] = o;
  }
  return out;
}

// "host:port" -> port.
int PortOf(const std::string& address) {
  int port = -1;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  return port;
}

// A memory quantity (512Mi, 32Gi) in MiB.
int64_t MiB(const std::string& quantity) {
  int64_t n = 0;
  if (absl::EndsWith(quantity, "Gi") &&
      absl::SimpleAtoi(quantity.substr(0, quantity.size() - 2), &n)) {
    return n * 1024;
  }
  if (absl::EndsWith(quantity, "Mi") &&
      absl::SimpleAtoi(quantity.substr(0, quantity.size() - 2), &n)) {
    return n;
  }
  ADD_FAILURE() << "memory quantity '" << quantity << "' is not in Mi or Gi";
  return 0;
}

// The expected peak host MiB `flashdraft config check` prints for "coordinator" or "worker".
std::map<std::string, int64_t> ExpectedPeaks(const std::string& check_output) {
  std::map<std::string, int64_t> peaks;
  const std::regex line(R"(# (coordinator|each of \d+ worker\(s\)): expected peak (\d+) MiB host)");
  for (std::sregex_iterator it(check_output.begin(), check_output.end(), line), end; it != end;
       ++it) {
    peaks[absl::StrContains((*it)[1].str(), "worker") ? "worker" : "coordinator"] =
        std::stoll((*it)[2].str());
  }
  return peaks;
}

// Every mount of a container: path -> the volume's spec.
std::map<std::string, YAML::Node> Mounts(const YAML::Node& pod, const YAML::Node& container) {
  std::map<std::string, YAML::Node> volumes, mounts;
  for (const YAML::Node& v : pod["volumes"]) volumes[v["name"].as<std::string>()] = v;
  for (const YAML::Node& m : container["volumeMounts"]) {
    EXPECT_TRUE(volumes.count(m["name"].as<std::string>())) << m["name"];
    mounts[m["mountPath"].as<std::string>()] = volumes[m["name"].as<std::string>()];
  }
  return mounts;
}

// The file `path` is in one of the container's mounts: under a Secret's mount, as one of the items
// it projects; under a ConfigMap's, as a key of `config_map` (which the volume must name); under a
// volume's, anywhere. Returns the volume.
YAML::Node ExpectMounted(const std::map<std::string, YAML::Node>& mounts, const std::string& path,
                         const YAML::Node& config_map, const std::string& what) {
  for (const auto& [mount, volume] : mounts) {
    if (!absl::StartsWith(path, mount + "/")) continue;
    const std::string rest = path.substr(mount.size() + 1);
    std::set<std::string> files;
    if (volume["secret"]) {
      for (const YAML::Node& item : volume["secret"]["items"]) {
        files.insert(item["path"].as<std::string>());
      }
    } else if (volume["configMap"]) {
      EXPECT_EQ(volume["configMap"]["name"].as<std::string>(),
                config_map["metadata"]["name"].as<std::string>())
          << what << ": the volume names another ConfigMap than the one rendered";
      for (const auto& kv : config_map["data"]) files.insert(kv.first.as<std::string>());
    } else {
      return volume;  // a volume: whatever its owner put there
    }
    EXPECT_TRUE(files.count(rest)) << what << " " << path << ": " << mount << " holds no " << rest;
    return volume;
  }
  ADD_FAILURE() << what << " " << path << " is under no mount of the pod";
  return YAML::Node();
}

// What the container runs: its command, then its args.
std::vector<std::string> Argv(const YAML::Node& container) {
  std::vector<std::string> argv;
  for (const char* part : {"command", "args"}) {
    for (const YAML::Node& a : container[part]) argv.push_back(a.as<std::string>());
  }
  return argv;
}

// Each --flag the container passes is one its binary (or `flashdraft` subcommand) has; each
// $(VAR) one its env defines.
void ExpectFlagsExist(const YAML::Node& container) {
  const std::vector<std::string> argv = Argv(container);
  ASSERT_FALSE(argv.empty()) << container["name"] << " runs nothing";
  std::string program = argv[0];
  if (program == "flashdraft" && argv.size() > 1) absl::StrAppend(&program, " ", argv[1]);
  const auto help = RunCommand(absl::StrCat(kBin, "/", program, " --help 2>&1"));
  ASSERT_EQ(help.exit_code, 0) << program << ": " << help.output;
  std::set<std::string> env;
  for (const YAML::Node& e : container["env"]) env.insert(e["name"].as<std::string>());
  const std::regex reference(R"(\$\((\w+)\))");
  for (const std::string& arg : argv) {
    if (absl::StartsWith(arg, "--")) {
      EXPECT_THAT(help.output, HasSubstr(absl::StrCat("  ", arg, " ")))
          << program << " has no " << arg;
    }
    for (std::sregex_iterator it(arg.begin(), arg.end(), reference), end; it != end; ++it) {
      EXPECT_TRUE(env.count((*it)[1].str())) << program << ": $(" << (*it)[1] << ") is not in env";
    }
  }
  // What the downward API can give (an annotation or label by key, or one of the fields).
  const std::regex field(
      R"(metadata\.(name|namespace|uid|(annotations|labels)\['[\w./-]+'\])|spec\.(nodeName|serviceAccountName)|status\.(hostIP|podIP|podIPs))");
  for (const YAML::Node& e : container["env"]) {
    if (e["valueFrom"]["fieldRef"]) {
      const std::string path = e["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>();
      EXPECT_TRUE(std::regex_match(path, field)) << "fieldRef " << path;
    }
  }
}

// The value following `flag` in what the container runs ("" if absent).
std::string ArgAfter(const YAML::Node& container, const std::string& flag) {
  const std::vector<std::string> argv = Argv(container);
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag) return argv[i + 1];
  }
  return "";
}

// A Job's podFailurePolicy as the API server and the binaries take it: pods that never restart in
// place (the policy needs it), rules about this container, the exit code of a SIGTERM stop (the
// container's --stopped-exit-code) ignored, and 2 (a refused job) failing the Job.
void ExpectFailurePolicyFits(const YAML::Node& job_spec, const YAML::Node& container) {
  EXPECT_EQ(job_spec["template"]["spec"]["restartPolicy"].as<std::string>(), "Never");
  const std::string stopped = ArgAfter(container, "--stopped-exit-code");
  EXPECT_NE(stopped, "") << container["name"] << " exits 0 when stopped: its pod would succeed";
  std::set<std::string> ignored, failing;
  for (const YAML::Node& rule : job_spec["podFailurePolicy"]["rules"]) {
    const YAML::Node codes = rule["onExitCodes"];
    if (!codes) continue;
    EXPECT_EQ(codes["containerName"].as<std::string>(), container["name"].as<std::string>());
    EXPECT_EQ(codes["operator"].as<std::string>(), "In");
    for (const YAML::Node& v : codes["values"]) {
      (rule["action"].as<std::string>() == "Ignore" ? ignored : failing)
          .insert(v.as<std::string>());
    }
  }
  EXPECT_EQ(ignored, std::set<std::string>{stopped}) << container["name"];
  EXPECT_EQ(failing, std::set<std::string>{"2"}) << container["name"];
}

// The container's port named `name` (-1 if none).
int NamedPort(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& p : container["ports"]) {
    if (p["name"].as<std::string>() == name) return p["containerPort"].as<int>();
  }
  return -1;
}

// Probes and scrape annotations reach the metrics port the process serves on (`serves`), the
// container's port named `port`.
void ExpectProbedOn(const YAML::Node& pod_template, const YAML::Node& container,
                    const std::string& port, int serves) {
  EXPECT_EQ(NamedPort(container, port), serves) << container["name"];
  EXPECT_EQ(pod_template["metadata"]["annotations"]["prometheus.io/port"].as<std::string>(),
            std::to_string(serves));
  const std::map<std::string, std::string> probes = {
      {"startupProbe", "/healthz"}, {"livenessProbe", "/healthz"}, {"readinessProbe", "/readyz"}};
  for (const auto& [probe, path] : probes) {
    const YAML::Node get = container[probe]["httpGet"];
    ASSERT_TRUE(get) << container["name"] << " has no " << probe;
    EXPECT_EQ(get["path"].as<std::string>(), path) << probe;
    EXPECT_EQ(get["port"].as<std::string>(), port) << probe;
  }
}

// Why the manifests cannot be rendered and validated here ("" when they can).
std::string RenderUnavailable() {
  if (RunCommand("kubectl version --client >/dev/null 2>&1").exit_code != 0) {
    return "needs kubectl (its kustomize renders the manifests; Debian's kubectl or "
           "kubernetes-client >= 1.21)";
  }
  return ValidatorUnavailable();
}

class KubernetesOverlayTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (const std::string why = RenderUnavailable(); !why.empty()) GTEST_SKIP() << why;
    const std::string overlay = kSource + "/deploy/kubernetes/overlays/" + GetParam();
    const auto rendered = RunCommand("kubectl kustomize " + overlay + " 2>&1");
    ASSERT_EQ(rendered.exit_code, 0) << rendered.output;
    ASSERT_TRUE(WriteFileAtomically(dir_.Join("rendered.yaml"), rendered.output).ok());
    rendered_ = Parse(rendered.output);
    const YAML::Node job_file = rendered_.Get("ConfigMap/flashdraft-job")["data"]["job.yaml"];
    ASSERT_TRUE(job_file) << "no job.yaml in the ConfigMap flashdraft-job";
    ASSERT_TRUE(WriteFileAtomically(dir_.Join("job.yaml"), job_file.as<std::string>()).ok());
    job_ = YAML::Load(job_file.as<std::string>());
  }

  // The job file's memory estimate with `target` (a folder with the target's config.json) and
  // as few workers as the job runs with (each then holds the most).
  std::map<std::string, int64_t> Estimate(const std::string& target) {
    const auto check = RunCommand(absl::StrCat(
        kBin, "/flashdraft config check ", dir_.Join("job.yaml"), " --set target.path=", target,
        " --set cluster.max_workers=", job_["cluster"]["min_workers"].as<int>(), " 2>&1"));
    EXPECT_EQ(check.exit_code, 0) << check.output;
    return ExpectedPeaks(check.output);
  }

  testing::TempDir dir_;
  Rendered rendered_;
  YAML::Node job_;
};

TEST_P(KubernetesOverlayTest, EveryObjectValidatesAgainstTheApiSchemas) {
  const auto r = Validate(dir_.Join("rendered.yaml"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string all =
      absl::StrCat(rendered_.objects.size(), " of ", rendered_.objects.size(), " object(s) valid");
  EXPECT_THAT(r.output, HasSubstr(all));
  for (const char* kind : {"ConfigMap/flashdraft-job", "Service/flashdraft-coordinator",
                           "PersistentVolumeClaim/flashdraft-output", "Job/flashdraft-coordinator",
                           "Job/flashdraft-workers", "PodMonitor/flashdraft"}) {
    EXPECT_TRUE(rendered_.objects.count(kind)) << kind;
  }
}

// The coordinator's and the workers' pods: what they run, where their files are, their ports.
TEST_P(KubernetesOverlayTest, ThePodsRunWhatTheBinariesAndTheJobFileSay) {
  const YAML::Node coordinator_pod =
      rendered_.Get("Job/flashdraft-coordinator")["spec"]["template"];
  const YAML::Node worker_pod = rendered_.Get("Job/flashdraft-workers")["spec"]["template"];
  const YAML::Node coordinator = coordinator_pod["spec"]["containers"][0];
  const YAML::Node worker = worker_pod["spec"]["containers"][0];
  ExpectFlagsExist(coordinator);
  ExpectFlagsExist(worker);
  ExpectFailurePolicyFits(rendered_.Get("Job/flashdraft-coordinator")["spec"], coordinator);
  ExpectFailurePolicyFits(rendered_.Get("Job/flashdraft-workers")["spec"], worker);
  const auto coordinator_mounts = Mounts(coordinator_pod["spec"], coordinator);
  const auto worker_mounts = Mounts(worker_pod["spec"], worker);
  const YAML::Node job_data = rendered_.Get("ConfigMap/flashdraft-job");
  ExpectMounted(coordinator_mounts, ArgAfter(coordinator, "--job"), job_data, "coordinator --job");
  ExpectMounted(worker_mounts, ArgAfter(worker, "--job"), job_data, "worker --job");
  const YAML::Node security = job_["security"];
  for (const char* field : {"tls_cert", "tls_key", "tls_ca", "token_file"}) {
    ExpectMounted(coordinator_mounts, security[field].as<std::string>(), job_data,
                  absl::StrCat("coordinator security.", field));
  }
  for (const char* field : {"client_cert", "client_key", "tls_ca", "token_file"}) {
    ExpectMounted(worker_mounts, security[field].as<std::string>(), job_data,
                  absl::StrCat("worker security.", field));
  }
  // output_dir on the Job's volume; the target and the data on the data volume.
  const YAML::Node output =
      ExpectMounted(coordinator_mounts, job_["output_dir"].as<std::string>() + "/checkpoints",
                    job_data, "output_dir");
  EXPECT_EQ(output["persistentVolumeClaim"]["claimName"].as<std::string>(""), "flashdraft-output");
  for (const char* field : {"target.path", "data.jsonl"}) {
    const std::vector<std::string> key = absl::StrSplit(field, '.');
    const std::string path = job_[key[0]][key[1]].as<std::string>();
    const YAML::Node data = ExpectMounted(coordinator_mounts, path + "/", job_data, field);
    EXPECT_EQ(data["persistentVolumeClaim"]["claimName"].as<std::string>(""), "flashdraft-data");
  }
  // The workers reach the coordinator's gRPC port through the Service.
  const YAML::Node service = rendered_.Get("Service/flashdraft-coordinator");
  const int grpc = PortOf(job_["cluster"]["listen"].as<std::string>());
  EXPECT_EQ(NamedPort(coordinator, "grpc"), grpc);
  EXPECT_EQ(ArgAfter(worker, "--coordinator"),
            absl::StrCat(service["metadata"]["name"].as<std::string>(), ":",
                         service["spec"]["ports"][0]["port"].as<int>()));
  EXPECT_EQ(service["spec"]["ports"][0]["targetPort"].as<std::string>(), "grpc");
  EXPECT_EQ(service["spec"]["selector"]["app.kubernetes.io/name"].as<std::string>(),
            coordinator_pod["metadata"]["labels"]["app.kubernetes.io/name"].as<std::string>());
  // Probes and Prometheus on the ports the processes serve /metrics, /healthz and /readyz on.
  ExpectProbedOn(coordinator_pod, coordinator, "metrics",
                 PortOf(job_["metrics"]["listen"].as<std::string>()));
  const int worker_metrics = PortOf(ArgAfter(worker, "--metrics-listen"));
  EXPECT_EQ(worker_metrics, PortOf(job_["metrics"]["worker_listen"].as<std::string>()));
  ExpectProbedOn(worker_pod, worker, "metrics", worker_metrics);
  EXPECT_EQ(rendered_.Get("PodMonitor/flashdraft")["spec"]["podMetricsEndpoints"][0]["port"]
                .as<std::string>(),
            "metrics");
}

// As many workers as the job waits for and admits; CPUs, GPUs and memory as the job needs them.
TEST_P(KubernetesOverlayTest, ThePodsAskForWhatTheJobNeeds) {
  const YAML::Node workers = rendered_.Get("Job/flashdraft-workers")["spec"];
  const int n = workers["completions"].as<int>();
  EXPECT_EQ(workers["parallelism"].as<int>(), n);
  EXPECT_GE(n, job_["cluster"]["min_workers"].as<int>());
  EXPECT_LE(n, job_["cluster"]["max_workers"].as<int>());
  // The memory estimate needs the target's config.json only.
  std::string target = dir_.Join("target");
  if (GetParam() == "cpu") {
    const auto made = RunCommand(
        absl::StrCat(kBin, "/flashdraft make-tiny-target --steps 1 --out ", target, " 2>&1"));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  } else {  // Qwen3-8B's published config.json
    ASSERT_TRUE(std::filesystem::create_directories(target));
    ASSERT_TRUE(WriteFileAtomically(target + "/config.json", R"({
      "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
      "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
      "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
      "tie_word_embeddings": false, "attention_bias": false, "hidden_act": "silu",
      "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"})")
                    .ok());
  }
  const std::map<std::string, int64_t> peaks = Estimate(target);
  ASSERT_EQ(peaks.size(), 2u) << "no estimate for both processes";
  const std::map<std::string, std::string> device = {
      {"coordinator", job_["target"]["device"].as<std::string>()},
      {"worker", job_["worker"]["device"].as<std::string>()}};
  for (const auto& [process, peak] : peaks) {
    const YAML::Node c = rendered_.Get(
        process == "worker"
            ? "Job/flashdraft-workers"
            : "Job/flashdraft-coordinator")["spec"]["template"]["spec"]["containers"][0];
    const YAML::Node resources = c["resources"];
    EXPECT_GE(MiB(resources["requests"]["memory"].as<std::string>()), peak) << process;
    EXPECT_GT(MiB(resources["limits"]["memory"].as<std::string>()), peak) << process;
    EXPECT_EQ(resources["requests"]["cpu"].as<std::string>(),
              job_["train"]["intra_op_threads"].as<std::string>())
        << process;
    EXPECT_EQ(resources["limits"]["nvidia.com/gpu"].as<std::string>("0"),
              device.at(process) == "cuda" ? "1" : "0")
        << process;
  }
}

// The PyTorchJob (deploy/kubernetes/pytorchjob): its own fields and both pod templates validate,
// each pod runs `flashdraft run-rank` on the job file it mounts, the job file passes `config
// check`, and the probes reach the coordinator's port in the Master and the worker's in a Worker.
TEST(KubernetesTest, ThePyTorchJobRunsRunRankOnTheJobItMounts) {
  if (const std::string why = RenderUnavailable(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  const auto rendered =
      RunCommand("kubectl kustomize " + kSource + "/deploy/kubernetes/pytorchjob 2>&1");
  ASSERT_EQ(rendered.exit_code, 0) << rendered.output;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("rendered.yaml"), rendered.output).ok());
  const auto validated = Validate(dir.Join("rendered.yaml"));
  EXPECT_EQ(validated.exit_code, 0) << validated.output;
  EXPECT_THAT(validated.output, HasSubstr("5 of 5 object(s) valid"));
  const Rendered objects = Parse(rendered.output);
  const YAML::Node job_data = objects.Get("ConfigMap/flashdraft-job");
  ASSERT_TRUE(
      WriteFileAtomically(dir.Join("job.yaml"), job_data["data"]["job.yaml"].as<std::string>())
          .ok());
  const auto check =
      RunCommand(kBin + "/flashdraft config check " + dir.Join("job.yaml") + " 2>&1");
  ASSERT_EQ(check.exit_code, 0) << check.output;
  const YAML::Node job = YAML::Load(job_data["data"]["job.yaml"].as<std::string>());
  const YAML::Node replicas = objects.Get("PyTorchJob/flashdraft")["spec"]["pytorchReplicaSpecs"];
  for (const char* type : {"Master", "Worker"}) {
    const YAML::Node pod = replicas[type]["template"];
    const YAML::Node container = pod["spec"]["containers"][0];
    ASSERT_GE(container["command"].size(), 3u) << type;
    EXPECT_EQ(container["command"][0].as<std::string>(), "flashdraft") << type;
    EXPECT_EQ(container["command"][1].as<std::string>(), "run-rank") << type;
    ExpectFlagsExist(container);
    // Stopped by SIGTERM: an exit the ExitCode policy retries (128-255); errors fail the job.
    EXPECT_EQ(replicas[type]["restartPolicy"].as<std::string>(), "ExitCode") << type;
    EXPECT_EQ(ArgAfter(container, "--stopped-exit-code"), "143") << type;
    const auto mounts = Mounts(pod["spec"], container);
    ExpectMounted(mounts, container["command"][2].as<std::string>(), job_data, "run-rank's job");
    const bool master = std::string(type) == "Master";
    std::vector<std::string> files = {"client_cert", "client_key", "tls_ca", "token_file"};
    if (master) files.insert(files.end(), {"tls_cert", "tls_key"});
    for (const std::string& field : files) {
      ExpectMounted(mounts, job["security"][field].as<std::string>(), job_data, field);
    }
    ExpectProbedOn(pod, container, master ? "metrics" : "worker-metrics",
                   PortOf(job["metrics"][master ? "listen" : "worker_listen"].as<std::string>()));
  }
  const YAML::Node master = replicas["Master"]["template"]["spec"]["containers"][0];
  EXPECT_EQ(NamedPort(master, "grpc"), PortOf(job["cluster"]["listen"].as<std::string>()));
  EXPECT_EQ(NamedPort(master, "worker-metrics"),
            PortOf(job["metrics"]["worker_listen"].as<std::string>()));
  ExpectMounted(Mounts(replicas["Master"]["template"]["spec"], master),
                job["output_dir"].as<std::string>() + "/checkpoints", job_data, "output_dir");
}

// A coordinator and a worker with --stopped-exit-code 143 on the small job of `steps` steps (the
// shards in `dir`), the coordinator sent SIGTERM once the job trains when `stop`; their exit codes.
std::pair<int, int> StoppedOrFinished(const testing::TempDir& dir, int steps, bool stop) {
  const std::string out = dir.Join(absl::StrCat("run-", steps));
  testing::SmallJob small;
  small.shards_dir = dir.Join("shards");
  small.output_dir = out;
  small.max_steps = steps;
  EXPECT_TRUE(WriteFileAtomically(out + ".yaml", testing::SmallJobYaml(small)).ok());
  const int coordinator =
      testing::StartProcess({kBin + "/flashdraft-coordinator", "--job", out + ".yaml",
                             "--port-file", out + ".port", "--stopped-exit-code", "143"},
                            out + ".coordinator.log");
  const int port = testing::WaitForPortFile(out + ".port");
  const int worker =
      testing::StartProcess({kBin + "/flashdraft-worker", "--coordinator",
                             absl::StrCat("127.0.0.1:", port), "--stopped-exit-code", "143"},
                            out + ".worker.log");
  if (stop) {
    for (int i = 0; i < 600 && testing::ReadSteps(out + "/steps.jsonl").empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(coordinator, SIGTERM);
  }
  std::pair<int, int> codes = {-1, -1};
  for (auto [pid, code] :
       {std::make_pair(coordinator, &codes.first), std::make_pair(worker, &codes.second)}) {
    int status = 0;
    waitpid(pid, &status, 0);
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return codes;
}

// The exit codes the manifests' failure policies name are the binaries': a job file refused is 2;
// a SIGTERM before the job's end is --stopped-exit-code, for a coordinator waiting for its workers
// and for a worker waiting for its coordinator (a pod drained before the job started).
TEST(KubernetesTest, TheBinariesExitWithTheCodesThePoliciesName) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("bad.yaml"), "train: {learning_rate: fast}\n").ok());
  const auto refused = RunCommand(
      absl::StrCat(kBin, "/flashdraft-coordinator --job ", dir.Join("bad.yaml"), " 2>&1"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  const auto shards =
      RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", dir.Join("shards"),
                              " --samples 24 --seq 64 --vocab 48 --hidden 32 2>&1"));
  ASSERT_EQ(shards.exit_code, 0) << shards.output;
  testing::SmallJob small;
  small.shards_dir = dir.Join("shards");
  small.output_dir = dir.Join("out");
  ASSERT_TRUE(WriteFileAtomically(dir.Join("job.yaml"), testing::SmallJobYaml(small)).ok());
  const int coordinator =
      testing::StartProcess({kBin + "/flashdraft-coordinator", "--job", dir.Join("job.yaml"),
                             "--port-file", dir.Join("port"), "--stopped-exit-code", "143"},
                            dir.Join("coordinator.log"));
  const int port = testing::WaitForPortFile(dir.Join("port"));
  EXPECT_GT(port, 0) << *ReadFile(dir.Join("coordinator.log"));
  // A port nothing serves (the coordinator's, once it is gone) for the waiting worker.
  kill(coordinator, SIGTERM);
  int status = 0;
  waitpid(coordinator, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 143)
      << status << ": " << *ReadFile(dir.Join("coordinator.log"));
  const int worker = testing::StartProcess(
      {kBin + "/flashdraft-worker", "--coordinator", absl::StrCat("127.0.0.1:", port),
       "--stopped-exit-code", "143", "--connect-timeout", "60"},
      dir.Join("worker.log"));
  std::this_thread::sleep_for(std::chrono::seconds(2));  // trying to join
  kill(worker, SIGTERM);
  waitpid(worker, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 143)
      << status << ": " << *ReadFile(dir.Join("worker.log"));
  // A training job whose coordinator is stopped: its worker exits 143 too (its pod is not done:
  // the replacement coordinator needs it); a finished job's worker exits 0.
  EXPECT_EQ(StoppedOrFinished(dir, 400, /*stop=*/true), std::make_pair(143, 143));
  EXPECT_EQ(StoppedOrFinished(dir, 3, /*stop=*/false), std::make_pair(0, 0));
}

// A worker that finds no coordinator within --connect-timeout gives up, however long its
// --reconnect-timeout (that is for a coordinator it had and lost); the manifests set both.
TEST(KubernetesTest, AWorkerGivesUpItsFirstJoinAfterItsConnectTimeout) {
  const int closed = testing::FreeTcpPort();
  const auto r = RunCommand(absl::StrCat("timeout 120 ", kBin,
                                         "/flashdraft-worker --coordinator 127.0.0.1:", closed,
                                         " --connect-timeout 3 --reconnect-timeout 600 2>&1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;  // 124: still trying after 2 minutes
  EXPECT_THAT(r.output,
              HasSubstr(absl::StrCat("cannot join the coordinator at 127.0.0.1:", closed)));
}

INSTANTIATE_TEST_SUITE_P(Overlays, KubernetesOverlayTest, ::testing::Values("cpu", "gpu"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace flashdraft
