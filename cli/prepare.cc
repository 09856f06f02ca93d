#include "cli/prepare.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/chat_template.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/safetensors.h"
#include "common/shard_format.h"
#include "common/status_macros.h"
#include "common/tokenizer.h"
#include "model/chat_data.h"
#include "model/drafter_config.h"
#include "model/target_model.h"

namespace flashdraft {
namespace {

// A SpecForge offline sample: one torch.save dict with input_ids [S], loss_mask [S] and
// hidden_states [S, F] (a leading batch dimension of 1 is accepted on each).
struct ImportedSample {
  std::vector<int64_t> ids, mask;
  torch::Tensor features;  // [S, F] float
};

absl::StatusOr<torch::Tensor> DictTensor(const c10::Dict<c10::IValue, c10::IValue>& dict,
                                         const std::string& key, int64_t dims) {
  auto it = dict.find(c10::IValue(key));
  if (it == dict.end()) return absl::InvalidArgumentError(absl::StrCat("no '", key, "' entry"));
  if (!it->value().isTensor()) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' is not a tensor"));
  }
  torch::Tensor t = it->value().toTensor();
  if (t.dim() == dims + 1 && t.size(0) == 1) t = t.squeeze(0);
  if (t.dim() != dims) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' has ", t.dim(),
                                                   " dimensions, expected ", dims, " (or 1 + ",
                                                   dims, " with batch size 1)"));
  }
  return t;
}

absl::StatusOr<ImportedSample> ReadSpecForgeFile(const std::string& path, int64_t vocab) {
  FD_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  c10::IValue value;
  try {
    value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InvalidArgumentError(
        absl::StrCat("not a torch.save file: ", what.substr(0, what.find('\n'))));
  }
  if (!value.isGenericDict()) return absl::InvalidArgumentError("not a dict of tensors");
  const c10::Dict<c10::IValue, c10::IValue> dict = value.toGenericDict();
  FD_ASSIGN_OR_RETURN(torch::Tensor ids, DictTensor(dict, "input_ids", 1));
  FD_ASSIGN_OR_RETURN(torch::Tensor mask, DictTensor(dict, "loss_mask", 1));
  FD_ASSIGN_OR_RETURN(torch::Tensor features, DictTensor(dict, "hidden_states", 2));
  if (ids.size(0) == 0 || mask.size(0) != ids.size(0) || features.size(0) != ids.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("lengths differ or are zero: input_ids ",
                                                   ids.size(0), ", loss_mask ", mask.size(0),
                                                   ", hidden_states ", features.size(0)));
  }
  if (ids.is_floating_point() || ids.is_complex()) {
    return absl::InvalidArgumentError("input_ids is not an integer tensor");
  }
  ids = ids.to(torch::kInt64).contiguous();
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_ids holds ", lo < 0 ? lo : hi, ", not a token id in [0, ", vocab, ")"));
  }
  mask = mask.to(torch::kInt64).contiguous();
  if (mask.min().item<int64_t>() < 0 || mask.max().item<int64_t>() > 1) {
    return absl::InvalidArgumentError("loss_mask holds values other than 0 and 1");
  }
  if (!features.is_floating_point()) {
    return absl::InvalidArgumentError("hidden_states is not a floating-point tensor");
  }
  ImportedSample out;
  out.ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.size(0));
  out.mask.assign(mask.data_ptr<int64_t>(), mask.data_ptr<int64_t>() + mask.size(0));
  out.features = features;
  return out;
}

// The *.pt / *.ckpt files under `dir`, in natural order (data_2 before data_10).
absl::StatusOr<std::vector<std::string>> ListSpecForgeFiles(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  std::vector<std::string> files;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    if (it->is_regular_file() && (ext == ".pt" || ext == ".ckpt")) {
      files.push_back(it->path().string());
    }
  }
  if (ec) return absl::InternalError(absl::StrCat(dir, ": ", ec.message()));
  auto natural_less = [](const std::string& a, const std::string& b) {
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
      if (std::isdigit(static_cast<unsigned char>(a[i])) &&
          std::isdigit(static_cast<unsigned char>(b[j]))) {
        size_t ei = i, ej = j;
        while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
        while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
        const std::string na = a.substr(i, ei - i), nb = b.substr(j, ej - j);
        if (na.size() != nb.size()) return na.size() < nb.size();
        if (na != nb) return na < nb;
        i = ei;
        j = ej;
      } else {
        if (a[i] != b[j]) return a[i] < b[j];
        ++i;
        ++j;
      }
    }
    return a.size() - i < b.size() - j;
  };
  std::sort(files.begin(), files.end(), natural_less);
  if (files.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no *.pt or *.ckpt files"));
  return files;
}

// How many target layers an import's files hold: n·H features; which layers they are is
// SpecForge's choice, the same formula as ours (DFLASH.md §2) unless --layers says otherwise.
absl::StatusOr<int> ImportedFeatureCount(const std::vector<std::string>& files,
                                         const TargetModelConfig& t, int otherwise) {
  for (const std::string& f : files) {
    absl::StatusOr<ImportedSample> first = ReadSpecForgeFile(f, t.vocab_size);
    if (!first.ok()) continue;
    const int64_t width = first->features.size(1);
    if (width % t.hidden_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(f, ": hidden_states width ", width,
                                                     " is not a multiple of the target's ",
                                                     "hidden size ", t.hidden_size));
    }
    return static_cast<int>(width / t.hidden_size);
  }
  return otherwise;
}

// The target layers whose features the shards hold: --layers, else the default choice of
// --num-features (or of what the imported files hold).
absl::StatusOr<std::vector<int>> PrepareLayers(const PrepareOptions& o, const TargetModelConfig& t,
                                               const std::vector<std::string>& files) {
  std::vector<int> layers = o.layer_ids;
  int num_features = o.num_features;
  if (!o.import_specforge.empty() && layers.empty()) {
    FD_ASSIGN_OR_RETURN(num_features, ImportedFeatureCount(files, t, num_features));
  }
  if (layers.empty())
    layers = DefaultTargetLayerIds(static_cast<int>(t.num_hidden_layers), num_features);
  for (int id : layers) {
    if (id < 0 || id >= t.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layer id ", id, " is outside the target's ",
                                                     t.num_hidden_layers, " layers"));
    }
  }
  return layers;
}

// The samples of one run into the shards: resumes after an earlier run's complete shards, counts
// what it writes and skips, and shows how far through the input it is.
class SampleWriter {
 public:
  // `teacher_size`: the last columns of feature_size that hold the teacher (0: none).
  SampleWriter(const PrepareOptions& o, int64_t feature_size, int64_t teacher_size,
               double input_size)
      : o_(o),
        import_(!o.import_specforge.empty()),
        dtype_(o.float32_features ? DType::kF32 : DType::kBF16),
        input_size_(input_size),
        writer_(o.out, feature_size, dtype_, o.samples_per_shard) {
    writer_.SetTeacherSize(teacher_size);
  }

  absl::Status Resume() {
    FD_ASSIGN_OR_RETURN(done_, writer_.ResumeExisting());
    if (done_ > 0)
      std::printf("resuming: %lld samples already in complete shards\n",
                  static_cast<long long>(done_));
    progress_.emplace(Progress::ForStream("prepare", input_size_, import_ ? "files" : "B", stdout));
    return absl::OkStatus();
  }
  // `at`: how far through the input (bytes of the JSONL, or files imported).
  void ShowProgress(double at) {
    progress_->Update(at, absl::StrCat(done_ + written_, " samples, ", tokens_, " tokens"));
  }
  // A bad record is fatal, or reported and skipped with --skip-bad-lines.
  absl::Status Bad(const std::string& where, const absl::Status& s) {
    const std::string what = absl::StrCat(where, ": ", s.message());
    if (!o_.skip_bad_lines) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " (--skip-bad-lines to skip such ", import_ ? "files" : "lines", ")"));
    }
    std::fprintf(stderr, "skipped %s\n", what.c_str());
    ++bad_;
    return absl::OkStatus();
  }
  // Counts a valid sample; true when an earlier run's complete shard holds it already.
  bool AlreadyWritten() { return valid_++ < done_; }
  absl::Status Add(std::vector<int64_t>& ids, std::vector<int64_t>& mask,
                   const torch::Tensor& features) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(ids.size()), o_.max_seq_len);
    ids.resize(len);
    mask.resize(len);
    const torch::Tensor f = features.narrow(0, 0, len)
                                .to(dtype_ == DType::kBF16 ? torch::kBFloat16 : torch::kFloat32)
                                .contiguous();
    FD_RETURN_IF_ERROR(writer_.Add(ids, mask, f.data_ptr()));
    ++written_;
    tokens_ += len;
    return absl::OkStatus();
  }
  // The metadata, the target's frozen tensors and the last shard.
  // `input_done`: the input's whole size, as the progress shows it.
  absl::Status Finish(const TargetModel& model, const std::vector<int>& layers, double input_done);

 private:
  const PrepareOptions& o_;
  const bool import_;
  const DType dtype_;
  const double input_size_;
  ShardWriter writer_;
  std::optional<flashdraft::Progress> progress_;  // from Resume on
  int64_t done_ = 0, valid_ = 0, written_ = 0, bad_ = 0, tokens_ = 0;
};

absl::Status SampleWriter::Finish(const TargetModel& model, const std::vector<int>& layers,
                                  double input_done) {
  const std::string input = import_ ? o_.import_specforge : o_.data;
  if (valid_ == 0) return absl::InvalidArgumentError(absl::StrCat(input, ": no valid samples"));
  const DrafterModelConfig d =
      DrafterConfigForTarget(model.config(), layers, o_.max_seq_len, o_.mask_token_id);
  writer_.SetMetadata("drafter_config", DrafterConfigToJson(d));
  writer_.SetMetadata("source", absl::StrCat("flashdraft prepare --target ", o_.target,
                                             import_ ? " --import-specforge " : " --data ", input));
  FD_RETURN_IF_ERROR(WriteFrozenTargetTensors(model, o_.out + "/target.safetensors"));
  FD_RETURN_IF_ERROR(writer_.Finish());
  ShowProgress(input_done);
  progress_->Finish();
  std::printf("prepared %lld samples (%lld new, %lld tokens), %lld bad %s skipped -> %s\n",
              static_cast<long long>(valid_), static_cast<long long>(written_),
              static_cast<long long>(tokens_), static_cast<long long>(bad_),
              import_ ? "file(s)" : "line(s)", o_.out.c_str());
  return absl::OkStatus();
}

// --import-specforge: each file one sample with its features.
absl::Status ImportFiles(const std::vector<std::string>& files, const TargetModelConfig& t,
                         int64_t feature_size, size_t layers, SampleWriter& out) {
  size_t seen = 0;
  for (const std::string& file : files) {
    out.ShowProgress(static_cast<double>(seen++));
    absl::StatusOr<ImportedSample> sample = ReadSpecForgeFile(file, t.vocab_size);
    if (sample.ok() && sample->features.size(1) != feature_size) {
      sample = absl::InvalidArgumentError(
          absl::StrCat("hidden_states width ", sample->features.size(1), " is not ", layers,
                       " layers x hidden size ", t.hidden_size, " = ", feature_size));
    }
    if (!sample.ok()) {
      FD_RETURN_IF_ERROR(out.Bad(file, sample.status()));
      continue;
    }
    if (out.AlreadyWritten()) continue;  // in a complete shard of an earlier run
    FD_RETURN_IF_ERROR(out.Add(sample->ids, sample->mask, sample->features));
  }
  return absl::OkStatus();
}

// --data: each JSONL line one sample, its features from the target's forward (`computed`: the
// layers a row holds, the teacher's last).
absl::Status ReadLines(const PrepareOptions& o, std::istream& in, TargetModel& model,
                       const std::vector<int>& computed, SampleWriter& out) {
  const int64_t vocab = model.config().vocab_size;
  std::string line;
  int64_t line_no = 0;
  std::vector<int64_t> ids, mask;
  ChatLineReader chat({o.target, o.tokenizer, o.max_new_tokens, o.chat}, model);
  while (std::getline(in, line)) {
    ++line_no;
    if (const std::streamoff at = in.tellg(); at >= 0) out.ShowProgress(static_cast<double>(at));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    bool is_chat = false;
    absl::Status s = chat.Parse(line, vocab, /*regenerate=*/false, ids, mask, &is_chat);
    if (!s.ok()) {
      FD_RETURN_IF_ERROR(out.Bad(absl::StrCat(o.data, ":", line_no), s));
      continue;
    }
    if (out.AlreadyWritten()) continue;  // in a complete shard of an earlier run
    if (is_chat && o.regenerate) {
      absl::Status r = chat.Parse(line, vocab, /*regenerate=*/true, ids, mask, &is_chat);
      if (!r.ok())
        return absl::InternalError(absl::StrCat(o.data, ":", line_no, ": ", r.message()));
    }
    if (static_cast<int64_t>(ids.size()) > o.max_seq_len) ids.resize(o.max_seq_len);
    const torch::Tensor input = torch::tensor(ids, torch::kInt64).unsqueeze(0);
    FD_ASSIGN_OR_RETURN(TargetOutput features,
                        model.Forward(input, computed, /*with_logits=*/false));
    FD_RETURN_IF_ERROR(out.Add(ids, mask, features.features.squeeze(0)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Prepare(const PrepareOptions& o) {
  const bool import = !o.import_specforge.empty();
  if (import == !o.data.empty()) {
    return absl::InvalidArgumentError("give exactly one of --data and --import-specforge");
  }
  if (import && o.teacher) {
    return absl::InvalidArgumentError(
        "--teacher needs --data: the target computes its final hidden state, and imported "
        "SpecForge files hold none");
  }
  FD_ASSIGN_OR_RETURN(auto model, TargetModel::Load(o.target));
  const TargetModelConfig& t = model->config();
  std::vector<std::string> files;
  if (import) {
    FD_ASSIGN_OR_RETURN(files, ListSpecForgeFiles(o.import_specforge));
  }
  FD_ASSIGN_OR_RETURN(const std::vector<int> layers, PrepareLayers(o, t, files));
  std::ifstream in;
  if (!import) {
    in.open(o.data);
    if (!in) return absl::NotFoundError(absl::StrCat(o.data, ": cannot open"));
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.out, ": ", ec.message()));

  // The layers a row holds: the drafter's, then with --teacher the target's last.
  const std::vector<int> computed =
      LayersWithTeacher(layers, static_cast<int>(t.num_hidden_layers), o.teacher);
  const int64_t feature_size = static_cast<int64_t>(computed.size()) * t.hidden_size;
  // How far through the input (bytes of the JSONL, or files imported): a bar on a terminal.
  std::error_code size_error;
  const auto input_bytes = import ? 0 : std::filesystem::file_size(o.data, size_error);
  SampleWriter out(o, feature_size, o.teacher ? t.hidden_size : 0,
                   import       ? static_cast<double>(files.size())
                   : size_error ? 0.0
                                : input_bytes);
  FD_RETURN_IF_ERROR(out.Resume());
  if (import) {
    FD_RETURN_IF_ERROR(ImportFiles(files, t, feature_size, layers.size(), out));
  } else {
    FD_RETURN_IF_ERROR(ReadLines(o, in, *model, computed, out));
  }
  return out.Finish(*model, layers,
                    import ? static_cast<double>(files.size()) : static_cast<double>(input_bytes));
}

}  // namespace flashdraft
