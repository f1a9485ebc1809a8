// Byte tokenizer, the JSON string-field parser and prepare_dataset.
#include <gtest/gtest.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/json.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace hdp {
namespace {

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

std::string doc_text(const TokenDataset& ds, int64_t d) {
  std::vector<int32_t> ids = ds.read_document(d);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), static_cast<int32_t>(kByteEos)) << "document " << d << " must end with EOS";
  return decode_bytes(std::span<const int32_t>(ids.data(), ids.size() - 1));
}

TEST(DataTokenizer, ByteRoundTripWithUtf8) {
  std::string text = "héllo, wörld — 日本語 🎉\n\t\x01\xff";
  std::vector<uint32_t> ids = encode_bytes(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'h');
  EXPECT_EQ(ids[1], 0xC3u);  // é = C3 A9
  EXPECT_EQ(ids[2], 0xA9u);
  EXPECT_EQ(ids.back(), 255u);
  EXPECT_EQ(decode_bytes(ids), text);
  std::vector<uint32_t> with_special = {kByteBos, 'a', kByteEos};
  EXPECT_EQ(decode_bytes(with_special), "a");
  EXPECT_EQ(decode_bytes(with_special, true), "<bos>a<eos>");
  std::vector<int32_t> bad = {'a', 258};
  EXPECT_THROW(decode_bytes(bad), std::invalid_argument);
  std::vector<int32_t> negative = {-1};
  EXPECT_THROW(decode_bytes(negative), std::invalid_argument);
  EXPECT_EQ(kByteVocabSize, 258u);
}

TEST(DataJson, StringFieldUnescaping) {
  auto f = json_object_string_field(R"({"id": 3, "text": "a\"b\\c\/d\n\t\u00e9\u65e5\ud83c\udf89", "x": [1, {"y": null}]})",
                                    "text");
  ASSERT_EQ(f.status, JsonStringField::Status::kString);
  EXPECT_EQ(f.value, "a\"b\\c/d\n\t\xC3\xA9\xE6\x97\xA5\xF0\x9F\x8E\x89");
  // Raw UTF-8 passes through; whitespace around is fine; the last duplicate wins.
  f = json_object_string_field("  {\"text\":\"first\", \"text\" : \"日本\"}\r", "text");
  EXPECT_EQ(f.value, "日本");
  EXPECT_EQ(json_object_string_field(R"({"other": "x"})", "text").status, JsonStringField::Status::kMissing);
  f = json_object_string_field(R"({"text": 12.5e3})", "text");
  EXPECT_EQ(f.status, JsonStringField::Status::kNotString);
  EXPECT_EQ(f.actual_type, "number");
  // Nested "text" members do not count.
  EXPECT_EQ(json_object_string_field(R"({"meta": {"text": "no"}})", "text").status,
            JsonStringField::Status::kMissing);
  EXPECT_EQ(json_unescape(R"(x\u0041\n)"), "xA\n");
}

TEST(DataJson, SyntaxErrorsHaveColumns) {
  auto column_of = [](const std::string& s) -> size_t {
    try {
      json_object_string_field(s, "text");
    } catch (const JsonError& e) {
      return e.column();
    }
    return 0;
  };
  EXPECT_EQ(column_of(R"({"text": "abc")"), 15u);          // missing '}' (end of line)
  EXPECT_EQ(column_of(R"({"text" "abc"})"), 9u);           // missing ':'
  EXPECT_EQ(column_of(R"({"text": "a\qb"})"), 12u);        // bad escape
  EXPECT_EQ(column_of(R"({"text": "\ud83c"})"), 11u);      // unpaired surrogate
  EXPECT_EQ(column_of(R"({"text": "x"} extra)"), 15u);     // trailing garbage
  EXPECT_EQ(column_of(R"(["text"])"), 1u);                 // not an object
  EXPECT_EQ(column_of(R"({"a": 01})"), 8u);                // leading zero
  EXPECT_EQ(column_of(R"({"a": tru})"), 7u);
  EXPECT_EQ(column_of("{\"text\": \"tab\there\"}"), 14u);  // raw control character
  EXPECT_EQ(column_of(R"({"a": [1, 2,]})"), 13u);
  EXPECT_EQ(column_of(""), 1u);
}

TEST(DataPrepare, TextAndJsonlInputs) {
  std::string dir = testing::scratch_dir("data_prepare_ok");
  write_file(dir + "/a.txt", "plain file\nwith two lines, ünïcode\n");
  write_file(dir + "/b.jsonl",
             "{\"text\": \"first \\\"doc\\\"\\nline2\"}\n"
             "\n"
             "   \n"
             "{\"meta\": 1, \"text\": \"caf\\u00e9 \\ud83d\\ude00 日本\"}\r\n"
             "{\"text\": \"\"}\n"
             "{\"text\": \"last\"}");  // no final newline
  write_file(dir + "/empty.txt", "");
  std::string out = dir + "/out.h5";
  DatasetBuildStats stats = prepare_dataset({dir + "/a.txt", dir + "/b.jsonl", dir + "/empty.txt"}, out);
  EXPECT_EQ(stats.documents, 4);
  EXPECT_EQ(stats.skipped, 2);  // the empty "text" and the empty file
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));

  TokenDataset ds(out);
  ASSERT_EQ(ds.num_documents(), 4);
  EXPECT_EQ(ds.vocab_size(), 258u);
  EXPECT_EQ(ds.tokenizer(), "byte-level");
  EXPECT_EQ(ds.bos_id(), 256u);
  EXPECT_EQ(ds.eos_id(), 257u);
  EXPECT_EQ(ds.max_token_id(), 257u);
  EXPECT_EQ(doc_text(ds, 0), "plain file\nwith two lines, ünïcode\n");
  EXPECT_EQ(doc_text(ds, 1), "first \"doc\"\nline2");
  EXPECT_EQ(doc_text(ds, 2), "café \xF0\x9F\x98\x80 日本");
  EXPECT_EQ(doc_text(ds, 3), "last");
  EXPECT_EQ(stats.tokens, ds.num_tokens());
}

TEST(DataPrepare, LargePlainFileIsOneDocument) {
  std::string dir = testing::scratch_dir("data_prepare_large");
  std::string text;
  for (int i = 0; text.size() < (3u << 20); ++i) text += "line " + std::to_string(i) + "\n";
  write_file(dir + "/big.txt", text);
  DatasetBuildStats stats = prepare_dataset({dir + "/big.txt"}, dir + "/big.h5", PrepareOptions{1 << 20});
  EXPECT_EQ(stats.documents, 1);
  TokenDataset ds(dir + "/big.h5");
  EXPECT_EQ(ds.document_length(0), static_cast<int64_t>(text.size()) + 1);
  EXPECT_EQ(doc_text(ds, 0), text);
}

void expect_input_error(const std::vector<std::string>& inputs, const std::string& out, const std::string& needle) {
  try {
    prepare_dataset(inputs, out);
    FAIL() << "expected DataInputError containing " << needle;
  } catch (const DataInputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out)) << "no output on error";
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp")) << "temporary output removed on error";
}

TEST(DataPrepare, ErrorsNameFileAndLine) {
  std::string dir = testing::scratch_dir("data_prepare_errors");
  std::string out = dir + "/out.h5";
  expect_input_error({dir + "/missing.txt"}, out, dir + "/missing.txt: no such file");

  write_file(dir + "/bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  expect_input_error({dir + "/bad.jsonl"}, out, dir + "/bad.jsonl:2: invalid JSON: unterminated string");

  write_file(dir + "/nottext.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": 5}\n");
  expect_input_error({dir + "/nottext.jsonl"}, out, dir + "/nottext.jsonl:3: \"text\" is a number, expected a string");

  write_file(dir + "/notext.jsonl", "{\"body\": \"x\"}\n");
  expect_input_error({dir + "/notext.jsonl"}, out, dir + "/notext.jsonl:1: the JSON object has no \"text\" member");

  write_file(dir + "/array.jsonl", "[1, 2]\n");
  expect_input_error({dir + "/array.jsonl"}, out, dir + "/array.jsonl:1: invalid JSON: expected a JSON object");

  write_file(dir + "/empty.jsonl", "\n\n");
  expect_input_error({dir + "/empty.jsonl"}, out, "no non-empty documents");
}

// Inputs that are not text: compressed files and NUL bytes are refused naming
// the file (and the line and byte offset of the NUL), before any output exists;
// bytes that are not UTF-8 are kept (the tokenizer sees them unchanged) with one
// warning per file counting them and naming the first's line and offset.
// Every file the writer creates is compared with every input: the Megatron writer
// makes OUTPUT.bin and OUTPUT.idx, so `--input in.bin --output in` is refused and
// in.bin stays as it was (it was once overwritten, exit 0). A dataset already at
// the output is replaced only with options.overwrite (--overwrite).
TEST(DataPrepare, NeverWritesOverAnInputAndOverADatasetOnlyWhenAsked) {
  const std::string dir = testing::scratch_dir("data_prepare_outputs");
  const std::string text = "a document named like a Megatron dataset\n";
  write_file(dir + "/in.bin", text);
  PrepareOptions megatron;
  megatron.format = DatasetFormat::Megatron;
  try {
    prepare_dataset({dir + "/in.bin"}, dir + "/in", megatron);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--output '" + dir + "/in' writes '" + dir + "/in.bin', which is the input '" +
                                         dir + "/in.bin'; writing the dataset would replace it, so choose another "
                                         "output path");
  }
  std::ifstream in(dir + "/in.bin");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), text);
  EXPECT_FALSE(std::filesystem::exists(dir + "/in.idx"));

  prepare_dataset({dir + "/in.bin"}, dir + "/out", megatron);
  try {
    prepare_dataset({dir + "/in.bin"}, dir + "/out", megatron);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--output '" + dir + "/out': '" + dir + "/out.bin' exists; pass --overwrite to "
                                         "replace the dataset there, or choose another output path");
  }
  megatron.overwrite = true;
  EXPECT_EQ(prepare_dataset({dir + "/in.bin", dir + "/in.bin"}, dir + "/out", megatron).documents, 2);
  PrepareOptions hdf5;
  prepare_dataset({dir + "/in.bin"}, dir + "/out.h5", hdf5);
  EXPECT_THROW(prepare_dataset({dir + "/in.bin"}, dir + "/out.h5", hdf5), UsageError);
  hdf5.overwrite = true;
  EXPECT_EQ(prepare_dataset({dir + "/in.bin"}, dir + "/out.h5", hdf5).documents, 1);
}

TEST(DataPrepare, CompressedAndBinaryInputsAreRefusedAndInvalidUtf8IsCounted) {
  std::string dir = testing::scratch_dir("data_prepare_not_text");
  std::string out = dir + "/out.h5";
  write_file(dir + "/notes.txt.gz", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00", 8) + "compressed");
  expect_input_error({dir + "/notes.txt.gz"}, out,
                     dir + "/notes.txt.gz: is gzip-compressed (its first bytes are gzip's magic number); prepare-data "
                           "reads text, so decompress it first, e.g. gunzip -k " + dir + "/notes.txt.gz");
  write_file(dir + "/notes.jsonl.zst", std::string("\x28\xb5\x2f\xfd\x00\x58", 6));
  expect_input_error({dir + "/notes.jsonl.zst"}, out, dir + "/notes.jsonl.zst: is zstd-compressed");

  write_file(dir + "/binary.txt", std::string("line one\nline two\nab\0cd\n", 24));
  expect_input_error({dir + "/binary.txt"}, out, dir + "/binary.txt:3: a NUL byte at byte offset 20: this is binary data");
  write_file(dir + "/binary.jsonl", std::string("{\"text\": \"ok\"}\n{\"text\": \"a\0\"}\n", 30));
  expect_input_error({dir + "/binary.jsonl"}, out, dir + "/binary.jsonl:2: a NUL byte at byte offset 26");

  // Latin-1 "café" (e9), a stray continuation byte (80), an overlong '/' (c0 af), a
  // surrogate (ed a0 80) and a sequence cut short by a newline (e6 97); the
  // four-byte emoji is valid.
  const std::string latin1 = "caf\xe9\nfine \xf0\x9f\x98\x80 text\n\x80 \xc0\xaf \xed\xa0\x80 \xe6\x97\nend";
  write_file(dir + "/latin1.txt", latin1);
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  DatasetBuildStats stats = prepare_dataset({dir + "/latin1.txt"}, out);
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(stats.documents, 1);
  EXPECT_EQ(doc_text(TokenDataset(out), 0), latin1) << "kept unchanged";
  // e9; 80; c0 and af; ed, a0 and 80; e6 97 cut short: 8.
  EXPECT_NE(log.str().find("prepare-data: " + dir + "/latin1.txt: 8 byte sequence(s) that are not valid UTF-8, the "
                           "first on line 1 (byte offset 3)"),
            std::string::npos) << log.str();
  std::ostringstream clean_log;
  auto clean_sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(clean_log);
  spdlog::default_logger()->sinks().push_back(clean_sink);
  write_file(dir + "/utf8.txt", "café \xf0\x9f\x98\x80 日本\n");
  prepare_dataset({dir + "/utf8.txt"}, dir + "/utf8.h5");
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(clean_log.str().find("utf8.txt"), std::string::npos) << "valid UTF-8 is not warned about: " << clean_log.str();
}

}  // namespace
}  // namespace hdp
