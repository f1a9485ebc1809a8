#include "data/prepare.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

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

class Progress {
 public:
  explicit Progress(int64_t every) : every_(every > 0 ? every : INT64_MAX), next_(every_) {}
  void add(int64_t bytes, const DatasetBuildStats& stats) {
    total_ += bytes;
    if (total_ >= next_) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      spdlog::info("prepare-data: {} MB read, {} documents, {} tokens, {:.1f} s", total_ >> 20, stats.documents,
                   stats.tokens, secs);
      while (next_ <= total_) next_ += every_;
    }
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  int64_t every_, next_;
  int64_t total_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

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

template <class Writer>
void read_jsonl(const std::string& path, const Tokenizer& tokenizer, Writer& writer, DatasetBuildStats& stats,
                Progress& progress) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataInputError(path + ": cannot open: " + std::strerror(errno));
  std::string line;
  std::vector<uint32_t> ids;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    stats.input_bytes += static_cast<int64_t>(line.size()) + 1;
    progress.add(static_cast<int64_t>(line.size()) + 1, stats);
    if (is_blank(line)) continue;
    std::string where = path + ":" + std::to_string(line_no) + ": ";
    JsonStringField field;
    try {
      field = json_object_string_field(line, "text");
    } catch (const JsonError& e) {
      throw DataInputError(where + "invalid JSON: " + e.what());
    }
    if (field.status == JsonStringField::Status::kMissing)
      throw DataInputError(where + "the JSON object has no \"text\" member");
    if (field.status == JsonStringField::Status::kNotString)
      throw DataInputError(where + "\"text\" is " + (field.actual_type == "array" || field.actual_type == "object" ? "an " : "a ") +
                           field.actual_type + ", expected a string");
    if (field.value.empty()) {
      stats.skipped += 1;
      continue;
    }
    ids.clear();
    if (tokenizer.adds_bos()) ids.push_back(tokenizer.bos_id());
    tokenizer.encode_append(field.value, ids);
    add_document(writer, ids, tokenizer, stats);
  }
  if (in.bad()) throw DataInputError(path + ":" + std::to_string(line_no + 1) + ": read error");
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
  // A subword tokenizer must not see a word cut in two: it encodes up to the last
  // newline of what was read and carries the rest into the next block.
  std::string carry;
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
      if (tokenizer.splits_anywhere()) {
        encode(text);
      } else {
        carry.append(text);
        const size_t cut = carry.rfind('\n');
        if (cut != std::string::npos) {
          encode(std::string_view(carry).substr(0, cut + 1));
          carry.erase(0, cut + 1);
        }
      }
    }
    if (!in) break;
  }
  if (!carry.empty()) encode(carry);
  if (in.bad()) throw DataInputError(path + ": read error");
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
  }

  DatasetBuildStats stats;
  Progress progress(options.progress_every_bytes);
  std::unique_ptr<Tokenizer> bytes;
  const Tokenizer* tokenizer = options.tokenizer;
  if (tokenizer == nullptr) tokenizer = (bytes = load_tokenizer("")).get();
  auto write_all = [&](auto& writer) {
    for (const std::string& path : inputs) {
      if (ends_with(path, ".jsonl"))
        read_jsonl(path, *tokenizer, writer, stats, progress);
      else
        read_plain(path, *tokenizer, writer, stats, progress);
    }
    if (stats.documents == 0)
      throw DataInputError("prepare-data: the inputs hold no non-empty documents; nothing written to " + output);
    writer.finish();
  };
  if (options.format == DatasetFormat::Megatron) {
    MegatronWriter writer(output, tokenizer->vocab_size());
    write_all(writer);
  } else {
    TokenDatasetWriter writer(output, tokenizer->vocab_size(), tokenizer->name(), tokenizer->bos_id(), tokenizer->eos_id());
    write_all(writer);
  }
  stats.seconds = progress.seconds();
  spdlog::info("prepare-data: wrote {}: {} documents, {} tokens ({} skipped empty), longest {} tokens, {:.2f} s",
               output, stats.documents, stats.tokens, stats.skipped, stats.max_document_tokens, stats.seconds);
  return stats;
}

}  // namespace hdp
