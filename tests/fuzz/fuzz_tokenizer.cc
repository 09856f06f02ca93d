// libFuzzer: tokenizer.json files. A loaded tokenizer encodes and decodes a fixed text.
#include <cstdint>
#include <string>

#include "common/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tokenizer = flashdraft::Tokenizer::FromJson(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz/tokenizer.json");
  if (!tokenizer.ok()) return 0;
  const std::vector<int32_t> ids = (*tokenizer)->Encode("Hello, world! <|im_start|> 123 \xc3\xa9");
  (void)(*tokenizer)->Decode(ids);
  return 0;
}
