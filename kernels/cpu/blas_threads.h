#pragma once
// OpenBLAS thread control. The CPU backend keeps OpenBLAS at one thread and
// splits products over OpenMP threads itself (gemm.cpp), so the process has a
// single thread pool. The setting is process-wide.

namespace hdp::cpu {

int blas_num_threads();
void set_blas_num_threads(int n);
// The OpenBLAS kernel family in use (e.g. "Haswell"; OPENBLAS_CORETYPE overrides it),
// "unknown" when OpenBLAS does not say. Never null.
const char* blas_core_name();

}  // namespace hdp::cpu
