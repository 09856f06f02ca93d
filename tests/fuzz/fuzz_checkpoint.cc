// libFuzzer: the checkpoint loader on a damaged checkpoint.json (the files it names exist and are
// whole; the manifest is what the fuzzer writes), and its "numerics" record as a resume reads it.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "coordinator/checkpoint.h"
#include "coordinator/numerics_group.h"

namespace {

const std::string& Root() {
  static const std::string root = [] {
    char dir[] = "/tmp/fuzz_checkpoint_XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    std::filesystem::create_directories(std::string(dir) + "/step-00000001");
    for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
      std::ofstream(std::string(dir) + "/step-00000001/" + name) << "12345678{}";
    }
    return std::string(dir);
  }();
  return root;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(Root() + "/step-00000001/checkpoint.json",
                      std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  flashdraft::CheckpointStore store(Root(), 3, "0123abcd");
  (void)store.Latest();
  // The record alone (Latest() stops at the CRCs first).
  (void)flashdraft::ParseRecordedNumerics(std::string(reinterpret_cast<const char*>(data), size),
                                          "checkpoint.json");
  return 0;
}
