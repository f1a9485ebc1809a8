#pragma once
// Small RAII and error helpers over the HDF5 C API, used by data/ (and usable by
// any other HDF5 code in the project). Every function here expects the caller
// to hold hdf5_mutex() (see data/hdf5_lock.h), including handle destruction.

#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace hdp {

// An HDF5 call failed. The message names the operation and the innermost
// entries of HDF5's error stack (e.g. "unable to open file ... No such file").
class Hdf5Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Describes HDF5's current error stack in one line and clears it.
std::string hdf5_error_stack_message();

// Throw Hdf5Error("<what>: <stack>") when an HDF5 call returned a negative value.
hid_t h5check(hid_t id, const std::string& what);
herr_t h5check_status(herr_t status, const std::string& what);
bool h5check_tri(htri_t value, const std::string& what);

// Owns one hid_t and closes it with the matching H5?close function.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~H5Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Closes, ignoring errors (for destructors and unwinding).
  void reset() noexcept {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  // Closes and throws Hdf5Error if the close fails (a file close flushes data).
  void close(const std::string& what) {
    hid_t id = std::exchange(id_, H5I_INVALID_HID);
    if (id >= 0 && closer_) h5check_status(closer_(id), what);
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Checked constructors: call, check the id, wrap it with its closer.
inline H5Handle h5_file(hid_t id, const std::string& what) { return {h5check(id, what), H5Fclose}; }
inline H5Handle h5_dataset(hid_t id, const std::string& what) { return {h5check(id, what), H5Dclose}; }
inline H5Handle h5_space(hid_t id, const std::string& what) { return {h5check(id, what), H5Sclose}; }
inline H5Handle h5_type(hid_t id, const std::string& what) { return {h5check(id, what), H5Tclose}; }
inline H5Handle h5_attr(hid_t id, const std::string& what) { return {h5check(id, what), H5Aclose}; }
inline H5Handle h5_plist(hid_t id, const std::string& what) { return {h5check(id, what), H5Pclose}; }

// Attribute helpers on an object (file or dataset).
void h5_write_attr_u64(hid_t obj, const char* name, uint64_t value);
void h5_write_attr_u32(hid_t obj, const char* name, uint32_t value);
void h5_write_attr_string(hid_t obj, const char* name, const std::string& value);
bool h5_has_attr(hid_t obj, const char* name);
// Reads an integer attribute of any integer type (converted); throws Hdf5Error
// naming the attribute if it is missing, not scalar or not an integer.
uint64_t h5_read_attr_uint(hid_t obj, const char* name);
// Reads a fixed- or variable-length string attribute.
std::string h5_read_attr_string(hid_t obj, const char* name);

}  // namespace hdp
