#include "coordinator/sources/regeneration_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/file_util.h"

namespace flashdraft {
namespace {

constexpr char kMagic[] = "FDREGEN1";
constexpr size_t kMagicSize = 8;
constexpr size_t kMaxKey = 1 << 16;
// u64 line, u32 n; then the CRC.
constexpr size_t kRecordHead = 12;

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

std::string Header(const std::string& key) {
  std::string h(kMagic, kMagicSize);
  Put<uint32_t>(h, static_cast<uint32_t>(key.size()));
  h += key;
  return h;
}

// "<bytes> bytes, crc32c <hex>" of a file, or "missing".
std::string FileCrc(const std::string& path) {
  uint64_t bytes = 0;
  const absl::StatusOr<uint32_t> crc = FileCrc32c(path, &bytes);
  if (!crc.ok()) return "missing";
  return absl::StrCat(bytes, " bytes, crc32c ", absl::Hex(*crc, absl::kZeroPad8));
}

std::string WeightFiles(const std::string& target_dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(target_dir, ec)) {
    if (e.path().extension() != ".safetensors") continue;
    const auto time = std::filesystem::last_write_time(e.path(), ec).time_since_epoch().count();
    files.push_back(absl::StrCat(e.path().filename().string(), " ",
                                 std::filesystem::file_size(e.path(), ec), " ", time));
  }
  std::sort(files.begin(), files.end());
  return absl::StrJoin(files, ", ");
}

}  // namespace

absl::StatusOr<uint32_t> FileCrc32c(const std::string& path, uint64_t* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<char> buffer(1 << 20);  // in pieces: a data set is gigabytes
  uint32_t crc = 0;
  uint64_t size = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    crc = Crc32cExtend(crc, buffer.data(), static_cast<size_t>(in.gcount()));
    size += static_cast<uint64_t>(in.gcount());
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  if (bytes != nullptr) *bytes = size;
  return crc;
}

std::string RegenerationKey(const std::string& target, const std::string& target_dir,
                            const std::vector<std::string>& data_paths, int64_t max_new_tokens,
                            const std::string& tokenizer, const ChatRenderOptions& chat) {
  return absl::StrCat(
      "target ", target, "; weights ", WeightFiles(target_dir), "; data ",
      absl::StrJoin(data_paths, "; then ",
                    [](std::string* out, const std::string& path) { out->append(FileCrc(path)); }),
      "; max_new_tokens ", max_new_tokens, "; tokenizer ", FileCrc(tokenizer),
      ChatOptionsKey(chat));
}

absl::StatusOr<std::unique_ptr<RegenerationCache>> RegenerationCache::Open(const std::string& path,
                                                                           const std::string& key) {
  if (key.size() > kMaxKey) return absl::InvalidArgumentError("regeneration key too long");
  std::unique_ptr<RegenerationCache> c(new RegenerationCache());
  c->path_ = path;
  const std::string header = Header(key);
  size_t end = 0;
  if (std::filesystem::exists(path)) {
    absl::StatusOr<std::string> data = ReadFile(path);
    if (!data.ok()) return data.status();
    if (data->compare(0, header.size(), header) == 0) {
      c->ReadRecords(*data, header.size(), &end);
      if (end < data->size()) {
        c->note_ = absl::StrCat(path, ": ", data->size() - end,
                                " byte(s) after the last whole record dropped (an interrupted "
                                "write); regeneration goes on from there");
      }
    } else {
      c->note_ = absl::StrCat(path,
                              ": made for another target, data file or settings; started "
                              "over");
    }
  }
  if (end == 0) {
    if (absl::Status s = WriteFileAtomically(path, header); !s.ok()) return s;
    end = header.size();
  }
  if (truncate(path.c_str(), static_cast<off_t>(end)) != 0) {
    return absl::InternalError(absl::StrCat(path, ": cannot truncate: ", std::strerror(errno)));
  }
  c->file_ = std::fopen(path.c_str(), "ab");
  if (c->file_ == nullptr) {
    return absl::InternalError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  return c;
}

void RegenerationCache::ReadRecords(const std::string& data, size_t offset, size_t* end) {
  *end = offset;
  while (data.size() - offset >= kRecordHead + 4) {
    const char* p = data.data() + offset;
    const int64_t line = static_cast<int64_t>(Load<uint64_t>(p));
    const uint64_t n = Load<uint32_t>(p + 8);
    // 9 bytes per token, then the CRC: checked against what is left before anything is copied.
    const uint64_t body = n * 9;
    if (body > data.size() - offset - kRecordHead - 4) return;
    const size_t size = kRecordHead + body;
    if (Load<uint32_t>(p + size) != Crc32c(p, size)) return;
    Entry e;
    e.ids.resize(n);
    if (n > 0) std::memcpy(e.ids.data(), p + kRecordHead, n * 8);  // data() is null when empty
    e.mask.resize(n);
    for (uint64_t i = 0; i < n; ++i) e.mask[i] = static_cast<uint8_t>(p[kRecordHead + n * 8 + i]);
    entries_[line] = std::move(e);
    offset += size + 4;
    *end = offset;
  }
}

RegenerationCache::~RegenerationCache() {
  if (file_ != nullptr) std::fclose(file_);
}

std::optional<RegenerationCache::Entry> RegenerationCache::Take(int64_t line_no) {
  auto it = entries_.find(line_no);
  if (it == entries_.end()) return std::nullopt;
  Entry e = std::move(it->second);
  entries_.erase(it);
  return e;
}

absl::Status RegenerationCache::Append(int64_t line_no, const std::vector<int64_t>& ids,
                                       const std::vector<int64_t>& mask) {
  if (ids.size() != mask.size() || ids.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("regenerated line ", line_no, ": ", ids.size(),
                                                   " ids and ", mask.size(), " mask values"));
  }
  for (int64_t m : mask) {
    if (m != 0 && m != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("regenerated line ", line_no, ": a loss mask value of ", m));
    }
  }
  std::string record;
  Put<uint64_t>(record, static_cast<uint64_t>(line_no));
  Put<uint32_t>(record, static_cast<uint32_t>(ids.size()));
  if (!ids.empty()) record.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 8);
  for (int64_t m : mask) record.push_back(static_cast<char>(m));
  Put<uint32_t>(record, Crc32c(record.data(), record.size()));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    return absl::InternalError(absl::StrCat(path_, ": cannot write: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
