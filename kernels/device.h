#pragma once
// Where a tensor's memory lives. Every op dispatches on it (kernels/ops.cpp) to
// the backend of that device: kernels/cpu or kernels/cuda. Device::Guarded is a
// test-only device: the CPU kernels behind a device boundary, its memory closed to
// the host outside ops (kernels/guarded_memory.h), so that code above the kernels
// which reads device memory on the host fails without a GPU.

#include <stdexcept>
#include <string>

#include "base/enum_names.h"

namespace hdp {

enum class Device { CPU, CUDA, Guarded };

// The names of the devices, as a config writes them (train.device).
inline constexpr EnumName<Device> kDeviceNames[] = {
    {Device::CPU, "cpu"}, {Device::CUDA, "cuda"}, {Device::Guarded, "guarded", "test-only"}};

inline const char* device_name(Device device) { return enum_name(kDeviceNames, device); }

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
