#pragma once
// Where a tensor's memory lives. Every op dispatches on it, so a CUDA backend
// adds a case here and a directory beside kernels/cpu without touching callers.

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

// Thrown when an op is asked to run on a backend this build does not have.
class UnsupportedDevice : public std::runtime_error {
 public:
  UnsupportedDevice(const std::string& op, Device device)
      : std::runtime_error(op + ": no " + device_name(device) + " backend in this build") {}
};

}  // namespace hdp
