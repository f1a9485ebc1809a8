#include "base/tfevents.h"

#include <array>
#include <cstring>

namespace hdp::tfevents {
namespace {

constexpr std::array<uint32_t, 256> kCrc32cTable = [] {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
    table[i] = crc;
  }
  return table;
}();

void append_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// Event's fields (tensorboard/compat/proto/event.proto and summary.proto).
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5, kEventSessionLog = 7;
constexpr int kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;
constexpr int kSessionLogStatus = 1, kSessionLogStart = 1;

ProtoWriter event_header(double wall_time, int64_t step) {
  ProtoWriter event;
  event.fixed64(kEventWallTime, wall_time);
  if (step != 0) event.varint(kEventStep, static_cast<uint64_t>(step));  // proto3: a zero is left out
  return event;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = (crc >> 8) ^ kCrc32cTable[(crc ^ byte) & 0xFF];
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string record(std::string_view data) {
  std::string length;
  append_little_endian(length, data.size(), 8);
  std::string out = length;
  append_little_endian(out, masked_crc32c(length), 4);
  out.append(data);
  append_little_endian(out, masked_crc32c(data), 4);
  return out;
}

void ProtoWriter::raw_varint(uint64_t value) {
  while (value >= 0x80) {
    data_.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  data_.push_back(static_cast<char>(value));
}

void ProtoWriter::tag(int field, int wire_type) { raw_varint(static_cast<uint64_t>(field) << 3 | wire_type); }

void ProtoWriter::varint(int field, uint64_t value) {
  tag(field, 0);
  raw_varint(value);
}

void ProtoWriter::fixed64(int field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  tag(field, 1);
  append_little_endian(data_, bits, 8);
}

void ProtoWriter::fixed32(int field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  tag(field, 5);
  append_little_endian(data_, bits, 4);
}

void ProtoWriter::bytes(int field, std::string_view value) {
  tag(field, 2);
  raw_varint(value.size());
  data_.append(value);
}

std::string file_version_event(double wall_time) {
  ProtoWriter event = event_header(wall_time, 0);
  event.bytes(kEventFileVersion, "brain.Event:2");
  return event.data();
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars) {
  ProtoWriter summary;
  for (const Scalar& s : scalars) {
    ProtoWriter value;
    value.bytes(kValueTag, s.tag);
    value.fixed32(kValueSimpleValue, s.value);
    summary.bytes(kSummaryValue, value.data());
  }
  ProtoWriter event = event_header(wall_time, step);
  event.bytes(kEventSummary, summary.data());
  return event.data();
}

std::string session_start_event(double wall_time, int64_t step) {
  ProtoWriter session_log;
  session_log.varint(kSessionLogStatus, kSessionLogStart);
  ProtoWriter event = event_header(wall_time, step);
  event.bytes(kEventSessionLog, session_log.data());
  return event.data();
}

}  // namespace hdp::tfevents
