// Hidden-state streaming over loopback: the coordinator's path (gRPC stream of CRC-checked
// TensorChunk messages sent zero-copy, reassembled into preallocated memory by the receiver)
// against its peer, a raw TCP socket sending the same bytes in the same run; and, for reference,
// the same messages sent and received as protobuf objects (the copies the zero-copy path avoids).
// As in a job, the sender (the coordinator's side) runs in its own process: this binary re-executes
// itself with --serve, the child prints its ports and sends on request until its stdin closes.
//
// With --tls-dir (a folder deploy/make-certs.sh wrote) the zero-copy path is also measured over
// mutual TLS with the job secret on the call, as a secured job streams.
//
// With --connections N the zero-copy paths spread the stream over N connections (N channels, each
// stream carrying a share of the chunks), as a worker could; the CPU column is what both processes
// spent per GB moved.
//
//   stream_bench [--mib 512] [--repeats 3] [--tune-malloc 0|1] [--protobuf 0|1] [--tls-dir DIR]
//                [--connections 1]
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "common/chunk_wire.h"
#include "common/malloc_tuning.h"
#include "common/queued_writer.h"
#include "common/raw_client_stream.h"
#include "common/security.h"
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

// A share of whole chunks of an n-byte stream, for one of `parts` connections.
struct Part {
  size_t offset, bytes, first_chunk, chunks;
};
Part PartOf(size_t n, int part, int parts) {
  const size_t chunk = flashdraft::kDefaultMaxChunkBytes, total = (n + chunk - 1) / chunk;
  const size_t first = total * part / parts, end = total * (part + 1) / parts;
  const size_t offset = first * chunk;
  return {offset, std::min(n, end * chunk) - offset, first, end - first};
}

// The production path (coordinator/coordinator.cc's Train stream): the same messages on the wire,
// built by EncodeTensorBuffers (header serialized, data handed to gRPC as a slice of the source
// buffer) with the chunk CRCs that ChunkCrcWriter computed while the coordinator packed the batch,
// read as the worker reads them: the receiving thread parses and assembles each chunk.
class ZeroCopyService : public flashdraft::v1::Coordinator::WithRawCallbackMethod_FetchTensors<
                            flashdraft::v1::Coordinator::CallbackService> {
 public:
  ZeroCopyService(const std::vector<uint8_t>& bytes, std::vector<uint32_t> crcs)
      : bytes_(bytes), crcs_(std::move(crcs)) {}
  // The request's names, when given, are {part, parts}: send that share of the chunks (one of
  // several connections' streams).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchTensors(
      grpc::CallbackServerContext*, const grpc::ByteBuffer* request) override {
    // As the coordinator's Train session: the step's messages are encoded, then queued on a
    // QueuedWriter that keeps one write in flight.
    class Writer : public flashdraft::QueuedWriter<grpc::ServerWriteReactor<grpc::ByteBuffer>> {
      void OnDone() override { delete this; }
    };
    flashdraft::v1::FetchTensorsRequest parsed;
    int part = 0, parts = 1;
    if (!flashdraft::BufferToMessage(*request, &parsed)) std::abort();
    if (parsed.names_size() == 2) {
      part = std::stoi(parsed.names(0));
      parts = std::stoi(parsed.names(1));
    }
    const Part p = PartOf(bytes_.size(), part, parts);
    std::vector<grpc::ByteBuffer> buffers;
    const absl::Status s = flashdraft::EncodeTensorBuffers(
        {"hidden_states", flashdraft::DType::kBF16, {static_cast<int64_t>(p.bytes / 2)}},
        bytes_.data() + p.offset, p.bytes, flashdraft::kDefaultMaxChunkBytes, nullptr, 0, &buffers,
        absl::MakeConstSpan(crcs_).subspan(p.first_chunk, p.chunks));
    if (!s.ok()) std::abort();
    auto* writer = new Writer();
    for (grpc::ByteBuffer& b : buffers) writer->Send(std::move(b));
    writer->FinishAfterWrites(grpc::Status::OK);
    return writer;
  }

 private:
  const std::vector<uint8_t>& bytes_;
  const std::vector<uint32_t> crcs_;
};

void Fail(const std::string& what) {
  std::fprintf(stderr, "stream_bench: %s\n", what.c_str());
  std::exit(1);
}

// Receives part `part` of `parts` into its place in `dst`.
void ReceivePart(const std::shared_ptr<grpc::Channel>& channel, int part, int parts,
                 std::vector<uint8_t>& dst) {
  grpc::ClientContext ctx;
  flashdraft::v1::FetchTensorsRequest request;
  if (parts > 1) {
    request.add_names(std::to_string(part));
    request.add_names(std::to_string(parts));
  }
  flashdraft::RawClientStream reader(channel, "/flashdraft.v1.Coordinator/FetchTensors", &ctx);
  reader.Write(flashdraft::MessageToBuffer(request));
  reader.WritesDone();
  uint8_t* at = dst.data() + PartOf(dst.size(), part, parts).offset;
  flashdraft::TensorAssembler assembler(
      [&](const flashdraft::TensorSpec&, uint64_t) -> absl::StatusOr<void*> { return at; });
  // As in the worker: the receiving thread parses each chunk and assembles it as it arrives.
  grpc::ByteBuffer buffer;
  flashdraft::ReceivedChunk chunk;
  while (reader.Read(&buffer)) {
    if (!flashdraft::ParseChunkBuffer(buffer, 0, &chunk)) Fail("not a chunk");
    absl::Status s = assembler.Add(chunk.header, chunk.data);
    if (!s.ok()) Fail(std::string(s.message()));
  }
  if (!reader.Finish().ok() || !assembler.complete()) Fail("stream failed");
}

// CPU seconds (user + system) used so far by this process and by process `other`.
double CpuSeconds(pid_t other) {
  struct rusage self;
  getrusage(RUSAGE_SELF, &self);
  auto tv = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  double total = tv(self.ru_utime) + tv(self.ru_stime);
  FILE* f = std::fopen(("/proc/" + std::to_string(other) + "/stat").c_str(), "r");
  unsigned long utime = 0, stime = 0;
  // Fields 14 and 15 of /proc/PID/stat; the command name (field 2) has no spaces here.
  if (f == nullptr || std::fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                                  &utime, &stime) != 2) {
    Fail("cannot read the sender's CPU time");
  }
  std::fclose(f);
  return total + static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

// One stream of `dst` over each channel at once (each carries its share of the chunks).
double ZeroCopySeconds(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                       std::vector<uint8_t>& dst) {
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  const int parts = static_cast<int>(channels.size());
  for (int i = 1; i < parts; ++i) {
    threads.emplace_back([&, i] { ReceivePart(channels[i], i, parts, dst); });
  }
  ReceivePart(channels[0], 0, parts, dst);
  for (std::thread& t : threads) t.join();
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

// The receiving end of the raw TCP peer: connect, read everything the sender writes into `dst`.
double TcpSeconds(int port, std::vector<uint8_t>& dst) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const auto t0 = Clock::now();
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Fail("connect failed");
  size_t off = 0;
  while (off < dst.size()) {
    ssize_t n = recv(c, dst.data() + off, dst.size() - off, 0);
    if (n <= 0) break;
    off += n;
  }
  close(c);
  if (off != dst.size()) Fail("raw TCP stream ended early");
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The sending end of the raw TCP peer: every accepted connection gets all of `src` in 4 MiB sends.
void ServeTcp(int listener, const std::vector<uint8_t>& src) {
  for (;;) {
    int s = accept(listener, nullptr, nullptr);
    if (s < 0) return;
    size_t off = 0;
    while (off < src.size()) {
      ssize_t n = send(s, src.data() + off, std::min<size_t>(4 << 20, src.size() - off), 0);
      if (n <= 0) break;
      off += n;
    }
    close(s);
  }
}

std::vector<uint8_t> TestBytes(size_t n) {
  std::vector<uint8_t> bytes(n);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(bytes.data() + i, &r, 8);
  }
  return bytes;
}

std::unique_ptr<grpc::Server> StartServer(
    grpc::Service* service, int* port,
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials()) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", credentials, port);
  builder.SetMaxSendMessageSize(kMaxMessage);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// The sender process: serves both gRPC paths, the zero-copy path over mutual TLS when `tls_dir`
// holds deploy/make-certs.sh's files, and the raw TCP peer; prints "<grpc> <zero-copy> <tcp>
// <tls or 0>" ports on stdout and runs until its stdin closes (the parent exited or is done).
int Serve(size_t n, bool tune_malloc, const std::string& tls_dir) {
  if (tune_malloc) flashdraft::TuneMallocForStreaming();  // as the coordinator's side would
  // The batch as the coordinator packs it: copied, with every chunk's CRC computed on the way.
  const std::vector<uint8_t> data = TestBytes(n);
  std::vector<uint8_t> src(n);
  flashdraft::ChunkCrcWriter packer(src.data(), n, flashdraft::kDefaultMaxChunkBytes);
  if (!packer.Copy(data.data(), n).ok()) Fail("packing failed");
  absl::StatusOr<std::vector<uint32_t>> crcs = packer.Finish();
  if (!crcs.ok()) Fail("packing failed");
  StreamService service(src);
  ZeroCopyService zero_copy_service(src, *std::move(crcs));
  int port = 0, zc_port = 0;
  auto server = StartServer(&service, &port);
  auto zc_server = StartServer(&zero_copy_service, &zc_port);
  int tls_port = 0;
  std::unique_ptr<grpc::Server> tls_server;
  if (!tls_dir.empty()) {
    flashdraft::SecurityConfig security;  // as a job with mutual TLS and a token sets it
    security.tls_cert = tls_dir + "/coordinator.pem";
    security.tls_key = tls_dir + "/coordinator.key";
    security.tls_ca = tls_dir + "/ca.pem";
    security.token_file = tls_dir + "/token";
    auto server_security =
        flashdraft::ServerSecurity::Create(security, flashdraft::RealClock::Get());
    if (!server_security.ok()) Fail(std::string(server_security.status().message()));
    tls_server = StartServer(&zero_copy_service, &tls_port, (*server_security)->credentials());
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (!server || !zc_server || listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      listen(listener, 1) != 0) {
    Fail("sender: cannot listen on loopback");
  }
  std::thread tcp([&] { ServeTcp(listener, src); });
  std::printf("%d %d %d %d\n", port, zc_port, ntohs(addr.sin_port), tls_port);
  std::fflush(stdout);
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
  shutdown(listener, SHUT_RDWR);
  close(listener);
  tcp.join();
  server->Shutdown();
  zc_server->Shutdown();
  if (tls_server) tls_server->Shutdown();
  return 0;
}

// Starts this binary as the sender process; returns its pid, the write end of its stdin, its ports.
pid_t SpawnSender(size_t mib, bool tune_malloc, const std::string& tls_dir, int* stdin_fd,
                  int ports[4]) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) Fail("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, to_child[1]);
  posix_spawn_file_actions_addclose(&actions, from_child[0]);
  const std::string mib_arg = std::to_string(mib), tune_arg = tune_malloc ? "1" : "0";
  char* args[] = {const_cast<char*>("stream_bench"),
                  const_cast<char*>("--serve"),
                  const_cast<char*>("1"),
                  const_cast<char*>("--mib"),
                  const_cast<char*>(mib_arg.c_str()),
                  const_cast<char*>("--tune-malloc"),
                  const_cast<char*>(tune_arg.c_str()),
                  const_cast<char*>("--tls-dir"),
                  const_cast<char*>(tls_dir.c_str()),
                  nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, args, environ) != 0) {
    Fail("cannot start the sender process");
  }
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  FILE* out = fdopen(from_child[0], "r");
  if (out == nullptr ||
      std::fscanf(out, "%d %d %d %d", &ports[0], &ports[1], &ports[2], &ports[3]) != 4) {
    Fail("the sender process did not report its ports");
  }
  std::fclose(out);
  *stdin_fd = to_child[1];
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 512;
  int repeats = 3;
  int tune_malloc = 1;
  int connections = 1;
  bool serve = false;
  bool protobuf = true;
  std::string tls_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--tls-dir") tls_dir = argv[i + 1];
    if (std::string(argv[i]) == "--mib") mib = std::stoul(argv[i + 1]);
    if (std::string(argv[i]) == "--repeats") repeats = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--connections") connections = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--tune-malloc") tune_malloc = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--serve") serve = std::string(argv[i + 1]) == "1";
    if (std::string(argv[i]) == "--protobuf") protobuf = std::string(argv[i + 1]) == "1";
  }
  if (connections < 1) Fail("--connections must be at least 1");
  const size_t n = mib << 20;
  if (serve) return Serve(n, tune_malloc != 0, tls_dir);
  int sender_stdin = -1;
  int ports[4] = {0, 0, 0, 0};
  const pid_t sender = SpawnSender(mib, tune_malloc != 0, tls_dir, &sender_stdin, ports);
  if (tune_malloc) flashdraft::TuneMallocForStreaming();  // as flashdraft-worker does
  const std::vector<uint8_t> src = TestBytes(n);
  std::vector<uint8_t> dst(n, 0);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessage);
  auto stub = flashdraft::v1::Coordinator::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(ports[0]), grpc::InsecureChannelCredentials(), args));
  // The worker's channels: plaintext, and with --tls-dir mutual TLS and the job secret; one
  // connection each unless --connections asks for more.
  flashdraft::ClientSecurity plain, tls;
  if (!tls_dir.empty()) {
    tls.tls_ca = tls_dir + "/ca.pem";
    tls.tls_cert = tls_dir + "/worker.pem";
    tls.tls_key = tls_dir + "/worker.key";
    tls.token_file = tls_dir + "/token";
  }
  std::vector<std::shared_ptr<grpc::Channel>> zc_channels, tls_channels;
  for (int i = 0; i < connections; ++i) {
    auto zc = flashdraft::CreateSecureChannel("127.0.0.1:" + std::to_string(ports[1]), plain, i);
    if (!zc.ok()) Fail(std::string(zc.status().message()));
    zc_channels.push_back(*zc);
    if (tls_dir.empty()) continue;
    auto secure = flashdraft::CreateSecureChannel("127.0.0.1:" + std::to_string(ports[3]), tls, i);
    if (!secure.ok()) Fail(std::string(secure.status().message()));
    tls_channels.push_back(*secure);
  }
  const bool with_tls = !tls_channels.empty();

  double grpc_best = 1e9, zc_best = 1e9, tcp_best = 1e9, tls_best = 1e9;
  double zc_cpu = 0, tls_cpu = 0;  // CPU seconds of both processes over all repeats
  auto check = [&] {
    if (std::memcmp(src.data(), dst.data(), n) != 0) Fail("received bytes differ");
    std::fill(dst.begin(), dst.end(), 0);
  };
  if (protobuf) {
    GrpcSeconds(*stub, dst);  // warm-up
    check();
  }
  ZeroCopySeconds(zc_channels, dst);
  check();
  TcpSeconds(ports[2], dst);
  check();
  if (with_tls) {
    ZeroCopySeconds(tls_channels, dst);
    check();
  }
  // Times one run of a path and adds the CPU both processes spent in it to `cpu`.
  auto timed = [&](auto run, double& cpu) {
    const double c0 = CpuSeconds(sender);
    const double s = run();
    cpu += CpuSeconds(sender) - c0;
    check();
    return s;
  };
  for (int r = 0; r < repeats; ++r) {
    if (protobuf) {
      grpc_best = std::min(grpc_best, GrpcSeconds(*stub, dst));
      check();
    }
    zc_best = std::min(zc_best, timed([&] { return ZeroCopySeconds(zc_channels, dst); }, zc_cpu));
    tcp_best = std::min(tcp_best, TcpSeconds(ports[2], dst));
    check();
    if (with_tls) {
      tls_best =
          std::min(tls_best, timed([&] { return ZeroCopySeconds(tls_channels, dst); }, tls_cpu));
    }
  }
  close(sender_stdin);
  int wstatus = 0;
  waitpid(sender, &wstatus, 0);
  const double gb = n / 1e9;
  std::printf("malloc tuned for streaming: %s\n",
              tune_malloc ? "yes (as flashdraft-worker)" : "no");
  std::printf("loopback streaming of %zu MiB, sender in its own process, best of %d\n", mib,
              repeats);
  std::printf("gRPC paths over %d connection(s); CPU: core-seconds of both processes per GB\n",
              connections);
  std::printf("%-40s %8s %8s %10s %8s\n", "path", "s", "GB/s", "vs TCP", "CPU s/GB");
  std::printf("%-40s %8.3f %8.2f %9.0f%%\n", "raw TCP socket (peer)", tcp_best, gb / tcp_best,
              100.0);
  std::printf("%-40s %8.3f %8.2f %9.0f%% %8.2f\n", "gRPC zero-copy chunks (flashdraft)", zc_best,
              gb / zc_best, 100.0 * tcp_best / zc_best, zc_cpu / (gb * repeats));
  if (with_tls) {
    std::printf("%-40s %8.3f %8.2f %9.0f%% %8.2f\n", "gRPC zero-copy chunks, mutual TLS + token",
                tls_best, gb / tls_best, 100.0 * tcp_best / tls_best, tls_cpu / (gb * repeats));
    std::printf("TLS / plaintext: %.2f\n", zc_best / tls_best);
  }
  if (protobuf) {
    std::printf("%-40s %8.3f %8.2f %9.0f%%\n", "gRPC protobuf TensorChunk messages", grpc_best,
                gb / grpc_best, 100.0 * tcp_best / grpc_best);
  }
  return WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0 ? 0 : 1;
}
