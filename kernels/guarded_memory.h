#pragma once
// Memory of the test-only device Device::Guarded: page-aligned regions in host RAM
// that stay closed (PROT_NONE) while no op runs. An op on guarded tensors, and a
// copy between host and guarded memory, hold a guarded::Access for its duration,
// which opens every region read-write; any other touch of guarded memory by the
// host faults, and the SIGSEGV handler installed with the first region names the
// region and aborts:
//   host access to guarded device memory at ADDR (arena NAME): a host-side read or
//   write of device memory
// Faults outside guarded regions go on to the handler installed before.

#include <cstddef>
#include <string>

namespace hdp::guarded {

// A new region of at least `bytes` (whole pages), closed unless an Access is held.
void* allocate(size_t bytes);
// Unmaps a region from allocate().
void deallocate(void* region);
// Names the region starting at `region` in fault messages (an arena's name).
void set_name(void* region, const std::string& name);

// Whether `p` lies inside a guarded region.
bool contains(const void* p);

// Scoped: guarded regions are open to the host while at least one Access lives in
// any thread (a process-wide count: the copy engine's worker and the main thread
// may hold one at once).
class Access {
 public:
  Access();
  ~Access();
  Access(const Access&) = delete;
  Access& operator=(const Access&) = delete;
};

}  // namespace hdp::guarded
