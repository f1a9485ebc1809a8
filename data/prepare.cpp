#include "data/prepare.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <thread>
#include <utility>

#include "base/progress_meter.h"
#include "base/utf8.h"
#include "data/json.h"
#include "data/megatron.h"
#include "data/tokenizer.h"

namespace hdp {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_blank(const std::string& line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return false;
  return true;
}

// Logs after every `every` bytes of input and at least every 10 s: MB read of the
// total, documents, tokens, MB/s, the time elapsed and the time left at that rate.
class Progress {
 public:
  Progress(int64_t every, int64_t input_bytes)
      : every_(every > 0 ? every : INT64_MAX), next_(every_), input_bytes_(input_bytes) {}
  void add(int64_t bytes, const DatasetBuildStats& stats) {
    total_ += bytes;
    const bool by_bytes = total_ >= next_;
    if (!meter_.due() && !by_bytes) return;
    const double secs = seconds();
    const double rate = secs > 0 ? static_cast<double>(total_) / secs : 0;
    const double done = input_bytes_ > 0 ? static_cast<double>(total_) / static_cast<double>(input_bytes_) : 0;
    spdlog::info("prepare-data: {} of {} MB read, {} documents, {} tokens, {:.1f} MB/s, {}", total_ >> 20,
                 input_bytes_ >> 20, stats.documents, stats.tokens, rate / 1e6, meter_.elapsed_and_left(done));
    while (next_ <= total_) next_ += every_;
  }
  double seconds() const { return meter_.elapsed_s(); }

 private:
  int64_t every_, next_;
  int64_t input_bytes_;
  int64_t total_ = 0;
  ProgressMeter meter_;
};

// What prepare-data checks in every byte of an input, across the blocks or lines
// it is read in: a NUL byte (binary data, never text) is refused naming the file,
// line and byte offset; bytes that are not UTF-8 are counted, for one warning per
// file naming the first.
class TextCheck {
 public:
  explicit TextCheck(std::string path) : path_(std::move(path)) {}

  void feed(std::string_view bytes) {
    for (const char ch : bytes) {
      const auto b = static_cast<unsigned char>(ch);
      if (b == 0) {
        throw DataInputError(path_ + ":" + std::to_string(line_) + ": a NUL byte at byte offset " +
                             std::to_string(offset_) +
                             ": this is binary data, not text; prepare-data reads UTF-8 text and JSON Lines");
      }
      count(utf8_.next(b, offset_));
      if (b == '\n') ++line_;
      ++offset_;
    }
  }

  // After the last byte: warns when there were bytes that are not UTF-8.
  void finish() {
    count(utf8_.finish());
    if (invalid_ == 0) return;
    spdlog::warn("prepare-data: {}: {} byte sequence(s) that are not valid UTF-8, the first on line {} (byte offset {}); "
                 "they go to the tokenizer unchanged. If the file is in another encoding, convert it first, e.g. "
                 "iconv -f LATIN1 -t UTF-8", path_, invalid_, first_line_, utf8_.first_invalid());
  }

 private:
  void count(int invalid) {
    if (invalid > 0 && invalid_ == 0) first_line_ = line_;  // a sequence never spans a newline
    invalid_ += invalid;
  }

  std::string path_;
  Utf8Checker utf8_;
  int64_t offset_ = 0, line_ = 1;
  int64_t invalid_ = 0, first_line_ = 0;
};

// Compressed files are refused by their magic bytes: their tokens would be the
// compressed bytes. (Decompressing is one command away and keeps prepare-data free
// of compression libraries.)
void refuse_compressed(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char head[6] = {};
  in.read(reinterpret_cast<char*>(head), sizeof(head));
  const auto got = in.gcount();
  struct Format {
    const char* name;
    std::string magic;
    const char* command;
  };
  const Format formats[] = {{"gzip", "\x1f\x8b", "gunzip -k"},
                            {"zstd", "\x28\xb5\x2f\xfd", "zstd -d"},
                            {"xz", std::string("\xfd" "7zXZ\0", 6), "unxz -k"}};
  for (const Format& f : formats) {
    if (got >= static_cast<std::streamsize>(f.magic.size()) &&
        std::memcmp(head, f.magic.data(), f.magic.size()) == 0) {
      throw DataInputError(path + ": is " + f.name + "-compressed (its first bytes are " + f.name +
                           "'s magic number); prepare-data reads text, so decompress it first, e.g. " + f.command +
                           " " + path);
    }
  }
}
// Writer: TokenDatasetWriter (HDF5) or MegatronWriter (.bin/.idx), the same calls.
template <class Writer>
void add_document(Writer& writer, std::vector<uint32_t>& ids, const Tokenizer& tokenizer,
                  DatasetBuildStats& stats) {
  ids.push_back(tokenizer.eos_id());
  writer.append(ids);
  stats.documents += 1;
  stats.tokens += static_cast<int64_t>(ids.size());
  stats.max_document_tokens = std::max<int64_t>(stats.max_document_tokens, ids.size());
}

// JSON Lines in batches of lines: the batch's lines are parsed and tokenized by
// `threads` workers at once (each line on its own, so any split of the work gives
// the same ids), then appended in file order; an error is the first bad line's.
template <class Writer>
void read_jsonl(const std::string& path, const Tokenizer& tokenizer, Writer& writer, DatasetBuildStats& stats,
                Progress& progress, int threads) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataInputError(path + ": cannot open: " + std::strerror(errno));
  constexpr size_t kBatchLines = 4096;
  struct Line {
    int64_t number = 0;
    std::string text;
    std::vector<uint32_t> ids;
    std::string error;  // set by a worker: the line's DataInputError message
    bool skipped = false;
  };
  std::vector<Line> batch(kBatchLines);
  int64_t line_no = 0;
  TextCheck check(path);
  auto encode = [&](Line& l) {
    const std::string where = path + ":" + std::to_string(l.number) + ": ";
    JsonStringField field;
    try {
      field = json_object_string_field(l.text, "text");
    } catch (const JsonError& e) {
      l.error = where + "invalid JSON: " + e.what();
      return;
    }
    if (field.status == JsonStringField::Status::kMissing) {
      l.error = where + "the JSON object has no \"text\" member";
      return;
    }
    if (field.status == JsonStringField::Status::kNotString) {
      l.error = where + "\"text\" is " + (field.actual_type == "array" || field.actual_type == "object" ? "an " : "a ") +
                field.actual_type + ", expected a string";
      return;
    }
    if (field.value.empty()) {
      l.skipped = true;
      return;
    }
    if (tokenizer.adds_bos()) l.ids.push_back(tokenizer.bos_id());
    try {
      tokenizer.encode_append(field.value, l.ids);
    } catch (const std::exception& e) {
      l.error = where + e.what();
    }
  };
  bool more = true;
  while (more) {
    size_t n = 0;
    int64_t bytes = 0;
    while (n < kBatchLines) {
      Line& l = batch[n];
      if (!std::getline(in, l.text)) {
        more = false;
        break;
      }
      ++line_no;
      bytes += static_cast<int64_t>(l.text.size()) + 1;
      check.feed(l.text);
      if (!in.eof()) check.feed("\n");
      if (is_blank(l.text)) continue;
      l.number = line_no;
      l.ids.clear();
      l.error.clear();
      l.skipped = false;
      ++n;
    }
    const int workers = std::max(1, std::min<int>(threads, static_cast<int>(n)));
    std::vector<std::thread> pool;
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) encode(batch[i]);
    };
    for (int w = 1; w < workers; ++w) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    for (size_t i = 0; i < n; ++i) {
      Line& l = batch[i];
      if (!l.error.empty()) throw DataInputError(l.error);
      if (l.skipped) {
        stats.skipped += 1;
        continue;
      }
      add_document(writer, l.ids, tokenizer, stats);
    }
    stats.input_bytes += bytes;
    progress.add(bytes, stats);
  }
  if (in.bad()) throw DataInputError(path + ":" + std::to_string(line_no + 1) + ": read error");
  check.finish();
}

template <class Writer>
void read_plain(const std::string& path, const Tokenizer& tokenizer, Writer& writer, DatasetBuildStats& stats,
                Progress& progress) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataInputError(path + ": cannot open: " + std::strerror(errno));
  constexpr size_t kBlock = 1 << 20;
  std::string block(kBlock, '\0');
  std::vector<uint32_t> ids;
  int64_t doc_tokens = 0;
  // A subword tokenizer sees the whole document at once, as its library encodes it:
  // any cut (even between lines) can change the ids (SentencePiece starts every
  // piece with a word boundary; a regex lookahead sees the end of a piece). So the
  // file is held in memory whole, then encoded (in time linear in its length).
  std::string whole;
  TextCheck check(path);
  auto encode = [&](std::string_view text) {
    ids.clear();
    if (doc_tokens == 0 && tokenizer.adds_bos()) ids.push_back(tokenizer.bos_id());
    tokenizer.encode_append(text, ids);
    writer.append_partial(ids);
    doc_tokens += static_cast<int64_t>(ids.size());
  };
  while (true) {
    in.read(block.data(), kBlock);
    std::streamsize got = in.gcount();
    if (got > 0) {
      stats.input_bytes += got;
      progress.add(got, stats);
      std::string_view text(block.data(), static_cast<size_t>(got));
      check.feed(text);
      if (tokenizer.splits_anywhere()) {
        encode(text);
      } else {
        whole.append(text);
      }
    }
    if (!in) break;
  }
  if (!whole.empty()) encode(whole);
  if (in.bad()) throw DataInputError(path + ": read error");
  check.finish();
  if (doc_tokens == 0) {
    stats.skipped += 1;
    spdlog::warn("prepare-data: {} is empty; skipped", path);
    return;
  }
  uint32_t eos = tokenizer.eos_id();
  writer.append_partial(std::span<const uint32_t>(&eos, 1));
  writer.end_document();
  stats.documents += 1;
  stats.tokens += doc_tokens + 1;
  stats.max_document_tokens = std::max(stats.max_document_tokens, doc_tokens + 1);
}

// The files the dataset's writer creates for `output`, the finished ones first:
// TokenDatasetWriter writes OUTPUT through OUTPUT.tmp; MegatronWriter writes
// OUTPUT.bin and OUTPUT.idx through OUTPUT.bin.tmp and OUTPUT.idx.tmp.
std::vector<std::string> written_files(const std::string& output, DatasetFormat format) {
  if (format == DatasetFormat::Megatron) return {output + ".bin", output + ".idx", output + ".bin.tmp", output + ".idx.tmp"};
  return {output, output + ".tmp"};
}

// Writing the dataset must destroy neither an input nor, unless asked, a dataset
// already there. An input is compared with every file the writer creates, by
// path and by the file it is (a hard or symbolic link is the same file).
void check_outputs(const std::vector<std::string>& inputs, const std::string& output, const PrepareOptions& options) {
  namespace fs = std::filesystem;
  const std::vector<std::string> files = written_files(output, options.format);
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::path input_path = fs::weakly_canonical(input, ec);
    for (const std::string& file : files) {
      std::error_code same_ec, path_ec;
      const bool same = fs::equivalent(input, file, same_ec) || fs::weakly_canonical(file, path_ec) == input_path;
      if (!same) continue;
      throw UsageError("--output '" + output + "' " + (file == output ? "" : "writes '" + file + "', which ") +
                       "is the input '" + input + "'; writing the dataset would replace it, so choose another "
                       "output path");
    }
  }
  if (options.overwrite) return;
  for (size_t i = 0; i < (options.format == DatasetFormat::Megatron ? 2u : 1u); ++i) {
    std::error_code ec;
    if (fs::exists(files[i], ec))
      throw UsageError("--output '" + output + "': '" + files[i] + "' exists; pass --overwrite to replace the "
                       "dataset there, or choose another output path");
  }
}

}  // namespace

DatasetBuildStats prepare_dataset(const std::vector<std::string>& inputs, const std::string& output,
                                  const PrepareOptions& options) {
  namespace fs = std::filesystem;
  if (inputs.empty()) throw DataInputError("prepare-data: no input files given");
  for (const std::string& path : inputs) {
    std::error_code ec;
    fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) throw DataInputError(path + ": no such file");
    if (fs::is_directory(st)) throw DataInputError(path + ": is a directory, expected a file");
    std::ifstream probe(path, std::ios::binary);
    if (!probe) throw DataInputError(path + ": cannot open: " + std::strerror(errno));
    refuse_compressed(path);
  }
  check_outputs(inputs, output, options);

  DatasetBuildStats stats;
  int64_t input_bytes = 0;
  for (const std::string& path : inputs) {
    std::error_code ec;
    input_bytes += static_cast<int64_t>(fs::file_size(path, ec));
  }
  Progress progress(options.progress_every_bytes, input_bytes);
  const int threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  std::unique_ptr<Tokenizer> bytes;
  const Tokenizer* tokenizer = options.tokenizer;
  if (tokenizer == nullptr) tokenizer = (bytes = load_tokenizer("")).get();
  auto write_all = [&](auto& writer) {
    for (const std::string& path : inputs) {
      if (ends_with(path, ".jsonl"))
        read_jsonl(path, *tokenizer, writer, stats, progress, threads);
      else
        read_plain(path, *tokenizer, writer, stats, progress);
    }
    if (stats.documents == 0)
      throw DataInputError("prepare-data: the inputs hold no non-empty documents; nothing written to " + output);
    writer.finish();
  };
  std::optional<TokenizerFiles> copy = options.tokenizer_copy;
  if (!copy && tokenizer->name() == kByteTokenizerName) copy = TokenizerFiles{kByteTokenizerName, {}};
  if (copy && copy->identity != tokenizer->name())
    throw std::invalid_argument("prepare_dataset: the tokenizer's copy is of '" + copy->identity + "', not of '" +
                                tokenizer->name() + "'");
  if (options.format == DatasetFormat::Megatron) {
    MegatronWriter writer(output, tokenizer->vocab_size());
    write_all(writer);
    // The .idx has no room for it: the copy goes beside the files.
    if (copy) write_tokenizer_directory(megatron_tokenizer_directory(output), *copy);
  } else {
    TokenDatasetWriter writer(output, tokenizer->vocab_size(), tokenizer->name(), tokenizer->bos_id(), tokenizer->eos_id());
    if (copy) writer.store_tokenizer_copy(*copy);
    write_all(writer);
  }
  stats.seconds = progress.seconds();
  spdlog::info("prepare-data: wrote {}: {} documents, {} tokens ({} skipped empty), longest {} tokens, {:.2f} s",
               output, stats.documents, stats.tokens, stats.skipped, stats.max_document_tokens, stats.seconds);
  return stats;
}

}  // namespace hdp
