// A string field of a YAML file (common/yaml_fields.h) that may span lines, kept out of that header
// so that the configs holding one need not include yaml-cpp.
#pragma once

#include <optional>
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

// What makes `text` unfit for a MultiLineText, e.g. "has a control character (byte 3 is 0x0d)" or
// "is not UTF-8 (byte 5 is 0xff)"; nullopt when it is fit.
std::optional<std::string> MultiLineTextProblem(const std::string& text);

}  // namespace flashdraft
