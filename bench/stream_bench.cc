// Hidden-state streaming over loopback: the coordinator's path (gRPC server stream of CRC-checked
// TensorChunk messages, reassembled into preallocated memory by the receiver) against its peer, a raw
// TCP socket sending the same bytes in the same run.
//
//   stream_bench [--mib 512] [--repeats 3]
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
        flashdraft::TensorSpec spec{"hidden_states", flashdraft::DType::kBF16,
                                    {static_cast<int64_t>(bytes.size() / 2)}};
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
        msg_.mutable_data()->assign(reinterpret_cast<const char*>(bytes_.data()) + h.offset(),
                                    std::min<uint64_t>(flashdraft::kDefaultMaxChunkBytes,
                                                       bytes_.size() - h.offset()));
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
  if (!reader->Finish().ok() || !assembler.complete()) {
    std::fprintf(stderr, "stream_bench: stream failed\n");
    std::exit(1);
  }
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
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--mib") mib = std::stoul(argv[i + 1]);
    if (std::string(argv[i]) == "--repeats") repeats = std::stoi(argv[i + 1]);
  }
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

  double grpc_best = 1e9, tcp_best = 1e9;
  GrpcSeconds(*stub, dst);  // warm-up
  TcpSeconds(src, dst);
  for (int r = 0; r < repeats; ++r) {
    grpc_best = std::min(grpc_best, GrpcSeconds(*stub, dst));
    tcp_best = std::min(tcp_best, TcpSeconds(src, dst));
  }
  if (std::memcmp(src.data(), dst.data(), n) != 0) {
    std::fprintf(stderr, "stream_bench: received bytes differ\n");
    return 1;
  }
  const double gb = n / 1e9;
  std::printf("loopback streaming of %zu MiB, best of %d\n", mib, repeats);
  std::printf("%-40s %8s %8s %10s\n", "path", "s", "GB/s", "vs TCP");
  std::printf("%-40s %8.3f %8.2f %9.0f%%\n", "raw TCP socket (peer)", tcp_best, gb / tcp_best, 100.0);
  std::printf("%-40s %8.3f %8.2f %9.0f%%\n", "gRPC stream + chunk codec (CRC, assemble)",
              grpc_best, gb / grpc_best, 100.0 * tcp_best / grpc_best);
  server->Shutdown();
  return 0;
}
