#include "data/tokenizer_files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace hdp {
namespace {

namespace fs = std::filesystem;

bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos && name != kTokenizerIdentityFile;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  if (!out) throw TokenizerError(path + ": cannot write: " + std::strerror(errno));
}

}  // namespace

TokenizerIdentity parse_tokenizer_identity(const std::string& identity, const std::string& where) {
  // "KIND NAME fnv1a64:HASH"; NAME may hold spaces.
  const size_t kind_end = identity.find(' ');
  const std::string marker = " fnv1a64:";
  const size_t hash_at = identity.rfind(marker);
  TokenizerIdentity id;
  if (kind_end != std::string::npos && hash_at != std::string::npos && hash_at > kind_end) {
    id.kind = identity.substr(0, kind_end);
    id.file = identity.substr(kind_end + 1, hash_at - kind_end - 1);
    id.hash = identity.substr(hash_at + marker.size());
  }
  if ((id.kind != "sentencepiece" && id.kind != "bpe") || !plain_file_name(id.file) || id.hash.size() != 16 ||
      id.hash.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw TokenizerError(where + ": tokenizer '" + identity + "' is not one this build knows (byte-level, "
                         "'sentencepiece FILE fnv1a64:HASH' or 'bpe FILE fnv1a64:HASH')");
  return id;
}

bool same_tokenizer(const std::string& a, const std::string& b) {
  if (a == b) return true;
  try {
    const TokenizerIdentity x = parse_tokenizer_identity(a, "a"), y = parse_tokenizer_identity(b, "b");
    return x.kind == y.kind && x.hash == y.hash;
  } catch (const TokenizerError&) {
    return false;
  }
}

std::string read_bounded_file(const std::string& path, uint64_t limit) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw TokenizerError(path + ": cannot read: " + ec.message());
  if (size > limit)
    throw TokenizerError(path + ": " + std::to_string(size) + " bytes, more than a tokenizer file may hold (" +
                         std::to_string(limit) + ")");
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (!in || in.gcount() != static_cast<std::streamsize>(size))
    throw TokenizerError(path + ": cannot read: " + std::strerror(errno));
  return bytes;
}

TokenizerFiles tokenizer_files(const std::string& path, const Tokenizer& tokenizer) {
  TokenizerFiles out;
  out.identity = tokenizer.name();
  if (out.byte_level()) return out;
  const TokenizerIdentity id = parse_tokenizer_identity(out.identity, path);
  out.files.push_back({id.file, read_bounded_file(path, kMaxTokenizerFileBytes)});
  if (id.kind == "bpe") {
    const std::string config = (fs::path(path).parent_path() / kTokenizerConfigFile).string();
    out.files.push_back({kTokenizerConfigFile, read_bounded_file(config, kMaxTokenizerFileBytes)});
  }
  // The file changed since it was loaded: the copy would not be the tokenizer used.
  check_tokenizer_files(out, path);
  return out;
}

void check_tokenizer_files(const TokenizerFiles& files, const std::string& where) {
  if (files.files.size() > kMaxTokenizerFiles)
    throw TokenizerError(where + ": the tokenizer's copy holds " + std::to_string(files.files.size()) +
                         " files, more than " + std::to_string(kMaxTokenizerFiles));
  for (const TokenizerFile& f : files.files) {
    if (!plain_file_name(f.name))
      throw TokenizerError(where + ": the tokenizer's copy holds a file named '" + f.name + "', not a plain file name");
    if (f.bytes.size() > kMaxTokenizerFileBytes)
      throw TokenizerError(where + ": the tokenizer's copy of " + f.name + " is " + std::to_string(f.bytes.size()) +
                           " bytes, more than " + std::to_string(kMaxTokenizerFileBytes));
  }
  if (files.byte_level()) {
    if (!files.files.empty())
      throw TokenizerError(where + ": the byte-level tokenizer has no files, but the copy holds " + files.files[0].name);
    return;
  }
  const TokenizerIdentity id = parse_tokenizer_identity(files.identity, where);
  if (files.files.empty() || files.files[0].name != id.file)
    throw TokenizerError(where + ": the copy of tokenizer '" + files.identity + "' lacks its file " + id.file);
  const std::string hash = bytes_fingerprint(files.files[0].bytes);
  if (hash != id.hash)
    throw TokenizerError(where + ": the copy of " + id.file + " hashes to fnv1a64:" + hash + ", not the fnv1a64:" +
                         id.hash + " its tokenizer '" + files.identity + "' records: the copy was changed");
  if (id.kind == "bpe" && (files.files.size() < 2 || files.files[1].name != kTokenizerConfigFile))
    throw TokenizerError(where + ": the copy of tokenizer '" + files.identity + "' lacks its " + kTokenizerConfigFile);
}

void write_tokenizer_directory(const std::string& dir, const TokenizerFiles& files) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw TokenizerError(dir + ": cannot create: " + ec.message());
  write_file((fs::path(dir) / kTokenizerIdentityFile).string(), files.identity + "\n");
  write_tokenizer_files(dir, files.files);
}

void write_tokenizer_files(const std::string& dir, const std::vector<TokenizerFile>& files) {
  for (const TokenizerFile& f : files) write_file((fs::path(dir) / f.name).string(), f.bytes);
}

TokenizerFiles read_tokenizer_copy(const std::string& identity,
                                   const std::function<std::string(const std::string& name)>& read,
                                   const std::string& where) {
  TokenizerFiles out;
  out.identity = identity;
  if (!out.byte_level()) {
    const TokenizerIdentity id = parse_tokenizer_identity(identity, where);
    out.files.push_back({id.file, read(id.file)});
    if (id.kind == "bpe") out.files.push_back({kTokenizerConfigFile, read(kTokenizerConfigFile)});
  }
  check_tokenizer_files(out, where);
  return out;
}

std::string read_tokenizer_identity(const std::string& dir) {
  const std::string identity_file = (fs::path(dir) / kTokenizerIdentityFile).string();
  std::error_code ec;
  if (!fs::is_regular_file(identity_file, ec)) throw TokenizerError(dir + ": no tokenizer copy (" + identity_file + " is missing)");
  std::string identity = read_bounded_file(identity_file, 4096);
  while (!identity.empty() && identity.back() == '\n') identity.pop_back();
  return identity;
}

TokenizerFiles read_tokenizer_directory(const std::string& dir) {
  return read_tokenizer_copy(
      read_tokenizer_identity(dir),
      [&](const std::string& name) { return read_bounded_file((fs::path(dir) / name).string(), kMaxTokenizerFileBytes); },
      dir);
}

std::unique_ptr<Tokenizer> load_tokenizer_directory(const std::string& dir) {
  const TokenizerFiles files = read_tokenizer_directory(dir);
  if (files.byte_level()) return load_tokenizer(kByteTokenizerName);
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer((fs::path(dir) / files.files[0].name).string());
  if (tokenizer->name() != files.identity)
    throw TokenizerError(dir + ": the copy loads as tokenizer '" + tokenizer->name() + "', not '" + files.identity + "'");
  return tokenizer;
}

}  // namespace hdp
