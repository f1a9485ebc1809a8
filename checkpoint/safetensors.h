#pragma once
// Hugging Face safetensors files (https://github.com/huggingface/safetensors,
// "Format"): an 8-byte little-endian header length N, N bytes of JSON header
// (an object: tensor name -> {"dtype", "shape", "data_offsets": [begin, end]},
// plus an optional "__metadata__" object of strings), then the data buffer, the
// tensors' raw little-endian bytes at [begin, end) relative to the buffer's start.
// The buffer must be covered exactly: no overlaps, no holes, nothing after the
// last tensor.
//
// Our own small reader and writer (JSON through nlohmann-json). The reader
// validates the whole header when it opens a file (header length inside the
// file, JSON, dtype names, shapes against data_offsets, offsets inside the
// file, no overlaps or holes, no duplicate names) so a bad file is refused
// before any tensor is used. Every error is a CheckpointError (exit code 2)
// whose message names the file and, where there is one, the tensor.
//
// Tensors of dtype F32, F16 and BF16 are read (converted to float32); any other
// dtype of the format is named and refused.

#include <cstdint>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace hdp {

enum class SafetensorsDtype { F32, F16, BF16 };

// "F32", "F16", "BF16": the format's names.
const char* safetensors_dtype_name(SafetensorsDtype dtype);
size_t safetensors_dtype_bytes(SafetensorsDtype dtype);

// Conversions between float32 and IEEE binary16 (subnormals, infinities and NaN
// included), exact where the target can hold the value, rounded to nearest even
// otherwise. bf16 is the compute type's (kernels/dtype.h: to_bf16, to_float).
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::F32;
  std::vector<int64_t> shape;  // [] is a scalar
  uint64_t begin = 0, end = 0; // byte range in the data buffer
  int64_t numel() const;
};

// A safetensors file opened for reading; the header is read and checked whole.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return path_; }
  // In data-buffer order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* find(const std::string& name) const;

  // The tensor's bytes as stored (little-endian).
  std::vector<uint8_t> read_raw(const SafetensorsTensor& tensor);
  // The tensor's values as float32 (F16 and BF16 widened exactly).
  std::vector<float> read_floats(const SafetensorsTensor& tensor);

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, size_t> index_;
};

// Writes a safetensors file tensor by tensor, so a model never needs to be in
// memory whole: the constructor takes every tensor's name, dtype and shape
// (their data follows in that order), write() takes each tensor's bytes in
// turn, finish() checks that all came and renames PATH.tmp to PATH. A writer
// destroyed before finish() deletes PATH.tmp.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, const std::vector<Spec>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // The next tensor's bytes (exactly its size, little-endian).
  void write(std::span<const uint8_t> bytes);
  // The next tensor from float32 values, narrowed to its dtype.
  void write_floats(std::span<const float> values);
  void finish();

  // Bytes of the data buffer of the file (the sum of the tensors' sizes).
  uint64_t data_bytes() const { return data_bytes_; }

 private:
  std::string path_, tmp_;
  std::ofstream out_;
  std::vector<Spec> specs_;
  std::vector<uint64_t> sizes_;
  size_t next_ = 0;
  uint64_t data_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace hdp
