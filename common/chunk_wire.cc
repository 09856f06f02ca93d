#include "common/chunk_wire.h"

#include <grpcpp/support/slice.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kDataField = 15;  // TensorChunk.data

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void ReleaseOwner(void* p) { delete static_cast<std::shared_ptr<const void>*>(p); }

// Reads protobuf wire primitives across the slices of a received buffer.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) remaining_ += s.size();
    Skip0();
  }
  uint64_t remaining() const { return remaining_; }

  bool Byte(uint8_t* b) {
    if (remaining_ == 0) return false;
    *b = slices_[index_].begin()[offset_];
    Advance(1);
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Takes `n` bytes as spans of the slices (no copy); appends a copy to `copy` when given.
  bool Take(uint64_t n, std::vector<absl::Span<const uint8_t>>* spans, std::string* copy) {
    if (n > remaining_) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[index_];
      const size_t len = std::min<uint64_t>(n, s.size() - offset_);
      const uint8_t* p = s.begin() + offset_;
      if (spans != nullptr) spans->emplace_back(p, len);
      if (copy != nullptr) copy->append(reinterpret_cast<const char*>(p), len);
      Advance(len);
      n -= len;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    remaining_ -= n;
    Skip0();
  }
  // Moves past exhausted (and empty) slices.
  void Skip0() {
    while (index_ < slices_.size() && offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0, offset_ = 0;
  uint64_t remaining_ = 0;
};

}  // namespace

grpc::ByteBuffer EncodeChunkBuffer(v1::TensorChunk& header, const uint8_t* data, size_t len,
                                   const std::shared_ptr<const void>& owner, int wrapper_field,
                                   std::optional<uint32_t> crc) {
  header.clear_data();
  header.set_crc32c(crc.has_value() ? *crc : len == 0 ? 0 : Crc32c(data, len));
  const std::string serialized = header.SerializeAsString();
  std::string prefix;
  const uint64_t data_field_bytes = len == 0 ? 0 : 1 + VarintSize(len) + len;
  if (wrapper_field != 0) {
    PutVarint(prefix, (static_cast<uint64_t>(wrapper_field) << 3) | kLengthDelimited);
    PutVarint(prefix, serialized.size() + data_field_bytes);
  }
  prefix += serialized;
  if (len == 0) {
    grpc::Slice head(prefix);
    return grpc::ByteBuffer(&head, 1);
  }
  PutVarint(prefix, (kDataField << 3) | kLengthDelimited);
  PutVarint(prefix, len);
  grpc::Slice slices[2] = {grpc::Slice(prefix),
                           owner ? grpc::Slice(const_cast<uint8_t*>(data), len, &ReleaseOwner,
                                               new std::shared_ptr<const void>(owner))
                                 : grpc::Slice(data, len, grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, 2);
}

absl::Status EncodeTensorBuffers(const TensorSpec& spec, const void* data, size_t nbytes,
                                 size_t max_chunk_bytes, const std::shared_ptr<const void>& owner,
                                 int wrapper_field, std::vector<grpc::ByteBuffer>* out,
                                 absl::Span<const uint32_t> chunk_crcs) {
  v1::TensorChunk header;
  FD_ASSIGN_OR_RETURN(const uint32_t num_chunks,
                      StartChunkHeader(spec, nbytes, max_chunk_bytes, header));
  if (!chunk_crcs.empty() && chunk_crcs.size() != num_chunks) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "': ", chunk_crcs.size(),
                                                   " chunk CRCs for ", num_chunks, " chunks"));
  }
  const uint8_t* src = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < num_chunks; ++i) {
    const uint64_t offset = i * max_chunk_bytes;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(max_chunk_bytes, nbytes - offset));
    header.set_offset(offset);
    header.set_chunk_index(static_cast<uint32_t>(i));
    out->push_back(EncodeChunkBuffer(
        header, src + offset, len, owner, wrapper_field,
        chunk_crcs.empty() ? std::nullopt : std::optional<uint32_t>(chunk_crcs[i])));
  }
  return absl::OkStatus();
}

bool ParseChunkBuffer(const grpc::ByteBuffer& buffer, int wrapper_field, ReceivedChunk* out) {
  out->data.clear();
  out->slices.clear();
  if (!buffer.Dump(&out->slices).ok()) return false;
  SliceCursor in(out->slices);
  if (wrapper_field != 0) {
    uint64_t tag, len;
    if (!in.Varint(&tag) ||
        tag != ((static_cast<uint64_t>(wrapper_field) << 3) | kLengthDelimited) ||
        !in.Varint(&len) || len != in.remaining()) {
      return false;
    }
  }
  // Copy the header fields (small) until the data field, which must run to the end.
  std::string header;
  while (in.remaining() > 0) {
    uint64_t tag;
    if (!in.Varint(&tag)) return false;
    if (tag == ((kDataField << 3) | kLengthDelimited)) {
      uint64_t len;
      if (!in.Varint(&len) || len != in.remaining()) return false;
      if (!in.Take(len, &out->data, nullptr)) return false;
      break;
    }
    PutVarint(header, tag);
    uint64_t v;
    switch (tag & 7) {
      case 0:  // varint
        if (!in.Varint(&v)) return false;
        PutVarint(header, v);
        break;
      case 1:  // fixed64
        if (!in.Take(8, nullptr, &header)) return false;
        break;
      case 2:  // length-delimited
        if (!in.Varint(&v) || v > in.remaining()) return false;
        PutVarint(header, v);
        if (!in.Take(v, nullptr, &header)) return false;
        break;
      case 5:  // fixed32
        if (!in.Take(4, nullptr, &header)) return false;
        break;
      default:
        return false;
    }
  }
  return out->header.ParseFromString(header);
}

grpc::ByteBuffer MessageToBuffer(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

bool BufferToMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message) {
  if (!buffer.Valid()) return message->ParseFromArray(nullptr, 0);  // an empty message
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok()) return false;
  return message->ParseFromArray(slice.begin(), static_cast<int>(slice.size()));
}

}  // namespace flashdraft
