// The CUDA backend's entry points in a build without a CUDA compiler: every
// query answers "no device" and every allocation is refused with that reason.

#include <new>
#include <stdexcept>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/device.h"

namespace hdp::cuda {
namespace {
[[noreturn]] void absent() { throw std::runtime_error("train.device=cuda: this build has no CUDA backend (no nvcc found at configure time)"); }
}  // namespace

bool compiled() { return false; }
bool available(std::string* why) {
  if (why) *why = "this build has no CUDA backend";
  return false;
}
void require_device(const char* op) { throw UnsupportedDevice(op, Device::CUDA); }
void initialize(int) { absent(); }
int device_count() { return 0; }
std::string device_description() { absent(); }
void* device_malloc(size_t) { absent(); }
void device_free(void*) {}
void* pinned_malloc(size_t) { absent(); }
void pinned_free(void*) {}
void synchronize() {}
void* compute_stream_handle() { absent(); }
std::string device_bus_id() { absent(); }
void* copy_stream_create() { absent(); }
void copy_stream_destroy(void*) {}
void* copy_event_create() { absent(); }
void copy_event_destroy(void*) {}
void copy_after_compute(void*, void*, void*, void*, const void*, size_t) { absent(); }
void compute_wait_event(void*) { absent(); }
void copy_stream_synchronize(void*) {}
void* timing_event_create() { absent(); }
void timing_event_destroy(void*) {}
void event_record(void*) { absent(); }
bool event_done(void*) { return true; }
void event_synchronize(void*) {}
float event_elapsed_ms(void*, void*) { absent(); }
void set_tf32(bool) {}
bool op_times_enabled() { return false; }
OpTimer::OpTimer(const char*) {}
OpTimer::OpTimer(const char*, const GemmShape&) {}
OpTimer::~OpTimer() = default;
void op_times_reset() {}
std::string op_times_report() { return {}; }
bool tf32() { return false; }

}  // namespace hdp::cuda
