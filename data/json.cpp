#include "data/json.h"

#include <cstdint>
#include <cstdio>
#include <vector>

namespace hdp {

namespace {

constexpr int kMaxDepth = 512;

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  [[noreturn]] void error(const std::string& what) const { throw JsonError(what, pos_ + 1); }
  [[noreturn]] void error_at(const std::string& what, size_t pos) const { throw JsonError(what, pos + 1); }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  std::string found() const {
    if (at_end()) return "end of line";
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x20 && c < 0x7f) return std::string("character '") + static_cast<char>(c) + "'";
    char buf[32];
    std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
  }
  std::string describe_here() const { return "unexpected " + found(); }

  void expect(char c, const char* what) {
    if (peek() != c) error(std::string("expected ") + what + ", found " + found());
    ++pos_;
  }

  // Parses a string literal at pos_ (which is '"'); appends the unescaped value to out if non-null.
  void parse_string(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (at_end()) error("unterminated string");
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return;
      }
      if (c < 0x20) error("control character in string (must be escaped)");
      if (c != '\\') {
        size_t start = pos_;
        while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\\' && static_cast<unsigned char>(s_[pos_]) >= 0x20)
          ++pos_;
        if (out) out->append(s_.substr(start, pos_ - start));
        continue;
      }
      size_t esc = pos_;
      ++pos_;
      if (at_end()) error("unterminated escape");
      char e = s_[pos_++];
      char plain = 0;
      switch (e) {
        case '"': plain = '"'; break;
        case '\\': plain = '\\'; break;
        case '/': plain = '/'; break;
        case 'b': plain = '\b'; break;
        case 'f': plain = '\f'; break;
        case 'n': plain = '\n'; break;
        case 'r': plain = '\r'; break;
        case 't': plain = '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4(esc);
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (pos_ + 1 < s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
              size_t esc2 = pos_;
              pos_ += 2;
              uint32_t lo = parse_hex4(esc2);
              if (lo < 0xDC00 || lo > 0xDFFF) error_at("high surrogate not followed by a low surrogate", esc);
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              error_at("unpaired high surrogate \\u escape", esc);
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            error_at("unpaired low surrogate \\u escape", esc);
          }
          if (out) append_utf8(cp, *out);
          continue;
        }
        default: error_at(std::string("invalid escape '\\") + e + "'", esc);
      }
      if (out) out->push_back(plain);
    }
  }

  uint32_t parse_hex4(size_t esc) {
    if (pos_ + 4 > s_.size()) error_at("truncated \\u escape", esc);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_ + i];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else error_at("invalid hex digit in \\u escape", esc);
    }
    pos_ += 4;
    return v;
  }

  static void append_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  void parse_number() {
    size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      error_at("invalid number", start);
    }
    if (peek() == '.') {
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) error("invalid number: digit expected after '.'");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) error("invalid number: digit expected in exponent");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
  }

  void parse_literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) error(describe_here());
    pos_ += word.size();
  }

  // Parses any value; returns its type name.
  const char* parse_value(int depth) {
    if (depth > kMaxDepth) error("nesting deeper than 512 levels");
    skip_ws();
    char c = peek();
    switch (c) {
      case '{': parse_object(depth + 1, std::string_view(), nullptr); return "object";
      case '[': {
        ++pos_;
        skip_ws();
        if (peek() == ']') {
          ++pos_;
          return "array";
        }
        while (true) {
          parse_value(depth + 1);
          skip_ws();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          expect(']', "',' or ']'");
          return "array";
        }
      }
      case '"': parse_string(nullptr); return "string";
      case 't': parse_literal("true"); return "boolean";
      case 'f': parse_literal("false"); return "boolean";
      case 'n': parse_literal("null"); return "null";
      default:
        if (c == '-' || (c >= '0' && c <= '9')) {
          parse_number();
          return "number";
        }
        error(at_end() ? "unexpected end of line, expected a value" : describe_here() + ", expected a value");
    }
  }

  // Parses an object at pos_ ('{'). If field != nullptr, records member `key`.
  void parse_object(int depth, std::string_view key, JsonStringField* field) {
    ++pos_;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_ws();
      if (peek() != '"') error(describe_here() + ", expected a member name in double quotes");
      std::string name;
      parse_string(&name);
      skip_ws();
      expect(':', "':'");
      skip_ws();
      if (field && name == key) {
        if (peek() == '"') {
          field->status = JsonStringField::Status::kString;
          field->value.clear();
          field->actual_type.clear();
          parse_string(&field->value);
        } else {
          field->value.clear();
          field->actual_type = parse_value(depth);
          field->status = JsonStringField::Status::kNotString;
        }
      } else {
        parse_value(depth);
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}', "',' or '}'");
      return;
    }
  }

  size_t pos() const { return pos_; }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

JsonStringField json_object_string_field(std::string_view text, std::string_view key) {
  Parser p(text);
  JsonStringField field;
  p.skip_ws();
  if (p.peek() != '{') {
    if (p.at_end()) p.error("empty input, expected a JSON object");
    size_t start = p.pos();
    const char* type = p.parse_value(0);
    p.error_at(std::string("expected a JSON object, found ") + (std::string_view(type) == "array" ? "an " : "a ") +
                   type,
               start);
  }
  p.parse_object(1, key, &field);
  p.skip_ws();
  if (!p.at_end()) p.error(p.describe_here() + " after the JSON object");
  return field;
}

std::string json_unescape(std::string_view body) {
  std::string quoted;
  quoted.reserve(body.size() + 2);
  quoted.push_back('"');
  quoted.append(body);
  quoted.push_back('"');
  std::string out;
  Parser p(quoted);
  try {
    p.parse_string(&out);
  } catch (const JsonError& e) {
    throw JsonError(std::string(e.what()).substr(0, std::string(e.what()).rfind(" at column")),
                    e.column() > 1 ? e.column() - 1 : 1);
  }
  if (!p.at_end()) throw JsonError("unescaped '\"' inside string body", p.pos());
  return out;
}

}  // namespace hdp
