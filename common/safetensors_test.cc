#include "common/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;
using testing_util = ::flashdraft::testing::TempDir;

std::string FileImage(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
  return out + header + data;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

// Element i of a view as double, for comparisons with the Python side.
double ValueAt(const TensorView& v, size_t i) {
  const uint8_t* p = v.data + i * ElementSize(v.dtype);
  switch (v.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kI64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DType::kI32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::kBool:
    case DType::kU8:
      return *p;
  }
  return NAN;
}

TEST(SafetensorsTest, WriterReaderRoundTrip) {
  testing_util dir;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  std::vector<int64_t> ids = {1, 2, 151669};
  std::vector<uint8_t> mask = {1, 0, 1};
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("layers.0.weight", DType::kF32, {2, 3}, a.data(), 24).ok());
  ASSERT_TRUE(writer.Add("input_ids", DType::kI64, {3}, ids.data(), 24).ok());
  ASSERT_TRUE(writer.Add("loss_mask", DType::kU8, {1, 3}, mask.data(), 3).ok());
  ASSERT_TRUE(writer.Add("empty", DType::kF32, {0, 4}, nullptr, 0).ok());
  writer.SetMetadata("format", "pt");
  const std::string path = dir.Join("t.safetensors");
  ASSERT_TRUE(writer.Write(path).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->names(),
              ::testing::ElementsAre("layers.0.weight", "input_ids", "loss_mask", "empty"));
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  auto w = (*file)->GetChecked("layers.0.weight", DType::kF32, {2, 3});
  ASSERT_TRUE(w.ok()) << w.status();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(ValueAt(*w, i), a[i]);
  auto i64 = (*file)->Get("input_ids");
  ASSERT_TRUE(i64.ok());
  EXPECT_EQ(ValueAt(*i64, 2), 151669);
  EXPECT_EQ((*file)->Get("empty")->nbytes, 0u);
  // The data section starts 8-byte aligned, as the reference writer arranges.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % 8, 0u);
}

TEST(SafetensorsTest, GetCheckedNamesTensorAndMismatch) {
  std::vector<float> a(6, 1.0f);
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("fc.weight", DType::kF32, {2, 3}, a.data(), 24).ok());
  auto file = SafetensorsFile::FromBytes("w.safetensors", writer.Serialize());
  ASSERT_TRUE(file.ok());
  auto wrong_dtype = (*file)->GetChecked("fc.weight", DType::kBF16);
  EXPECT_THAT(wrong_dtype.status().message(),
              HasSubstr("w.safetensors: tensor 'fc.weight': dtype is F32, expected BF16"));
  auto wrong_shape = (*file)->GetChecked("fc.weight", DType::kF32, {3, 2});
  EXPECT_THAT(wrong_shape.status().message(),
              HasSubstr("tensor 'fc.weight': shape is [2, 3], expected [3, 2]"));
  auto missing = (*file)->Get("norm.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("w.safetensors: no tensor named 'norm.weight'"));
}

TEST(SafetensorsTest, WriterRefusesInconsistentInput) {
  std::vector<float> a(6);
  SafetensorsWriter writer;
  EXPECT_THAT(writer.Add("x", DType::kF32, {2, 2}, a.data(), 24).message(),
              HasSubstr("needs 16 bytes, got 24"));
  ASSERT_TRUE(writer.Add("x", DType::kF32, {6}, a.data(), 24).ok());
  EXPECT_THAT(writer.Add("x", DType::kF32, {6}, a.data(), 24).message(), HasSubstr("added twice"));
}

struct MalformedCase {
  const char* label;
  std::string image;
  const char* error;
};

std::vector<MalformedCase> MalformedCases() {
  const std::string f32x2(8, '\x01');
  auto header = [](const std::string& entries) { return "{" + entries + "}"; };
  std::string huge_len(8, '\0');
  huge_len[4] = 1;  // 2^32 bytes of header
  return {
      {"too short", std::string("\x05\x00\x00", 3), "too short for the 8-byte header length"},
      {"header past end", FileImage("{}", "").substr(0, 9), "exceeds the 1 bytes that follow it"},
      {"header over limit", huge_len + "{}", "exceeds the limit of 100000000 bytes"},
      {"not json", FileImage("{\"a\": [1,", ""), "header is not valid JSON"},
      {"not an object", FileImage("[1, 2]", ""), "header is not a JSON object"},
      {"unknown dtype",
       FileImage(header(R"("w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]})"),
                 "\x01\x02"),
       "tensor 'w': unsupported dtype 'F8_E4M3'"},
      {"missing dtype", FileImage(header(R"("w": {"shape": [2], "data_offsets": [0, 8]})"), f32x2),
       "tensor 'w': missing or non-string \"dtype\""},
      {"negative dim",
       FileImage(header(R"("w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]})"), f32x2),
       "tensor 'w': bad dimension -2 in shape"},
      {"offsets not a pair",
       FileImage(header(R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0]})"), f32x2),
       "tensor 'w': \"data_offsets\" must be two non-negative integers"},
      {"end before begin",
       FileImage(header(R"("w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]})"), f32x2),
       "tensor 'w': data_offsets [8, 0] end before begin"},
      {"size mismatch",
       FileImage(header(R"("w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})"), f32x2),
       "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8"},
      {"truncated data",
       FileImage(header(R"("w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})"), f32x2),
       "tensor 'w': data_offsets end 16 is past the 8 bytes of data in the file (truncated"},
      {"overlap",
       FileImage(header(R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                        R"("b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})"),
                 f32x2),
       "tensor 'b': data_offsets [4, 8] overlap tensor 'a'"},
      {"gap",
       FileImage(header(R"("a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})"), f32x2),
       "tensor 'a': gap of 4 bytes before its data"},
      {"trailing bytes",
       FileImage(header(R"("a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})"), f32x2),
       "4 unexpected bytes after the last tensor's data"},
      {"metadata value not string", FileImage(header(R"("__metadata__": {"format": 1})"), ""),
       "__metadata__ value of 'format' is not a string"},
      {"entry not object", FileImage(header(R"("w": 3)"), ""),
       "tensor 'w': entry is not an object"},
  };
}

TEST(SafetensorsTest, MalformedFilesGetErrorsNamingFileAndTensor) {
  for (const MalformedCase& c : MalformedCases()) {
    SCOPED_TRACE(c.label);
    auto file = SafetensorsFile::FromBytes("bad.safetensors", c.image);
    ASSERT_FALSE(file.ok());
    EXPECT_THAT(file.status().message(), HasSubstr("bad.safetensors: "));
    EXPECT_THAT(file.status().message(), HasSubstr(c.error));
  }
}

TEST(SafetensorsTest, MalformedFilesOnDiskToo) {
  testing_util dir;
  for (const MalformedCase& c : MalformedCases()) {
    SCOPED_TRACE(c.label);
    const std::string path = dir.Join("bad.safetensors");
    ASSERT_TRUE(WriteFileAtomically(path, c.image).ok());
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_THAT(file.status().message(), HasSubstr(path + ": "));
    EXPECT_THAT(file.status().message(), HasSubstr(c.error));
  }
  EXPECT_THAT(SafetensorsFile::Open(dir.Join("absent.safetensors")).status().message(),
              HasSubstr("absent.safetensors: cannot open"));
  EXPECT_THAT(SafetensorsFile::Open(dir.path()).status().message(),
              HasSubstr("not a regular file"));
}

TEST(SafetensorsTest, ShardedModelFolder) {
  testing_util dir;
  std::vector<float> a = {1, 2, 3, 4}, b = {5, 6};
  SafetensorsWriter s1, s2;
  ASSERT_TRUE(s1.Add("embed_tokens.weight", DType::kF32, {2, 2}, a.data(), 16).ok());
  ASSERT_TRUE(s2.Add("lm_head.weight", DType::kF32, {1, 2}, b.data(), 8).ok());
  ASSERT_TRUE(s1.Write(dir.Join("model-00001-of-00002.safetensors")).ok());
  ASSERT_TRUE(s2.Write(dir.Join("model-00002-of-00002.safetensors")).ok());
  const std::string index = R"({"metadata": {"total_size": 24}, "weight_map": {
      "embed_tokens.weight": "model-00001-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"}})";
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors.index.json"), index).ok());
  auto model = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->names(), ::testing::ElementsAre("embed_tokens.weight", "lm_head.weight"));
  auto head = (*model)->GetChecked("lm_head.weight", DType::kF32, {1, 2});
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(ValueAt(*head, 1), 6.0);

  // An index that places a tensor in a shard without it.
  const std::string bad_index =
      R"({"weight_map": {"norm.weight": "model-00001-of-00002.safetensors"}})";
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors.index.json"), bad_index).ok());
  EXPECT_THAT(SafetensorsModel::Open(dir.path()).status().message(),
              HasSubstr("places tensor 'norm.weight' in model-00001-of-00002.safetensors, which "
                        "has no such tensor"));
  const std::string escaping = R"({"weight_map": {"x": "../etc/passwd"}})";
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors.index.json"), escaping).ok());
  EXPECT_THAT(SafetensorsModel::Open(dir.path()).status().message(),
              HasSubstr("names an invalid shard '../etc/passwd'"));
  const std::string missing_shard = R"({"weight_map": {"x": "model-9.safetensors"}})";
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors.index.json"), missing_shard).ok());
  EXPECT_THAT(SafetensorsModel::Open(dir.path()).status().message(),
              HasSubstr("model-9.safetensors: cannot open"));

  testing_util empty;
  EXPECT_THAT(SafetensorsModel::Open(empty.path()).status().message(),
              HasSubstr("contains neither model.safetensors nor model.safetensors.index.json"));
}

// A Python writer built only from the format description (no safetensors package here): the files
// it writes must read back with the same values in C++, and the files C++ writes must read in
// Python.
constexpr const char* kPythonWriter = R"PY(
import json, struct, sys, torch
path = sys.argv[1]
g = torch.Generator().manual_seed(7)
tensors = {
    "f32": torch.randn(3, 5, generator=g),
    "f16": torch.randn(4, generator=g).half(),
    "bf16": torch.randn(2, 3, generator=g).bfloat16(),
    "i64": torch.tensor([[0, -5, 151669]], dtype=torch.int64),
    "i32": torch.tensor([7, -8], dtype=torch.int32),
    "bool": torch.tensor([True, False, True]),
    "u8": torch.tensor([0, 255, 3], dtype=torch.uint8),
    "scalar": torch.tensor(2.5),
}
names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
         torch.int32: "I32", torch.bool: "BOOL", torch.uint8: "U8"}
def raw(t):
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()
header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
# The reference writer orders by dtype size then name; any order is valid, this one differs on purpose.
for name in sorted(tensors, reverse=True):
    b = raw(tensors[name])
    header[name] = {"dtype": names[tensors[name].dtype], "shape": list(tensors[name].shape),
                    "data_offsets": [offset, offset + len(b)]}
    blobs.append(b)
    offset += len(b)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print(json.dumps({n: {"dtype": names[t.dtype], "shape": list(t.shape),
                      "values": t.float().flatten().tolist()} for n, t in tensors.items()}))
)PY";

constexpr const char* kPythonReader = R"PY(
import json, struct, sys, torch
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
body = data[8 + n:]
dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "BOOL": torch.bool, "U8": torch.uint8}
out = {}
for name, e in header.items():
    if name == "__metadata__":
        continue
    b, en = e["data_offsets"]
    t = torch.frombuffer(bytearray(body[b:en]), dtype=dtypes[e["dtype"]]).reshape(e["shape"])
    out[name] = {"dtype": e["dtype"], "shape": e["shape"], "values": t.float().flatten().tolist()}
print(json.dumps(out))
)PY";

void ExpectMatchesPython(const SafetensorsFile& file, const nlohmann::json& expected) {
  ASSERT_EQ(file.names().size(), expected.size());
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    SCOPED_TRACE(it.key());
    auto view = file.Get(it.key());
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(DTypeName(view->dtype), it.value()["dtype"].get<std::string>());
    EXPECT_EQ(view->shape, it.value()["shape"].get<std::vector<int64_t>>());
    const auto values = it.value()["values"].get<std::vector<double>>();
    ASSERT_EQ(static_cast<size_t>(view->numel()), values.size());
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(ValueAt(*view, i), values[i]) << i;
  }
}

TEST(SafetensorsPythonTest, ReadsFilesWrittenByPython) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  testing_util dir;
  const std::string path = dir.Join("py.safetensors");
  auto out = flashdraft::testing::RunReferencePython(kPythonWriter, {path});
  ASSERT_TRUE(out.ok()) << out.status();
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  ExpectMatchesPython(**file, nlohmann::json::parse(*out));
}

TEST(SafetensorsPythonTest, PythonReadsFilesWrittenByCpp) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  testing_util dir;
  // Round trip: Python writes, C++ re-writes every tensor, Python reads the C++ file back.
  const std::string py_path = dir.Join("py.safetensors");
  auto expected = flashdraft::testing::RunReferencePython(kPythonWriter, {py_path});
  ASSERT_TRUE(expected.ok()) << expected.status();
  auto source = SafetensorsFile::Open(py_path);
  ASSERT_TRUE(source.ok());
  SafetensorsWriter writer;
  for (const std::string& name : (*source)->names()) {
    TensorView v = *(*source)->Get(name);
    ASSERT_TRUE(writer.Add(name, v.dtype, v.shape, v.data, v.nbytes).ok());
  }
  const std::string cpp_path = dir.Join("cpp.safetensors");
  ASSERT_TRUE(writer.Write(cpp_path).ok());
  auto read_back = flashdraft::testing::RunReferencePython(kPythonReader, {cpp_path});
  ASSERT_TRUE(read_back.ok()) << read_back.status();
  EXPECT_EQ(nlohmann::json::parse(*read_back), nlohmann::json::parse(*expected));
}

}  // namespace
}  // namespace flashdraft
