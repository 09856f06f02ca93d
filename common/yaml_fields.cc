#include "common/yaml_fields.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace flashdraft {

FieldCheck<double> Positive() {
  return [](const double& v) -> std::optional<std::string> {
    if (!(v > 0)) return std::string("must be > 0");
    return std::nullopt;
  };
}

FieldCheck<std::string> OneOf(std::vector<std::string> options) {
  return [options](const std::string& v) -> std::optional<std::string> {
    for (const auto& o : options) {
      if (v == o) return std::nullopt;
    }
    return absl::StrCat("must be one of: ", absl::StrJoin(options, ", "));
  };
}

FieldCheck<std::vector<std::string>> EachOneOf(std::vector<std::string> options) {
  return [one_of = OneOf(std::move(options))](
             const std::vector<std::string>& list) -> std::optional<std::string> {
    for (size_t i = 0; i < list.size(); ++i) {
      if (std::optional<std::string> why = one_of(list[i])) {
        return absl::StrCat("has entry ", i, " '", absl::CHexEscape(list[i]), "', which ", *why);
      }
    }
    return std::nullopt;
  };
}

absl::Status FieldError(const std::string& source, const std::string& path,
                        const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field '", path, "' ", why));
}

absl::StatusOr<YAML::Node> LoadYaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid YAML: ", e.what()));
  }
}

absl::StatusOr<std::string> KeyName(const YAML::Node& key, const std::string& source) {
  if (!key.IsScalar()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a key that is not a plain name (line ", key.Mark().line + 1, ")"));
  }
  return key.Scalar();
}

std::string ShownValue(const YAML::Node& node) {
  YAML::Emitter shown;
  shown << YAML::Flow << node;
  return shown.c_str();
}

namespace yaml_fields_internal {

bool DecodeIntList(const YAML::Node& node, std::vector<int>& out) {
  if (node.IsNull()) {
    out.clear();
    return true;
  }
  if (!node.IsSequence()) return false;
  std::vector<int> v;
  for (const YAML::Node& e : node) {
    int x;
    if (!e.IsScalar() || !YAML::convert<int>::decode(e, x)) return false;
    v.push_back(x);
  }
  out = std::move(v);
  return true;
}

bool DecodeStringList(const YAML::Node& node, std::vector<std::string>& out) {
  if (node.IsNull()) {
    out.clear();
    return true;
  }
  if (!node.IsSequence()) return false;
  std::vector<std::string> v;
  for (const YAML::Node& e : node) {
    if (!e.IsScalar()) return false;
    v.push_back(e.Scalar());
  }
  out = std::move(v);
  return true;
}

bool DecodeString(const YAML::Node& node, std::string& out) {
  if (node.IsNull()) {
    out.clear();
    return true;
  }
  if (!node.IsScalar()) return false;
  out = node.Scalar();
  return true;
}

absl::Status CheckOneLine(const std::string& value, const std::string& source,
                          const std::string& path) {
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: field '%s' = \"%s\" has a control character (byte %d is 0x%02x); names, paths and "
          "addresses are one line of printable text",
          source, path, absl::CHexEscape(value), i, c));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckText(const std::string& value, const std::string& source,
                       const std::string& path) {
  if (std::optional<std::string> problem = MultiLineTextProblem(value)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: field '%s' = \"%s\" %s; text may have line breaks and tabs, no other "
                        "control character, and is UTF-8",
                        source, path, absl::CHexEscape(value), *problem));
  }
  return absl::OkStatus();
}

// The shortest precision that reads back exactly: 6e-4, not 0.00059999999999999995.
void EmitDouble(YAML::Emitter& e, double v) {
  for (int precision = 6; precision <= 17; ++precision) {
    YAML::Emitter probe;
    probe << YAML::Precision(precision) << v;
    if (YAML::Load(probe.c_str()).as<double>() == v || precision == 17) {
      e << YAML::Precision(precision) << v;
      return;
    }
  }
}

}  // namespace yaml_fields_internal
}  // namespace flashdraft
