#include "common/multi_line_text.h"

#include "absl/strings/str_format.h"

namespace flashdraft {
namespace {

// The length of the UTF-8 sequence at text[i], or 0 when it is not one (overlong forms,
// surrogates and code points past U+10FFFF included).
size_t Utf8Length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  if (c >= 0xe0 && c <= 0xef) n = 3;
  if (c >= 0xf0 && c <= 0xf4) n = 4;
  if (c == 0xe0) lo = 0xa0;
  if (c == 0xed) hi = 0x9f;
  if (c == 0xf0) lo = 0x90;
  if (c == 0xf4) hi = 0x8f;
  if (n == 0 || i + n > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

std::optional<std::string> MultiLineTextProblem(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      return absl::StrFormat("has a control character (byte %d is 0x%02x)", i, c);
    }
    const size_t n = Utf8Length(text, i);
    if (n == 0) return absl::StrFormat("is not UTF-8 (byte %d is 0x%02x)", i, c);
    i += n;
  }
  return std::nullopt;
}

}  // namespace flashdraft
