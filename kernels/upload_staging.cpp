#include "kernels/upload_staging.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hdp {
namespace {
DeviceAllocator& staging_memory(Device device) {
  return device == Device::CUDA ? pinned_host_allocator() : allocator_for(Device::CPU);
}
}  // namespace

UploadStaging::UploadStaging(Device device, int64_t capacity)
    : device_(device),
      buffer_(device == Device::CPU ? 0 : static_cast<size_t>(capacity),
              HostVectorAllocator<int32_t>(staging_memory(device))),
      copied_(device) {}

UploadStaging::~UploadStaging() {
  try {
    copied_.wait();
  } catch (...) {  // a failing device at exit: nothing left to protect
  }
}

void UploadStaging::begin() {
  copied_.wait();
  used_ = 0;
}

void UploadStaging::upload(IndexTensor dst, std::span<const int32_t> src) {
  const int64_t n = static_cast<int64_t>(src.size());
  const IndexTensor into = dst.rows(0, n);
  if (device_ == Device::CPU) {
    copy(into, IndexTensor(const_cast<int32_t*>(src.data()), {n}, Device::CPU));
    return;
  }
  if (used_ + n > static_cast<int64_t>(buffer_.size())) {
    throw std::logic_error("UploadStaging: " + std::to_string(used_ + n) + " values in a set, room for " +
                           std::to_string(buffer_.size()));
  }
  int32_t* staged = buffer_.data() + used_;
  std::copy_n(src.data(), n, staged);
  used_ += n;
  copy_async(into, IndexTensor(staged, {n}, Device::CPU));
  copied_.record();
}

}  // namespace hdp
