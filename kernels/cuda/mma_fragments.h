#pragma once
// Register layouts of the warp-wide tensor-core product
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   D (16x8) = A (16x16) B (16x8) + C
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), and of
//   mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32     D (16x8) = A (16x8) B (8x8) + C
// ("Matrix Fragments for mma.m16n8k8", namespace m16n8k8 below): which element of A, B
// and C each lane's registers hold. Plain C++ with __host__ __device__ functions, so
// the attention kernels (kernels/cuda/attention.cu) load their fragments through
// exactly these maps and a CPU test (tests/kernels_mma_fragments_test.cpp) checks them
// by emulating a warp.
//
// With g = lane / 4 (the group) and t = lane % 4 (the thread in the group):
//
//   A 16x16 row-major, 4 x .b32, each two bf16 (low half first):
//     a0 = A[g][2t],   A[g][2t+1]        a2 = A[g][2t+8],   A[g][2t+9]
//     a1 = A[g+8][2t], A[g+8][2t+1]      a3 = A[g+8][2t+8], A[g+8][2t+9]
//   B 16x8 (k x n) column-major, 2 x .b32, each two bf16 (low half first):
//     b0 = B[2t][g], B[2t+1][g]          b1 = B[2t+8][g], B[2t+9][g]
//   C, D 16x8, 4 x f32:
//     c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
//
// Two consequences the kernels use:
// - The two halves of an A register are adjacent columns of one row, and those of a
//   B register adjacent k of one column: from a row-major A, or from B stored as B^T
//   (row n holds B[.][n], e.g. K for S = Q K^T), each register is one aligned 32-bit
//   shared-memory load.
// - The C fragments of two neighbouring n-blocks (columns 8j..8j+15 of a 16-row
//   strip) are, element for element, the A fragment of that 16x16 block: register r
//   takes C values (2(r&1), 2(r&1)+1) of n-block 2j + (r>>1). So a product's result
//   (P = softmax(S), dS) becomes the next product's A operand in registers, without
//   shared memory (FlashAttention-2's register reuse: Dao, 2023).

#include "kernels/cuda/host_device.h"

namespace hdp::mma {

constexpr int kM = 16, kN = 8, kK = 16;  // the shape m16n8k16
constexpr int kARegs = 4, kBRegs = 2, kCRegs = 4;

HDP_HD constexpr int group_of(int lane) { return lane >> 2; }
HDP_HD constexpr int thread_in_group(int lane) { return lane & 3; }

// A: register r (0..3), half h (0 = low 16 bits, 1 = high).
HDP_HD constexpr int a_row(int lane, int r) { return group_of(lane) + 8 * (r & 1); }
HDP_HD constexpr int a_col(int lane, int r, int h) { return 2 * thread_in_group(lane) + h + 8 * (r >> 1); }

// B (k x n): register r (0..1), half h.
HDP_HD constexpr int b_k(int lane, int r, int h) { return 2 * thread_in_group(lane) + h + 8 * r; }
HDP_HD constexpr int b_n(int lane) { return group_of(lane); }

// C and D: value i (0..3).
HDP_HD constexpr int c_row(int lane, int i) { return group_of(lane) + 8 * (i >> 1); }
HDP_HD constexpr int c_col(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1); }

// A register r of the 16x16 block made of n-blocks 2j and 2j + 1 of a C strip: the
// n-block (2j + c_block_of_a(r)) and its first value (c_value_of_a(r); the second is
// the next one), low half first.
HDP_HD constexpr int c_block_of_a(int r) { return r >> 1; }
HDP_HD constexpr int c_value_of_a(int r) { return 2 * (r & 1); }

// m16n8k8 with .tf32 operands: one element per register. A's rows (a_row), B's column
// (b_n) and C are as above; k runs over 8:
//   A 16x8 row-major:  a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]
//   B 8x8 (k x n):     b0 = B[t][g], b1 = B[t+4][g]
// An A register holds column t or t + 4 where the lane's C values are columns 2t and
// 2t + 1, so a product's result reaches the next product's A through shared memory
// (stored at c_row, c_col; loaded at a_row, a_col).
namespace m16n8k8 {
constexpr int kK = 8;
HDP_HD constexpr int a_col(int lane, int r) { return thread_in_group(lane) + 4 * (r >> 1); }
HDP_HD constexpr int b_k(int lane, int r) { return thread_in_group(lane) + 4 * r; }
}  // namespace m16n8k8

}  // namespace hdp::mma
