#pragma once
// Where a tensor's memory lives. Every op dispatches on it (kernels/ops.cpp) to
// the backend of that device: kernels/cpu or kernels/cuda.

#include <stdexcept>
#include <string>

namespace hdp {

enum class Device { CPU, CUDA };

inline const char* device_name(Device device) {
  switch (device) {
    case Device::CPU: return "cpu";
    case Device::CUDA: return "cuda";
  }
  return "unknown";
}

// The device named in a config ("cpu", "cuda").
inline Device device_from_name(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda") return Device::CUDA;
  throw std::invalid_argument("unknown device '" + name + "' (cpu or cuda)");
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
