#include "common/tensor_codec.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "flashdraft/v1/tensor.pb.h"

namespace flashdraft {

static_assert(static_cast<int>(DType::kF32) == v1::F32);
static_assert(static_cast<int>(DType::kF16) == v1::F16);
static_assert(static_cast<int>(DType::kBF16) == v1::BF16);
static_assert(static_cast<int>(DType::kI64) == v1::I64);
static_assert(static_cast<int>(DType::kI32) == v1::I32);
static_assert(static_cast<int>(DType::kBool) == v1::BOOL);
static_assert(static_cast<int>(DType::kU8) == v1::U8);

namespace {

absl::Status ChunkError(const std::string& name, uint32_t index, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("tensor '", name, "' chunk ", index, ": ", what));
}

}  // namespace

uint64_t NumChunks(uint64_t nbytes, size_t max_chunk_bytes) {
  return nbytes == 0 ? 1 : (nbytes + max_chunk_bytes - 1) / max_chunk_bytes;
}

absl::StatusOr<uint32_t> StartChunkHeader(const TensorSpec& spec, size_t nbytes,
                                          size_t max_chunk_bytes, v1::TensorChunk& header) {
  if (max_chunk_bytes == 0) return absl::InvalidArgumentError("max_chunk_bytes must be > 0");
  FD_ASSIGN_OR_RETURN(uint64_t expected, ByteSize(spec.dtype, spec.shape));
  if (expected != nbytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name, "': shape ", ShapeString(spec.shape), " of ",
                     DTypeName(spec.dtype), " needs ", expected, " bytes, got ", nbytes));
  }
  const uint64_t num_chunks = NumChunks(nbytes, max_chunk_bytes);
  if (num_chunks > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name, "' needs too many chunks"));
  }
  header.set_name(spec.name);
  header.set_dtype(static_cast<v1::DType>(spec.dtype));
  header.mutable_shape()->Assign(spec.shape.begin(), spec.shape.end());
  header.set_total_bytes(nbytes);
  header.set_num_chunks(static_cast<uint32_t>(num_chunks));
  return static_cast<uint32_t>(num_chunks);
}

ChunkCrcWriter::ChunkCrcWriter(void* dst, size_t nbytes, size_t max_chunk_bytes)
    : dst_(static_cast<uint8_t*>(dst)),
      nbytes_(nbytes),
      max_chunk_bytes_(std::max<size_t>(max_chunk_bytes, 1)) {
  crcs_.reserve(NumChunks(nbytes, max_chunk_bytes_));
}

template <typename Fill>
absl::Status ChunkCrcWriter::Write(size_t n, Fill fill) {
  if (n > nbytes_ - written_) {
    return absl::OutOfRangeError(absl::StrCat("ChunkCrcWriter: writing ", n, " bytes at ", written_,
                                              " overflows the tensor's ", nbytes_, " bytes"));
  }
  while (n > 0) {
    const size_t in_chunk = written_ % max_chunk_bytes_;
    const size_t len = std::min(n, max_chunk_bytes_ - in_chunk);
    crc_ = fill(crc_, dst_ + written_, len);
    written_ += len;
    n -= len;
    if (in_chunk + len == max_chunk_bytes_ || written_ == nbytes_) {
      crcs_.push_back(crc_);
      crc_ = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkCrcWriter::Copy(const void* src, size_t n) {
  const uint8_t* from = static_cast<const uint8_t*>(src);
  return Write(n, [&](uint32_t crc, uint8_t* to, size_t len) {
    crc = Crc32cCopy(crc, to, from, len);
    from += len;
    return crc;
  });
}

absl::Status ChunkCrcWriter::Zero(size_t n) {
  // The CRC runs over a small zero block that stays in cache instead of reading the run back.
  static constexpr size_t kBlock = 16 << 10;
  static const uint8_t kZeros[kBlock] = {};
  return Write(n, [&](uint32_t crc, uint8_t* to, size_t len) {
    std::memset(to, 0, len);
    for (size_t done = 0; done < len; done += kBlock) {
      crc = Crc32cExtend(crc, kZeros, std::min(kBlock, len - done));
    }
    return crc;
  });
}

absl::StatusOr<std::vector<uint32_t>> ChunkCrcWriter::Finish() {
  if (written_ != nbytes_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ChunkCrcWriter: ", written_, " of the tensor's ", nbytes_, " bytes were written"));
  }
  // An empty tensor is one empty chunk, whose CRC is 0.
  if (nbytes_ == 0) return std::vector<uint32_t>{0};
  return std::move(crcs_);
}

absl::Status EncodeTensor(const TensorSpec& spec, const void* data, size_t nbytes,
                          size_t max_chunk_bytes, v1::TensorChunk& chunk,
                          const std::function<absl::Status(v1::TensorChunk&)>& sink) {
  FD_ASSIGN_OR_RETURN(const uint32_t num_chunks,
                      StartChunkHeader(spec, nbytes, max_chunk_bytes, chunk));
  const uint8_t* src = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < num_chunks; ++i) {
    const uint64_t offset = i * max_chunk_bytes;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(max_chunk_bytes, nbytes - offset));
    std::string* buf = chunk.mutable_data();
    // resize() would zero-fill the whole buffer first; growing only when needed keeps it to a copy.
    if (buf->size() != len) buf->resize(len);
    chunk.set_crc32c(len == 0 ? 0 : Crc32cCopy(0, buf->data(), src + offset, len));
    chunk.set_offset(offset);
    chunk.set_chunk_index(static_cast<uint32_t>(i));
    FD_RETURN_IF_ERROR(sink(chunk));
  }
  return absl::OkStatus();
}

absl::Status AppendTensorChunks(const TensorSpec& spec, const void* data, size_t nbytes,
                                size_t max_chunk_bytes,
                                std::function<v1::TensorChunk*()> add_chunk) {
  v1::TensorChunk scratch;
  return EncodeTensor(spec, data, nbytes, max_chunk_bytes, scratch, [&](v1::TensorChunk& chunk) {
    // The data moves into the new message; the header is copied.
    std::string data = std::move(*chunk.mutable_data());
    chunk.clear_data();
    v1::TensorChunk* out = add_chunk();
    *out = chunk;
    *out->mutable_data() = std::move(data);
    return absl::OkStatus();
  });
}

TensorAssembler::TensorAssembler(Allocate allocate, uint64_t max_total_bytes)
    : allocate_(std::move(allocate)), max_total_bytes_(max_total_bytes) {}

void TensorAssembler::Reset() {
  started_ = false;
  failed_ = absl::OkStatus();
  spec_ = TensorSpec();
  total_bytes_ = 0;
  num_chunks_ = 0;
  next_index_ = 0;
  received_ = 0;
  dest_ = nullptr;
}

absl::Status TensorAssembler::Start(const v1::TensorChunk& chunk) {
  const std::string& name = chunk.name();
  if (name.empty()) return ChunkError("", chunk.chunk_index(), "empty tensor name");
  std::optional<DType> dtype = DTypeFromInt(chunk.dtype());
  if (!dtype) {
    return ChunkError(name, chunk.chunk_index(),
                      absl::StrCat("unknown dtype value ", static_cast<int>(chunk.dtype())));
  }
  TensorSpec spec{name, *dtype, {chunk.shape().begin(), chunk.shape().end()}};
  absl::StatusOr<uint64_t> expected = ByteSize(spec.dtype, spec.shape);
  if (!expected.ok()) return ChunkError(name, chunk.chunk_index(), expected.status().message());
  if (*expected != chunk.total_bytes()) {
    return ChunkError(
        name, chunk.chunk_index(),
        absl::StrCat("shape ", ShapeString(spec.shape), " of ", DTypeName(spec.dtype), " needs ",
                     *expected, " bytes but the header says ", chunk.total_bytes()));
  }
  if (*expected > max_total_bytes_) {
    return ChunkError(
        name, chunk.chunk_index(),
        absl::StrCat("tensor of ", *expected, " bytes exceeds the limit of ", max_total_bytes_));
  }
  if (chunk.chunk_index() != 0 || chunk.offset() != 0) {
    return ChunkError(name, chunk.chunk_index(),
                      absl::StrCat("first chunk has index ", chunk.chunk_index(), " and offset ",
                                   chunk.offset(), ", expected 0 and 0 (missing chunks?)"));
  }
  if (chunk.num_chunks() == 0 || (*expected > 0 && chunk.num_chunks() > *expected)) {
    return ChunkError(
        name, 0,
        absl::StrCat("implausible num_chunks ", chunk.num_chunks(), " for ", *expected, " bytes"));
  }
  absl::StatusOr<void*> dest = allocate_(spec, *expected);
  if (!dest.ok()) return dest.status();
  if (*dest == nullptr && *expected > 0) {
    return absl::InternalError(absl::StrCat("tensor '", name, "': allocator returned null"));
  }
  spec_ = std::move(spec);
  total_bytes_ = *expected;
  num_chunks_ = chunk.num_chunks();
  dest_ = static_cast<uint8_t*>(*dest);
  started_ = true;
  return absl::OkStatus();
}

absl::Status TensorAssembler::Add(const v1::TensorChunk& chunk) {
  const absl::Span<const uint8_t> data(reinterpret_cast<const uint8_t*>(chunk.data().data()),
                                       chunk.data().size());
  return AddImpl(chunk, absl::MakeConstSpan(&data, 1));
}

absl::Status TensorAssembler::Add(const v1::TensorChunk& header,
                                  absl::Span<const absl::Span<const uint8_t>> data) {
  if (!header.data().empty()) {
    return absl::InvalidArgumentError("TensorAssembler::Add: header carries data too");
  }
  return AddImpl(header, data);
}

absl::Status TensorAssembler::AddImpl(const v1::TensorChunk& chunk,
                                      absl::Span<const absl::Span<const uint8_t>> data) {
  if (!failed_.ok()) return failed_;
  auto fail = [&](absl::Status s) {
    failed_ = s;
    return s;
  };
  if (!started_) {
    absl::Status s = Start(chunk);
    if (!s.ok()) return fail(s);
  } else {
    const uint32_t index = chunk.chunk_index();
    if (complete()) {
      return fail(ChunkError(spec_.name, index, "arrived after the tensor was complete"));
    }
    if (chunk.name() != spec_.name ||
        static_cast<int>(chunk.dtype()) != static_cast<int>(spec_.dtype) ||
        !std::equal(chunk.shape().begin(), chunk.shape().end(), spec_.shape.begin(),
                    spec_.shape.end()) ||
        chunk.total_bytes() != total_bytes_ || chunk.num_chunks() != num_chunks_) {
      return fail(ChunkError(spec_.name, index,
                             absl::StrCat("header (name '", chunk.name(), "', dtype ",
                                          static_cast<int>(chunk.dtype()), ", shape ",
                                          ShapeString(std::vector<int64_t>(chunk.shape().begin(),
                                                                           chunk.shape().end())),
                                          ") differs from the tensor's first chunk")));
    }
    if (index != next_index_ || chunk.offset() != received_) {
      return fail(
          ChunkError(spec_.name, index,
                     absl::StrCat("out of sequence: index ", index, " offset ", chunk.offset(),
                                  ", expected index ", next_index_, " offset ", received_)));
    }
  }
  uint64_t size = 0;
  for (const auto& piece : data) size += piece.size();
  const uint32_t index = chunk.chunk_index();
  if (size > total_bytes_ - received_) {
    return fail(ChunkError(spec_.name, index,
                           absl::StrCat(size, " data bytes at offset ", received_,
                                        " overrun the tensor's ", total_bytes_, " bytes")));
  }
  const bool last = index + 1 == num_chunks_;
  if (last != (received_ + size == total_bytes_)) {
    return fail(ChunkError(spec_.name, index,
                           absl::StrCat(last ? "is the last chunk but the tensor has "
                                             : "is not the last chunk but the tensor has ",
                                        total_bytes_ - received_ - size, " bytes left after it")));
  }
  uint32_t crc = 0;
  uint8_t* dest = dest_ + received_;
  for (const auto& piece : data) {
    if (piece.empty()) continue;
    crc = Crc32cCopy(crc, dest, piece.data(), piece.size());
    dest += piece.size();
  }
  if (crc != chunk.crc32c()) {
    return fail(
        ChunkError(spec_.name, index,
                   absl::StrCat("CRC-32C mismatch: computed ", absl::Hex(crc, absl::kZeroPad8),
                                ", header says ", absl::Hex(chunk.crc32c(), absl::kZeroPad8))));
  }
  received_ += size;
  ++next_index_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OwnedTensor>> DecodeTensors(
    const std::vector<const v1::TensorChunk*>& chunks, uint64_t max_total_bytes) {
  std::vector<OwnedTensor> out;
  TensorAssembler assembler(
      [&](const TensorSpec& spec, uint64_t nbytes) -> absl::StatusOr<void*> {
        out.push_back({spec, std::vector<uint8_t>(nbytes)});
        return static_cast<void*>(out.back().bytes.data());
      },
      max_total_bytes);
  for (const v1::TensorChunk* chunk : chunks) {
    FD_RETURN_IF_ERROR(assembler.Add(*chunk));
    if (assembler.complete()) assembler.Reset();
  }
  if (assembler.started()) {
    return absl::DataLossError(
        absl::StrCat("tensor '", assembler.spec().name, "' is incomplete: the chunks ended early"));
  }
  return out;
}

}  // namespace flashdraft
