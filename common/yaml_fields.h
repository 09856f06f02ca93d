// The field machinery of the project's YAML files: the job file (common/job_config.cc) and the
// Proxmox cluster file (deploy/proxmox/pve_cluster.cc). A file's format is a table of fields; each
// reads one key into a struct member with a type and a check, and every error names the file, the
// field's path in it and the value as written.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/multi_line_text.h"

namespace flashdraft {

// A rule on a field's value; returns an explanation ("must be >= 1") when the value breaks it.
template <typename T>
using FieldCheck = std::function<std::optional<std::string>(const T&)>;

template <typename T>
FieldCheck<T> AtLeast(T lo) {
  return [lo](const T& v) -> std::optional<std::string> {
    if (v < lo) return absl::StrCat("must be >= ", lo);
    return std::nullopt;
  };
}

template <typename T>
FieldCheck<T> Between(T lo, T hi) {
  return [lo, hi](const T& v) -> std::optional<std::string> {
    if (v < lo || v > hi) return absl::StrCat("must be in [", lo, ", ", hi, "]");
    return std::nullopt;
  };
}

FieldCheck<double> Positive();
FieldCheck<std::string> OneOf(std::vector<std::string> options);
// Every entry of a list is one of `options`.
FieldCheck<std::vector<std::string>> EachOneOf(std::vector<std::string> options);

// "<source>: field '<path>' <why>".
absl::Status FieldError(const std::string& source, const std::string& path, const std::string& why);

// The text as YAML, or "<source>: not valid YAML: ...".
absl::StatusOr<YAML::Node> LoadYaml(const std::string& text, const std::string& source);

// A mapping's key as a plain name; YAML also allows sequences and mappings as keys ("? [a]: 1").
absl::StatusOr<std::string> KeyName(const YAML::Node& key, const std::string& source);

// The node as the user wrote it (flow style), for errors.
std::string ShownValue(const YAML::Node& node);

namespace yaml_fields_internal {

inline std::string TypeName(const int*) { return "an integer"; }
inline std::string TypeName(const int64_t*) { return "an integer"; }
inline std::string TypeName(const uint64_t*) { return "a non-negative integer"; }
inline std::string TypeName(const double*) { return "a number"; }
inline std::string TypeName(const bool*) { return "true or false"; }
inline std::string TypeName(const std::string*) { return "a string"; }
inline std::string TypeName(const MultiLineText*) { return "a string"; }
inline std::string TypeName(const std::vector<int>*) { return "a list of integers"; }
inline std::string TypeName(const std::vector<std::string>*) { return "a list of strings"; }

bool DecodeIntList(const YAML::Node& node, std::vector<int>& out);
bool DecodeStringList(const YAML::Node& node, std::vector<std::string>& out);
bool DecodeString(const YAML::Node& node, std::string& out);

template <typename T>
bool Decode(const YAML::Node& node, T& out) {
  if constexpr (std::is_same_v<T, std::vector<int>>) {
    return DecodeIntList(node, out);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return DecodeStringList(node, out);
  } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, MultiLineText>) {
    return DecodeString(node, out);
  } else {
    if (!node.IsScalar()) return false;
    if constexpr (std::is_same_v<T, uint64_t>) {
      // yaml-cpp happily wraps "-1" into a huge unsigned; refuse signs explicitly.
      if (!node.Scalar().empty() && node.Scalar()[0] == '-') return false;
    }
    return YAML::convert<T>::decode(node, out);
  }
}

// Every string field is a name, a path or an address: one line of printable text. (A carriage
// return in one also printed back as YAML that read as another value.)
absl::Status CheckOneLine(const std::string& value, const std::string& source,
                          const std::string& path);
// A MultiLineText: printable text, newlines and tabs.
absl::Status CheckText(const std::string& value, const std::string& source,
                       const std::string& path);

void EmitDouble(YAML::Emitter& e, double v);

template <typename T>
void Emit(YAML::Emitter& e, const T& v) {
  if constexpr (std::is_same_v<T, std::vector<int>> ||
                std::is_same_v<T, std::vector<std::string>>) {
    e << YAML::Flow << YAML::BeginSeq;
    for (const auto& x : v) e << x;
    e << YAML::EndSeq;
  } else if constexpr (std::is_same_v<T, double>) {
    EmitDouble(e, v);
  } else if constexpr (std::is_same_v<T, MultiLineText>) {
    e << static_cast<const std::string&>(v);  // yaml-cpp quotes and escapes a line break
  } else {
    e << v;
  }
}

template <typename T>
struct NonDeduced {
  using type = T;
};

}  // namespace yaml_fields_internal

// Reads `node` as a T into `out` when it is one and passes `check` (which may be null).
template <typename T>
absl::Status ReadValue(const YAML::Node& node, const std::string& source, const std::string& path,
                       const FieldCheck<T>& check, T& out) {
  T value{};
  if (!yaml_fields_internal::Decode(node, value)) {
    return FieldError(source, path,
                      absl::StrCat("must be ", yaml_fields_internal::TypeName(&value), ", got '",
                                   ShownValue(node), "'"));
  }
  if constexpr (std::is_same_v<T, std::string>) {
    if (absl::Status s = yaml_fields_internal::CheckOneLine(value, source, path); !s.ok()) return s;
  } else if constexpr (std::is_same_v<T, MultiLineText>) {
    if (absl::Status s = yaml_fields_internal::CheckText(value, source, path); !s.ok()) return s;
  }
  if (check) {
    if (std::optional<std::string> why = check(value)) {
      return FieldError(source, path, absl::StrCat("= ", ShownValue(node), " ", *why));
    }
  }
  out = std::move(value);
  return absl::OkStatus();
}

// One key of a mapping, read into a `Config`.
template <typename Config>
struct Field {
  std::string section;  // "" at the top of its table
  std::string key;
  // Reads the value; `path` is where it is in the file ("train.seed", "containers[2].ip").
  std::function<absl::Status(Config&, const YAML::Node&, const std::string& source,
                             const std::string& path)>
      set;
  // Writes the value as YAML; null for a field that is never written back.
  std::function<void(const Config&, YAML::Emitter&)> emit;

  std::string path() const { return section.empty() ? key : absl::StrCat(section, ".", key); }
};

// A field of type T that `ref` finds in the Config (e.g. `c.train.seed`).
template <typename T, typename Config>
Field<Config> MakeField(std::string section, std::string key, std::function<T&(Config&)> ref,
                        FieldCheck<T> check = nullptr) {
  Field<Config> f;
  f.section = std::move(section);
  f.key = std::move(key);
  f.set = [ref, check](Config& c, const YAML::Node& node, const std::string& source,
                       const std::string& path) {
    return ReadValue<T>(node, source, path, check, ref(c));
  };
  f.emit = [ref](const Config& c, YAML::Emitter& e) {
    yaml_fields_internal::Emit(e, ref(const_cast<Config&>(c)));
  };
  return f;
}

// A top-level field that is a member of the Config (`&PveCluster::port`).
template <typename Config, typename T>
Field<Config> MemberField(
    std::string key, T Config::*member,
    typename yaml_fields_internal::NonDeduced<FieldCheck<T>>::type check = nullptr) {
  return MakeField<T, Config>(
      "", std::move(key), [member](Config& c) -> T& { return c.*member; }, std::move(check));
}

template <typename Config>
const Field<Config>* FindField(const std::vector<Field<Config>>& fields, const std::string& section,
                               const std::string& key) {
  for (const Field<Config>& f : fields) {
    if (f.section == section && f.key == key) return &f;
  }
  return nullptr;
}

// The keys of `section`, comma-separated.
template <typename Config>
std::string KeysOf(const std::vector<Field<Config>>& fields, const std::string& section) {
  std::string keys;
  for (const Field<Config>& f : fields) {
    if (f.section == section) absl::StrAppend(&keys, keys.empty() ? "" : ", ", f.key);
  }
  return keys;
}

// Reads every key of mapping `map` with the field of that name in `section` of `fields`. `where` is
// the mapping's path in the file ("" for the file itself). A key no field has is an error that
// lists the known ones: a typo must not silently fall back to a default.
template <typename Config>
absl::Status ReadMapping(const YAML::Node& map, const std::vector<Field<Config>>& fields,
                         const std::string& section, const std::string& source,
                         const std::string& where, Config& out) {
  if (!map.IsMap()) {
    return where.empty() ? absl::InvalidArgumentError(source + ": the file must be a mapping")
                         : FieldError(source, where, "must be a mapping");
  }
  for (const auto& entry : map) {
    absl::StatusOr<std::string> key = KeyName(entry.first, source);
    if (!key.ok()) return key.status();
    const std::string path = where.empty() ? *key : absl::StrCat(where, ".", *key);
    const Field<Config>* f = FindField(fields, section, *key);
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unknown field '", path,
                                                     "' (known: ", KeysOf(fields, section), ")"));
    }
    if (absl::Status s = f->set(out, entry.second, source, path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

template <typename Item>
using ItemFinish =
    std::function<absl::Status(Item&, const std::string& source, const std::string& path)>;

// A field holding a list of mappings, each read with `item_fields()` and then `finish` (defaults
// and checks across its fields; may be null), and written back as a list of flow mappings.
template <typename Item, typename Config>
Field<Config> ListField(std::string section, std::string key,
                        std::function<std::vector<Item>&(Config&)> ref,
                        const std::vector<Field<Item>>& (*item_fields)(),
                        ItemFinish<Item> finish = nullptr) {
  Field<Config> f;
  f.section = std::move(section);
  f.key = std::move(key);
  f.set = [ref, item_fields, finish](Config& c, const YAML::Node& node, const std::string& source,
                                     const std::string& path) -> absl::Status {
    if (!node.IsSequence()) return FieldError(source, path, "must be a list");
    std::vector<Item> items;
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string where = absl::StrCat(path, "[", i, "]");
      Item item;
      if (absl::Status s = ReadMapping(node[i], item_fields(), "", source, where, item); !s.ok()) {
        return s;
      }
      if (finish) {
        if (absl::Status s = finish(item, source, where); !s.ok()) return s;
      }
      items.push_back(std::move(item));
    }
    ref(c) = std::move(items);
    return absl::OkStatus();
  };
  f.emit = [ref, item_fields](const Config& c, YAML::Emitter& e) {
    e << YAML::BeginSeq;
    for (const Item& item : ref(const_cast<Config&>(c))) {
      e << YAML::Flow << YAML::BeginMap;
      for (const Field<Item>& field : item_fields()) {
        e << YAML::Key << field.key << YAML::Value;
        field.emit(item, e);
      }
      e << YAML::EndMap;
    }
    e << YAML::EndSeq;
  };
  return f;
}

// A top-level ListField that is a member of the Config (`&PveCluster::containers`).
template <typename Item, typename Config>
Field<Config> MemberListField(std::string key, std::vector<Item> Config::*member,
                              const std::vector<Field<Item>>& (*item_fields)(),
                              ItemFinish<Item> finish = nullptr) {
  return ListField<Item, Config>(
      "", std::move(key), [member](Config& c) -> std::vector<Item>& { return c.*member; },
      item_fields, std::move(finish));
}

}  // namespace flashdraft
