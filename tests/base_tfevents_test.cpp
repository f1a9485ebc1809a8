// TensorBoard's event file format written by hand (base/tfevents.h): CRC-32C
// against RFC 3720's test vectors, the protobuf wire format against bytes encoded
// by hand from the protobuf encoding rules, and a whole TFRecord against its bytes
// (the masked CRCs computed apart, by a bitwise CRC-32C, not this table's).

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "base/tfevents.h"

namespace hdp::tfevents {
namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

TEST(Crc32c, MatchesRfc3720TestVectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC catalogue's check value
}

TEST(Crc32c, MaskedRotatesAndAddsTheConstant) {
  EXPECT_EQ(masked_crc32c(""), 0xa282ead8u);  // CRC 0, rotated 0, plus the constant
  EXPECT_EQ(masked_crc32c("abc"), 0x21f1576eu);
}

TEST(ProtoWriter, EncodesEachWireType) {
  ProtoWriter p;
  p.varint(1, 300);  // 300 = 0b10_0101100: AC 02
  EXPECT_EQ(hex(p.data()), "08ac02");
  ProtoWriter big;
  big.varint(2, UINT64_MAX);  // ten bytes, the last holding the top bit
  EXPECT_EQ(hex(big.data()), "10ffffffffffffffffff01");
  ProtoWriter d;
  d.fixed64(1, 1.5);  // 0x3FF8000000000000 little-endian
  EXPECT_EQ(hex(d.data()), "09000000000000f83f");
  ProtoWriter f;
  f.fixed32(2, 2.0f);  // 0x40000000
  EXPECT_EQ(hex(f.data()), "1500000040");
  ProtoWriter s;
  s.bytes(16, "hi");  // field 16: a two-byte tag (16 << 3 | 2 = 130: 82 01)
  EXPECT_EQ(hex(s.data()), "820102" "6869");
}

TEST(Events, AScalarEventIsTheHandEncodedMessage) {
  // Event { wall_time: 1.5 (09 + 8 bytes), step: 3 (10 03), summary (2a 0d) {
  //   value (0a 0b) { tag: "loss" (0a 04 6c6f7373), simple_value: 2.0 (15 00000040) } } }
  EXPECT_EQ(hex(scalars_event(1.5, 3, {{"loss", 2.0f}})),
            "09000000000000f83f" "1003" "2a0d" "0a0b" "0a046c6f7373" "1500000040");
  // Step 0 is proto3's default: left out.
  EXPECT_EQ(hex(scalars_event(1.5, 0, {})), "09000000000000f83f" "2a00");
}

TEST(Events, FileVersionAndSessionStart) {
  EXPECT_EQ(hex(file_version_event(1.5)), "09000000000000f83f" "1a0d" + hex("brain.Event:2"));
  // session_log (field 7: 3a) { status: START (08 01) }
  EXPECT_EQ(hex(session_start_event(1.5, 7)), "09000000000000f83f" "1007" "3a02" "0801");
}

TEST(Records, FrameTheDataWithLengthAndMaskedCrcs) {
  const std::string event = scalars_event(1.5, 3, {{"loss", 2.0f}});
  ASSERT_EQ(event.size(), 26u);
  EXPECT_EQ(hex(record(event)),
            "1a00000000000000"  // uint64 length 26
            "129bd82d"          // masked CRC-32C of those 8 bytes (0x2dd89b12)
            "09000000000000f83f10032a0d0a0b0a046c6f73731500000040"
            "96100c33");        // masked CRC-32C of the data (0x330c1096)
}

}  // namespace
}  // namespace hdp::tfevents
