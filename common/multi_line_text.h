// A string field of a YAML file (common/yaml_fields.h) that may span lines, kept out of that header
// so that the configs holding one need not include yaml-cpp.
#pragma once

#include <string>
#include <utility>

namespace flashdraft {

// Text such as a prompt: newlines and tabs are allowed in it, other control characters are refused
// when it is read. Everywhere else it is the std::string it derives from.
struct MultiLineText : std::string {
  MultiLineText() = default;
  MultiLineText(std::string text) : std::string(std::move(text)) {}  // NOLINT: implicit on purpose
  MultiLineText(const char* text) : std::string(text) {}             // NOLINT: implicit on purpose
};

}  // namespace flashdraft
