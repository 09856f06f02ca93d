#include "common/tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest for 256 + n.
uint32_t ByteLevelCodePoint(uint8_t b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
  uint32_t n = 0;
  for (uint32_t x = 0; x < b; ++x) {
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) ++n;
  }
  return 256 + n;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  char buf[4];
  int32_t len = 0;
  UBool error = false;
  U8_APPEND(reinterpret_cast<uint8_t*>(buf), len, 4, cp, error);
  (void)error;  // cp is always a valid code point here
  out.append(buf, static_cast<size_t>(len));
}

// Character classes the split pattern uses.
enum : uint8_t { kLetter = 1, kNumber = 2, kSpace = 4, kNewline = 8 };

uint8_t ClassOf(UChar32 c) {
  if (c == '\r' || c == '\n') return kSpace | kNewline;
  const uint32_t mask = U_GET_GC_MASK(c);
  uint8_t k = 0;
  if (mask & U_GC_L_MASK) k |= kLetter;
  if (mask & U_GC_N_MASK) k |= kNumber;
  if (u_isUWhiteSpace(c)) k |= kSpace;  // Oniguruma's \s: the White_Space property
  return k;
}

// Folds a code point for the (?i:...) contractions: ASCII letters and U+017F (long s ~ s).
int FoldForContraction(UChar32 c) {
  if (c == 0x17F) return 's';
  if (c < 128) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return -1;
}

// End (code point index) of the split pattern's match at `i`; every position matches something.
size_t MatchAt(const std::vector<UChar32>& cp, const std::vector<uint8_t>& cls, size_t i,
               int max_digits) {
  const size_t n = cp.size();
  auto is = [&](size_t k, uint8_t c) { return k < n && (cls[k] & c) != 0; };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (cp[i] == '\'' && i + 1 < n) {
    const int a = FoldForContraction(cp[i + 1]);
    const int b = i + 2 < n ? FoldForContraction(cp[i + 2]) : -1;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (!is(j, kLetter) && !is(j, kNewline | kNumber) && is(j + 1, kLetter)) ++j;
    if (is(j, kLetter)) {
      while (is(j, kLetter)) ++j;
      return j;
    }
  }
  // \p{N} or \p{N}{1,3}
  if (is(i, kNumber)) {
    size_t j = i;
    while (is(j, kNumber) && j - i < static_cast<size_t>(max_digits)) ++j;
    return j;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  {
    size_t j = cp[i] == ' ' ? i + 1 : i;
    size_t k = j;
    while (k < n && !is(k, kSpace | kLetter | kNumber)) ++k;
    if (k > j) {
      while (is(k, kNewline)) ++k;
      return k;
    }
  }
  if (is(i, kSpace)) {
    size_t k = i;
    while (is(k, kSpace)) ++k;
    // \s*[\r\n]+ : up to the run's last newline
    for (size_t p = k; p > i; --p) {
      if (is(p - 1, kNewline)) return p;
    }
    // \s+(?!\S) : the whole run at the end of the text, else all but its last character
    if (k == n) return k;
    if (k - 1 > i) return k - 1;
    // \s+
    return k;
  }
  return i + 1;  // not reachable for this pattern: every character class is covered above
}

// NFC of `text`, with a map from normalized to original byte offsets (at the granularity of
// normalization units: text between code points that have a boundary before them).
struct Normalized {
  std::string text;
  std::vector<std::pair<size_t, size_t>> units;  // (normalized start, original start); empty: same
  size_t original_size = 0;

  size_t ToOriginalStart(size_t x) const {
    if (units.empty()) return x;
    auto it = std::upper_bound(units.begin(), units.end(), std::make_pair(x, SIZE_MAX));
    return std::prev(it)->second;
  }
  size_t ToOriginalEnd(size_t x) const {
    if (units.empty()) return x;
    auto it = std::lower_bound(units.begin(), units.end(), std::make_pair(x, size_t{0}));
    return it == units.end() ? original_size : it->second;
  }
};

bool IsAscii(absl::string_view s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

Normalized Nfc(absl::string_view text) {
  Normalized out;
  out.original_size = text.size();
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status) || IsAscii(text)) {
    out.text = std::string(text);
    return out;
  }
  const icu::UnicodeString whole = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (nfc->isNormalized(whole, status) && U_SUCCESS(status)) {
    whole.toUTF8String(out.text);
    return out;
  }
  // Normalize unit by unit, remembering where each started.
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    UChar32 c;
    int32_t pos = static_cast<int32_t>(j);
    U8_NEXT(reinterpret_cast<const uint8_t*>(text.data()), pos, static_cast<int32_t>(text.size()),
            c);
    j = static_cast<size_t>(pos);
    while (j < text.size()) {
      int32_t next = static_cast<int32_t>(j);
      U8_NEXT(reinterpret_cast<const uint8_t*>(text.data()), next,
              static_cast<int32_t>(text.size()), c);
      if (c >= 0 && nfc->hasBoundaryBefore(c)) break;
      j = static_cast<size_t>(next);
    }
    icu::UnicodeString unit = icu::UnicodeString::fromUTF8(
        icu::StringPiece(text.data() + i, static_cast<int32_t>(j - i)));
    UErrorCode unit_status = U_ZERO_ERROR;
    icu::UnicodeString normalized = nfc->normalize(unit, unit_status);
    out.units.emplace_back(out.text.size(), i);
    if (U_FAILURE(unit_status)) normalized = unit;
    normalized.toUTF8String(out.text);
    i = j;
  }
  return out;
}

absl::StatusOr<bool> ReadNormalizer(const json& n, const std::string& label) {
  if (n.is_null()) return false;
  const std::string type = n.value("type", "");
  if (type == "NFC") return true;
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    bool nfc = false;
    for (const json& item : n["normalizers"]) {
      FD_ASSIGN_OR_RETURN(bool x, ReadNormalizer(item, label));
      nfc = nfc || x;
    }
    return nfc;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(label, ": normalizer '", type, "' is not supported (supported: NFC)"));
}

// Returns the digit limit of the split pattern (1: Qwen2, 3: Llama-3).
absl::StatusOr<int> ReadPreTokenizer(const json& p, const std::string& label) {
  const auto unsupported = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": pre_tokenizer ", what,
        " is not supported (supported: Split with the Qwen2 or Llama-3 pattern + ByteLevel)"));
  };
  if (!p.is_object() || p.value("type", "") != "Sequence" || !p.contains("pretokenizers") ||
      !p["pretokenizers"].is_array() || p["pretokenizers"].size() != 2) {
    return unsupported(p.is_object() ? "'" + p.value("type", "") + "'" : "(missing)");
  }
  const json& split = p["pretokenizers"][0];
  const json& byte_level = p["pretokenizers"][1];
  if (split.value("type", "") != "Split" || !split.contains("pattern") ||
      !split["pattern"].is_object() || !split["pattern"].contains("Regex") ||
      split.value("behavior", "") != "Isolated" || split.value("invert", false)) {
    return unsupported("Sequence[0] (expected Split, Regex pattern, Isolated)");
  }
  if (byte_level.value("type", "") != "ByteLevel" || byte_level.value("add_prefix_space", false) ||
      byte_level.value("use_regex", true)) {
    return unsupported("Sequence[1] (expected ByteLevel without prefix space or regex)");
  }
  const std::string pattern = split["pattern"]["Regex"].get<std::string>();
  if (pattern == kQwen2SplitPattern) return 1;
  if (pattern == kLlama3SplitPattern) return 3;
  return unsupported("split pattern " + pattern);
}

}  // namespace

std::string ByteLevelChar(uint8_t byte) {
  std::string s;
  AppendUtf8(s, ByteLevelCodePoint(byte));
  return s;
}

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  FD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(absl::string_view text,
                                                               const std::string& label) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not a JSON object"));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  try {
    FD_ASSIGN_OR_RETURN(t->nfc_, ReadNormalizer(j.value("normalizer", json()), label));
    FD_ASSIGN_OR_RETURN(t->max_digits_, ReadPreTokenizer(j.value("pre_tokenizer", json()), label));
    const json& model = j.at("model");
    if (model.value("type", "") != "BPE") {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": model.type '", model.value("type", ""), "' is not supported (supported: BPE)"));
    }
    if (model.value("byte_fallback", false) ||
        !model.value("continuing_subword_prefix", "").empty() ||
        !model.value("end_of_word_suffix", "").empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label,
          ": BPE byte_fallback / continuing_subword_prefix / end_of_word_suffix are not "
          "supported (byte-level BPE has none)"));
    }
    t->ignore_merges_ = model.value("ignore_merges", false);
    // Ids are integers below kMaxVocabulary (the id → token table is that long).
    auto id_of = [&](const json& id, const std::string& token) -> absl::StatusOr<int32_t> {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocabulary) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, ": token '", token.substr(0, 64), "' has id ",
                         id.dump().substr(0, 32), ", not an integer in [0, ", kMaxVocabulary, ")"));
      }
      return static_cast<int32_t>(id.get<int64_t>());
    };
    int32_t max_id = -1;
    for (const auto& [token, id] : model.at("vocab").items()) {
      FD_ASSIGN_OR_RETURN(const int32_t i, id_of(id, token));
      t->vocab_[token] = i;
      max_id = std::max(max_id, i);
    }
    for (const json& a : j.value("added_tokens", json::array())) {
      AddedToken added{a.at("content").get<std::string>(), 0, a.value("special", false)};
      FD_ASSIGN_OR_RETURN(added.id, id_of(a.at("id"), added.content));
      if (added.content.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(label, ": added token with empty content"));
      }
      if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false)) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, ": added token '", added.content,
                         "' uses lstrip/rstrip/single_word, which are not supported"));
      }
      t->vocab_[added.content] = added.id;
      max_id = std::max(max_id, added.id);
      t->added_.push_back(std::move(added));
    }
    t->vocab_size_ = max_id + 1;
    t->id_to_token_.assign(static_cast<size_t>(t->vocab_size_), "");
    for (const auto& [token, id] : t->vocab_) t->id_to_token_[id] = token;
    for (int b = 0; b < 256; ++b) {
      auto it = t->vocab_.find(ByteLevelChar(static_cast<uint8_t>(b)));
      if (it == t->vocab_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, ": the vocabulary lacks the byte-level token of byte ", b));
      }
      t->byte_ids_[b] = it->second;
    }
    int32_t rank = 0;
    for (const json& m : model.at("merges")) {
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat(label, ": merge ", rank, " '", s, "' is not 'left right'"));
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {
        left = m.at(0).get<std::string>();
        right = m.at(1).get<std::string>();
      }
      auto l = t->vocab_.find(left), r = t->vocab_.find(right),
           merged = t->vocab_.find(left + right);
      if (l == t->vocab_.end() || r == t->vocab_.end() || merged == t->vocab_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(label, ": merge ", rank, " ('", left, "', '",
                                                       right, "') names tokens not in the vocab"));
      }
      const uint64_t key =
          (uint64_t{static_cast<uint32_t>(l->second)} << 32) | static_cast<uint32_t>(r->second);
      t->merges_.emplace(key, Merge{rank, merged->second});  // the first (best) rank wins
      ++rank;
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", e.what()));
  }
  // Added tokens: longest first, indexed by first byte, for leftmost-longest matching.
  std::sort(t->added_.begin(), t->added_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  t->added_by_first_byte_.assign(256, {});
  for (size_t i = 0; i < t->added_.size(); ++i) {
    t->added_by_first_byte_[static_cast<uint8_t>(t->added_[i].content[0])].push_back(i);
    t->added_by_id_[t->added_[i].id] = i;
  }
  return t;
}

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

std::vector<int32_t> Tokenizer::Encode(absl::string_view text) const {
  return EncodeWithOffsets(text).ids;
}

Tokenizer::Encoding Tokenizer::EncodeWithOffsets(absl::string_view text) const {
  Encoding out;
  size_t start = 0;  // of the text not yet encoded
  for (size_t i = 0; i < text.size();) {
    const std::vector<size_t>& candidates = added_by_first_byte_[static_cast<uint8_t>(text[i])];
    const AddedToken* match = nullptr;
    for (size_t c : candidates) {  // longest first
      if (text.substr(i, added_[c].content.size()) == added_[c].content) {
        match = &added_[c];
        break;
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    EncodeOrdinary(text.substr(start, i - start), start, &out);
    out.ids.push_back(match->id);
    out.offsets.emplace_back(i, i + match->content.size());
    i += match->content.size();
    start = i;
  }
  EncodeOrdinary(text.substr(start), start, &out);
  return out;
}

std::vector<std::pair<size_t, size_t>> Tokenizer::SplitPieces(absl::string_view s) const {
  // Code points and their byte positions; invalid bytes count as U+FFFD but keep their bytes.
  std::vector<UChar32> cps;
  std::vector<size_t> pos;
  cps.reserve(s.size());
  pos.reserve(s.size() + 1);
  for (int32_t i = 0; i < static_cast<int32_t>(s.size());) {
    pos.push_back(static_cast<size_t>(i));
    UChar32 c;
    U8_NEXT(reinterpret_cast<const uint8_t*>(s.data()), i, static_cast<int32_t>(s.size()), c);
    cps.push_back(c < 0 ? 0xFFFD : c);
  }
  pos.push_back(s.size());
  std::vector<uint8_t> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = ClassOf(cps[i]);
  std::vector<std::pair<size_t, size_t>> pieces;
  for (size_t i = 0; i < cps.size();) {
    const size_t j = MatchAt(cps, cls, i, max_digits_);
    pieces.emplace_back(pos[i], pos[j]);
    i = j;
  }
  return pieces;
}

std::vector<std::string> Tokenizer::PreTokenize(absl::string_view text) const {
  const Normalized norm = nfc_ ? Nfc(text) : Normalized{std::string(text), {}, text.size()};
  std::vector<std::string> out;
  for (const auto& [begin, end] : SplitPieces(norm.text)) {
    out.push_back(norm.text.substr(begin, end - begin));
  }
  return out;
}

void Tokenizer::EncodeOrdinary(absl::string_view text, size_t base, Encoding* out) const {
  if (text.empty()) return;
  const Normalized norm = nfc_ ? Nfc(text) : Normalized{std::string(text), {}, text.size()};
  const std::string& s = norm.text;
  std::vector<int32_t> ids;
  std::vector<size_t> lengths;
  for (const auto& [begin, end] : SplitPieces(s)) {
    ids.clear();
    lengths.clear();
    Bpe(absl::string_view(s).substr(begin, end - begin), &ids, &lengths);
    size_t at = begin;
    for (size_t k = 0; k < ids.size(); ++k) {
      out->ids.push_back(ids[k]);
      out->offsets.emplace_back(base + norm.ToOriginalStart(at),
                                base + norm.ToOriginalEnd(at + lengths[k]));
      at += lengths[k];
    }
  }
}

void Tokenizer::Bpe(absl::string_view piece, std::vector<int32_t>* ids,
                    std::vector<size_t>* lengths) const {
  if (ignore_merges_ && piece.size() > 1) {
    std::string chars;
    for (unsigned char b : piece) chars += ByteLevelChar(b);
    auto it = vocab_.find(chars);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      lengths->push_back(piece.size());
      return;
    }
  }
  struct Symbol {
    int32_t id;
    size_t len;
    int prev, next;
  };
  std::vector<Symbol> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    sym[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], 1, static_cast<int>(i) - 1,
              i + 1 < piece.size() ? static_cast<int>(i) + 1 : -1};
  }
  // Candidate merges ordered by (rank, position); stale entries are skipped when popped.
  struct Candidate {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    const int right = sym[left].next;
    const uint64_t key = (uint64_t{static_cast<uint32_t>(sym[left].id)} << 32) |
                         static_cast<uint32_t>(sym[right].id);
    auto it = merges_.find(key);
    if (it != merges_.end()) {
      heap.push({it->second.rank, left, right, sym[left].id, sym[right].id});
    }
  };
  for (int i = 0; i + 1 < static_cast<int>(piece.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[c.left];
    if (l.len == 0 || l.next != c.right || l.id != c.left_id || sym[c.right].id != c.right_id) {
      continue;  // stale
    }
    Symbol& r = sym[c.right];
    const uint64_t key =
        (uint64_t{static_cast<uint32_t>(l.id)} << 32) | static_cast<uint32_t>(r.id);
    l.id = merges_.at(key).merged;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0 && i < static_cast<int>(sym.size()); i = sym[i].next) {
    ids->push_back(sym[i].id);
    lengths->push_back(sym[i].len);
  }
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  // Byte-level code point -> byte.
  static const std::unordered_map<uint32_t, uint8_t> kToByte = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    for (int b = 0; b < 256; ++b) m[ByteLevelCodePoint(static_cast<uint8_t>(b))] = b;
    return m;
  }();
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      if (!(skip_special_tokens && added_[added->second].special)) {
        bytes += added_[added->second].content;
      }
      continue;
    }
    const std::string& token = id_to_token_[id];
    for (int32_t i = 0; i < static_cast<int32_t>(token.size());) {
      UChar32 c;
      U8_NEXT(reinterpret_cast<const uint8_t*>(token.data()), i, static_cast<int32_t>(token.size()),
              c);
      auto it = kToByte.find(static_cast<uint32_t>(c));
      if (it != kToByte.end()) bytes.push_back(static_cast<char>(it->second));
    }
  }
  // Lossy UTF-8: each maximal invalid subsequence becomes U+FFFD.
  std::string out;
  out.reserve(bytes.size());
  for (int32_t i = 0; i < static_cast<int32_t>(bytes.size());) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(reinterpret_cast<const uint8_t*>(bytes.data()), i, static_cast<int32_t>(bytes.size()),
            c);
    if (c < 0) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(bytes, static_cast<size_t>(start), static_cast<size_t>(i - start));
    }
  }
  return out;
}

}  // namespace flashdraft
