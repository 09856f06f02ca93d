// FetchTensors end to end over a real gRPC connection on port 0: the coordinator's reactor
// (coordinator/service.h, without a Coordinator) streams the tensors of a mapped safetensors file,
// the worker's FetchTensors assembles them.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/grpc_options.h"
#include "common/safetensors.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"
#include "model/wire_tensor.h"
#include "tests/support/test_util.h"
#include "worker/training_state.h"

namespace flashdraft {
namespace {

using NamedTensor = std::pair<std::string, torch::Tensor>;

// The coordinator's FetchTensors alone: every call gets `entries` in chunks of `max_chunk_bytes`.
class FetchOnlyService
    : public v1::Coordinator::WithRawCallbackMethod_FetchTensors<v1::Coordinator::Service> {
 public:
  FetchOnlyService(std::vector<FetchEntry> entries, size_t max_chunk_bytes)
      : entries_(std::move(entries)), max_chunk_bytes_(max_chunk_bytes) {}
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchTensors(grpc::CallbackServerContext*,
                                                           const grpc::ByteBuffer*) override {
    return NewFetchReactor(entries_, max_chunk_bytes_);
  }

 private:
  std::vector<FetchEntry> entries_;
  size_t max_chunk_bytes_;
};

// `tensors` as one safetensors file under `dir`, mapped as the coordinator maps its files, and the
// FetchTensors entries of all of them under their own names.
std::vector<FetchEntry> ServeFile(const std::vector<NamedTensor>& tensors,
                                  const testing::TempDir& dir) {
  SafetensorsWriter writer;
  for (const auto& [name, t] : tensors) {
    const DType dtype = FromTorchDType(t.scalar_type()).value();
    EXPECT_TRUE(writer.Add(name, dtype, t.sizes().vec(), t.data_ptr(), t.nbytes()).ok());
  }
  const std::string path = dir.Join("tensors.safetensors");
  EXPECT_TRUE(writer.Write(path).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> opened = SafetensorsModel::Open(path);
  EXPECT_TRUE(opened.ok()) << opened.status();
  std::vector<FetchEntry> entries;
  if (!opened.ok()) return entries;
  std::shared_ptr<const SafetensorsModel> file = *std::move(opened);
  for (const auto& [name, t] : tensors) entries.push_back({file, name, name});
  return entries;
}

// Chunks of 1 MiB: tensors of exactly 3, of 2 and a part, of more than gRPC's message limit (the
// embedding of a real target is 2.5 GB), and an empty one (one empty chunk) arrive whole, in
// messages the worker's channel accepts.
TEST(FetchTensorsTest, TensorsOfSeveralChunksArriveWhole) {
  constexpr size_t kChunk = 1 << 20;
  constexpr int64_t kFloatsPerChunk = kChunk / sizeof(float);
  const std::vector<NamedTensor> tensors = {
      {"embed_tokens.weight", torch::randn({3, kFloatsPerChunk})},
      {"lm_head.weight", torch::randn({2 * kFloatsPerChunk + 123})},
      {"drafter.fc.weight", torch::randn({4100, 4096})},
      {"drafter.empty", torch::zeros({0})}};
  ASSERT_GT(tensors[2].second.nbytes(), static_cast<size_t>(kMaxMessageBytes));
  testing::TempDir dir;
  FetchOnlyService service(ServeFile(tensors, dir), kChunk);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ConfigureServer(builder);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  auto channel =
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                grpc::InsecureChannelCredentials(), ClientChannelArguments());

  absl::StatusOr<std::map<std::string, torch::Tensor>> fetched =
      FetchTensors(channel, "token", /*timeout_seconds=*/120);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ASSERT_EQ(fetched->size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_EQ(fetched->count(name), 1u) << name;
    EXPECT_TRUE(torch::equal(fetched->at(name), t)) << name;
  }
  server->Shutdown();
}

}  // namespace
}  // namespace flashdraft
