#pragma once
// The one writer of the project's own JSON records: metrics.jsonl (run/metrics.h),
// op traces (whatif/trace.h) and Chrome traces (whatif/simulator.h). It puts each
// token on the stream as it comes and keeps only the nesting, so a trace of 10,000
// workers goes out a line, or an event, at a time.
//
// Why not nlohmann-json, which reads these files: its dump() writes a double as
// the shortest text that reads back exactly, where these formats fix the digits
// (metrics to 9 significant digits, a float's precision; times to 3 decimals of
// their unit), and it builds a whole value in memory before writing any of it.
//
// Strings are escaped as RFC 8259 (section 7) requires: '"', '\\' and the control
// characters U+0000..U+001F, the latter as \b \f \n \r \t or \u00xx; they must be
// UTF-8 (RFC 8259, section 8.1): other bytes are refused (std::invalid_argument,
// misuse such as a member without its key is a std::logic_error). JSON has no NaN or
// infinity: a non-finite number is written as null.

#include <cstdint>
#include <iosfwd>
#include <string_view>
#include <vector>

namespace hdp {

class JsonWriter {
 public:
  // Between members and elements: {"a":1,"b":[1,2]} or {"a": 1, "b": [1, 2]}.
  enum class Spacing { Compact, Spaced };
  // How an array lays out its elements: on the line, or one per line
  // ("[\n" e1 ",\n" e2 "\n]", as Chrome traces list their events).
  enum class Lines { Inline, OnePerLine };

  explicit JsonWriter(std::ostream& out, Spacing spacing = Spacing::Compact);

  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array(Lines lines = Lines::Inline);
  JsonWriter& end_array();
  // The name of the next member of the object being written.
  JsonWriter& key(std::string_view name);

  JsonWriter& string(std::string_view text);
  JsonWriter& integer(int64_t value);
  JsonWriter& null();
  // printf's %.<digits>g.
  JsonWriter& number(double value, int significant_digits);
  // printf's %.<decimals>f.
  JsonWriter& fixed(double value, int decimals);

 private:
  struct Level {
    bool object;
    bool one_per_line;
    bool empty = true;
  };
  void before_value();
  // The value through snprintf's `format` ("%.*g" or "%.*f"); null when not finite.
  JsonWriter& printed(double value, const char* format, int precision);
  void escaped(std::string_view text);

  std::ostream& out_;
  Spacing spacing_;
  std::vector<Level> levels_;
  bool after_key_ = false;
};

}  // namespace hdp
