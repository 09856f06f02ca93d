#include "common/target_fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace flashdraft {
namespace {

// An incremental SHA-256.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
  }
  void Add(const std::string& bytes) { EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size()); }
  std::string Hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_.get(), digest, &len);
    return absl::BytesToHexString(
        absl::string_view(reinterpret_cast<const char*>(digest), static_cast<size_t>(len)));
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

// The JSON header of a safetensors file: an 8-byte little-endian length, then that many bytes.
absl::StatusOr<std::string> SafetensorsHeader(const std::filesystem::path& path) {
  constexpr uint64_t kMaxHeader = uint64_t{100} << 20;  // as safetensors itself allows
  std::ifstream in(path, std::ios::binary);
  unsigned char len_bytes[8];
  if (!in || !in.read(reinterpret_cast<char*>(len_bytes), 8)) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a safetensors file"));
  }
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || len > kMaxHeader || len > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": header length ", len,
                                                   " beyond the file (", size, " bytes)"));
  }
  std::string header(len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(len))) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": cannot read its header"));
  }
  return header;
}

}  // namespace

absl::StatusOr<TargetFingerprintValue> FingerprintTarget(const std::string& target_dir) {
  const std::filesystem::path dir(target_dir);
  absl::StatusOr<std::string> config = ReadFile((dir / "config.json").string());
  if (!config.ok()) {
    return absl::NotFoundError(
        absl::StrCat((dir / "config.json").string(), ": ", config.status().message()));
  }
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(target_dir, ": no *.safetensors file"));
  }
  std::sort(files.begin(), files.end());
  Sha256 config_hash, tensors_hash;
  config_hash.Add(*config);
  for (const auto& file : files) {
    absl::StatusOr<std::string> header = SafetensorsHeader(file);
    if (!header.ok()) return header.status();
    tensors_hash.Add(file.filename().string());
    tensors_hash.Add(std::string(1, '\0'));
    tensors_hash.Add(*header);
  }
  return TargetFingerprintValue{config_hash.Hex(), tensors_hash.Hex()};
}

}  // namespace flashdraft
