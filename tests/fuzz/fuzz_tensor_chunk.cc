// libFuzzer: tensor chunks off the wire — the zero-copy chunk parser (ParseChunkBuffer) on raw
// bytes, then the assembler with whatever header the bytes claim (bounded allocation).
#include <cstdint>
#include <vector>

#include "common/chunk_wire.h"
#include "common/tensor_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flashdraft;
  std::vector<uint8_t> memory;
  TensorAssembler assembler(
      [&](const TensorSpec&, uint64_t nbytes) -> absl::StatusOr<void*> {
        if (nbytes > (16u << 20)) return absl::ResourceExhaustedError("too big for the fuzzer");
        memory.assign(nbytes, 0);
        return static_cast<void*>(memory.data());
      },
      16u << 20);
  grpc::Slice slice(data, size);
  grpc::ByteBuffer buffer(&slice, 1);
  for (int field : {0, kCoordinatorMessageChunkField}) {
    ReceivedChunk chunk;
    if (ParseChunkBuffer(buffer, field, &chunk)) (void)assembler.Add(chunk.header, chunk.data);
  }
  // The same bytes as a protobuf TensorChunk, fed twice (a chunk that repeats or continues).
  v1::TensorChunk parsed;
  if (parsed.ParseFromArray(data, static_cast<int>(size))) {
    assembler.Reset();
    (void)assembler.Add(parsed);
    (void)assembler.Add(parsed);
  }
  return 0;
}
