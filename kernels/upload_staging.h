#pragma once
// Host-to-device uploads of a micro-batch's index lists (tokens, targets, positions,
// document boundaries) that do not wait for the device. A copy from pageable host
// memory makes the host wait until the device has drained its queue up to it (a host
// wait, kernels/ops.h); instead the values go into a staging buffer of page-locked
// host memory, sized once, from which copy_async moves them on the compute stream,
// ordered before the ops that read them. One staging buffer per pipeline slot: it is
// refilled for the slot's next micro-batch only after its previous copies have run,
// which begin() waits for (they were enqueued before that micro-batch's forward and
// backward, so in a step they have long run and it does not block).
// On the CPU the destination is host memory: values are copied straight in, no buffer.

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"

namespace hdp {

class UploadStaging {
 public:
  // Room for `capacity` values a set of uploads (between two begin()s) into `device`.
  UploadStaging(Device device, int64_t capacity);
  // Waits for the last set's copies: the buffer must outlive them.
  ~UploadStaging();
  UploadStaging(UploadStaging&&) noexcept = default;
  UploadStaging& operator=(UploadStaging&&) = delete;

  // Starts a set of uploads in the buffer's first values, once the last set's copies have run.
  void begin();
  // dst rows [0, src.size()) <- src, through the buffer after this set's earlier values.
  void upload(IndexTensor dst, std::span<const int32_t> src);

 private:
  Device device_;
  std::vector<int32_t, HostVectorAllocator<int32_t>> buffer_;  // pinned on CUDA; empty on the CPU
  int64_t used_ = 0;                                           // values of this set
  DeviceEvent copied_;                                         // recorded after the set's last copy
};

}  // namespace hdp
