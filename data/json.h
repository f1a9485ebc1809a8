#pragma once
// A small strict JSON (RFC 8259) parser, just enough for JSON Lines inputs:
// validates one JSON text and extracts a top-level string member, with full
// string unescaping (\n, \", \uXXXX, surrogate pairs -> UTF-8). It builds no
// tree, which makes it several times faster per corpus line than nlohmann-json
// (the product's reader for whole JSON documents; docs/internals.md, data/).

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include "base/errors.h"

namespace hdp {

// Invalid JSON; column() is the 1-based byte position of the problem.
class JsonError : public InputError {
 public:
  JsonError(const std::string& what, size_t column)
      : InputError(what + " at column " + std::to_string(column)), column_(column) {}
  size_t column() const { return column_; }

 private:
  size_t column_;
};

struct JsonStringField {
  enum class Status { kString, kMissing, kNotString };
  Status status = Status::kMissing;
  std::string value;        // the unescaped UTF-8 string when status == kString
  std::string actual_type;  // "number", "object", ... when status == kNotString
};

// Parses `text` as exactly one JSON value (surrounding whitespace allowed),
// which must be an object, and returns its member `key` (the last one if the
// key repeats). Throws JsonError on any syntax error or a non-object value.
JsonStringField json_object_string_field(std::string_view text, std::string_view key);

// Unescapes the body of a JSON string literal (without the quotes).
// Throws JsonError (column relative to the body) on a bad escape.
std::string json_unescape(std::string_view body);

}  // namespace hdp
