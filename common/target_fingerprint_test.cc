#include "common/target_fingerprint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

// A safetensors image: the 8-byte length, the header, `data_bytes` zero bytes.
std::string Safetensors(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

const char kHeader[] = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
const char kOtherShape[] = R"({"w":{"dtype":"F32","shape":[4,1],"data_offsets":[0,16]}})";

void WriteTarget(const testing::TempDir& dir, const std::string& config, const std::string& header,
                 char fill = '\0') {
  ASSERT_TRUE(WriteFileAtomically(dir.Join("config.json"), config).ok());
  std::string image = Safetensors(header, 16);
  image.back() = fill;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors"), image).ok());
}

TEST(TargetFingerprintTest, SameFilesSameFingerprintAnyShapeChangeShows) {
  testing::TempDir a, b, c, d;
  WriteTarget(a, R"({"hidden_size": 4})", kHeader);
  WriteTarget(b, R"({"hidden_size": 4})", kHeader, /*fill=*/'\7');  // other weight values
  WriteTarget(c, R"({"hidden_size": 4})", kOtherShape);
  WriteTarget(d, R"({"hidden_size": 8})", kHeader);
  absl::StatusOr<TargetFingerprintValue> fa = FingerprintTarget(a.path());
  ASSERT_TRUE(fa.ok()) << fa.status();
  EXPECT_EQ(fa->config_sha256.size(), 64u);
  const TargetFingerprintValue fb = *FingerprintTarget(b.path());
  const TargetFingerprintValue fc = *FingerprintTarget(c.path());
  const TargetFingerprintValue fd = *FingerprintTarget(d.path());
  EXPECT_EQ(fa->config_sha256, fb.config_sha256);
  EXPECT_EQ(fa->tensors_sha256, fb.tensors_sha256);
  EXPECT_EQ(fa->config_sha256, fc.config_sha256);
  EXPECT_NE(fa->tensors_sha256, fc.tensors_sha256);
  EXPECT_NE(fa->config_sha256, fd.config_sha256);
  // The SHA-256 of the config's bytes, as sha256sum prints it.
  const testing::CommandResult sum = testing::RunCommand("sha256sum " + a.Join("config.json"));
  ASSERT_EQ(sum.exit_code, 0) << sum.output;
  EXPECT_EQ(sum.output.substr(0, 64), fa->config_sha256);
}

TEST(TargetFingerprintTest, ErrorsNameTheFile) {
  testing::TempDir empty;
  absl::StatusOr<TargetFingerprintValue> none = FingerprintTarget(empty.path());
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr(empty.Join("config.json")));

  testing::TempDir no_tensors;
  ASSERT_TRUE(WriteFileAtomically(no_tensors.Join("config.json"), "{}").ok());
  EXPECT_THAT(FingerprintTarget(no_tensors.path()).status().message(),
              HasSubstr("no *.safetensors file"));

  testing::TempDir truncated;
  ASSERT_TRUE(WriteFileAtomically(truncated.Join("config.json"), "{}").ok());
  std::string image = Safetensors(kHeader, 16);
  image[0] = '\xff';  // a header length beyond the file
  ASSERT_TRUE(WriteFileAtomically(truncated.Join("model.safetensors"), image).ok());
  absl::StatusOr<TargetFingerprintValue> bad = FingerprintTarget(truncated.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("model.safetensors: header length"));
}

}  // namespace
}  // namespace flashdraft
