// The scalar attribute helpers of data/hdf5_util.h: values round trip, and an
// attribute that is missing, of the other class, not a single value or a
// negative integer is an Hdf5Error naming it.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>

#include "data/hdf5_lock.h"
#include "data/hdf5_util.h"
#include "test_util.h"

namespace hdp {
namespace {

std::string hdf5_error(const std::function<void()>& read) {
  try {
    read();
  } catch (const Hdf5Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Hdf5Error";
  return "";
}

// An attribute written with the raw API: `count` values of `type`.
void write_raw_attr(hid_t obj, const char* name, hid_t type, hsize_t count, const void* values) {
  H5Handle space = h5_space(H5Screate_simple(1, &count, nullptr), "space");
  H5Handle attr = h5_attr(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), "create");
  h5check_status(H5Awrite(attr.get(), type, values), "write");
}

TEST(DataHdf5Attributes, ScalarsRoundTripAndBadOnesAreNamed) {
  const std::string path = testing::scratch_dir("hdf5_attributes") + "/a.h5";
  Hdf5Lock lock;
  H5Handle file = h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "create " + path);
  const hid_t f = file.get();
  h5_write_attr_u64(f, "big", (uint64_t{1} << 63) + 5);
  h5_write_attr_u32(f, "small", 7);
  h5_write_attr_string(f, "name", "llama");
  h5_write_attr_string(f, "empty", "");
  const int64_t signed_values[2] = {12, -3};
  write_raw_attr(f, "signed", H5T_NATIVE_INT64, 1, &signed_values[0]);
  write_raw_attr(f, "negative", H5T_NATIVE_INT64, 1, &signed_values[1]);
  write_raw_attr(f, "pair", H5T_NATIVE_INT64, 2, signed_values);

  EXPECT_EQ(h5_read_attr_uint(f, "big"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(h5_read_attr_uint(f, "small"), 7u);
  EXPECT_EQ(h5_read_attr_uint(f, "signed"), 12u);
  EXPECT_EQ(h5_read_attr_string(f, "name"), "llama");
  EXPECT_EQ(h5_read_attr_string(f, "empty"), "");
  h5_write_attr_string(f, "name", "mistral");  // rewriting replaces
  EXPECT_EQ(h5_read_attr_string(f, "name"), "mistral");

  EXPECT_EQ(hdf5_error([&] { h5_read_attr_uint(f, "absent"); }), "attribute 'absent' is missing");
  EXPECT_EQ(hdf5_error([&] { h5_read_attr_string(f, "absent"); }), "attribute 'absent' is missing");
  EXPECT_EQ(hdf5_error([&] { h5_read_attr_uint(f, "name"); }), "attribute 'name' is not an integer");
  EXPECT_EQ(hdf5_error([&] { h5_read_attr_string(f, "small"); }), "attribute 'small' is not a string");
  EXPECT_EQ(hdf5_error([&] { h5_read_attr_uint(f, "pair"); }), "attribute 'pair' is not a single value");
  EXPECT_EQ(hdf5_error([&] { h5_read_attr_string(f, "pair"); }), "attribute 'pair' is not a single value");
  EXPECT_EQ(hdf5_error([&] { h5_read_attr_uint(f, "negative"); }), "attribute 'negative' is negative (-3)");
}

}  // namespace
}  // namespace hdp
