#pragma once
// Where a tensor's memory lives. Every op dispatches on it (kernels/ops.cpp) to
// the backend of that device: kernels/cpu or kernels/cuda. Device::Guarded is a
// test-only device: the CPU kernels behind a device boundary, its memory closed to
// the host outside ops (kernels/guarded_memory.h), so that code above the kernels
// which reads device memory on the host fails without a GPU.

#include <stdexcept>
#include <string>

namespace hdp {

enum class Device { CPU, CUDA, Guarded };

inline const char* device_name(Device device) {
  switch (device) {
    case Device::CPU: return "cpu";
    case Device::CUDA: return "cuda";
    case Device::Guarded: return "guarded";
  }
  return "unknown";
}

// The device named in a config ("cpu", "cuda", "guarded").
inline Device device_from_name(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda") return Device::CUDA;
  if (name == "guarded") return Device::Guarded;
  throw std::invalid_argument("unknown device '" + name + "' (cpu, cuda or guarded)");
}

// Thrown when an op is asked to run on a backend this build does not have.
class UnsupportedDevice : public std::runtime_error {
 public:
  UnsupportedDevice(const std::string& op, Device device)
      : std::runtime_error(op + ": no " + device_name(device) + " backend in this build") {}
  // The backend is built in but cannot run here (no device, no driver): `reason` says why.
  UnsupportedDevice(const std::string& op, Device device, const std::string& reason)
      : std::runtime_error(op + ": no usable " + device_name(device) + " device (" + reason + ")") {}
};

}  // namespace hdp
