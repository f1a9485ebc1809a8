#include "kernels/cpu/blas_threads.h"

// Declared here rather than relying on cblas.h, which declares them only in
// OpenBLAS's own copy of the header.
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char* openblas_get_corename(void);
}

namespace hdp::cpu {

int blas_num_threads() { return openblas_get_num_threads(); }

void set_blas_num_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

const char* blas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

}  // namespace hdp::cpu
