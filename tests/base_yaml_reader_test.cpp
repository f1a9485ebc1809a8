// The one YAML reader (base/yaml_reader.h): typed values, required and optional
// keys, unknown and duplicate keys, and messages of the one shape
// "<file>:<line>: <key.path>: <problem>; <what is valid>".

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "base/yaml_reader.h"
#include "test_util.h"

namespace hdp {
namespace {

// Runs `fn`, which must throw ConfigError; returns the message.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ConfigError";
  return "";
}

const char* kDocument =
    "name: h100\n"             // 1
    "count: 8\n"               // 2
    "seed: 18446744073709551615\n"  // 3
    "rate: 1.5e12\n"           // 4
    "enabled: yes\n"           // 5
    "layer:\n"                 // 6
    "  a1: 2.0e-9\n"           // 7
    "  lengths: [128, 256]\n"  // 8
    "  parts: [a.h5, b.h5]\n"  // 9
    "empty:\n";                // 10

TEST(YamlReader, TypedValuesAndOptionalKeys) {
  const YamlMap root = YamlDocument::parse(kDocument, "doc.yaml").root_map();
  EXPECT_EQ(root.get<std::string>("name"), "h100");
  EXPECT_EQ(root.get<int64_t>("count"), 8);
  EXPECT_EQ(root.get<int>("count"), 8);
  EXPECT_EQ(root.get<uint64_t>("seed"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(root.get<double>("rate"), 1.5e12);
  EXPECT_TRUE(root.get<bool>("enabled"));
  const YamlMap layer = root.map("layer");
  EXPECT_EQ(layer.get<double>("a1"), 2.0e-9);
  EXPECT_EQ(layer.get<std::vector<int64_t>>("lengths"), (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(layer.get<std::vector<double>>("lengths"), (std::vector<double>{128, 256}));
  EXPECT_EQ(layer.get<std::vector<std::string>>("parts"), (std::vector<std::string>{"a.h5", "b.h5"}));
  EXPECT_EQ(root.get<std::string>("empty"), "");  // null is the empty string
  EXPECT_EQ(root.get_or<int64_t>("absent", 42), 42);
  EXPECT_EQ(root.get_or<int64_t>("count", 42), 8);
  EXPECT_FALSE(root.optional_map("absent").has_value());
  EXPECT_TRUE(root.optional_map("empty")->entries().empty());
  EXPECT_EQ(root.where("count"), "doc.yaml:2");
  EXPECT_EQ(layer.where("lengths"), "doc.yaml:8");
  EXPECT_EQ(layer.where("absent"), "doc.yaml:6");  // a missing key: the map's header
  EXPECT_EQ(layer.path("a1"), "layer.a1");
  ASSERT_EQ(root.entries().size(), 7u);
  EXPECT_EQ(root.entries()[6].key, "empty");
}

TEST(YamlReader, MessagesNameFileLineKeyAndWhatWasWrong) {
  const YamlMap root = YamlDocument::parse(kDocument, "doc.yaml").root_map();
  const YamlMap layer = root.map("layer");
  EXPECT_EQ(error_of([&] { layer.get<double>("b1"); }), "doc.yaml:6: layer.b1: required key is missing");
  EXPECT_EQ(error_of([&] { root.get<int64_t>("rate"); }),
            "doc.yaml:4: rate: expected an integer, got '1.5e12'; write a whole number");
  EXPECT_EQ(error_of([&] { root.get_or<int64_t>("name", 7); }),
            "doc.yaml:1: name: expected an integer, got 'h100'; write a whole number such as 7");
  EXPECT_EQ(error_of([&] { root.get<int>("seed"); }),
            "doc.yaml:3: seed: 18446744073709551615 is out of range; the value must fit a 32-bit signed integer");
  EXPECT_EQ(error_of([&] { root.get<bool>("count"); }),
            "doc.yaml:2: count: expected true or false, got '8'; write true or false");
  EXPECT_EQ(error_of([&] { root.get<std::string>("layer"); }),
            "doc.yaml:6: layer: expected a string, got a mapping; write a single value");
  EXPECT_EQ(error_of([&] { layer.get<std::vector<int64_t>>("parts"); }),
            "doc.yaml:9: layer.parts: expected a list of integers, found 'a.h5' in it; write e.g. [3, 5]");
  EXPECT_EQ(error_of([&] { root.map("count"); }), "doc.yaml:2: count: expected a mapping of keys, got '8'");
  EXPECT_EQ(error_of([&] { layer.fail("a1", "is too small", "make it larger"); }),
            "doc.yaml:7: layer.a1: is too small; make it larger");
  // A quoted number is a string.
  const YamlMap quoted = YamlDocument::parse("n: \"128\"\n", "q.yaml").root_map();
  EXPECT_EQ(error_of([&] { quoted.get<int64_t>("n"); }),
            "q.yaml:1: n: expected an integer, got the quoted string \"128\" (remove the quotes); "
            "write a whole number");
}

TEST(YamlReader, UnknownAndDuplicateKeys) {
  const YamlMap root = YamlDocument::parse("count: 1\ncuont: 2\n", "doc.yaml").root_map();
  EXPECT_EQ(error_of([&] { root.allow_only({"count", "name"}); }),
            "doc.yaml:2: cuont: unknown key; did you mean 'count'? valid keys: count, name");
  const YamlMap layer = YamlDocument::parse("layer:\n  zzz: 1\n", "doc.yaml").root_map().map("layer");
  EXPECT_EQ(error_of([&] { layer.allow_only({"a1", "b1"}); }),
            "doc.yaml:2: layer.zzz: unknown key; valid keys in layer: a1, b1");
  EXPECT_EQ(error_of([] { YamlDocument::parse("a: 1\nb: 2\na: 3\n", "dup.yaml").root_map(); }),
            "dup.yaml:3: a: key given twice (first at dup.yaml:1); keep only one");
  EXPECT_EQ(error_of([] { YamlDocument::parse("- a\n- b\n", "list.yaml").root_map(); }),
            "list.yaml:1: (top level): expected a mapping of keys, got a list");
}

// A config is UTF-8 text: a NUL, a byte that is not UTF-8 (here Latin-1 'é') and a
// UTF-16 file are named by line and column before yaml-cpp garbles them; UTF-8
// text (a byte order mark included) reads as it is.
TEST(YamlReader, BytesThatAreNotUtf8TextAreNamed) {
  EXPECT_EQ(error_of([] { YamlDocument::parse(std::string("a: 1\nb: x\0y\n", 12), "nul.yaml"); }),
            "nul.yaml:2: a NUL byte at column 5: this is not a text file; a config is UTF-8 text; check that this is "
            "the file meant");
  EXPECT_NE(error_of([] { YamlDocument::parse("a: 1\n# caf\xe9\nb: 2\n", "latin1.yaml"); })
                .find("latin1.yaml:2: the byte 0xe9 at column 6 is not UTF-8 text; save the file as UTF-8"),
            std::string::npos);
  EXPECT_NE(error_of([] { YamlDocument::parse("name: ok\xc3", "cut.yaml"); })
                .find("cut.yaml:1: the byte 0xc3 at column 9 is not UTF-8 text"),
            std::string::npos);
  EXPECT_NE(error_of([] { YamlDocument::parse(std::string("\xff\xfe" "a\0:\0", 6), "utf16.yaml"); })
                .find("utf16.yaml:1: the file is UTF-16 or UTF-32 (it starts with a byte order mark), not UTF-8"),
            std::string::npos);
  const YamlMap root = YamlDocument::parse("\xef\xbb\xbfname: caf\xc3\xa9 \xf0\x9f\x98\x80\n", "utf8.yaml").root_map();
  EXPECT_EQ(root.get<std::string>("name"), "caf\xc3\xa9 \xf0\x9f\x98\x80");
}

TEST(YamlReader, FilesSyntaxErrorsAndRemedies) {
  const std::string dir = testing::scratch_dir("yaml_reader");
  EXPECT_EQ(error_of([&] { YamlDocument::read_file(dir + "/absent.yaml", "cluster", "pass a cluster file"); }),
            dir + "/absent.yaml: cannot open the cluster file (No such file or directory); pass a cluster file");
  EXPECT_EQ(error_of([&] { YamlDocument::read_file(dir, "cluster", "pass a cluster file"); }),
            dir + ": is a directory, not a cluster file; pass a cluster file");
  std::ofstream(dir + "/broken.yaml") << "a: 1\nb: [unclosed\n";
  const std::string syntax = error_of([&] { YamlDocument::read_file(dir + "/broken.yaml", "cost", ""); });
  EXPECT_EQ(syntax.rfind(dir + "/broken.yaml:3: YAML syntax error: ", 0), 0u) << syntax;
  EXPECT_NE(syntax.find("; fix the YAML at line 3, column 1"), std::string::npos) << syntax;
  // A document's remedy ends every message about it.
  const YamlMap root = YamlDocument::parse("a: x\n", "cost.yaml", "write it with 'trainer profile'").root_map();
  EXPECT_EQ(error_of([&] { root.get<double>("a"); }),
            "cost.yaml:1: a: expected a number, got 'x'; write a finite number; write it with 'trainer profile'");
  EXPECT_EQ(error_of([&] { root.get<double>("b"); }),
            "cost.yaml: b: required key is missing; write it with 'trainer profile'");
}

TEST(YamlReader, Suggestions) {
  EXPECT_EQ(did_you_mean("hiden_size", {"hidden_size", "num_heads"}), "did you mean 'hidden_size'? ");
  EXPECT_EQ(did_you_mean("nmu_heads", {"hidden_size", "num_heads"}), "did you mean 'num_heads'? ");
  EXPECT_EQ(did_you_mean("compression", {"path", "format"}), "");
  EXPECT_EQ(join_names({"a", "b", "c"}), "a, b, c");
  EXPECT_EQ(format_double(3e-4), "0.0003");
  EXPECT_EQ(format_double(-1e-8), "-1e-08");
}

}  // namespace
}  // namespace hdp
