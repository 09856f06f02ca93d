// `flashdraft inspect PATH`: the tensors of a safetensors file or model folder, with CRCs.
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "common/crc32c.h"
#include "common/safetensors.h"

namespace flashdraft {
namespace {

class InspectCommand : public Command {
 public:
  explicit InspectCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "inspect", "List the tensors of a safetensors file or Hugging Face model folder")) {
    app().add_option("path", path_, "file.safetensors or model folder")->required();
  }

  int Run() override {
    absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(path_);
    if (!model.ok()) return Fail(model.status());
    uint64_t total = 0;
    std::printf("%-60s %-5s %-22s %14s %10s\n", "tensor", "dtype", "shape", "bytes", "crc32c");
    for (const std::string& name : (*model)->names()) {
      TensorView v = *(*model)->Get(name);
      std::printf("%-60s %-5s %-22s %14zu   %08x\n", name.c_str(),
                  std::string(DTypeName(v.dtype)).c_str(), ShapeString(v.shape).c_str(), v.nbytes,
                  Crc32c(v.data, v.nbytes));
      total += v.nbytes;
    }
    std::printf("%zu tensors, %llu bytes\n", (*model)->names().size(),
                static_cast<unsigned long long>(total));
    return 0;
  }

 private:
  std::string path_;
};

}  // namespace

void AddInspectCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<InspectCommand>(app));
}

}  // namespace flashdraft
