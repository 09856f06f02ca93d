#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

using json = nlohmann::json;

absl::Status FileError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status TensorError(const std::string& path, absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': ", what));
}

absl::StatusOr<TensorView> CheckView(const std::string& path, absl::string_view name,
                                     const TensorView& view, DType dtype,
                                     const std::vector<int64_t>& shape) {
  if (view.dtype != dtype) {
    return TensorError(
        path, name,
        absl::StrCat("dtype is ", DTypeName(view.dtype), ", expected ", DTypeName(dtype)));
  }
  if (!shape.empty() && view.shape != shape) {
    return TensorError(
        path, name,
        absl::StrCat("shape is ", ShapeString(view.shape), ", expected ", ShapeString(shape)));
  }
  return view;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return FileError(path, "not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return FileError(
        path, absl::StrCat("file is ", size, " bytes, too short for the 8-byte header length"));
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (mapping == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(err)));
  }
  file->mapping_ = mapping;
  file->mapping_size_ = size;
  FD_RETURN_IF_ERROR(file->Parse(static_cast<const uint8_t*>(mapping), size));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string label,
                                                                            std::string bytes) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(label);
  file->owned_ = std::move(bytes);
  if (file->owned_.size() < 8) {
    return FileError(file->path_, absl::StrCat("file is ", file->owned_.size(),
                                               " bytes, too short for the 8-byte header length"));
  }
  FD_RETURN_IF_ERROR(
      file->Parse(reinterpret_cast<const uint8_t*>(file->owned_.data()), file->owned_.size()));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

absl::Status SafetensorsFile::Parse(const uint8_t* bytes, size_t size) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return FileError(path_, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                         kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_len > size - 8) {
    return FileError(path_, absl::StrCat("header length ", header_len, " exceeds the ", size - 8,
                                         " bytes that follow it (truncated file?)"));
  }
  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {
    return FileError(path_, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return FileError(path_, "header is not a JSON object");

  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return FileError(path_, "__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return FileError(path_,
                           absl::StrCat("__metadata__ value of '", m.key(), "' is not a string"));
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return TensorError(path_, name, "entry is not an object");
    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return TensorError(path_, name, "missing or non-string \"dtype\"");
    }
    const std::string dtype_name = dtype_it->get<std::string>();
    std::optional<DType> dtype = DTypeFromName(dtype_name);
    if (!dtype) {
      return TensorError(path_, name,
                         absl::StrCat("unsupported dtype '", dtype_name,
                                      "' (supported: F32 F16 BF16 I64 I32 BOOL U8)"));
    }
    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return TensorError(path_, name, "missing or non-array \"shape\"");
    }
    std::vector<int64_t> shape;
    for (const json& d : *shape_it) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 56)) {
        return TensorError(path_, name, absl::StrCat("bad dimension ", d.dump(), " in shape"));
      }
      shape.push_back(d.get<int64_t>());
    }
    auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      return TensorError(path_, name, "\"data_offsets\" must be two non-negative integers");
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (end < begin) {
      return TensorError(path_, name,
                         absl::StrCat("data_offsets [", begin, ", ", end, "] end before begin"));
    }
    absl::StatusOr<uint64_t> nbytes = ByteSize(*dtype, shape);
    if (!nbytes.ok()) return TensorError(path_, name, nbytes.status().message());
    if (*nbytes != end - begin) {
      return TensorError(
          path_, name,
          absl::StrCat("shape ", ShapeString(shape), " of ", dtype_name, " needs ", *nbytes,
                       " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin));
    }
    if (end > data_size) {
      return TensorError(path_, name,
                         absl::StrCat("data_offsets end ", end, " is past the ", data_size,
                                      " bytes of data in the file (truncated file?)"));
    }
    TensorView view;
    view.dtype = *dtype;
    view.shape = std::move(shape);
    view.data = data + begin;
    view.nbytes = end - begin;
    tensors_.emplace(name, std::move(view));
    spans.push_back({begin, end, name});
  }

  // The data section must be tiled exactly: no overlaps, no gaps, no trailing bytes.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const std::string* previous = nullptr;
  for (const Span& s : spans) {
    if (s.begin < cursor) {
      return TensorError(path_, s.name,
                         absl::StrCat("data_offsets [", s.begin, ", ", s.end, "] overlap tensor '",
                                      *previous, "' (ends at ", cursor, ")"));
    }
    if (s.begin > cursor) {
      return TensorError(
          path_, s.name,
          absl::StrCat("gap of ", s.begin - cursor, " bytes before its data at ", s.begin));
    }
    cursor = s.end;
    previous = &s.name;
    names_.push_back(s.name);
  }
  if (cursor != data_size) {
    return FileError(
        path_, absl::StrCat(data_size - cursor, " unexpected bytes after the last tensor's data"));
  }
  return absl::OkStatus();
}

bool SafetensorsFile::Contains(absl::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

absl::StatusOr<TensorView> SafetensorsFile::Get(absl::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named '", name, "'"));
  }
  return it->second;
}

absl::StatusOr<TensorView> SafetensorsFile::GetChecked(absl::string_view name, DType dtype,
                                                       const std::vector<int64_t>& shape) const {
  FD_ASSIGN_OR_RETURN(TensorView view, Get(name));
  return CheckView(path_, name, view, dtype, shape);
}

absl::Status SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                                    const void* data, size_t nbytes) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("invalid tensor name '", name, "'"));
  }
  for (const Entry& e : entries_) {
    if (e.name == name) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' added twice"));
    }
  }
  FD_ASSIGN_OR_RETURN(uint64_t expected, ByteSize(dtype, shape));
  if (expected != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': shape ",
                                                   ShapeString(shape), " of ", DTypeName(dtype),
                                                   " needs ", expected, " bytes, got ", nbytes));
  }
  entries_.push_back({std::move(name), dtype, std::move(shape), data, nbytes});
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::Header() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", DTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xFF));
  return out + text;
}

std::vector<absl::string_view> SafetensorsWriter::Pieces(const std::string& header) const {
  std::vector<absl::string_view> pieces = {header};
  for (const Entry& e : entries_) pieces.emplace_back(static_cast<const char*>(e.data), e.nbytes);
  return pieces;
}

std::string SafetensorsWriter::Serialize() const {
  const std::string header = Header();
  std::string out;
  for (absl::string_view piece : Pieces(header)) out.append(piece.data(), piece.size());
  return out;
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  const std::string header = Header();
  return WriteFileAtomically(path, Pieces(header));
}

absl::Status SafetensorsWriter::Write(const std::string& path,
                                      const std::function<void(size_t)>& written, uint64_t* bytes,
                                      uint32_t* crc32c) const {
  const std::string header = Header();
  const std::vector<absl::string_view> pieces = Pieces(header);
  uint64_t size = 0;
  uint32_t crc = 0;
  for (absl::string_view piece : pieces) {
    size += piece.size();
    crc = Crc32cExtend(crc, piece.data(), piece.size());
  }
  FD_RETURN_IF_ERROR(WriteFileAtomically(path, pieces, written));
  *bytes = size;
  *crc32c = crc;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(const std::string& path) {
  namespace fs = std::filesystem;
  auto model = std::make_unique<SafetensorsModel>();
  model->path_ = path;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    FD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    for (const std::string& name : file->names()) model->index_[name] = file.get();
    model->files_.push_back(std::move(file));
    return model;
  }
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  const fs::path dir(path);
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (!fs::exists(index_path, ec)) {
    const fs::path single = dir / "model.safetensors";
    if (!fs::exists(single, ec)) {
      return absl::NotFoundError(absl::StrCat(
          path, ": contains neither model.safetensors nor model.safetensors.index.json"));
    }
    return Open(single.string());
  }
  FD_ASSIGN_OR_RETURN(std::string index_text, ReadFile(index_path.string()));
  json index;
  try {
    index = json::parse(index_text);
  } catch (const json::exception& e) {
    return FileError(index_path.string(), absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return FileError(index_path.string(), "missing \"weight_map\" object");
  }
  std::map<std::string, const SafetensorsFile*> shards;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return FileError(index_path.string(),
                       absl::StrCat("weight_map entry for '", it.key(), "' is not a string"));
    }
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") {
      return FileError(index_path.string(), absl::StrCat("weight_map entry for '", it.key(),
                                                         "' names an invalid shard '", shard,
                                                         "' (must be a file in the folder)"));
    }
    auto found = shards.find(shard);
    if (found == shards.end()) {
      FD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open((dir / shard).string()));
      found = shards.emplace(shard, file.get()).first;
      model->files_.push_back(std::move(file));
    }
    if (!found->second->Contains(it.key())) {
      return FileError(index_path.string(),
                       absl::StrCat("weight_map places tensor '", it.key(), "' in ", shard,
                                    ", which has no such tensor"));
    }
    model->index_[it.key()] = found->second;
  }
  return model;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, file] : index_) out.push_back(name);
  return out;
}

bool SafetensorsModel::Contains(absl::string_view name) const {
  return index_.find(name) != index_.end();
}

absl::StatusOr<const SafetensorsFile*> SafetensorsModel::FileOf(absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named '", name, "'"));
  }
  return it->second;
}

absl::StatusOr<TensorView> SafetensorsModel::Get(absl::string_view name) const {
  FD_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->Get(name);
}

absl::StatusOr<TensorView> SafetensorsModel::GetChecked(absl::string_view name, DType dtype,
                                                        const std::vector<int64_t>& shape) const {
  FD_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->GetChecked(name, dtype, shape);
}

}  // namespace flashdraft
