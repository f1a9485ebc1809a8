#include "checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/checkpoint_error.h"
#include "kernels/dtype.h"

namespace hdp {

// The format is little-endian and we read and write the bytes as they are in memory.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; a larger length is
// a corrupted file, not a big model (a 70B model's header is about 100 KB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Every dtype name of the format, so an unsupported one is told apart from a typo.
const std::set<std::string> kFormatDtypes = {"BOOL", "U8",  "I8",  "I16", "U16", "F16",     "BF16",    "I32",
                                             "U32",  "F32", "F64", "I64", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                             "F4",   "F6_E2M3", "F6_E3M2", "C64"};

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw CheckpointError(path + ": " + message);
}
[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, const std::string& message) {
  throw CheckpointError(path + ": tensor '" + name + "': " + message);
}

// A JSON value that must be a non-negative integer (the format's offsets and dims).
uint64_t unsigned_value(const Json& v, const std::string& path, const std::string& name, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  fail_tensor(path, name, what + " must be a non-negative integer, got " + v.dump());
}

SafetensorsTensor parse_entry(const std::string& path, const std::string& name, const Json& entry) {
  if (!entry.is_object()) fail_tensor(path, name, "expected an object {dtype, shape, data_offsets}, got " + entry.dump());
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail_tensor(path, name, "unknown key '" + key + "'; a tensor has dtype, shape and data_offsets");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) fail_tensor(path, name, std::string("'") + key + "' is missing");
  }
  SafetensorsTensor t;
  t.name = name;
  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) fail_tensor(path, name, "dtype must be a string, got " + dtype.dump());
  const std::string d = dtype.get<std::string>();
  if (d == "F32") t.dtype = SafetensorsDtype::F32;
  else if (d == "F16") t.dtype = SafetensorsDtype::F16;
  else if (d == "BF16") t.dtype = SafetensorsDtype::BF16;
  else if (kFormatDtypes.count(d)) fail_tensor(path, name, "dtype " + d + " is not supported; this reader takes F32, F16 and BF16");
  else fail_tensor(path, name, "unknown dtype '" + d + "'; the format's float dtypes are F32, F16, BF16, F64");

  const Json& shape = entry["shape"];
  if (!shape.is_array()) fail_tensor(path, name, "shape must be an array of integers, got " + shape.dump());
  uint64_t elements = 1;
  for (const Json& dim : shape) {
    const uint64_t n = unsigned_value(dim, path, name, "every dimension of shape");
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (n != 0 && elements > std::numeric_limits<uint64_t>::max() / 8 / n))
      fail_tensor(path, name, "shape " + shape.dump() + " has more elements than any file can hold");
    elements *= n;
    t.shape.push_back(static_cast<int64_t>(n));
  }
  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    fail_tensor(path, name, "data_offsets must be [begin, end], got " + offsets.dump());
  t.begin = unsigned_value(offsets[0], path, name, "data_offsets[0]");
  t.end = unsigned_value(offsets[1], path, name, "data_offsets[1]");
  if (t.end < t.begin)
    fail_tensor(path, name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
  const uint64_t expected = elements * safetensors_dtype_bytes(t.dtype);
  if (t.end - t.begin != expected)
    fail_tensor(path, name, "shape " + shape_text(t.shape) + " of " + d + " needs " + std::to_string(expected) +
                                " bytes, data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                "] hold " + std::to_string(t.end - t.begin));
  return t;
}

}  // namespace

const char* safetensors_dtype_name(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::F32: return "F32";
    case SafetensorsDtype::F16: return "F16";
    case SafetensorsDtype::BF16: return "BF16";
  }
  return "?";
}

size_t safetensors_dtype_bytes(SafetensorsDtype dtype) { return dtype == SafetensorsDtype::F32 ? 4 : 2; }

float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);  // +-0
  // Subnormal: m x 2^-24, exact in float32.
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign ? -magnitude : magnitude;
}

uint16_t float_to_f16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00;   // NaN
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds to >= 65520: infinity
  if (abs < 0x38800000) {                        // below 2^-14: subnormal or zero
    // value / 2^-24 rounded to nearest even is the subnormal's mantissa.
    const float scaled = std::ldexp(std::bit_cast<float>(abs), 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t rounding = 0xfff + ((abs >> 13) & 1);
  return sign | static_cast<uint16_t>(((abs + rounding) >> 13) - (112u << 10));
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// Reading

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(path, fs::exists(path, ec) ? "not a regular file" : "no such file");
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) fail(path, "cannot stat: " + ec.message());
  in_.open(path, std::ios::binary);
  if (!in_) fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (file_size < 8) fail(path, "the file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length: not a safetensors file, or truncated");
  uint8_t length_bytes[8];
  in_.read(reinterpret_cast<char*>(length_bytes), 8);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[i];
  if (header_bytes > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_bytes) + " is above the format's limit of 100 MB: not a safetensors file, or corrupted");
  if (header_bytes > file_size - 8)
    fail(path, "header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
                   std::to_string(file_size) + " bytes): truncated");
  std::string header(header_bytes, '\0');
  in_.read(header.data(), static_cast<std::streamsize>(header_bytes));
  if (!in_) fail(path, "reading the header failed");
  data_start_ = 8 + header_bytes;
  const uint64_t data_bytes = file_size - data_start_;

  // Duplicate names are refused (the format forbids them; a JSON parser would keep the last).
  std::set<std::string> seen;
  std::string duplicate;
  Json root;
  try {
    root = Json::parse(header, [&](int depth, Json::parse_event_t event, Json& parsed) {
      if (depth == 1 && event == Json::parse_event_t::key && !seen.insert(parsed.get<std::string>()).second &&
          duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const Json::exception& e) {
    fail(path, "the header is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!duplicate.empty()) fail_tensor(path, duplicate, "named twice in the header");
  if (!root.is_object()) fail(path, "the header must be a JSON object, got " + std::string(root.type_name()));

  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ must be an object of strings, got " + entry.dump());
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(path, "__metadata__ '" + key + "' must be a string, got " + value.dump());
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(parse_entry(path, name, entry));
  }
  for (const SafetensorsTensor& t : tensors_) {
    if (t.end > data_bytes)
      fail_tensor(path, t.name, "data_offsets end at byte " + std::to_string(t.end) + " of the data, but the file holds " +
                                    std::to_string(data_bytes) + " bytes of data: truncated");
  }
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  // The buffer is covered exactly once, in order (the format's rule).
  uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& t : tensors_) {
    if (t.begin < covered)
      fail_tensor(path, t.name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                    "] overlap tensor '" + previous->name + "' [" + std::to_string(previous->begin) +
                                    ", " + std::to_string(previous->end) + "]");
    if (t.begin > covered)
      fail_tensor(path, t.name, "data_offsets begin at " + std::to_string(t.begin) + ", leaving bytes [" +
                                    std::to_string(covered) + ", " + std::to_string(t.begin) +
                                    ") of the data buffer unused; the format allows no holes");
    covered = t.end;
    previous = &t;
  }
  if (covered != data_bytes)
    fail(path, std::to_string(data_bytes - covered) + " bytes after the last tensor's data; the format allows none");
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const SafetensorsTensor* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<uint8_t> SafetensorsReader::read_raw(const SafetensorsTensor& t) {
  std::vector<uint8_t> bytes(t.end - t.begin);
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(data_start_ + t.begin));
  in_.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in_ || static_cast<size_t>(in_.gcount()) != bytes.size())
    fail_tensor(path_, t.name, "reading its " + std::to_string(bytes.size()) + " bytes failed (file changed or truncated?)");
  return bytes;
}

std::vector<float> SafetensorsReader::read_floats(const SafetensorsTensor& t) {
  const std::vector<uint8_t> bytes = read_raw(t);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  if (t.dtype == SafetensorsDtype::F32) {
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    values[i] = t.dtype == SafetensorsDtype::BF16 ? to_float(bf16{h}) : f16_to_float(h);
  }
  return values;
}

// ---------------------------------------------------------------------------
// Writing

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<Spec>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path + ".tmp"), specs_(tensors) {
  // nlohmann's ordered_json keeps the insertion order, so the header lists the
  // tensors in file order as the reference writer does.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  for (const Spec& s : specs_) {
    if (s.name.empty() || s.name == "__metadata__") fail(path, "cannot write a tensor named '" + s.name + "'");
    if (!names.insert(s.name).second) fail_tensor(path, s.name, "given twice");
    uint64_t n = safetensors_dtype_bytes(s.dtype);
    for (int64_t d : s.shape) {
      if (d < 0) fail_tensor(path, s.name, "negative dimension in shape " + shape_text(s.shape));
      n *= static_cast<uint64_t>(d);
    }
    header[s.name] = {{"dtype", safetensors_dtype_name(s.dtype)},
                      {"shape", s.shape},
                      {"data_offsets", {data_bytes_, data_bytes_ + n}}};
    sizes_.push_back(n);
    data_bytes_ += n;
  }
  std::string text = header.dump();
  // The reference writer pads the header with spaces so the data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  if (!out_) fail(tmp_, std::string("cannot create: ") + std::strerror(errno));
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out_.write(reinterpret_cast<const char*>(length), 8);
  out_.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out_) fail(tmp_, "writing the header failed");
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!finished_) {
    out_.close();
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

void SafetensorsWriter::write(std::span<const uint8_t> bytes) {
  if (next_ >= specs_.size()) fail(path_, "more tensors written than declared");
  if (bytes.size() != sizes_[next_])
    fail_tensor(path_, specs_[next_].name, "got " + std::to_string(bytes.size()) + " bytes, its shape and dtype need " +
                                               std::to_string(sizes_[next_]));
  out_.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out_) fail_tensor(tmp_, specs_[next_].name, "writing failed (disk full?)");
  ++next_;
}

void SafetensorsWriter::write_floats(std::span<const float> values) {
  if (next_ >= specs_.size()) fail(path_, "more tensors written than declared");
  const SafetensorsDtype dtype = specs_[next_].dtype;
  if (dtype == SafetensorsDtype::F32) {
    write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()));
    return;
  }
  std::vector<uint16_t> narrow(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    narrow[i] = dtype == SafetensorsDtype::BF16 ? to_bf16(values[i]).bits : float_to_f16(values[i]);
  write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(narrow.data()), narrow.size() * 2));
}

void SafetensorsWriter::finish() {
  if (next_ != specs_.size())
    fail_tensor(path_, specs_[next_].name, "declared but never written (" + std::to_string(next_) + " of " +
                                               std::to_string(specs_.size()) + " tensors written)");
  out_.close();
  if (!out_) fail(tmp_, "closing failed (disk full?)");
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) fail(path_, "renaming " + tmp_ + " failed: " + ec.message());
  finished_ = true;
}

}  // namespace hdp
