#include "common/grpc_status.h"

#include <gtest/gtest.h>

namespace flashdraft {
namespace {

TEST(GrpcStatusTest, RoundTripsEveryCode) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : "what went wrong");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    if (code != 0) {
      EXPECT_EQ(g.error_message(), "what went wrong");
    }
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
}

}  // namespace
}  // namespace flashdraft
