#include "data/hdf5_util.h"

#include <algorithm>
#include <vector>

#include "data/hdf5_lock.h"

namespace hdp {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

void hdf5_skip_exit_cleanup() { H5dont_atexit(); }

void hdf5_silence_errors() {
  // The setting lives in the library's (global, non-thread-safe build) default
  // error stack; re-applying it is cheap and also covers an H5close/H5open cycle.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

namespace {

struct StackEntry {
  std::string func;
  std::string desc;
  std::string minor;
};

herr_t collect_entry(unsigned, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<StackEntry>*>(data);
  StackEntry e;
  if (err->func_name) e.func = err->func_name;
  if (err->desc) e.desc = err->desc;
  char buf[256];
  H5E_type_t type;
  if (H5Eget_msg(err->min_num, &type, buf, sizeof buf) > 0) e.minor = buf;
  out->push_back(std::move(e));
  return 0;
}

// The file driver's I/O errors carry a long record over two lines (time, file
// name, descriptor, buffer address, sizes) with the system's message inside, e.g.
// 'No space left on device': that message is what the reader needs.
std::string condensed(std::string desc) {
  std::replace(desc.begin(), desc.end(), '\n', ' ');
  const std::string marker = "error message = '";
  const size_t at = desc.find(marker);
  if (at == std::string::npos) return desc;
  const size_t begin = at + marker.size(), end = desc.find('\'', begin);
  const size_t head = desc.find(": time = ");
  return (head == std::string::npos ? std::string("I/O failed") : desc.substr(0, head)) + ": " +
         desc.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string describe(const StackEntry& e) {
  std::string s = e.desc.empty() ? e.minor : condensed(e.desc);
  if (!e.minor.empty() && !e.desc.empty() && e.minor != e.desc) s += " (" + e.minor + ")";
  return s;
}

}  // namespace

std::string hdf5_error_stack_message() {
  std::vector<StackEntry> entries;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_entry, &entries);
  H5Eclear2(H5E_DEFAULT);
  if (entries.empty()) return "HDF5 call failed (no error details)";
  // Downward: the API call first, the innermost cause last. Both are useful.
  std::string msg = describe(entries.front());
  if (entries.size() > 1) msg += ": " + describe(entries.back());
  return msg;
}

hid_t h5check(hid_t id, const std::string& what) {
  if (id < 0) throw Hdf5Error(what + ": " + hdf5_error_stack_message());
  return id;
}

herr_t h5check_status(herr_t status, const std::string& what) {
  if (status < 0) throw Hdf5Error(what + ": " + hdf5_error_stack_message());
  return status;
}

bool h5check_tri(htri_t value, const std::string& what) {
  if (value < 0) throw Hdf5Error(what + ": " + hdf5_error_stack_message());
  return value > 0;
}

namespace {

void write_scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* value) {
  std::string what = std::string("writing attribute '") + name + "'";
  if (h5check_tri(H5Aexists(obj, name), what)) h5check_status(H5Adelete(obj, name), what);
  H5Handle space = h5_space(H5Screate(H5S_SCALAR), what);
  H5Handle attr = h5_attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), what);
  h5check_status(H5Awrite(attr.get(), mem_type, value), what);
  attr.close(what);
}

// The attribute `name` of `obj`, which must exist and hold a single value of
// `type_class` (`class_name` says which in the error), and its type.
struct ScalarAttr {
  H5Handle attr, type;
};
ScalarAttr open_scalar_attr(hid_t obj, const char* name, H5T_class_t type_class, const char* class_name,
                            const std::string& what) {
  if (!h5_has_attr(obj, name)) throw Hdf5Error(what + " is missing");
  ScalarAttr a;
  a.attr = h5_attr(H5Aopen(obj, name, H5P_DEFAULT), "opening " + what);
  H5Handle space = h5_space(H5Aget_space(a.attr.get()), what);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) throw Hdf5Error(what + " is not a single value");
  a.type = h5_type(H5Aget_type(a.attr.get()), what);
  if (H5Tget_class(a.type.get()) != type_class) throw Hdf5Error(what + " is not " + class_name);
  return a;
}

}  // namespace

void h5_write_attr_u64(hid_t obj, const char* name, uint64_t value) {
  write_scalar_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

void h5_write_attr_u32(hid_t obj, const char* name, uint32_t value) {
  write_scalar_attr(obj, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &value);
}

void h5_write_attr_string(hid_t obj, const char* name, const std::string& value) {
  std::string what = std::string("writing attribute '") + name + "'";
  H5Handle type = h5_type(H5Tcopy(H5T_C_S1), what);
  h5check_status(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), what);
  h5check_status(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), what);
  h5check_status(H5Tset_cset(type.get(), H5T_CSET_UTF8), what);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  write_scalar_attr(obj, name, type.get(), type.get(), padded.data());
}

bool h5_has_attr(hid_t obj, const char* name) {
  return h5check_tri(H5Aexists(obj, name), std::string("checking attribute '") + name + "'");
}

uint64_t h5_read_attr_uint(hid_t obj, const char* name) {
  const std::string what = std::string("attribute '") + name + "'";
  const auto [attr, type] = open_scalar_attr(obj, name, H5T_INTEGER, "an integer", what);
  if (H5Tget_sign(type.get()) == H5T_SGN_2) {
    int64_t v = 0;
    h5check_status(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), "reading " + what);
    if (v < 0) throw Hdf5Error(what + " is negative (" + std::to_string(v) + ")");
    return static_cast<uint64_t>(v);
  }
  uint64_t v = 0;
  h5check_status(H5Aread(attr.get(), H5T_NATIVE_UINT64, &v), "reading " + what);
  return v;
}

std::string h5_read_attr_string(hid_t obj, const char* name) {
  const std::string what = std::string("attribute '") + name + "'";
  const auto [attr, type] = open_scalar_attr(obj, name, H5T_STRING, "a string", what);
  if (h5check_tri(H5Tis_variable_str(type.get()), what)) {
    H5Handle mem = h5_type(H5Tcopy(H5T_C_S1), what);
    h5check_status(H5Tset_size(mem.get(), H5T_VARIABLE), what);
    h5check_status(H5Tset_cset(mem.get(), H5Tget_cset(type.get())), what);
    char* ptr = nullptr;
    h5check_status(H5Aread(attr.get(), mem.get(), &ptr), "reading " + what);
    std::string value = ptr ? ptr : "";
    H5free_memory(ptr);
    return value;
  }
  size_t size = H5Tget_size(type.get());
  if (size == 0) throw Hdf5Error(what + " has size 0");
  std::vector<char> buf(size + 1, '\0');
  h5check_status(H5Aread(attr.get(), type.get(), buf.data()), "reading " + what);
  return std::string(buf.data());  // stops at the first NUL (null-terminated or padded)
}

}  // namespace hdp
