// Zero-copy TensorChunk messages on gRPC streams. The bytes on the wire are exactly the protobuf
// encoding of a TensorChunk (optionally as field `wrapper_field` of an enclosing message such as
// CoordinatorMessage), so any protobuf peer can read them; only the copies are gone:
//  - the sender serializes the small header with protobuf and hands the data to gRPC as a slice
//    that points at the sender's memory (kept alive by `owner` until gRPC lets go of it);
//  - the receiver parses the header out of the received slices and leaves the data in them, so the
//    TensorAssembler CRC-checks and copies it straight from gRPC's buffers into the tensor.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/tensor.pb.h"

namespace flashdraft {

// Field number of CoordinatorMessage.tensor_chunk; 0 means "a bare TensorChunk".
inline constexpr int kCoordinatorMessageChunkField = 4;

// FetchTensors sends the drafter's starting weights under this prefix + their parameter names, the
// frozen target tensors under their own names.
inline constexpr char kDrafterWeightPrefix[] = "drafter.";
// ... and, when resuming from a checkpoint, the AdamW state under this prefix: <name>.exp_avg,
// <name>.exp_avg_sq and "step" (I64 [1]).
inline constexpr char kOptimizerStatePrefix[] = "adamw.";

// One chunk: `header` (everything but data; its crc32c is computed here unless `crc` gives it)
// plus `len` bytes at `data`, which are not copied. `owner` keeps them alive while gRPC holds the
// slice; pass nullptr only for memory that outlives the server (the coordinator's mapped target
// file).
grpc::ByteBuffer EncodeChunkBuffer(v1::TensorChunk& header, const uint8_t* data, size_t len,
                                   const std::shared_ptr<const void>& owner, int wrapper_field,
                                   std::optional<uint32_t> crc = std::nullopt);

// All chunks of a tensor, in order, appended to `out`. `chunk_crcs`, when not empty, are the
// chunks' CRCs already known (ChunkCrcWriter computed them while building the data): one per
// chunk, or an error.
absl::Status EncodeTensorBuffers(const TensorSpec& spec, const void* data, size_t nbytes,
                                 size_t max_chunk_bytes, const std::shared_ptr<const void>& owner,
                                 int wrapper_field, std::vector<grpc::ByteBuffer>* out,
                                 absl::Span<const uint32_t> chunk_crcs = {});

// A received chunk whose data still lies in gRPC's slices.
struct ReceivedChunk {
  v1::TensorChunk header;  // data() is empty
  std::vector<absl::Span<const uint8_t>> data;
  std::vector<grpc::Slice> slices;  // keep `data` alive
};

// True when `buffer` holds a TensorChunk (inside field `wrapper_field` when non-zero) that ends
// with its data field, the form EncodeChunkBuffer writes; `out` then holds it. False for any other
// message, or a malformed one: the caller parses it with protobuf, which reports what is wrong.
bool ParseChunkBuffer(const grpc::ByteBuffer& buffer, int wrapper_field, ReceivedChunk* out);

// A protobuf message as a ByteBuffer, and back (false when it does not parse).
grpc::ByteBuffer MessageToBuffer(const google::protobuf::MessageLite& message);
bool BufferToMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message);

}  // namespace flashdraft
