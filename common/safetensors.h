// Hugging Face safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then raw data.
// Reading maps the file and hands out views into it; every malformed file is an error that names
// the file and, where one is involved, the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace flashdraft {

// Header sizes above this are refused before parsing (the reference implementation uses 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// A tensor's bytes inside a mapped file (or any other buffer); valid while its owner lives.
// `data` carries no alignment promise: copy out or use unaligned loads.
struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const { return nbytes / ElementSize(dtype); }
};

class SafetensorsFile {
 public:
  // Maps and validates `path`.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Validates a file image held in memory; `label` names it in errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string label,
                                                                    std::string bytes);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names in data order.
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(absl::string_view name) const;
  // NotFound naming the file and tensor when absent.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  // Get() plus a check of dtype and shape (empty `shape` = any); errors name file, tensor and both.
  absl::StatusOr<TensorView> GetChecked(absl::string_view name, DType dtype,
                                        const std::vector<int64_t>& shape = {}) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  absl::Status Parse(const uint8_t* bytes, size_t size);

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::string owned_;  // FromBytes() storage
  std::vector<std::string> names_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors (by reference: their memory must outlive Write) and writes one file atomically
// (temporary file, fsync, rename). Header padded with spaces to a multiple of 8 bytes, as the
// reference writer does, so that the data section starts aligned.
class SafetensorsWriter {
 public:
  absl::Status Add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                   size_t nbytes);
  void SetMetadata(std::string key, std::string value);
  absl::Status Write(const std::string& path) const;
  // The same, the tensors written from where they lie (never copied into one image), `written`
  // told the bytes so far; the file's size and CRC-32C into *bytes and *crc32c.
  absl::Status Write(const std::string& path, const std::function<void(size_t)>& written,
                     uint64_t* bytes, uint32_t* crc32c) const;
  // The complete file image (used by Write and by tests).
  std::string Serialize() const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t nbytes;
  };
  // The length prefix and JSON header; the pieces of the whole file after it.
  std::string Header() const;
  std::vector<absl::string_view> Pieces(const std::string& header) const;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A model folder as Hugging Face stores it: `model.safetensors`, or shards listed by
// `model.safetensors.index.json` ({"weight_map": {tensor: shard file}}). Also accepts a single
// file.
class SafetensorsModel {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& path);

  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool Contains(absl::string_view name) const;
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  absl::StatusOr<TensorView> GetChecked(absl::string_view name, DType dtype,
                                        const std::vector<int64_t>& shape = {}) const;
  const std::string& path() const { return path_; }

 private:
  absl::StatusOr<const SafetensorsFile*> FileOf(absl::string_view name) const;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*, std::less<>> index_;
};

}  // namespace flashdraft
