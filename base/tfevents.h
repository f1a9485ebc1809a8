#pragma once
// TensorBoard's event file format, written without TensorFlow or protobuf: a file
// of TFRecord records (uint64 length, masked CRC32C of the length, the data,
// masked CRC32C of the data; all little-endian), each record one `Event` protobuf
// (tensorboard/compat/proto/event.proto) encoded by hand in the protobuf wire
// format (varints, fixed64, fixed32, length-delimited fields).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hdp::tfevents {

// CRC-32C (Castagnoli polynomial, reflected 0x82F63B78), as in RFC 3720 B.4.
uint32_t crc32c(std::string_view data);
// TFRecord's masked CRC: the CRC rotated right by 15 bits plus 0xa282ead8, so
// that a CRC of data that holds CRCs stays well distributed.
uint32_t masked_crc32c(std::string_view data);

// One record: the framing around `data`.
std::string record(std::string_view data);

// The protobuf wire format, the parts an Event needs. Fields are appended in
// the order called.
class ProtoWriter {
 public:
  void varint(int field, uint64_t value);                  // wire type 0
  void fixed64(int field, double value);                   // wire type 1 (a double)
  void fixed32(int field, float value);                    // wire type 5 (a float)
  void bytes(int field, std::string_view value);           // wire type 2 (a string or a message)
  const std::string& data() const { return data_; }

 private:
  void tag(int field, int wire_type);
  void raw_varint(uint64_t value);
  std::string data_;
};

struct Scalar {
  std::string tag;
  float value = 0;
};

// Event { wall_time = 1, step = 2, file_version = 3 }: the first event of a file
// ("brain.Event:2"), which readers check.
std::string file_version_event(double wall_time);
// Event { wall_time, step, summary = 5 { value = 1 { tag = 1, simple_value = 2 } ... } }.
std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars);
// Event { wall_time, step, session_log = 7 { status = 1: START } }: a (re)start at
// `step`; TensorBoard's reader drops the events of this step and later ones that
// earlier files hold (the steps a resumed run reruns).
std::string session_start_event(double wall_time, int64_t step);

}  // namespace hdp::tfevents
