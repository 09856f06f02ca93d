// Tensor wire codec: any tensor as a sequence of flashdraft.v1.TensorChunk messages of at most
// `max_chunk_bytes` data each, every chunk with its CRC-32C; the receiver validates each chunk and
// copies it straight into memory it preallocated for the whole tensor. No LibTorch here: tensors
// are (spec, pointer, size); model/wire_tensor.h adapts torch::Tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace flashdraft {
namespace v1 {
class TensorChunk;
}

// gRPC's default message limit is 4 MiB; chunks stay below it with room for the header.
inline constexpr size_t kDefaultMaxChunkBytes = (4u << 20) - (64u << 10);

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  bool operator==(const TensorSpec& other) const {
    return name == other.name && dtype == other.dtype && shape == other.shape;
  }
};

// How many chunks a tensor of `nbytes` takes (an empty tensor still sends one, empty chunk).
uint64_t NumChunks(uint64_t nbytes, size_t max_chunk_bytes);

// Checks that `nbytes` fits `spec` and fills the header fields every chunk of the tensor repeats
// (name, dtype, shape, total_bytes, num_chunks); returns the number of chunks.
absl::StatusOr<uint32_t> StartChunkHeader(const TensorSpec& spec, size_t nbytes,
                                          size_t max_chunk_bytes, v1::TensorChunk& header);

// Calls `sink` once per chunk, in order. `chunk` is reused between calls (its data buffer keeps its
// capacity, so steady-state encoding allocates nothing): the sink must consume it before returning.
// Data is copied into the chunk and checksummed in one pass.
absl::Status EncodeTensor(const TensorSpec& spec, const void* data, size_t nbytes,
                          size_t max_chunk_bytes, v1::TensorChunk& chunk,
                          const std::function<absl::Status(v1::TensorChunk&)>& sink);

// Appends the chunks of a tensor to `out` (convenience for messages that carry several tensors).
absl::Status AppendTensorChunks(const TensorSpec& spec, const void* data, size_t nbytes,
                                size_t max_chunk_bytes,
                                std::function<v1::TensorChunk*()> add_chunk);

// Builds a tensor's bytes front to back (copies and zero runs) and computes the CRC-32C of each of
// its chunks in the same pass, so that a sender which packs its batch anyway (the coordinator's
// padded microbatches) needs no pass of its own to checksum what it sends: hand the CRCs to
// EncodeTensorBuffers. The chunk boundaries are those of EncodeTensor with `max_chunk_bytes`.
class ChunkCrcWriter {
 public:
  ChunkCrcWriter(void* dst, size_t nbytes, size_t max_chunk_bytes);
  // Appends `n` bytes from `src`, or `n` zero bytes; an error (and nothing written) when the
  // tensor would overflow.
  absl::Status Copy(const void* src, size_t n);
  absl::Status Zero(size_t n);
  size_t written() const { return written_; }
  // The CRC of every chunk, in order (NumChunks entries); an error unless all bytes were written.
  absl::StatusOr<std::vector<uint32_t>> Finish();

 private:
  template <typename Fill>
  absl::Status Write(size_t n, Fill fill);

  uint8_t* dst_;
  size_t nbytes_, max_chunk_bytes_;
  size_t written_ = 0;
  uint32_t crc_ = 0;  // of the current chunk's bytes so far
  std::vector<uint32_t> crcs_;
};

// Reassembles one tensor from its chunks.
class TensorAssembler {
 public:
  // Called once, on the first chunk, with the validated spec and size; returns where to write the
  // tensor (at least `nbytes` bytes, owned by the caller) or an error to refuse it.
  using Allocate = std::function<absl::StatusOr<void*>(const TensorSpec& spec, uint64_t nbytes)>;

  // Tensors announced larger than `max_total_bytes` are refused before anything is allocated.
  explicit TensorAssembler(Allocate allocate, uint64_t max_total_bytes = uint64_t{64} << 30);

  // Validates `chunk` (header consistent with the first chunk, index and offset in sequence, size
  // within bounds, CRC) and copies its data into place. Errors name the tensor and what was wrong;
  // after an error the assembler stays failed.
  absl::Status Add(const v1::TensorChunk& chunk);

  // The same for a chunk whose data travels apart from its header (header.data() must be empty):
  // `data` are the pieces of the chunk's data, in order (e.g. received gRPC slices).
  absl::Status Add(const v1::TensorChunk& header, absl::Span<const absl::Span<const uint8_t>> data);

  bool started() const { return started_; }
  bool complete() const {
    return started_ && received_ == total_bytes_ && next_index_ == num_chunks_;
  }
  const TensorSpec& spec() const { return spec_; }
  uint64_t total_bytes() const { return total_bytes_; }

  // Ready for the next tensor.
  void Reset();

 private:
  absl::Status Start(const v1::TensorChunk& chunk);
  absl::Status AddImpl(const v1::TensorChunk& header,
                       absl::Span<const absl::Span<const uint8_t>> data);

  Allocate allocate_;
  uint64_t max_total_bytes_;
  bool started_ = false;
  absl::Status failed_;
  TensorSpec spec_;
  uint64_t total_bytes_ = 0;
  uint32_t num_chunks_ = 0;
  uint32_t next_index_ = 0;
  uint64_t received_ = 0;
  uint8_t* dest_ = nullptr;
};

// A decoded tensor that owns its bytes (for small tensors, tests and tools).
struct OwnedTensor {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};

// Decodes a sequence of chunks holding one or more whole tensors, in order.
absl::StatusOr<std::vector<OwnedTensor>> DecodeTensors(
    const std::vector<const v1::TensorChunk*>& chunks,
    uint64_t max_total_bytes = uint64_t{64} << 30);

}  // namespace flashdraft
