// Hidden-state streaming over loopback: the coordinator's path (gRPC stream of CRC-checked
// TensorChunk messages sent zero-copy, reassembled into preallocated memory by the receiver)
// against its peer, a raw TCP socket sending the same bytes in the same run; and, for reference,
// the same messages sent and received as protobuf objects (the copies the zero-copy path avoids).
//
//   stream_bench [--mib 512] [--repeats 3] [--tune-malloc 0|1]
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "common/blocking_queue.h"
#include "common/chunk_wire.h"
#include "common/malloc_tuning.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxMessage = 64 << 20;

// FetchTensors streams `bytes` as one bf16 tensor, encoding one chunk per write.
class StreamService : public flashdraft::v1::Coordinator::CallbackService {
 public:
  explicit StreamService(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  grpc::ServerWriteReactor<flashdraft::v1::TensorChunk>* FetchTensors(
      grpc::CallbackServerContext*, const flashdraft::v1::FetchTensorsRequest*) override {
    class Writer : public grpc::ServerWriteReactor<flashdraft::v1::TensorChunk> {
     public:
      explicit Writer(const std::vector<uint8_t>& bytes) : bytes_(bytes) {
        flashdraft::TensorSpec spec{
            "hidden_states", flashdraft::DType::kBF16, {static_cast<int64_t>(bytes.size() / 2)}};
        // Pre-split into chunk headers; data is copied into the message right before each write.
        flashdraft::v1::TensorChunk scratch;
        (void)flashdraft::EncodeTensor(spec, bytes.data(), bytes.size(),
                                       flashdraft::kDefaultMaxChunkBytes, scratch,
                                       [&](flashdraft::v1::TensorChunk& c) {
                                         headers_.push_back(c);
                                         headers_.back().clear_data();
                                         crcs_.push_back(c.crc32c());
                                         return absl::OkStatus();
                                       });
        Next();
      }
      void OnWriteDone(bool ok) override {
        if (!ok) return Finish(grpc::Status::CANCELLED);
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (i_ == headers_.size()) return Finish(grpc::Status::OK);
        const auto& h = headers_[i_];
        msg_.CopyFrom(h);
        msg_.mutable_data()->assign(
            reinterpret_cast<const char*>(bytes_.data()) + h.offset(),
            std::min<uint64_t>(flashdraft::kDefaultMaxChunkBytes, bytes_.size() - h.offset()));
        ++i_;
        StartWrite(&msg_);
      }
      const std::vector<uint8_t>& bytes_;
      std::vector<flashdraft::v1::TensorChunk> headers_;
      std::vector<uint32_t> crcs_;
      size_t i_ = 0;
      flashdraft::v1::TensorChunk msg_;
    };
    return new Writer(bytes_);
  }

 private:
  const std::vector<uint8_t>& bytes_;
};

// The production path (coordinator/coordinator.cc's FetchTensors; its Train stream sends the same
// buffers, encoded ahead by the run loop): the same messages on the wire, built by
// EncodeChunkBuffer (header serialized, data handed to gRPC as a slice of the source buffer, the
// CRC computed right before each write), read on the worker's threads: one receives, one parses and
// assembles.
class ZeroCopyService : public flashdraft::v1::Coordinator::WithRawCallbackMethod_FetchTensors<
                            flashdraft::v1::Coordinator::CallbackService> {
 public:
  explicit ZeroCopyService(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchTensors(grpc::CallbackServerContext*,
                                                           const grpc::ByteBuffer*) override {
    class Writer : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
     public:
      explicit Writer(const std::vector<uint8_t>& bytes) : bytes_(bytes) {
        (void)flashdraft::StartChunkHeader(
            {"hidden_states", flashdraft::DType::kBF16, {static_cast<int64_t>(bytes.size() / 2)}},
            bytes.size(), flashdraft::kDefaultMaxChunkBytes, header_);
        Next();
      }
      void OnWriteDone(bool ok) override {
        if (!ok) return Finish(grpc::Status::CANCELLED);
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (index_ == header_.num_chunks()) return Finish(grpc::Status::OK);
        const uint64_t offset = uint64_t{index_} * flashdraft::kDefaultMaxChunkBytes;
        header_.set_offset(offset);
        header_.set_chunk_index(index_++);
        buffer_ = flashdraft::EncodeChunkBuffer(
            header_, bytes_.data() + offset,
            std::min<uint64_t>(flashdraft::kDefaultMaxChunkBytes, bytes_.size() - offset), nullptr,
            0);
        StartWrite(&buffer_);
      }
      const std::vector<uint8_t>& bytes_;
      flashdraft::v1::TensorChunk header_;
      uint32_t index_ = 0;
      grpc::ByteBuffer buffer_;
    };
    return new Writer(bytes_);
  }

 private:
  const std::vector<uint8_t>& bytes_;
};

void Fail(const std::string& what) {
  std::fprintf(stderr, "stream_bench: %s\n", what.c_str());
  std::exit(1);
}

double ZeroCopySeconds(const std::shared_ptr<grpc::Channel>& channel, std::vector<uint8_t>& dst) {
  const auto t0 = Clock::now();
  grpc::ClientContext ctx;
  flashdraft::v1::FetchTensorsRequest request;
  grpc::internal::RpcMethod method("/flashdraft.v1.Coordinator/FetchTensors",
                                   grpc::internal::RpcMethod::SERVER_STREAMING, channel);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                    request));
  flashdraft::TensorAssembler assembler(
      [&](const flashdraft::TensorSpec&, uint64_t) -> absl::StatusOr<void*> { return dst.data(); });
  // As in the worker: this thread only receives, a decoder thread parses and assembles.
  flashdraft::BlockingQueue<grpc::ByteBuffer> received(64);
  std::thread decoder([&] {
    flashdraft::ReceivedChunk chunk;
    while (std::optional<grpc::ByteBuffer> buffer = received.Pop()) {
      if (!flashdraft::ParseChunkBuffer(*buffer, 0, &chunk)) Fail("not a chunk");
      absl::Status s = assembler.Add(chunk.header, chunk.data);
      if (!s.ok()) Fail(std::string(s.message()));
    }
  });
  grpc::ByteBuffer buffer;
  while (reader->Read(&buffer)) received.Push(std::move(buffer));
  received.Close();
  decoder.join();
  if (!reader->Finish().ok() || !assembler.complete()) Fail("stream failed");
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double GrpcSeconds(flashdraft::v1::Coordinator::Stub& stub, std::vector<uint8_t>& dst) {
  const auto t0 = Clock::now();
  grpc::ClientContext ctx;
  flashdraft::v1::FetchTensorsRequest request;
  auto reader = stub.FetchTensors(&ctx, request);
  flashdraft::TensorAssembler assembler(
      [&](const flashdraft::TensorSpec&, uint64_t) -> absl::StatusOr<void*> { return dst.data(); });
  flashdraft::v1::TensorChunk chunk;
  while (reader->Read(&chunk)) {
    absl::Status s = assembler.Add(chunk);
    if (!s.ok()) {
      std::fprintf(stderr, "stream_bench: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  }
  if (!reader->Finish().ok() || !assembler.complete()) Fail("stream failed");
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double TcpSeconds(const std::vector<uint8_t>& src, std::vector<uint8_t>& dst) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, 1);
  const auto t0 = Clock::now();
  std::thread sender([&] {
    int s = accept(listener, nullptr, nullptr);
    size_t off = 0;
    while (off < src.size()) {
      ssize_t n = send(s, src.data() + off, std::min<size_t>(4 << 20, src.size() - off), 0);
      if (n <= 0) break;
      off += n;
    }
    close(s);
  });
  int c = socket(AF_INET, SOCK_STREAM, 0);
  connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  size_t off = 0;
  while (off < dst.size()) {
    ssize_t n = recv(c, dst.data() + off, dst.size() - off, 0);
    if (n <= 0) break;
    off += n;
  }
  sender.join();
  close(c);
  close(listener);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 512;
  int repeats = 3;
  int tune_malloc = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--mib") mib = std::stoul(argv[i + 1]);
    if (std::string(argv[i]) == "--repeats") repeats = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--tune-malloc") tune_malloc = std::stoi(argv[i + 1]);
  }
  if (tune_malloc) flashdraft::TuneMallocForStreaming();  // as flashdraft-worker does
  const size_t n = mib << 20;
  std::vector<uint8_t> src(n), dst(n, 0);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(src.data() + i, &r, 8);
  }
  StreamService service(src);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxSendMessageSize(kMaxMessage);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessage);
  auto stub = flashdraft::v1::Coordinator::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args));

  ZeroCopyService zero_copy_service(src);
  grpc::ServerBuilder zc_builder;
  int zc_port = 0;
  zc_builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &zc_port);
  zc_builder.SetMaxSendMessageSize(kMaxMessage);
  zc_builder.RegisterService(&zero_copy_service);
  auto zc_server = zc_builder.BuildAndStart();
  auto zc_channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(zc_port),
                                              grpc::InsecureChannelCredentials(), args);

  double grpc_best = 1e9, zc_best = 1e9, tcp_best = 1e9;
  auto check = [&] {
    if (std::memcmp(src.data(), dst.data(), n) != 0) Fail("received bytes differ");
    std::fill(dst.begin(), dst.end(), 0);
  };
  GrpcSeconds(*stub, dst);  // warm-up
  check();
  ZeroCopySeconds(zc_channel, dst);
  check();
  TcpSeconds(src, dst);
  check();
  for (int r = 0; r < repeats; ++r) {
    grpc_best = std::min(grpc_best, GrpcSeconds(*stub, dst));
    check();
    zc_best = std::min(zc_best, ZeroCopySeconds(zc_channel, dst));
    check();
    tcp_best = std::min(tcp_best, TcpSeconds(src, dst));
    check();
  }
  const double gb = n / 1e9;
  std::printf("malloc tuned for streaming: %s\n",
              tune_malloc ? "yes (as flashdraft-worker)" : "no");
  std::printf("loopback streaming of %zu MiB, best of %d\n", mib, repeats);
  std::printf("%-40s %8s %8s %10s\n", "path", "s", "GB/s", "vs TCP");
  std::printf("%-40s %8.3f %8.2f %9.0f%%\n", "raw TCP socket (peer)", tcp_best, gb / tcp_best,
              100.0);
  std::printf("%-40s %8.3f %8.2f %9.0f%%\n", "gRPC zero-copy chunks (flashdraft)", zc_best,
              gb / zc_best, 100.0 * tcp_best / zc_best);
  std::printf("%-40s %8.3f %8.2f %9.0f%%\n", "gRPC protobuf TensorChunk messages", grpc_best,
              gb / grpc_best, 100.0 * tcp_best / grpc_best);
  server->Shutdown();
  zc_server->Shutdown();
  return 0;
}
