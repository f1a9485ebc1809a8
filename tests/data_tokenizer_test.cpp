// SentencePiece tokenizers (data/tokenizer.h): a model trained here by Debian's
// spm_train on demo-corpus text encodes every line exactly as spm_encode does,
// and prepare-data with it writes those ids between the model's BOS and EOS,
// recording the tokenizer (a fingerprint of the model file) and its vocabulary.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "data/tokenizer_files.h"
#include "test_util.h"

namespace hdp {
namespace {

using testing::run_command;

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// Lines of demo-corpus text (the documents' non-empty lines), about `bytes` of them.
std::vector<std::string> corpus_lines(size_t bytes) {
  CorpusOptions options;
  options.seed = 99;
  std::vector<std::string> lines;
  size_t total = 0;
  for (int64_t doc = 0; total < bytes; ++doc) {
    std::istringstream text(generate_demo_document(options, doc));
    for (std::string line; std::getline(text, line);) {
      if (line.find_first_not_of(' ') == std::string::npos) continue;
      total += line.size() + 1;
      lines.push_back(line);
    }
  }
  return lines;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::vector<std::vector<uint32_t>> read_id_lines(const std::string& path) {
  std::vector<std::vector<uint32_t>> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    out.emplace_back();
    for (uint32_t id; ids >> id;) out.back().push_back(id);
  }
  return out;
}

class SentencePiece : public ::testing::TestWithParam<std::string> {};

TEST_P(SentencePiece, EncodesLikeSpmEncodeAndPrepareDataRecordsIt) {
  const std::string type = GetParam();
  const std::string dir = testing::scratch_dir("sentencepiece-" + type);
  const std::vector<std::string> lines = corpus_lines(200'000);
  {
    std::ofstream text(dir + "/text.txt");
    for (const std::string& line : lines) text << line << "\n";
  }
  auto r = run_command("spm_train --input=" + dir + "/text.txt --model_prefix=" + dir + "/sp --vocab_size=600" +
                       " --model_type=" + type + " --character_coverage=1.0 --minloglevel=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command("spm_encode --model=" + dir + "/sp.model --output_format=id < " + dir + "/text.txt > " + dir +
                  "/ids.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = read_id_lines(dir + "/ids.txt");
  ASSERT_EQ(want.size(), lines.size());

  const std::unique_ptr<Tokenizer> sp = load_tokenizer(dir + "/sp.model");
  EXPECT_EQ(sp->vocab_size(), 600u);
  EXPECT_EQ(sp->bos_id(), 1u);  // spm_train's defaults: unk 0, bos 1, eos 2
  EXPECT_EQ(sp->eos_id(), 2u);
  EXPECT_TRUE(sp->adds_bos());
  EXPECT_EQ(sp->name(), "sentencepiece sp.model fnv1a64:" + file_fingerprint(dir + "/sp.model"));
  size_t tokens = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<uint32_t> got;
    sp->encode_append(lines[i], got);
    ASSERT_EQ(got, want[i]) << "line " << i + 1 << ": " << lines[i];
    tokens += got.size();
  }
  // A subword model: far fewer tokens than bytes.
  EXPECT_LT(tokens, 200'000u / 2);
  EXPECT_EQ(sp->decode(want[0]), lines[0]);

  // prepare-data: one document per JSON line, BOS + ids + EOS.
  {
    std::ofstream jsonl(dir + "/docs.jsonl");
    for (const std::string& line : lines) jsonl << "{\"text\": " << json_string(line) << "}\n";
  }
  PrepareOptions options;
  options.tokenizer = sp.get();
  prepare_dataset({dir + "/docs.jsonl"}, dir + "/docs.h5", options);
  TokenDataset data(dir + "/docs.h5");
  // One worker gives the same file as several (each line is tokenized on its own).
  PrepareOptions serial = options;
  serial.threads = 1;
  options.threads = 3;
  prepare_dataset({dir + "/docs.jsonl"}, dir + "/docs-serial.h5", serial);
  prepare_dataset({dir + "/docs.jsonl"}, dir + "/docs-parallel.h5", options);
  {
    TokenDataset a(dir + "/docs-serial.h5"), b(dir + "/docs-parallel.h5");
    ASSERT_EQ(a.num_documents(), b.num_documents());
    for (int64_t d = 0; d < a.num_documents(); ++d) ASSERT_EQ(a.read_document(d), b.read_document(d)) << d;
  }
  EXPECT_EQ(data.vocab_size(), 600u);
  EXPECT_EQ(data.tokenizer(), sp->name());
  EXPECT_EQ(data.bos_id(), 1u);
  EXPECT_EQ(data.eos_id(), 2u);
  ASSERT_EQ(data.num_documents(), static_cast<int64_t>(lines.size()));
  for (int64_t d = 0; d < data.num_documents(); ++d) {
    std::vector<int32_t> expected = {1};
    expected.insert(expected.end(), want[d].begin(), want[d].end());
    expected.push_back(2);
    ASSERT_EQ(data.read_document(d), expected) << "document " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(ModelTypes, SentencePiece, ::testing::Values("unigram", "bpe"));

TEST(SentencePieceFiles, PlainTextIsEncodedBetweenLines) {
  // A plain file larger than prepare-data's 1 MiB read block is one document;
  // words are never cut at a block boundary, so each line encodes as on its own.
  const std::string dir = testing::scratch_dir("sentencepiece-plain");
  const std::vector<std::string> lines = corpus_lines(1'500'000);
  {
    std::ofstream text(dir + "/train.txt");
    for (size_t i = 0; i < 2000; ++i) text << lines[i] << "\n";
  }
  auto r = run_command("spm_train --input=" + dir + "/train.txt --model_prefix=" + dir +
                       "/sp --vocab_size=400 --minloglevel=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::unique_ptr<Tokenizer> sp = load_tokenizer(dir + "/sp.model");
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  std::ofstream(dir + "/big.txt") << text;
  PrepareOptions options;
  options.tokenizer = sp.get();
  prepare_dataset({dir + "/big.txt"}, dir + "/big.h5", options);
  TokenDataset data(dir + "/big.h5");
  ASSERT_EQ(data.num_documents(), 1);
  const std::vector<int32_t> doc = data.read_document(0);
  ASSERT_GE(doc.size(), 2u);
  EXPECT_EQ(doc.front(), 1);
  EXPECT_EQ(doc.back(), 2);
  // The text between BOS and EOS decodes back to the text with its whitespace
  // normalised as SentencePiece does (runs of spaces and newlines become one
  // space): no word was cut where a read block ended.
  const std::vector<uint32_t> body(doc.begin() + 1, doc.end() - 1);
  std::string want;
  for (char c : text) {
    const bool space = c == ' ' || c == '\n';
    if (space && (want.empty() || want.back() == ' ')) continue;
    want += space ? ' ' : c;
  }
  while (!want.empty() && want.back() == ' ') want.pop_back();
  const std::string got = sp->decode(body);
  ASSERT_EQ(got.size(), want.size());
  const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
  EXPECT_TRUE(diff.first == got.end()) << "first difference at byte " << (diff.first - got.begin()) << ": '"
                                       << got.substr(diff.first - got.begin(), 40) << "' vs '"
                                       << want.substr(diff.first - got.begin(), 40) << "'";
}

// The copy of the tokenizer a dataset keeps (data/tokenizer_files.h): the model
// file's bytes in the HDF5 group tokenizer_files and in Megatron's PREFIX.tokenizer/,
// read back equal; a copy whose bytes no longer hash to the recorded identity is
// refused naming both hashes; a directory copy loads as the same tokenizer.
TEST(SentencePieceFiles, DatasetsKeepACheckedCopyOfTheModel) {
  const std::string dir = testing::scratch_dir("sentencepiece-copy");
  {
    std::ofstream text(dir + "/t.txt");
    for (const std::string& line : corpus_lines(50'000)) text << line << "\n";
  }
  auto r = run_command("spm_train --input=" + dir + "/t.txt --model_prefix=" + dir + "/sp --vocab_size=300 --minloglevel=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::unique_ptr<Tokenizer> sp = load_tokenizer(dir + "/sp.model");
  const TokenizerFiles files = tokenizer_files(dir + "/sp.model", *sp);
  ASSERT_EQ(files.files.size(), 1u);
  EXPECT_EQ(files.identity, sp->name());
  EXPECT_EQ(files.files[0].name, "sp.model");
  std::ifstream model(dir + "/sp.model", std::ios::binary);
  EXPECT_EQ(files.files[0].bytes, std::string(std::istreambuf_iterator<char>(model), {}));

  PrepareOptions options;
  options.tokenizer = sp.get();
  options.tokenizer_copy = files;
  prepare_dataset({dir + "/t.txt"}, dir + "/t.h5", options);
  std::optional<TokenizerFiles> copy = dataset_tokenizer_copy(dir + "/t.h5", DatasetFormat::Hdf5);
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->identity, files.identity);
  ASSERT_EQ(copy->files.size(), 1u);
  EXPECT_EQ(copy->files[0].bytes, files.files[0].bytes);

  options.format = DatasetFormat::Megatron;
  prepare_dataset({dir + "/t.txt"}, dir + "/mega", options);
  EXPECT_EQ(TokenDataset(dir + "/mega", DatasetFormat::Megatron).tokenizer(), sp->name());
  copy = dataset_tokenizer_copy(dir + "/mega", DatasetFormat::Megatron);
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->files[0].bytes, files.files[0].bytes);
  EXPECT_EQ(load_tokenizer_directory(dir + "/mega.tokenizer")->name(), sp->name());

  // Byte-level datasets need no files; a dataset written without a copy has none.
  options.format = DatasetFormat::Hdf5;
  options.tokenizer_copy.reset();
  prepare_dataset({dir + "/t.txt"}, dir + "/nocopy.h5", options);
  EXPECT_FALSE(dataset_tokenizer_copy(dir + "/nocopy.h5", DatasetFormat::Hdf5).has_value());
  prepare_dataset({dir + "/t.txt"}, dir + "/bytes.h5", PrepareOptions{});
  EXPECT_EQ(dataset_tokenizer_copy(dir + "/bytes.h5", DatasetFormat::Hdf5)->identity, "byte-level");

  // Changed bytes: refused in the HDF5 group and in the Megatron directory.
  TokenizerFiles changed = files;
  changed.files[0].bytes[100] ^= 1;
  options.tokenizer_copy = changed;
  prepare_dataset({dir + "/t.txt"}, dir + "/changed.h5", options);
  const std::string want = "the copy of sp.model hashes to fnv1a64:" + bytes_fingerprint(changed.files[0].bytes) +
                           ", not the fnv1a64:" + file_fingerprint(dir + "/sp.model");
  try {
    dataset_tokenizer_copy(dir + "/changed.h5", DatasetFormat::Hdf5);
    FAIL() << "a changed copy was read";
  } catch (const DatasetError& e) {
    EXPECT_CONTAINS(e.what(), "dataset '" + dir + "/changed.h5': " + dir + "/changed.h5 (group 'tokenizer_files'): " + want);
  }
  std::ofstream(dir + "/mega.tokenizer/sp.model", std::ios::binary | std::ios::trunc) << changed.files[0].bytes;
  try {
    dataset_tokenizer_copy(dir + "/mega", DatasetFormat::Megatron);
    FAIL() << "a changed copy was read";
  } catch (const DatasetError& e) {
    EXPECT_CONTAINS(e.what(), want);
  }
}

TEST(SentencePieceFiles, BadModelFilesAreNamed) {
  const std::string dir = testing::scratch_dir("sentencepiece-bad");
  std::ofstream(dir + "/garbage.model") << "this is not a protobuf";
  try {
    load_tokenizer(dir + "/garbage.model");
    FAIL() << "a garbage model loaded";
  } catch (const TokenizerError& e) {
    EXPECT_CONTAINS(e.what(), dir + "/garbage.model: not a SentencePiece model");
  }
  try {
    load_tokenizer(dir + "/missing.model");
    FAIL() << "a missing model loaded";
  } catch (const TokenizerError& e) {
    EXPECT_CONTAINS(e.what(), dir + "/missing.model: no such tokenizer file");
  }
  // A model without EOS cannot end documents.
  {
    std::ofstream text(dir + "/t.txt");
    for (const std::string& line : corpus_lines(50'000)) text << line << "\n";
  }
  auto r = run_command("spm_train --input=" + dir + "/t.txt --model_prefix=" + dir +
                       "/noeos --vocab_size=300 --eos_id=-1 --minloglevel=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  try {
    load_tokenizer(dir + "/noeos.model");
    FAIL() << "a model without EOS loaded";
  } catch (const TokenizerError& e) {
    EXPECT_CONTAINS(e.what(), dir + "/noeos.model: the SentencePiece model has no EOS piece");
  }
}

// A piece holding a NUL byte aborted the process inside libsentencepiece (its trie
// builder throws where the exception cannot pass; found by fuzz/sentencepiece_fuzz.cpp):
// it is refused first, naming the piece.
TEST(SentencePieceFiles, PieceWithNulIsRefused) {
  // ModelProto in the protobuf wire format: field 1, a SentencePiece {1: piece, 2: score, 3: type}.
  auto piece = [](const std::string& text, char type) {
    const std::string message = std::string("\x0a") + static_cast<char>(text.size()) + text +
                                std::string("\x15\0\0\0\0\x18", 6) + type;
    return std::string("\x0a") + static_cast<char>(message.size()) + message;
  };
  const std::string dir = testing::scratch_dir("sentencepiece-nul");
  std::ofstream(dir + "/nul.model", std::ios::binary) << piece("<unk>", 2) + piece("<s>", 3) + piece("</s>", 3) +
                                                            piece("a", 1) + piece(std::string("\0b", 2), 1);
  try {
    load_tokenizer(dir + "/nul.model");
    FAIL() << "a model with a NUL in a piece loaded";
  } catch (const TokenizerError& e) {
    EXPECT_CONTAINS(e.what(), dir + "/nul.model: piece 4 of the SentencePiece model holds a NUL byte");
  }
}

}  // namespace
}  // namespace hdp
