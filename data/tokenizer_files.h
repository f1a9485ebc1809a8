#pragma once
// The tokenizer as it travels with the data and the model: prepare-data stores a
// copy of the tokenizer's files in the dataset (docs/dataset-format.md, "The
// tokenizer's copy"), training copies it into every checkpoint
// (docs/checkpoint-format.md, "tokenizer/"), and generate, eval and export-hf take
// it from there, so a model is never decoded or evaluated with a tokenizer other
// than the one its data was made with.
//
// A copy is the tokenizer's identity (Tokenizer::name(), which names the model
// file and holds the FNV-1a 64 hash of its bytes) and the bytes of the files
// load_tokenizer read: the model file (tokenizer.model or tokenizer.json) and, for
// a tokenizer.json, the tokenizer_config.json that names its BOS and EOS. The
// byte-level tokenizer has no files. Whoever reads a copy checks that the model
// file's bytes still hash to the identity's hash.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace hdp {

// The largest tokenizer file a copy may hold (LLaMA-3's tokenizer.json is 9 MB,
// SentencePiece models are below 5 MB): every size read from a file is checked
// against it before anything is allocated.
inline constexpr uint64_t kMaxTokenizerFileBytes = 64ull << 20;
// The most files a copy holds (a model file and tokenizer_config.json).
inline constexpr size_t kMaxTokenizerFiles = 2;
inline constexpr const char* kTokenizerConfigFile = "tokenizer_config.json";

struct TokenizerFile {
  std::string name;   // a plain file name, no directory
  std::string bytes;
};

struct TokenizerFiles {
  std::string identity;               // "byte-level", "sentencepiece NAME fnv1a64:HASH", "bpe NAME fnv1a64:HASH"
  std::vector<TokenizerFile> files;   // the model file first; none for byte-level
  bool byte_level() const { return identity == kByteTokenizerName; }
};

// An identity's parts: kind "sentencepiece" or "bpe", the model file's name, its
// hash (16 hex digits). Throws TokenizerError naming `where` when the text is not one.
struct TokenizerIdentity {
  std::string kind, file, hash;
};
TokenizerIdentity parse_tokenizer_identity(const std::string& identity, const std::string& where);

// Whether two identities name the same tokenizer: the same text, or the same kind
// and hash under other file names (export-hf renames sp.model to tokenizer.model).
bool same_tokenizer(const std::string& a, const std::string& b);

// The files `tokenizer` was loaded from by load_tokenizer(path), with its identity.
TokenizerFiles tokenizer_files(const std::string& path, const Tokenizer& tokenizer);

// Checks a copy read from `where`: its identity's form, plain file names (at most
// kMaxTokenizerFiles, each at most kMaxTokenizerFileBytes), the model file named as
// the identity names it and hashing to its hash. TokenizerError naming `where`,
// both hashes or the file.
void check_tokenizer_files(const TokenizerFiles& files, const std::string& where);

// A copy read file by file: `read(name)` gives the bytes of the named file (the
// model file the identity names, then tokenizer_config.json for a tokenizer.json),
// refusing one above kMaxTokenizerFileBytes. Checked as above.
TokenizerFiles read_tokenizer_copy(const std::string& identity,
                                   const std::function<std::string(const std::string& name)>& read,
                                   const std::string& where);

// A copy on disk: DIR/identity (the identity, one line) and the files under their
// names; DIR is created (an existing one is replaced).
inline constexpr const char* kTokenizerIdentityFile = "identity";
void write_tokenizer_directory(const std::string& dir, const TokenizerFiles& files);
// Writes files into DIR (which exists) under their names.
void write_tokenizer_files(const std::string& dir, const std::vector<TokenizerFile>& files);
// The identity DIR/identity records (TokenizerError when it is missing).
std::string read_tokenizer_identity(const std::string& dir);
// Reads and checks the copy in DIR (check_tokenizer_files).
TokenizerFiles read_tokenizer_directory(const std::string& dir);
// The tokenizer of a checked copy in DIR (load_tokenizer of its model file there).
std::unique_ptr<Tokenizer> load_tokenizer_directory(const std::string& dir);

// A file's bytes, refused (TokenizerError naming it) above `limit` bytes.
std::string read_bounded_file(const std::string& path, uint64_t limit);

}  // namespace hdp
