// libFuzzer: what a feeder reads off the wire — a FeedMessage from the coordinator (its ShardWork
// checked by ShardFeatureBytes, then built into chunks and held in the shard store) and a worker's
// FetchShardRequest against that store — and what the coordinator reads from a feeder: a
// FeederMessage whose regenerated line becomes a sample's tokens (RegeneratedTokens). Bounded
// allocation: the work's feature bytes are checked before anything is computed, an answer's
// lengths before anything is copied. (A RegenerateWork's text goes to the chat-line parser,
// which fuzz_chat_line covers.)
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/feeder_pool.h"
#include "feeder/shard_builder.h"
#include "feeder/shard_store.h"
#include "flashdraft/v1/feeder.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flashdraft;
  // Rows of 8 elements, the last 2 of them a teacher feature when the work announces 5 tensors.
  const FeatureLayout plain{/*feature_size=*/8, DType::kBF16, /*max_seq_len=*/64};
  const FeatureLayout with_teacher{8, DType::kBF16, 64, /*teacher_size=*/2};
  ShardStore store(1 << 20);
  v1::FeedMessage message;
  if (message.ParseFromArray(data, static_cast<int>(size))) {
    if (message.has_work()) {
      const v1::ShardWork& work = message.work();
      const FeatureLayout& layout = work.header().num_tensors() == 5 ? with_teacher : plain;
      absl::StatusOr<uint64_t> bytes = ShardFeatureBytes(work, layout);
      if (bytes.ok() && store.Assign(work, *bytes).ok()) {
        if (std::optional<ShardStore::Pending> p = store.TryNextToCompute()) {
          store.Complete(p->key, BuildShard(p->work, layout, [&](const std::vector<int64_t>& ids) {
                           return absl::StatusOr<std::vector<uint8_t>>(
                               std::vector<uint8_t>(ids.size() * 8 * 2, 0x3f));
                         }));
        }
        store.WhenReady(work.ticket(), work.header().step(),
                        [](absl::StatusOr<std::vector<grpc::ByteBuffer>>) {});
      }
    }
    if (message.has_release()) store.Release(message.release().committed_steps());
  }
  v1::FetchShardRequest fetch;
  if (fetch.ParseFromArray(data, static_cast<int>(size))) {
    const uint64_t id = store.WhenReady(fetch.ticket(), fetch.step(),
                                        [](absl::StatusOr<std::vector<grpc::ByteBuffer>>) {});
    store.CancelWait(id);
  }
  store.Shutdown(absl::CancelledError("done"));
  v1::FeederMessage answer;
  if (answer.ParseFromArray(data, static_cast<int>(size)) && answer.has_regenerated()) {
    std::vector<int64_t> ids, mask;
    if (RegeneratedTokens(answer.regenerated(), ids, mask).ok() &&
        (ids.size() != mask.size() || ids.empty())) {
      __builtin_trap();  // an accepted answer is one token and one mask value per position
    }
  }
  return 0;
}
