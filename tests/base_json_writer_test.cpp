// The one JSON writer (base/json_writer.h): both spacings, arrays one element per
// line, RFC 8259 escaping, numbers in the formats the records fix, null for what
// JSON cannot hold, and refusals of misuse and of text that is not UTF-8.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "base/json_writer.h"

namespace hdp {
namespace {

TEST(JsonWriter, CompactObjectWithNestedValues) {
  std::ostringstream out;
  JsonWriter json(out);
  json.begin_object();
  json.key("step").integer(3).key("op").string("forward-send").key("group").null();
  json.key("sizes").begin_array().integer(1).integer(-2).end_array();
  json.key("args").begin_object().end_object();
  json.key("empty").begin_array().end_array();
  json.end_object();
  EXPECT_EQ(out.str(), R"({"step":3,"op":"forward-send","group":null,"sizes":[1,-2],"args":{},"empty":[]})");
}

TEST(JsonWriter, SpacedSeparatesMembersAndElements) {
  std::ostringstream out;
  JsonWriter json(out, JsonWriter::Spacing::Spaced);
  json.begin_object().key("a").integer(1).key("b").begin_array().integer(2).integer(3).end_array().end_object();
  EXPECT_EQ(out.str(), R"({"a": 1, "b": [2, 3]})");
}

TEST(JsonWriter, OnePerLineArraysPutEachElementOnItsOwnLine) {
  std::ostringstream out;
  JsonWriter json(out);
  json.begin_object().key("events").begin_array(JsonWriter::Lines::OnePerLine);
  json.begin_object().key("ts").fixed(1.5, 3).end_object();
  json.begin_object().key("ts").fixed(2, 3).end_object();
  json.end_array().end_object();
  EXPECT_EQ(out.str(), "{\"events\":[\n{\"ts\":1.500},\n{\"ts\":2.000}\n]}");

  std::ostringstream empty;
  JsonWriter(empty).begin_array(JsonWriter::Lines::OnePerLine).end_array();
  EXPECT_EQ(empty.str(), "[\n\n]");
}

TEST(JsonWriter, EscapesQuotesBackslashesAndControlCharacters) {
  std::ostringstream out;
  JsonWriter json(out);
  json.string(std::string("a\"b\\c/\b\f\n\r\t") + '\0' + "\x01\x1f\x7f");
  EXPECT_EQ(out.str(), R"("a\"b\\c/\b\f\n\r\t\u0000\u0001\u001f)" "\x7f\"");

  std::ostringstream key;
  JsonWriter(key).begin_object().key("na\"me").integer(0).end_object();
  EXPECT_EQ(key.str(), R"({"na\"me":0})");
}

TEST(JsonWriter, PassesUtf8ThroughAndRefusesOtherBytes) {
  std::ostringstream out;
  JsonWriter(out).string("\xc3\xa9t\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80");  // "été → 😀"
  EXPECT_EQ(out.str(), "\"\xc3\xa9t\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80\"");

  for (const std::string bad : {"\xff", "ab\xc3", "\xc0\xaf", "\xed\xa0\x80"}) {
    std::ostringstream refused;
    try {
      JsonWriter(refused).string(bad);
      ADD_FAILURE() << "accepted bytes that are not UTF-8";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("is not UTF-8"), std::string::npos) << e.what();
    }
  }
}

TEST(JsonWriter, NumbersInTheirFixedFormats) {
  std::ostringstream out;
  JsonWriter json(out);
  json.begin_array();
  json.number(1.0 / 3, 9).number(2.5, 9).number(1e-12, 9).number(123456789012.0, 9);
  json.fixed(1764000000.1234567, 3).fixed(-0.0005, 3).fixed(7, 0);
  json.integer(std::numeric_limits<int64_t>::min()).integer(std::numeric_limits<int64_t>::max());
  json.end_array();
  EXPECT_EQ(out.str(), "[0.333333333,2.5,1e-12,1.23456789e+11,1764000000.123,-0.001,7,"
                       "-9223372036854775808,9223372036854775807]");
}

TEST(JsonWriter, NonFiniteNumbersAreNull) {
  std::ostringstream out;
  JsonWriter json(out);
  const double inf = std::numeric_limits<double>::infinity();
  json.begin_array().number(std::nan(""), 9).number(-inf, 9).fixed(inf, 3).fixed(std::nan(""), 3).end_array();
  EXPECT_EQ(out.str(), "[null,null,null,null]");
}

TEST(JsonWriter, RefusesMisuse) {
  std::ostringstream out;
  EXPECT_THROW(JsonWriter(out).begin_object().integer(1), std::logic_error);       // a member without its key
  EXPECT_THROW(JsonWriter(out).begin_array().key("a"), std::logic_error);          // a key in an array
  EXPECT_THROW(JsonWriter(out).begin_object().key("a").key("b"), std::logic_error);  // two keys
  EXPECT_THROW(JsonWriter(out).begin_object().key("a").end_object(), std::logic_error);  // a key without a value
  EXPECT_THROW(JsonWriter(out).begin_array().end_object(), std::logic_error);
  EXPECT_THROW(JsonWriter(out).begin_object().end_array(), std::logic_error);
}

}  // namespace
}  // namespace hdp
