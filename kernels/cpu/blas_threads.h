#pragma once
// OpenBLAS thread control. OpenBLAS (pthread build) keeps its own thread pool,
// separate from OpenMP's. Calling cblas from inside an OpenMP parallel region
// with OpenBLAS threading still on oversubscribes the cores, so such code forces
// BLAS to one thread for the duration of the region with BlasThreadsScope.
//
// openblas_set_num_threads is process-wide: create the scope on the thread that
// owns the OpenMP region, outside the region, never inside it.

namespace hdp::cpu {

int blas_num_threads();
void set_blas_num_threads(int n);
// The OpenBLAS kernel family in use (e.g. "Haswell"; OPENBLAS_CORETYPE overrides it).
const char* blas_core_name();

// Sets OpenBLAS to `n` threads and restores the previous count on destruction.
class BlasThreadsScope {
 public:
  explicit BlasThreadsScope(int n = 1);
  ~BlasThreadsScope();
  BlasThreadsScope(const BlasThreadsScope&) = delete;
  BlasThreadsScope& operator=(const BlasThreadsScope&) = delete;

 private:
  int previous_;
};

}  // namespace hdp::cpu
