// libFuzzer: a safetensors image (header length, JSON header, data) parsed in memory, then every
// tensor it lists looked up.
#include <cstdint>
#include <string>

#include "common/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = flashdraft::SafetensorsFile::FromBytes(
      "fuzz.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  for (const std::string& name : (*file)->names()) {
    auto view = (*file)->Get(name);
    if (view.ok() && view->nbytes > 0) {
      volatile uint8_t sink = view->data[0] ^ view->data[view->nbytes - 1];  // in bounds
      (void)sink;
    }
  }
  return 0;
}
