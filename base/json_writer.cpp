#include "base/json_writer.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <stdexcept>
#include <string>

#include "base/utf8.h"

namespace hdp {

JsonWriter::JsonWriter(std::ostream& out, Spacing spacing) : out_(out), spacing_(spacing) {}

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (levels_.empty()) return;
  Level& level = levels_.back();
  if (level.object) throw std::logic_error("JsonWriter: a member's value without its key");
  if (!level.empty) out_ << (level.one_per_line ? ",\n" : spacing_ == Spacing::Spaced ? ", " : ",");
  level.empty = false;
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ << '{';
  levels_.push_back({true, false});
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  if (levels_.empty() || !levels_.back().object || after_key_)
    throw std::logic_error("JsonWriter: end_object outside an object or after a key");
  levels_.pop_back();
  out_ << '}';
  return *this;
}

JsonWriter& JsonWriter::begin_array(Lines lines) {
  before_value();
  const bool one_per_line = lines == Lines::OnePerLine;
  out_ << (one_per_line ? "[\n" : "[");
  levels_.push_back({false, one_per_line});
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  if (levels_.empty() || levels_.back().object) throw std::logic_error("JsonWriter: end_array outside an array");
  out_ << (levels_.back().one_per_line ? "\n]" : "]");
  levels_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  if (levels_.empty() || !levels_.back().object || after_key_)
    throw std::logic_error("JsonWriter: a key outside an object or after a key");
  Level& level = levels_.back();
  if (!level.empty) out_ << (spacing_ == Spacing::Spaced ? ", " : ",");
  level.empty = false;
  escaped(name);
  out_ << (spacing_ == Spacing::Spaced ? ": " : ":");
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::string(std::string_view text) {
  before_value();
  escaped(text);
  return *this;
}

JsonWriter& JsonWriter::integer(int64_t value) {
  before_value();
  char buf[24];
  const auto end = std::to_chars(buf, buf + sizeof buf, value).ptr;
  out_.write(buf, end - buf);
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  out_ << "null";
  return *this;
}

JsonWriter& JsonWriter::number(double value, int significant_digits) {
  return printed(value, "%.*g", significant_digits);
}

JsonWriter& JsonWriter::fixed(double value, int decimals) { return printed(value, "%.*f", decimals); }

JsonWriter& JsonWriter::printed(double value, const char* format, int precision) {
  if (!std::isfinite(value)) return null();
  before_value();
  // A double's %f can reach 309 digits before the point.
  char buf[400];
  const int n = std::snprintf(buf, sizeof buf, format, precision, value);
  if (n < 0 || n >= static_cast<int>(sizeof buf)) throw std::invalid_argument("JsonWriter: too many digits");
  out_.write(buf, n);
  return *this;
}

void JsonWriter::escaped(std::string_view text) {
  Utf8Checker utf8;
  for (size_t i = 0; i < text.size(); ++i) utf8.next(static_cast<unsigned char>(text[i]), static_cast<int64_t>(i));
  utf8.finish();
  if (utf8.first_invalid() >= 0) {
    throw std::invalid_argument("JsonWriter: the string \"" + std::string(text.substr(0, 64)) +
                                "\" is not UTF-8 (byte " + std::to_string(utf8.first_invalid()) + ")");
  }
  out_ << '"';
  size_t plain = 0;  // start of the characters not yet written
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c != '"' && c != '\\' && c >= 0x20) continue;
    out_.write(text.data() + plain, static_cast<std::streamsize>(i - plain));
    plain = i + 1;
    switch (c) {
      case '"': out_ << "\\\""; break;
      case '\\': out_ << "\\\\"; break;
      case '\b': out_ << "\\b"; break;
      case '\f': out_ << "\\f"; break;
      case '\n': out_ << "\\n"; break;
      case '\r': out_ << "\\r"; break;
      case '\t': out_ << "\\t"; break;
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out_ << buf;
      }
    }
  }
  out_.write(text.data() + plain, static_cast<std::streamsize>(text.size() - plain));
  out_ << '"';
}

}  // namespace hdp
