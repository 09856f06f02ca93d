// Tensor wire codec throughput: a 256 MiB bf16 tensor encoded into ≤4 MiB CRC-checked chunks and
// reassembled into preallocated memory, against a plain memcpy of the same bytes in the same run.
//
//   build/bin/codec_bench [--mib 256] [--repeats 5]
//
// Rows:
//   memcpy                     the peer: one copy src -> dst
//   encode                     copy + CRC into a reused chunk message (the sender's work)
//   encode+decode              chunk by chunk, as a stream: encode, then validate, CRC and copy
//                              into the destination (sender + receiver work, no wire)
//   encode+wire+decode         as above, plus protobuf serialization and parsing of every chunk
//   pipelined encode | decode  sender and receiver on their own threads with a ring of 4 chunk
//                              messages between them, as coordinator and worker run in production
//
// The sequential rows add the sender's and the receiver's time; each of them alone is a pass over
// DRAM like memcpy, so ~50% is their ceiling. The pipelined row is the codec's throughput as a
// stream.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/tensor.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

double BestSeconds(int repeats, const std::function<void()>& fn) {
  fn();  // warm-up: page faults, caches
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// The hand-over of a ring of `slots` chunk messages between the encoder and the decoder thread:
// how many chunks went into the ring and came out of it, and whether the encoder is done. Slot
// i % slots belongs to the encoder until chunk i is produced, then to the decoder until consumed.
class RingCursor {
 public:
  explicit RingCursor(uint64_t slots) : slots_(slots) {}

  // Encoder: waits for a free slot; returns the number of the chunk that goes there.
  uint64_t AwaitFree() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_, absl::Condition(this, &RingCursor::HasFreeLocked));
    return produced_;
  }
  void Produced() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++produced_;
  }
  void Finish() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  // Decoder: waits for a produced chunk and sets `*chunk` to its number; false once the encoder
  // finished and every chunk was consumed.
  bool AwaitFilled(uint64_t* chunk) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_, absl::Condition(this, &RingCursor::HasFilledOrDoneLocked));
    if (consumed_ == produced_) return false;
    *chunk = consumed_;
    return true;
  }
  void Consumed() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++consumed_;
  }

 private:
  bool HasFreeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return produced_ - consumed_ < slots_;
  }
  bool HasFilledOrDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return consumed_ < produced_ || done_;
  }

  const uint64_t slots_;
  absl::Mutex mu_;
  uint64_t produced_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t consumed_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "codec_bench: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 256;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--mib") {
      mib = std::stoul(argv[i + 1]);
    } else if (flag == "--repeats") {
      repeats = std::stoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: codec_bench [--mib N] [--repeats N]\n");
      return 2;
    }
  }
  const size_t nbytes = mib << 20;
  const flashdraft::TensorSpec spec{
      "hidden_states", flashdraft::DType::kBF16, {static_cast<int64_t>(nbytes / 2 / 4096), 4096}};
  std::vector<uint8_t> src(nbytes), dst(nbytes, 1);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < nbytes; i += 8) {
    uint64_t r = rng();
    std::memcpy(src.data() + i, &r, 8);
  }

  const double t_memcpy =
      BestSeconds(repeats, [&] { std::memcpy(dst.data(), src.data(), nbytes); });

  flashdraft::v1::TensorChunk chunk;
  const double t_encode = BestSeconds(repeats, [&] {
    Check(flashdraft::EncodeTensor(spec, src.data(), nbytes, flashdraft::kDefaultMaxChunkBytes,
                                   chunk,
                                   [](flashdraft::v1::TensorChunk&) { return absl::OkStatus(); }));
  });

  auto allocate = [&](const flashdraft::TensorSpec&, uint64_t) -> absl::StatusOr<void*> {
    return static_cast<void*>(dst.data());
  };
  const double t_roundtrip = BestSeconds(repeats, [&] {
    flashdraft::TensorAssembler assembler(allocate);
    Check(
        flashdraft::EncodeTensor(spec, src.data(), nbytes, flashdraft::kDefaultMaxChunkBytes, chunk,
                                 [&](flashdraft::v1::TensorChunk& c) { return assembler.Add(c); }));
  });
  if (std::memcmp(src.data(), dst.data(), nbytes) != 0) {
    std::fprintf(stderr, "codec_bench: decoded bytes differ\n");
    return 1;
  }

  std::string wire;
  flashdraft::v1::TensorChunk parsed;
  const double t_wire = BestSeconds(repeats, [&] {
    flashdraft::TensorAssembler assembler(allocate);
    Check(flashdraft::EncodeTensor(spec, src.data(), nbytes, flashdraft::kDefaultMaxChunkBytes,
                                   chunk, [&](flashdraft::v1::TensorChunk& c) {
                                     c.SerializeToString(&wire);
                                     parsed.ParseFromString(wire);
                                     return assembler.Add(parsed);
                                   }));
  });

  // A bounded ring of chunk messages: the encoder fills slot i % kSlots, the decoder drains it.
  constexpr int kSlots = 4;
  std::vector<flashdraft::v1::TensorChunk> ring(kSlots);
  const double t_pipe = BestSeconds(repeats, [&] {
    RingCursor cursor(kSlots);
    std::thread decoder([&] {
      flashdraft::TensorAssembler assembler(allocate);
      uint64_t chunk = 0;
      while (cursor.AwaitFilled(&chunk)) {
        Check(assembler.Add(ring[chunk % kSlots]));
        cursor.Consumed();
      }
    });
    flashdraft::v1::TensorChunk scratch;
    Check(flashdraft::EncodeTensor(spec, src.data(), nbytes, flashdraft::kDefaultMaxChunkBytes,
                                   scratch, [&](flashdraft::v1::TensorChunk& c) {
                                     // Hand the data over without copying; the slot's old buffer
                                     // becomes the next scratch.
                                     flashdraft::v1::TensorChunk& slot =
                                         ring[cursor.AwaitFree() % kSlots];
                                     std::string recycled = std::move(*slot.mutable_data());
                                     std::string payload = std::move(*c.mutable_data());
                                     c.clear_data();
                                     slot.CopyFrom(c);
                                     *slot.mutable_data() = std::move(payload);
                                     *c.mutable_data() = std::move(recycled);
                                     cursor.Produced();
                                     return absl::OkStatus();
                                   }));
    cursor.Finish();
    decoder.join();
  });

  const double gb = nbytes / 1e9;
  std::printf("tensor codec, %zu MiB bf16, chunks of %zu bytes, best of %d, crc32c %s\n", mib,
              flashdraft::kDefaultMaxChunkBytes, repeats,
              flashdraft::Crc32cHardwareAccelerated() ? "sse4.2" : "portable");
  std::printf("%-24s %10s %10s %10s\n", "path", "ms", "GB/s", "vs memcpy");
  auto row = [&](const char* name, double t) {
    std::printf("%-24s %10.1f %10.2f %9.0f%%\n", name, t * 1e3, gb / t, 100.0 * t_memcpy / t);
  };
  row("memcpy (peer)", t_memcpy);
  row("encode", t_encode);
  row("encode+decode", t_roundtrip);
  row("encode+wire+decode", t_wire);
  row("pipelined encode|decode", t_pipe);
  return 0;
}
