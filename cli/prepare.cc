#include "cli/prepare.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/chat_template.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/tokenizer.h"
#include "coordinator/sources/shard_source.h"
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

}  // namespace

absl::Status Prepare(const PrepareOptions& o) {
  const bool import = !o.import_specforge.empty();
  if (import == !o.data.empty()) {
    return absl::InvalidArgumentError("give exactly one of --data and --import-specforge");
  }
  FD_ASSIGN_OR_RETURN(auto model, TargetModel::Load(o.target));
  const TargetModelConfig& t = model->config();
  std::vector<std::string> files;
  if (import) {
    FD_ASSIGN_OR_RETURN(files, ListSpecForgeFiles(o.import_specforge));
  }
  std::vector<int> layers = o.layer_ids;
  int num_features = o.num_features;
  if (import && layers.empty()) {
    // The files hold n·H features; which layers they are is SpecForge's choice, the same
    // formula as ours (DFLASH.md §2) unless --layers says otherwise.
    for (const std::string& f : files) {
      absl::StatusOr<ImportedSample> first = ReadSpecForgeFile(f, t.vocab_size);
      if (!first.ok()) continue;
      const int64_t width = first->features.size(1);
      if (width % t.hidden_size != 0) {
        return absl::InvalidArgumentError(absl::StrCat(f, ": hidden_states width ", width,
                                                       " is not a multiple of the target's ",
                                                       "hidden size ", t.hidden_size));
      }
      num_features = static_cast<int>(width / t.hidden_size);
      break;
    }
  }
  if (layers.empty())
    layers = DefaultTargetLayerIds(static_cast<int>(t.num_hidden_layers), num_features);
  for (int id : layers) {
    if (id < 0 || id >= t.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layer id ", id, " is outside the target's ",
                                                     t.num_hidden_layers, " layers"));
    }
  }
  std::ifstream in;
  if (!import) {
    in.open(o.data);
    if (!in) return absl::NotFoundError(absl::StrCat(o.data, ": cannot open"));
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.out, ": ", ec.message()));

  const int64_t feature_size = static_cast<int64_t>(layers.size()) * t.hidden_size;
  const DType dtype = o.float32_features ? DType::kF32 : DType::kBF16;
  ShardWriter writer(o.out, feature_size, dtype, o.samples_per_shard);
  FD_ASSIGN_OR_RETURN(int64_t done, writer.ResumeExisting());
  if (done > 0)
    std::printf("resuming: %lld samples already in complete shards\n",
                static_cast<long long>(done));

  int64_t valid = 0, written = 0, bad = 0, tokens = 0;
  // How far through the input (bytes of the JSONL, or files imported): a bar on a terminal.
  std::error_code size_error;
  const auto input_bytes = import ? 0 : std::filesystem::file_size(o.data, size_error);
  Progress progress = Progress::ForStream("prepare",
                                          import       ? static_cast<double>(files.size())
                                          : size_error ? 0.0
                                                       : input_bytes,
                                          import ? "files" : "B", stdout);
  auto note = [&] { return absl::StrCat(done + written, " samples, ", tokens, " tokens"); };
  // A bad record is fatal, or reported and skipped with --skip-bad-lines.
  auto bad_record = [&](const std::string& where, const absl::Status& s) {
    const std::string what = absl::StrCat(where, ": ", s.message());
    if (!o.skip_bad_lines) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " (--skip-bad-lines to skip such ", import ? "files" : "lines", ")"));
    }
    std::fprintf(stderr, "skipped %s\n", what.c_str());
    ++bad;
    return absl::OkStatus();
  };
  auto add = [&](std::vector<int64_t>& ids, std::vector<int64_t>& mask,
                 const torch::Tensor& features) -> absl::Status {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(ids.size()), o.max_seq_len);
    ids.resize(len);
    mask.resize(len);
    const torch::Tensor f = features.narrow(0, 0, len)
                                .to(dtype == DType::kBF16 ? torch::kBFloat16 : torch::kFloat32)
                                .contiguous();
    FD_RETURN_IF_ERROR(writer.Add(ids, mask, f.data_ptr()));
    ++written;
    tokens += len;
    return absl::OkStatus();
  };

  if (import) {
    for (const std::string& file : files) {
      progress.Update(static_cast<double>(valid + bad), note());
      absl::StatusOr<ImportedSample> sample = ReadSpecForgeFile(file, t.vocab_size);
      if (sample.ok() && sample->features.size(1) != feature_size) {
        sample = absl::InvalidArgumentError(absl::StrCat(
            "hidden_states width ", sample->features.size(1), " is not ", layers.size(),
            " layers x hidden size ", t.hidden_size, " = ", feature_size));
      }
      if (!sample.ok()) {
        FD_RETURN_IF_ERROR(bad_record(file, sample.status()));
        continue;
      }
      if (valid++ < done) continue;  // in a complete shard of an earlier run
      FD_RETURN_IF_ERROR(add(sample->ids, sample->mask, sample->features));
    }
  } else {
    std::string line;
    int64_t line_no = 0;
    std::vector<int64_t> ids, mask;
    ChatLineReader chat({o.target, o.tokenizer, o.max_new_tokens}, *model);
    while (std::getline(in, line)) {
      ++line_no;
      if (const std::streamoff at = in.tellg(); at >= 0) {
        progress.Update(static_cast<double>(at), note());
      }
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      bool is_chat = false;
      absl::Status s = chat.Parse(line, t.vocab_size, /*regenerate=*/false, ids, mask, &is_chat);
      if (!s.ok()) {
        FD_RETURN_IF_ERROR(bad_record(absl::StrCat(o.data, ":", line_no), s));
        continue;
      }
      if (valid++ < done) continue;  // in a complete shard of an earlier run
      if (is_chat && o.regenerate) {
        absl::Status r = chat.Parse(line, t.vocab_size, /*regenerate=*/true, ids, mask, &is_chat);
        if (!r.ok())
          return absl::InternalError(absl::StrCat(o.data, ":", line_no, ": ", r.message()));
      }
      if (static_cast<int64_t>(ids.size()) > o.max_seq_len) ids.resize(o.max_seq_len);
      const torch::Tensor input = torch::tensor(ids, torch::kInt64).unsqueeze(0);
      FD_ASSIGN_OR_RETURN(TargetOutput out, model->Forward(input, layers, /*with_logits=*/false));
      FD_RETURN_IF_ERROR(add(ids, mask, out.features.squeeze(0)));
    }
  }
  const std::string input = import ? o.import_specforge : o.data;
  if (valid == 0) return absl::InvalidArgumentError(absl::StrCat(input, ": no valid samples"));

  const DrafterModelConfig d = DrafterConfigForTarget(t, layers, o.max_seq_len, o.mask_token_id);
  writer.SetMetadata("drafter_config", DrafterConfigToJson(d));
  writer.SetMetadata("source", absl::StrCat("flashdraft prepare --target ", o.target,
                                            import ? " --import-specforge " : " --data ", input));

  FD_RETURN_IF_ERROR(WriteFrozenTargetTensors(*model, o.out + "/target.safetensors"));
  FD_RETURN_IF_ERROR(writer.Finish());
  progress.Update(import ? static_cast<double>(files.size()) : static_cast<double>(input_bytes),
                  note());
  progress.Finish();
  std::printf("prepared %lld samples (%lld new, %lld tokens), %lld bad %s skipped -> %s\n",
              static_cast<long long>(valid), static_cast<long long>(written),
              static_cast<long long>(tokens), static_cast<long long>(bad),
              import ? "file(s)" : "line(s)", o.out.c_str());
  return absl::OkStatus();
}

}  // namespace flashdraft
