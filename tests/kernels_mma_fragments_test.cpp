// What of the bf16 tensor-core attention (kernels/cuda/attention.cu) can be checked
// without a GPU:
//  1. The fragment maps (kernels/cuda/mma_fragments.h) the kernels load their
//     registers with. One warp's mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 is
//     emulated lane by lane from the PTX ISA's own description of the fragments
//     (written out below independently of the maps: element index i of a lane,
//     register i / 2, half i % 2); registers are filled as the kernels fill them
//     (one 32-bit word per register, from a row-major A and from B stored as B^T;
//     the P/dS hand-over from C fragments to A fragments), and the result must be
//     the plain matrix product. The TF32 kernels' m16n8k8 maps (the same kernel
//     code, on the other kind of product) are checked the same way: A row-major, B
//     stored as B^T or row-major, P/dS through the warp's shared strip.
//  2. The tolerance of the selftest's bf16 attention rows on that path
//     (kBf16TensorCoreAttentionTolerance, kernels/backend_check.h). The kernels
//     round P and dS to bf16 where they become A operands; the CPU twin does not.
//     The same rounding points are emulated on the CPU (same tiles, same on-line
//     softmax order) on the selftest's shapes and inputs, and compared with the
//     twin as the selftest compares the GPU: the measured differences must stay
//     within half the tolerance.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_check.h"
#include "kernels/cuda/mma_fragments.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace {

namespace mma = hdp::mma;
using hdp::bf16;
using hdp::round_bf16;
using hdp::to_bf16;
using hdp::to_float;

// ---------------------------------------------------------------- one warp's mma

constexpr int kLanes = 32;

struct WarpRegisters {
  std::array<std::array<uint32_t, 4>, kLanes> a{};
  std::array<std::array<uint32_t, 2>, kLanes> b{};
  std::array<std::array<float, 4>, kLanes> c{};
};

uint32_t pack(float lo, float hi) {  // two bf16 in a .b32, lo in the low half
  return static_cast<uint32_t>(to_bf16(lo).bits) | (static_cast<uint32_t>(to_bf16(hi).bits) << 16);
}
float half_of(uint32_t reg, int h) { return to_float(bf16{static_cast<uint16_t>(h ? reg >> 16 : reg & 0xffffu)}); }

// The PTX ISA's description of mma.m16n8k16 with .bf16 operands, element by element:
// a lane holds A elements a0..a7 (a_i in register i / 2, half i % 2), B elements
// b0..b3 (likewise) and C elements c0..c3, with groupID = lane >> 2 and
// threadID_in_group = lane % 4:
//   A: row = groupID for i < 2 or 4 <= i < 6, groupID + 8 otherwise;
//      col = threadID_in_group * 2 + (i & 1), + 8 for i >= 4
//   B: row = threadID_in_group * 2 + (i & 1), + 8 for i >= 2;  col = groupID
//   C: row = groupID for i < 2, groupID + 8 otherwise;  col = threadID_in_group * 2 + (i & 1)
// The emulation gathers A and B from every lane, checking that each element is
// held exactly once, and scatters D = A B + C back.
void emulate_mma(WarpRegisters& w) {
  float A[16][16], B[16][8];
  int seen_a[16][16] = {}, seen_b[16][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int group = lane >> 2, tig = lane % 4;
    for (int i = 0; i < 8; ++i) {
      const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
      const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = half_of(w.a[lane][i / 2], i % 2);
      ++seen_a[row][col];
    }
    for (int i = 0; i < 4; ++i) {
      const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = group;
      B[row][col] = half_of(w.b[lane][i / 2], i % 2);
      ++seen_b[row][col];
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) ASSERT_EQ(seen_a[r][c], 1) << "A element " << r << "," << c;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) ASSERT_EQ(seen_b[r][c], 1) << "B element " << r << "," << c;
  for (int lane = 0; lane < kLanes; ++lane) {
    const int group = lane >> 2, tig = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? group : group + 8, col = tig * 2 + (i & 1);
      double sum = w.c[lane][i];
      for (int k = 0; k < 16; ++k) sum += static_cast<double>(A[row][k]) * B[k][col];
      w.c[lane][i] = static_cast<float>(sum);
    }
  }
}

// Registers filled as Bf16Mma::frag_a / frag_b fill them: register r is the 32-bit
// word at the low half's element, so the high half must be the next element.
void load_a(WarpRegisters& w, const std::vector<float>& A, int ld) {  // A row-major, 16 x 16
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < mma::kARegs; ++r) {
      const int row = mma::a_row(lane, r), col = mma::a_col(lane, r, 0);
      ASSERT_EQ(mma::a_col(lane, r, 1), col + 1);
      ASSERT_EQ(col % 2, 0) << "a 32-bit load must be aligned";
      w.a[lane][r] = pack(A[row * ld + col], A[row * ld + col + 1]);
    }
}
void load_b(WarpRegisters& w, const std::vector<float>& Bt, int ld) {  // B stored transposed: B[k][n] = Bt[n][k]
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < mma::kBRegs; ++r) {
      const int n = mma::b_n(lane), k = mma::b_k(lane, r, 0);
      ASSERT_EQ(mma::b_k(lane, r, 1), k + 1);
      ASSERT_EQ(k % 2, 0) << "a 32-bit load must be aligned";
      w.b[lane][r] = pack(Bt[n * ld + k], Bt[n * ld + k + 1]);
    }
}

// n uniform values in [lo, hi), rounded to bf16 (held in fp32).
std::vector<float> random_values(std::mt19937& rng, size_t n, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = round_bf16(u(rng));
  return x;
}

TEST(MmaFragments, MapsCoverEveryElementOnce) {
  int a[16][16] = {}, b[16][8] = {}, c[16][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int r = 0; r < mma::kARegs; ++r)
      for (int h = 0; h < 2; ++h) ++a[mma::a_row(lane, r)][mma::a_col(lane, r, h)];
    for (int r = 0; r < mma::kBRegs; ++r)
      for (int h = 0; h < 2; ++h) ++b[mma::b_k(lane, r, h)][mma::b_n(lane)];
    for (int i = 0; i < mma::kCRegs; ++i) ++c[mma::c_row(lane, i)][mma::c_col(lane, i)];
  }
  for (int r = 0; r < 16; ++r) {
    for (int col = 0; col < 16; ++col) EXPECT_EQ(a[r][col], 1) << "A " << r << "," << col;
    for (int col = 0; col < 8; ++col) EXPECT_EQ(c[r][col], 1) << "C " << r << "," << col;
  }
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) EXPECT_EQ(b[k][n], 1) << "B " << k << "," << n;
}

// A (16 x 16, row-major, padded rows as in shared memory) times B (stored as B^T,
// e.g. K in S = Q K^T), through the maps and the emulated instruction.
TEST(MmaFragments, WarpProductEqualsMatrixProduct) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int lda = 16 + 8, ldb = 16 + 8;  // the kernels' padding: D + 8 halves
    const std::vector<float> A = random_values(rng, 16 * lda), Bt = random_values(rng, 8 * ldb),
                             C = random_values(rng, 16 * 8);
    WarpRegisters w;
    load_a(w, A, lda);
    load_b(w, Bt, ldb);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < mma::kCRegs; ++i) w.c[lane][i] = C[mma::c_row(lane, i) * 8 + mma::c_col(lane, i)];
    emulate_mma(w);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < mma::kCRegs; ++i) {
        const int row = mma::c_row(lane, i), col = mma::c_col(lane, i);
        double want = C[row * 8 + col];
        for (int k = 0; k < 16; ++k) want += static_cast<double>(A[row * lda + k]) * Bt[col * ldb + k];
        EXPECT_NEAR(w.c[lane][i], want, 1e-5 * (1 + std::abs(want))) << "lane " << lane << " c" << i;
      }
  }
}

// FlashAttention-2's hand-over: the C fragments of S = A1 B1 over two n-blocks
// (16 x 16) become, rounded to bf16, the A fragment of P B2 in registers
// (c_block_of_a, c_value_of_a; Bf16Mma::frag_a_handed). The result must be round_bf16(S) B2.
TEST(MmaFragments, AccumulatorBecomesOperandInRegisters) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int ld = 16;
    const std::vector<float> A1 = random_values(rng, 16 * ld), B1t = random_values(rng, 16 * ld),
                             B2t = random_values(rng, 8 * ld);
    // S's two n-blocks (columns 0..7 and 8..15) as C fragments per lane.
    std::array<std::array<std::array<float, 4>, 2>, kLanes> s{};
    for (int nb = 0; nb < 2; ++nb) {
      WarpRegisters w;
      load_a(w, A1, ld);
      const std::vector<float> block(B1t.begin() + nb * 8 * ld, B1t.begin() + (nb + 1) * 8 * ld);
      load_b(w, block, ld);
      emulate_mma(w);
      for (int lane = 0; lane < kLanes; ++lane) s[lane][nb] = w.c[lane];
    }
    WarpRegisters w;
    for (int lane = 0; lane < kLanes; ++lane)
      for (int r = 0; r < mma::kARegs; ++r) {
        const auto& cb = s[lane][mma::c_block_of_a(r)];
        w.a[lane][r] = pack(cb[mma::c_value_of_a(r)], cb[mma::c_value_of_a(r) + 1]);
      }
    load_b(w, B2t, ld);
    emulate_mma(w);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < mma::kCRegs; ++i) {
        const int row = mma::c_row(lane, i), col = mma::c_col(lane, i);
        double want = 0;
        for (int k = 0; k < 16; ++k) {
          double sk = 0;
          for (int x = 0; x < 16; ++x) sk += static_cast<double>(A1[row * ld + x]) * B1t[k * ld + x];
          want += static_cast<double>(round_bf16(static_cast<float>(sk))) * B2t[col * ld + k];
        }
        EXPECT_NEAR(w.c[lane][i], want, 1e-4 * (1 + std::abs(want))) << "lane " << lane << " c" << i;
      }
  }
}

// ---------------------------------------------------------------- one warp's m16n8k8 tf32 mma

namespace k8 = hdp::mma::m16n8k8;

struct WarpRegistersTf32 {  // one tf32 value (held in fp32) per register
  std::array<std::array<float, 4>, kLanes> a{};
  std::array<std::array<float, 2>, kLanes> b{};
  std::array<std::array<float, 4>, kLanes> c{};
};

// The PTX ISA's description of mma.m16n8k8 with .tf32 operands, element by element,
// with groupID = lane >> 2 and threadID_in_group = lane % 4:
//   A: row = groupID for a0, a2, groupID + 8 for a1, a3;
//      col = threadID_in_group for a0, a1, threadID_in_group + 4 for a2, a3
//   B: row = threadID_in_group for b0, threadID_in_group + 4 for b1;  col = groupID
//   C: as for m16n8k16.
void emulate_mma_tf32(WarpRegistersTf32& w) {
  float A[16][8], B[8][8];
  int seen_a[16][8] = {}, seen_b[8][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int group = lane >> 2, tig = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = (i == 0 || i == 2) ? group : group + 8, col = i < 2 ? tig : tig + 4;
      A[row][col] = w.a[lane][i];
      ++seen_a[row][col];
    }
    for (int i = 0; i < 2; ++i) {
      const int row = i == 0 ? tig : tig + 4, col = group;
      B[row][col] = w.b[lane][i];
      ++seen_b[row][col];
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) ASSERT_EQ(seen_a[r][c], 1) << "A element " << r << "," << c;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) ASSERT_EQ(seen_b[r][c], 1) << "B element " << r << "," << c;
  for (int lane = 0; lane < kLanes; ++lane) {
    const int group = lane >> 2, tig = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? group : group + 8, col = tig * 2 + (i & 1);
      double sum = w.c[lane][i];
      for (int k = 0; k < 8; ++k) sum += static_cast<double>(A[row][k]) * B[k][col];
      w.c[lane][i] = static_cast<float>(sum);
    }
  }
}

// Registers filled as Tf32Mma::frag_a (A row-major), frag_b (B stored as B^T: row n
// holds B[.][n], e.g. K for S = Q K^T) and frag_b_kn (B row-major, e.g. V for P V)
// fill them.
void load_a_tf32(WarpRegistersTf32& w, const std::vector<float>& A, int ld) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < mma::kARegs; ++r) w.a[lane][r] = A[mma::a_row(lane, r) * ld + k8::a_col(lane, r)];
}
void load_b_tf32(WarpRegistersTf32& w, const std::vector<float>& Bt, int ld) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < mma::kBRegs; ++r) w.b[lane][r] = Bt[mma::b_n(lane) * ld + k8::b_k(lane, r)];
}
void load_b_kn_tf32(WarpRegistersTf32& w, const std::vector<float>& B, int ld) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < mma::kBRegs; ++r) w.b[lane][r] = B[k8::b_k(lane, r) * ld + mma::b_n(lane)];
}

TEST(MmaFragmentsTf32, MapsCoverEveryElementOnce) {
  int a[16][8] = {}, b[8][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int r = 0; r < mma::kARegs; ++r) ++a[mma::a_row(lane, r)][k8::a_col(lane, r)];
    for (int r = 0; r < mma::kBRegs; ++r) ++b[k8::b_k(lane, r)][mma::b_n(lane)];
  }
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 8; ++col) EXPECT_EQ(a[r][col], 1) << "A " << r << "," << col;
  for (int k = 0; k < 8; ++k)
    for (int n = 0; n < 8; ++n) EXPECT_EQ(b[k][n], 1) << "B " << k << "," << n;
}

// A (16 x 8, row-major, rows padded as the kernels pad them: D + 4) times B, stored as
// B^T (rows of D + 4) or row-major (rows of D + 8, the forward's V), through the maps
// and the emulated instruction. bf16-rounded values are exact in tf32.
TEST(MmaFragmentsTf32, WarpProductEqualsMatrixProduct) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 20; ++trial) {
    const int lda = 8 + 4, ldbt = 8 + 4, ldb = 8 + 8;
    const std::vector<float> A = random_values(rng, 16 * lda), Bt = random_values(rng, 8 * ldbt),
                             C = random_values(rng, 16 * 8);
    std::vector<float> B(8 * ldb, 0.0f);  // the same B, row-major
    for (int k = 0; k < 8; ++k)
      for (int n = 0; n < 8; ++n) B[k * ldb + n] = Bt[n * ldbt + k];
    for (const bool row_major : {false, true}) {
      WarpRegistersTf32 w;
      load_a_tf32(w, A, lda);
      if (row_major)
        load_b_kn_tf32(w, B, ldb);
      else
        load_b_tf32(w, Bt, ldbt);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int i = 0; i < mma::kCRegs; ++i) w.c[lane][i] = C[mma::c_row(lane, i) * 8 + mma::c_col(lane, i)];
      emulate_mma_tf32(w);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int i = 0; i < mma::kCRegs; ++i) {
          const int row = mma::c_row(lane, i), col = mma::c_col(lane, i);
          double want = C[row * 8 + col];
          for (int k = 0; k < 8; ++k) want += static_cast<double>(A[row * lda + k]) * Bt[col * ldbt + k];
          EXPECT_NEAR(w.c[lane][i], want, 1e-5 * (1 + std::abs(want)))
              << (row_major ? "B row-major" : "B^T") << " lane " << lane << " c" << i;
        }
    }
  }
}

// The TF32 kernels' hand-over: the C fragments of S = A1 B1 (16 x 8) are stored into
// the warp's strip at their C positions (c_row, c_col; rows of 8 + 4) and read back as
// the A fragment of P B2 (a_row, a_col). The result must be S B2.
TEST(MmaFragmentsTf32, StripHandsTheAccumulatorToTheNextProduct) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 20; ++trial) {
    const int ld = 8 + 4;
    const std::vector<float> A1 = random_values(rng, 16 * ld), B1t = random_values(rng, 8 * ld),
                             B2t = random_values(rng, 8 * ld);
    WarpRegistersTf32 w1;
    load_a_tf32(w1, A1, ld);
    load_b_tf32(w1, B1t, ld);
    emulate_mma_tf32(w1);
    std::vector<float> strip(16 * ld, std::numeric_limits<float>::quiet_NaN());  // every element written once
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < mma::kCRegs; ++i) strip[mma::c_row(lane, i) * ld + mma::c_col(lane, i)] = w1.c[lane][i];
    WarpRegistersTf32 w2;
    load_a_tf32(w2, strip, ld);
    load_b_tf32(w2, B2t, ld);
    emulate_mma_tf32(w2);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < mma::kCRegs; ++i) {
        const int row = mma::c_row(lane, i), col = mma::c_col(lane, i);
        double want = 0;
        for (int k = 0; k < 8; ++k) {
          double sk = 0;
          for (int x = 0; x < 8; ++x) sk += static_cast<double>(A1[row * ld + x]) * B1t[k * ld + x];
          want += static_cast<double>(static_cast<float>(sk)) * B2t[col * ld + k];
        }
        EXPECT_NEAR(w2.c[lane][i], want, 1e-4 * (1 + std::abs(want))) << "lane " << lane << " c" << i;
      }
  }
}

// ---------------------------------------------------------------- the rounding points

// Packed documents with an optional sliding window: query i sees keys
// [max(start of its document, i - W + 1), i] (kernels/ops.h).
struct Case {
  std::vector<int32_t> doc_lengths;
  int Hq, Hkv, d;
  int64_t window = hdp::kNoWindow;
};

struct Problem {
  int T, Hq, Hkv, d;
  int64_t window;
  std::vector<int32_t> cu;
  std::vector<float> q, k, v, dout;  // bf16 values held in fp32
  std::vector<int> lo, hi;           // keys of each query row
};

Problem make_problem(const Case& c, std::mt19937& rng) {
  Problem p;
  p.cu = {0};
  for (int32_t n : c.doc_lengths) p.cu.push_back(p.cu.back() + n);
  p.T = p.cu.back();
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.d = c.d;
  p.window = c.window;
  // As the selftest draws them (kernels/backend_check.cpp, check_attention).
  p.q = random_values(rng, static_cast<size_t>(p.T) * p.Hq * p.d, -2, 2);
  p.k = random_values(rng, static_cast<size_t>(p.T) * p.Hkv * p.d, -2, 2);
  p.v = random_values(rng, static_cast<size_t>(p.T) * p.Hkv * p.d, -1, 1);
  p.dout = random_values(rng, static_cast<size_t>(p.T) * p.Hq * p.d, -1, 1);
  const long long W = c.window == hdp::kNoWindow ? (1LL << 40) : c.window;
  for (size_t doc = 0; doc + 1 < p.cu.size(); ++doc)
    for (int i = p.cu[doc]; i < p.cu[doc + 1]; ++i) {
      p.lo.push_back(static_cast<int>(std::max<long long>(p.cu[doc], i - W + 1)));
      p.hi.push_back(i);
    }
  return p;
}

struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

std::vector<bf16> to_bf16_vector(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = to_bf16(x[i]);
  return y;
}
std::vector<float> to_float_vector(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = to_float(x[i]);
  return y;
}

// The CPU bf16 twin (fp32 throughout, one rounding on store): what the selftest
// compares the GPU with. The backward takes `fwd`'s out and lse, as the selftest
// gives both backends the CPU's (share_reference).
Results twin(const Problem& p) {
  const int64_t T = p.T, Hq = p.Hq, Hkv = p.Hkv, d = p.d;
  std::vector<bf16> q = to_bf16_vector(p.q), k = to_bf16_vector(p.k), v = to_bf16_vector(p.v),
                    dout = to_bf16_vector(p.dout), out(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
  std::vector<float> lse(static_cast<size_t>(Hq * T));
  std::vector<int32_t> cu = p.cu;
  const hdp::IndexTensor cus(cu.data(), {static_cast<int64_t>(cu.size())});
  const auto t = [](std::vector<bf16>& x, int64_t a, int64_t b, int64_t c) {
    return hdp::Tensor::of_bf16(x.data(), {a, b, c});
  };
  hdp::attention_forward(t(out, T, Hq, d), hdp::Tensor(lse.data(), {Hq, T}), t(q, T, Hq, d), t(k, T, Hkv, d),
                         t(v, T, Hkv, d), cus, p.window);
  hdp::attention_backward(t(dq, T, Hq, d), t(dk, T, Hkv, d), t(dv, T, Hkv, d), t(dout, T, Hq, d), t(q, T, Hq, d),
                          t(k, T, Hkv, d), t(v, T, Hkv, d), t(out, T, Hq, d), hdp::Tensor(lse.data(), {Hq, T}), cus,
                          p.window);
  return {to_float_vector(out), lse, to_float_vector(dq), to_float_vector(dk), to_float_vector(dv)};
}

float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int c = 0; c < n; ++c) s = std::fma(a[c], b[c], s);
  return s;
}

// The bf16 tensor-core kernels' arithmetic on the CPU: products of bf16 values
// accumulated in fp32, the forward's on-line softmax over the same key tiles
// (64-row query tiles; key tiles of 64 from the smallest first key of the tile's
// rows), and P and dS rounded to bf16 exactly where the kernels round them (with
// round_operands; without, the twin's arithmetic in the kernels' order). The
// backward starts from the twin's out and lse (as the selftest's does).
Results emulate_kernels(const Problem& p, const Results& reference, bool round_operands) {
  const auto operand = [round_operands](float x) { return round_operands ? round_bf16(x) : x; };
  constexpr int kRows = 64, kKeyTile = 64;
  const int T = p.T, Hq = p.Hq, Hkv = p.Hkv, d = p.d, group = Hq / Hkv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  Results r;
  r.out.assign(p.q.size(), 0.0f);
  r.lse.assign(static_cast<size_t>(Hq) * T, 0.0f);
  const auto qrow = [&](const std::vector<float>& x, int i, int h) { return &x[(static_cast<size_t>(i) * Hq + h) * d]; };
  const auto krow = [&](const std::vector<float>& x, int j, int h) {
    return &x[(static_cast<size_t>(j) * Hkv + h) * d];
  };
  for (int h = 0; h < Hq; ++h) {
    const int kvh = h / group;
    for (int i0 = 0; i0 < T; i0 += kRows) {
      const int rows = std::min(kRows, T - i0);
      int klo = std::numeric_limits<int>::max(), khi = -1;
      for (int i = i0; i < i0 + rows; ++i) {
        klo = std::min(klo, p.lo[i]);
        khi = std::max(khi, p.hi[i]);
      }
      for (int i = i0; i < i0 + rows; ++i) {
        float m = -INFINITY, l = 1.0f;
        std::vector<float> acc(static_cast<size_t>(d), 0.0f);
        for (int k0 = klo; k0 <= khi; k0 += kKeyTile) {
          float s[kKeyTile], mx = -INFINITY;
          for (int x = 0; x < kKeyTile; ++x) {
            const int j = k0 + x;
            const bool vis = j >= p.lo[i] && j <= p.hi[i];
            s[x] = vis ? dot(qrow(p.q, i, h), krow(p.k, j, kvh), d) * scale : -INFINITY;
            mx = std::max(mx, s[x]);
          }
          const float mnew = std::max(m, mx);
          if (mnew == -INFINITY) continue;  // alpha = 1, P = 0
          const float alpha = std::exp(m - mnew);
          float sum = 0;
          for (int c = 0; c < d; ++c) acc[static_cast<size_t>(c)] *= alpha;
          for (int x = 0; x < kKeyTile; ++x) {
            const float pj = std::exp(s[x] - mnew);
            sum += pj;  // l from the fp32 P
            if (pj == 0.0f) continue;
            const float pr = operand(pj);  // the rounding point of P
            const float* vr = krow(p.v, k0 + x, kvh);
            for (int c = 0; c < d; ++c) acc[static_cast<size_t>(c)] = std::fma(pr, vr[c], acc[static_cast<size_t>(c)]);
          }
          l = l * alpha + sum;
          m = mnew;
        }
        float* o = &r.out[(static_cast<size_t>(i) * Hq + h) * d];
        for (int c = 0; c < d; ++c) o[c] = round_bf16(acc[static_cast<size_t>(c)] / l);
        r.lse[static_cast<size_t>(h) * T + i] = m + std::log(l);
      }
    }
  }
  // Backward from the reference's out and lse.
  std::vector<float> dq(p.q.size(), 0.0f), dk(p.k.size(), 0.0f), dv(p.k.size(), 0.0f);
  for (int h = 0; h < Hq; ++h) {
    const int kvh = h / group;
    for (int i = 0; i < T; ++i) {
      if (p.lo[i] > p.hi[i]) continue;
      const float lse = reference.lse[static_cast<size_t>(h) * T + i];
      const float D = dot(qrow(p.dout, i, h), qrow(reference.out, i, h), d);
      for (int j = p.lo[i]; j <= p.hi[i]; ++j) {
        const float pij = std::exp(dot(qrow(p.q, i, h), krow(p.k, j, kvh), d) * scale - lse);
        const float dp = dot(qrow(p.dout, i, h), krow(p.v, j, kvh), d);
        const float ds = operand(pij * (dp - D) * scale);  // the rounding point of dS
        const float pr = operand(pij);                      // and of P^T (dV)
        for (int c = 0; c < d; ++c) {
          dq[(static_cast<size_t>(i) * Hq + h) * d + c] += ds * krow(p.k, j, kvh)[c];
          dk[(static_cast<size_t>(j) * Hkv + kvh) * d + c] += ds * qrow(p.q, i, h)[c];
          dv[(static_cast<size_t>(j) * Hkv + kvh) * d + c] += pr * qrow(p.dout, i, h)[c];
        }
      }
    }
  }
  for (float& x : dq) x = round_bf16(x);
  for (float& x : dk) x = round_bf16(x);
  for (float& x : dv) x = round_bf16(x);
  r.dq = std::move(dq);
  r.dk = std::move(dk);
  r.dv = std::move(dv);
  return r;
}

// The selftest's measure: max |x - ref| / max |ref|.
double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double max_abs = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return scale > 0 ? max_abs / scale : max_abs;
}

// The selftest's attention cases that take the bf16 tensor-core path (d = 64, 128).
const std::vector<Case>& tensor_core_cases() {
  static const std::vector<Case> cases = {
      {{300}, 2, 2, 64},          {{5, 250, 1, 96}, 8, 2, 128},          {{1000}, 4, 1, 128},
      {{300, 45}, 2, 2, 64, 64},  {{5, 250, 1, 96}, 8, 2, 128, 33},      {{1000}, 4, 1, 128, 256},
  };
  return cases;
}

std::string case_name(const Case& c, int T) {
  return "T=" + std::to_string(T) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
         " d=" + std::to_string(c.d) + (c.window == hdp::kNoWindow ? "" : " W=" + std::to_string(c.window));
}

// The derivation: on every tensor-core case of the selftest the emulated kernels
// differ from the twin by at most half the tolerance (the other half covers what
// the emulation does not model: the GPU's fp32 summation order, ~1e-6 of the
// scale, and its expf).
TEST(Bf16AttentionRounding, TensorCoreRoundingStaysWithinHalfTheSelftestTolerance) {
  const double tol = hdp::kBf16TensorCoreAttentionTolerance;
  double worst = 0;
  std::mt19937 rng(1);
  for (const Case& c : tensor_core_cases()) {
    const Problem p = make_problem(c, rng);
    const Results ref = twin(p);
    const Results emu = emulate_kernels(p, ref, /*round_operands=*/true);
    const std::pair<const char*, double> diffs[] = {{"out", relative_difference(emu.out, ref.out)},
                                                    {"dq", relative_difference(emu.dq, ref.dq)},
                                                    {"dk", relative_difference(emu.dk, ref.dk)},
                                                    {"dv", relative_difference(emu.dv, ref.dv)}};
    for (const auto& [what, diff] : diffs) {
      std::printf("  %-30s %-3s emulated max rel diff %.3e (tolerance %.1e)\n", case_name(c, p.T).c_str(), what, diff,
                  tol);
      EXPECT_LE(diff, tol / 2) << case_name(c, p.T) << " " << what;
      worst = std::max(worst, diff);
    }
    // lse is fp32 in both, and P's rounding does not enter it.
    EXPECT_LE(relative_difference(emu.lse, ref.lse), 2e-5) << case_name(c, p.T);
  }
  std::printf("  worst emulated difference %.3e, tolerance %.1e\n", worst, tol);
}

// The emulation models the twin: without the operand rounding it differs from the
// twin only by summation order, so by at most one bf16 step of the tensor's scale
// (2^-7) where the two fp32 values straddle a rounding boundary. And the rounding
// points are live: with them the fp32 results before the store change.
TEST(Bf16AttentionRounding, EmulationWithoutOperandRoundingIsTheTwin) {
  std::mt19937 rng(5);
  const Case c{{130, 170}, 2, 1, 64};
  const Problem p = make_problem(c, rng);
  const Results ref = twin(p);
  const Results exact = emulate_kernels(p, ref, /*round_operands=*/false);
  const double step = 1.0 / 128;
  std::printf("  without operand rounding: out %.3e dq %.3e dk %.3e dv %.3e (one bf16 step %.3e)\n",
              relative_difference(exact.out, ref.out), relative_difference(exact.dq, ref.dq),
              relative_difference(exact.dk, ref.dk), relative_difference(exact.dv, ref.dv), step);
  EXPECT_LE(relative_difference(exact.out, ref.out), step);
  EXPECT_LE(relative_difference(exact.dq, ref.dq), step);
  EXPECT_LE(relative_difference(exact.dk, ref.dk), step);
  EXPECT_LE(relative_difference(exact.dv, ref.dv), step);
  EXPECT_LE(relative_difference(exact.lse, ref.lse), 2e-5);
  const Results rounded = emulate_kernels(p, ref, /*round_operands=*/true);
  EXPECT_GT(relative_difference(rounded.dq, exact.dq), 0.0);
  EXPECT_GT(relative_difference(rounded.dv, exact.dv), 0.0);
  EXPECT_GT(relative_difference(rounded.out, exact.out), 0.0);
}

}  // namespace
