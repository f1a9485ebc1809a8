// Google Benchmark for the CPU kernels at LLaMA-step shapes.
//
//   build-kernels/bench/kernels_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Every benchmark measures wall-clock time (UseRealTime: the ops are multi-threaded)
// and reports GFLOP/s or GB/s as rate counters ("FLOPS"/"bytes_per_second" in
// units of 1000).
//
// FLOP conventions:
//   sgemm M x N x K:         2 M N K
//   attention, per (document of L tokens, query head), visible pairs P: causal
//   L (L + 1) / 2; with a sliding window W < L, W (W + 1) / 2 + (L - W) W:
//     forward  4 d P   (S = Q K^T and O = P V, 2 d P each)
//     backward 10 d P  (S recomputed, dV, dP, dQ, dK: 5 products; = 2.5 x forward)
//   ring-step (block) attention: the same, with P the visible pairs of the blocks
//   The exp/softmax work is not counted.
//
// Two thread pools share the cores: OpenBLAS's (matmul/linear) and OpenMP's (all
// other ops). By default each spins after its work, stealing the cores from the
// other: BM_MlpForwardSequence measured 75 ms against 55 ms for the sum of its
// parts. Launching with OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4 (both
// read at library load, so they must be in the environment at exec) brought it to
// 60 ms without slowing the separate benchmarks.

#include <benchmark/benchmark.h>
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "bench/random_data.h"
#include "kernels/cpu/blas_threads.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/ops.h"

namespace {

using hdp::IndexTensor;
using hdp::Tensor;

void set_gflops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iter * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}
void set_gbytes(benchmark::State& state, double bytes_per_iter) {
  state.counters["GB/s"] =
      benchmark::Counter(bytes_per_iter * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

// ---- dense algebra ----------------------------------------------------------------

// c[M, N] = a[M, K] b[K, N] through matmul (oneDNN) at 2048^3.
void BM_Sgemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  auto a = random_vector(M * K, -1, 1, 1), b = random_vector(K * N, -1, 1, 2), c = std::vector<float>(M * N);
  for (auto _ : state) {
    hdp::matmul(Tensor(c.data(), {M, N}), Tensor(a.data(), {M, K}), false, Tensor(b.data(), {K, N}), false);
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * M * N * K);
}
BENCHMARK(BM_Sgemm)->Args({2048, 2048, 2048})->UseRealTime()->Unit(benchmark::kMillisecond);

// The GEMM libraries side by side on a training step's products, each block of
// the OpenMP split single-threaded in the library, as matmul runs them
// (kernels/cpu/gemm.h). Args: library (0 oneDNN: what matmul uses, 1 OpenBLAS,
// 2 BLIS if Debian's libblis4 is installed: loaded with dlopen, no build
// dependency), product (0 forward y = x w^T: NT, 1 dx = dy w: NN, 2 dw = dy^T x:
// TN), tokens T, in, out. The libraries of one shape are registered next to one
// another; run with --benchmark_enable_random_interleaving=true on a shared machine.
// The table and the choice: docs/performance.md, "CPU GEMM library".
using BlisSgemm = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                           const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
BlisSgemm blis_sgemm() {
  static const BlisSgemm fn = [] {
    void* lib = dlopen("/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    return lib ? reinterpret_cast<BlisSgemm>(dlsym(lib, "bli_sgemm")) : nullptr;
  }();
  return fn;
}

// bli_sgemm with explicit row and column strides (transposes as strides), one
// block per OpenMP thread like kernels/cpu/gemm.cpp.
void blis_split(BlisSgemm fn, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                const float* B, int64_t ldb, float* C, int64_t ldc) {
  const int threads = omp_get_max_threads();
  const bool rows = M >= N;
  const int64_t extent = rows ? M : N, block = (extent / threads + 15) / 16 * 16;
  const float one = 1.0f, zero = 0.0f;
#pragma omp parallel num_threads(threads)
  {
    const int64_t begin = std::min<int64_t>(extent, block * omp_get_thread_num());
    const int64_t end = omp_get_thread_num() == threads - 1 ? extent : std::min<int64_t>(extent, begin + block);
    const int64_t m = rows ? end - begin : M, n = rows ? N : end - begin;
    const float* a = rows ? (ta ? A + begin : A + begin * lda) : A;
    const float* b = rows ? B : (tb ? B + begin * ldb : B + begin);
    float* c = rows ? C + begin * ldc : C + begin;
    // Transposes as strides: element (i, k) of op(A) is a[i * rsa + k * csa].
    if (end > begin) {
      fn(0, 0, m, n, K, &one, a, ta ? 1 : lda, ta ? lda : 1, b, tb ? 1 : ldb, tb ? ldb : 1, &zero, c, ldc, 1);
    }
  }
}

void BM_GemmLibrary(benchmark::State& state) {
  const int library = static_cast<int>(state.range(0)), product = static_cast<int>(state.range(1));
  const int64_t T = state.range(2), in = state.range(3), out = state.range(4);
  // C[M, N] = op(A) op(B) with A, B, C as linear_forward / linear_backward pass them.
  const bool ta = product == 2, tb = product == 0;
  const int64_t M = product == 2 ? out : T, N = product == 1 ? in : (product == 0 ? out : in);
  const int64_t K = product == 0 ? in : (product == 1 ? out : T);
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  auto a = random_vector(M * K, -1, 1, 1), b = random_vector(K * N, -1, 1, 2), c = std::vector<float>(M * N);
  const BlisSgemm blis = library == 2 ? blis_sgemm() : nullptr;
  if (library == 2 && !blis) return state.SkipWithError("BLIS (libblis4) not installed");
  const char* names[] = {"oneDNN", "OpenBLAS", "BLIS"};
  const char* products[] = {"fwd_NT", "dx_NN", "dw_TN"};
  state.SetLabel(std::string(names[library]) + " " + products[product]);
  for (auto _ : state) {
    if (library == 2) {
      blis_split(blis, ta, tb, M, N, K, a.data(), lda, b.data(), ldb, c.data(), N);
    } else {
      hdp::cpu::sgemm(library == 0 ? hdp::cpu::GemmLibrary::onednn : hdp::cpu::GemmLibrary::openblas, ta, tb, M, N, K,
                      1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), N);
    }
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * M * N * K);
}
void gemm_library_shapes(benchmark::internal::Benchmark* b) {
  for (auto [in, out] : {std::pair<int64_t, int64_t>{512, 512}, {512, 1376}, {1376, 512}, {512, 32000}, {2048, 2048},
                         {2048, 5632}})
    for (int64_t product : {0, 1, 2})
      for (int64_t library : {0, 1, 2}) b->Args({library, product, 4096, in, out});
}
BENCHMARK(BM_GemmLibrary)->Apply(gemm_library_shapes)->UseRealTime()->Unit(benchmark::kMillisecond);

// y[T, out] = x[T, in] w[out, in]^T at the LLaMA-step shapes (tokens x out x in).
void BM_LinearForward(benchmark::State& state) {
  const int64_t T = state.range(0), out = state.range(1), in = state.range(2);
  auto x = random_vector(T * in, -1, 1, 1), w = random_vector(out * in, -1, 1, 2), y = std::vector<float>(T * out);
  for (auto _ : state) {
    hdp::linear_forward(Tensor(y.data(), {T, out}), Tensor(x.data(), {T, in}), Tensor(w.data(), {out, in}));
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * T * out * in);
}
BENCHMARK(BM_LinearForward)
    ->Args({4096, 512, 512})
    ->Args({4096, 1376, 512})
    ->Args({4096, 512, 1376})
    ->Args({1024, 32000, 512})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// dx = dy w and dw += dy^T x (two sgemms).
void BM_LinearBackward(benchmark::State& state) {
  const int64_t T = state.range(0), out = state.range(1), in = state.range(2);
  auto x = random_vector(T * in, -1, 1, 1), w = random_vector(out * in, -1, 1, 2);
  auto dy = random_vector(T * out, -1, 1, 3), dx = std::vector<float>(T * in), dw = std::vector<float>(out * in);
  for (auto _ : state) {
    hdp::linear_backward(Tensor(dx.data(), {T, in}), Tensor(dw.data(), {out, in}), Tensor(dy.data(), {T, out}),
                         Tensor(x.data(), {T, in}), Tensor(w.data(), {out, in}), false);
    benchmark::ClobberMemory();
  }
  set_gflops(state, 4.0 * T * out * in);
}
BENCHMARK(BM_LinearBackward)
    ->Args({4096, 512, 512})
    ->Args({4096, 1376, 512})
    ->Args({1024, 32000, 512})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The attention tile products, single-threaded: the hand-written micro-kernel
// (tile_gemm) against cblas_sgemm with OpenBLAS forced to one thread. This is the
// measurement behind using tile_gemm in attention. Args: M, N, K.
void BM_TileGemmHand(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  auto a = random_vector(M * K, -1, 1, 1), b = random_vector(K * N, -1, 1, 2), c = std::vector<float>(M * N);
  for (auto _ : state) {
    hdp::cpu::tile_gemm(M, N, K, a.data(), K, 1, b.data(), N, c.data(), N, false);
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * M * N * K);
}
void BM_TileGemmBlas1T(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  auto a = random_vector(M * K, -1, 1, 1), b = random_vector(K * N, -1, 1, 2), c = std::vector<float>(M * N);
  hdp::cpu::set_blas_num_threads(1);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0f, a.data(), static_cast<int>(K), b.data(), static_cast<int>(N), 0.0f,
                c.data(), static_cast<int>(N));
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * M * N * K);
}
BENCHMARK(BM_TileGemmHand)->Args({64, 64, 64})->Args({64, 64, 128})->Args({128, 128, 64})->UseRealTime();
BENCHMARK(BM_TileGemmBlas1T)->Args({64, 64, 64})->Args({64, 64, 128})->Args({128, 128, 64})->UseRealTime();

// An MLP block forward as the model runs it: OpenBLAS-threaded sgemms alternating
// with OpenMP elementwise work. Compare with the sum of the separate benchmarks to
// see the cost of handing the cores between the two thread pools.
// Args: T, H, F.
void BM_MlpForwardSequence(benchmark::State& state) {
  const int64_t T = state.range(0), H = state.range(1), F = state.range(2);
  auto x = random_vector(T * H, -1, 1, 1), wg = random_vector(F * H, -0.05f, 0.05f, 2),
       wu = random_vector(F * H, -0.05f, 0.05f, 3), wd = random_vector(H * F, -0.05f, 0.05f, 4);
  std::vector<float> g(T * F), u(T * F), a(T * F), y(T * H);
  for (auto _ : state) {
    hdp::linear_forward(Tensor(g.data(), {T, F}), Tensor(x.data(), {T, H}), Tensor(wg.data(), {F, H}));
    hdp::linear_forward(Tensor(u.data(), {T, F}), Tensor(x.data(), {T, H}), Tensor(wu.data(), {F, H}));
    hdp::swiglu_forward(Tensor(a.data(), {T, F}), Tensor(g.data(), {T, F}), Tensor(u.data(), {T, F}));
    hdp::linear_forward(Tensor(y.data(), {T, H}), Tensor(a.data(), {T, F}), Tensor(wd.data(), {H, F}));
    hdp::add_inplace(Tensor(y.data(), {T, H}), Tensor(x.data(), {T, H}));
  }
  set_gflops(state, 3 * 2.0 * T * H * F);
}
BENCHMARK(BM_MlpForwardSequence)->Args({4096, 512, 1376})->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- attention -------------------------------------------------------------------

struct AttentionSetup {
  int64_t docs, len, Hq, Hkv, d, window, T;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  std::vector<int32_t> cu;
  AttentionSetup(int64_t docs_, int64_t len_, int64_t Hq_, int64_t Hkv_, int64_t d_, int64_t window_ = hdp::kNoWindow)
      : docs(docs_), len(len_), Hq(Hq_), Hkv(Hkv_), d(d_), window(window_), T(docs_ * len_) {
    q = random_vector(T * Hq * d, -1, 1, 1);
    k = random_vector(T * Hkv * d, -1, 1, 2);
    v = random_vector(T * Hkv * d, -1, 1, 3);
    dout = random_vector(T * Hq * d, -1, 1, 4);
    out.resize(T * Hq * d);
    lse.resize(Hq * T);
    dq.resize(q.size());
    dk.resize(k.size());
    dv.resize(v.size());
    for (int64_t i = 0; i <= docs; ++i) cu.push_back(static_cast<int32_t>(i * len));
  }
  IndexTensor cus() { return IndexTensor(cu.data(), {docs + 1}); }
  void forward() {
    hdp::attention_forward(Tensor(out.data(), {T, Hq, d}), Tensor(lse.data(), {Hq, T}), Tensor(q.data(), {T, Hq, d}),
                           Tensor(k.data(), {T, Hkv, d}), Tensor(v.data(), {T, Hkv, d}), cus(), window);
  }
  void backward() {
    hdp::attention_backward(Tensor(dq.data(), {T, Hq, d}), Tensor(dk.data(), {T, Hkv, d}),
                            Tensor(dv.data(), {T, Hkv, d}), Tensor(dout.data(), {T, Hq, d}),
                            Tensor(q.data(), {T, Hq, d}), Tensor(k.data(), {T, Hkv, d}),
                            Tensor(v.data(), {T, Hkv, d}), Tensor(out.data(), {T, Hq, d}),
                            Tensor(lse.data(), {Hq, T}), cus(), window);
  }
  // Visible (query, key) pairs summed over documents and query heads, times d.
  double pair_d() const {
    const double L = static_cast<double>(len), W = static_cast<double>(window);
    const double pairs = window == hdp::kNoWindow || window >= len ? L * (L + 1) / 2 : W * (W + 1) / 2 + (L - W) * W;
    return static_cast<double>(docs * Hq) * pairs * d;
  }
};

// Args: docs, tokens per doc, Hq, Hkv, d
void BM_AttentionForward(benchmark::State& state) {
  AttentionSetup s(state.range(0), state.range(1), state.range(2), state.range(3), state.range(4));
  for (auto _ : state) s.forward();
  set_gflops(state, 4.0 * s.pair_d());
}
void BM_AttentionBackward(benchmark::State& state) {
  AttentionSetup s(state.range(0), state.range(1), state.range(2), state.range(3), state.range(4));
  s.forward();
  for (auto _ : state) s.backward();
  set_gflops(state, 10.0 * s.pair_d());
}
void BM_AttentionForwardBackward(benchmark::State& state) {
  AttentionSetup s(state.range(0), state.range(1), state.range(2), state.range(3), state.range(4));
  for (auto _ : state) {
    s.forward();
    s.backward();
  }
  set_gflops(state, 14.0 * s.pair_d());
}
BENCHMARK(BM_AttentionForward)->Args({4, 1024, 8, 4, 64})->Args({1, 4096, 8, 4, 64})->Args({4, 1024, 8, 4, 128})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionBackward)->Args({4, 1024, 8, 4, 64})->Args({1, 4096, 8, 4, 64})->Args({4, 1024, 8, 4, 128})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionForwardBackward)->Args({4, 1024, 8, 4, 64})->UseRealTime()->Unit(benchmark::kMillisecond);

// Sliding-window attention (Mistral 7B, Jiang et al. 2023) forward + backward over
// one document of L tokens. Past the window every query sees W keys, so the time
// per token levels off (tokens/s constant: linear growth in L) while full causal
// attention (W = 0) keeps slowing down per token (quadratic growth).
// Args: L, W, Hq, Hkv, d.
void BM_AttentionWindowForwardBackward(benchmark::State& state) {
  AttentionSetup s(1, state.range(0), state.range(2), state.range(3), state.range(4), state.range(1));
  for (auto _ : state) {
    s.forward();
    s.backward();
  }
  set_gflops(state, 14.0 * s.pair_d());
  const double tokens = static_cast<double>(s.T) * static_cast<double>(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionWindowForwardBackward)
    ->ArgsProduct({{1024, 2048, 4096, 8192, 16384}, {1024}, {8}, {4}, {64}})
    ->ArgsProduct({{2048, 4096, 8192, 16384, 32768}, {4096}, {8}, {4}, {64}})
    ->ArgsProduct({{2048, 4096, 8192, 16384}, {hdp::kNoWindow}, {8}, {4}, {64}})
    ->ArgNames({"L", "W", "Hq", "Hkv", "d"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- ring attention: one zig-zag step (attention between row blocks) -------------
// A document of 4C tokens cut in chunks 0..3 over 2 ranks: rank 0 holds chunks 0
// and 3 (local query rows [0, 2C)), rank 1 chunks 1 and 2. Step 0 is rank 0 against
// its own keys (chunks 0, 3: two causal diagonals and one full block visible),
// step 1 against rank 1's keys (chunks 1, 2: two full blocks visible). All four
// chunk pairs are passed, as a ring caller would; the kernel skips the masked ones.
// FLOPs count visible (query, key) pairs only, with the conventions above.
struct RingStepSetup {
  int64_t C, Hq, Hkv, d, T;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  std::vector<hdp::AttentionBlock> blocks;
  double pairs = 0;  // visible pairs of one query head
  RingStepSetup(int64_t C_, int64_t Hq_, int64_t Hkv_, int64_t d_, bool remote)
      : C(C_), Hq(Hq_), Hkv(Hkv_), d(d_), T(2 * C_) {
    q = random_vector(T * Hq * d, -1, 1, 1);
    k = random_vector(T * Hkv * d, -1, 1, 2);
    v = random_vector(T * Hkv * d, -1, 1, 3);
    dout = random_vector(T * Hq * d, -1, 1, 4);
    out.resize(T * Hq * d);
    lse.resize(Hq * T);
    dq.assign(q.size(), 0.0f);
    dk.assign(k.size(), 0.0f);
    dv.assign(v.size(), 0.0f);
    const int64_t mine[2] = {0, 3}, theirs[2] = {remote ? 1 : 0, remote ? 2 : 3};
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        const auto qp = static_cast<int32_t>(mine[a] * C), kp = static_cast<int32_t>(theirs[b] * C);
        blocks.push_back({static_cast<int32_t>(a * C), static_cast<int32_t>((a + 1) * C), static_cast<int32_t>(b * C),
                          static_cast<int32_t>((b + 1) * C), qp, kp});
        for (int64_t i = 0; i < C; ++i) pairs += static_cast<double>(std::clamp<int64_t>(qp + i - kp + 1, 0, C));
      }
    hdp::attention_reset_rows(Tensor(out.data(), {T, Hq, d}), Tensor(lse.data(), {Hq, T}), 0, T);
  }
  void forward() {
    hdp::attention_forward_blocks(Tensor(out.data(), {T, Hq, d}), Tensor(lse.data(), {Hq, T}),
                                  Tensor(q.data(), {T, Hq, d}), Tensor(k.data(), {T, Hkv, d}),
                                  Tensor(v.data(), {T, Hkv, d}), blocks);
  }
  void backward() {
    hdp::attention_backward_blocks(Tensor(dq.data(), {T, Hq, d}), Tensor(dk.data(), {T, Hkv, d}),
                                   Tensor(dv.data(), {T, Hkv, d}), Tensor(dout.data(), {T, Hq, d}),
                                   Tensor(q.data(), {T, Hq, d}), Tensor(k.data(), {T, Hkv, d}),
                                   Tensor(v.data(), {T, Hkv, d}), Tensor(out.data(), {T, Hq, d}),
                                   Tensor(lse.data(), {Hq, T}), blocks);
  }
  double pair_d() const { return pairs * static_cast<double>(Hq * d); }
};

// Args: C (tokens per chunk), Hq, Hkv, d, step (0: own keys, 1: the other rank's)
void BM_AttentionRingStepForward(benchmark::State& state) {
  RingStepSetup s(state.range(0), state.range(1), state.range(2), state.range(3), state.range(4) != 0);
  for (auto _ : state) s.forward();  // merges into the same rows each time: same work
  set_gflops(state, 4.0 * s.pair_d());
}
void BM_AttentionRingStepBackward(benchmark::State& state) {
  RingStepSetup s(state.range(0), state.range(1), state.range(2), state.range(3), state.range(4) != 0);
  s.forward();
  for (auto _ : state) s.backward();  // adds into dq, dk, dv each time
  set_gflops(state, 10.0 * s.pair_d());
}
BENCHMARK(BM_AttentionRingStepForward)->Args({1024, 8, 4, 64, 0})->Args({1024, 8, 4, 64, 1})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionRingStepBackward)->Args({1024, 8, 4, 64, 0})->Args({1024, 8, 4, 64, 1})
    ->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- cross-entropy ---------------------------------------------------------------

void BM_CrossEntropyForwardBackward(benchmark::State& state) {
  const int64_t T = state.range(0), V = state.range(1);
  const auto init = random_vector(T * V, -4, 4, 1);
  std::vector<float> logits = init, scratch(3 * T);
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = static_cast<int32_t>((t * 7919) % V);
  for (auto _ : state) {
    // Refreshing the logits (a copy) is not timed.
    state.PauseTiming();
    std::copy(init.begin(), init.end(), logits.begin());
    state.ResumeTiming();
    benchmark::DoNotOptimize(hdp::cross_entropy_forward_backward(
        Tensor(logits.data(), {T, V}), IndexTensor(targets.data(), {T}), 1.0f / T, Tensor(scratch.data(), {3 * T})));
  }
  set_gbytes(state, 2.0 * T * V * sizeof(float));  // read + write of the logits
}
BENCHMARK(BM_CrossEntropyForwardBackward)->Args({1024, 32000})->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_CrossEntropyStats(benchmark::State& state) {
  const int64_t T = state.range(0), V = state.range(1);
  auto logits = random_vector(T * V, -4, 4, 1);
  std::vector<float> mx(T), se(T), tl(T);
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = static_cast<int32_t>((t * 7919) % V);
  for (auto _ : state)
    hdp::cross_entropy_stats(Tensor(mx.data(), {T}), Tensor(se.data(), {T}), Tensor(tl.data(), {T}),
                             Tensor(logits.data(), {T, V}), IndexTensor(targets.data(), {T}), 0);
  set_gbytes(state, 1.0 * T * V * sizeof(float));
}
BENCHMARK(BM_CrossEntropyStats)->Args({1024, 32000})->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- RMSNorm, RoPE, SwiGLU ---------------------------------------------------------

void BM_RmsnormForward(benchmark::State& state) {
  const int64_t T = state.range(0), H = state.range(1);
  auto x = random_vector(T * H, -1, 1, 1), w = random_vector(H, 0.5, 1.5, 2);
  std::vector<float> y(T * H), rstd(T);
  for (auto _ : state)
    hdp::rmsnorm_forward(Tensor(y.data(), {T, H}), Tensor(rstd.data(), {T}), Tensor(x.data(), {T, H}),
                         Tensor(w.data(), {H}), 1e-5f);
  set_gbytes(state, 2.0 * T * H * sizeof(float));
}
void BM_RmsnormBackward(benchmark::State& state) {
  const int64_t T = state.range(0), H = state.range(1);
  auto x = random_vector(T * H, -1, 1, 1), w = random_vector(H, 0.5, 1.5, 2), dy = random_vector(T * H, -1, 1, 3);
  std::vector<float> y(T * H), rstd(T), dx(T * H), dw(H);
  hdp::rmsnorm_forward(Tensor(y.data(), {T, H}), Tensor(rstd.data(), {T}), Tensor(x.data(), {T, H}),
                       Tensor(w.data(), {H}), 1e-5f);
  for (auto _ : state)
    hdp::rmsnorm_backward(Tensor(dx.data(), {T, H}), Tensor(dw.data(), {H}), Tensor(dy.data(), {T, H}),
                          Tensor(x.data(), {T, H}), Tensor(w.data(), {H}), Tensor(rstd.data(), {T}));
  set_gbytes(state, 4.0 * T * H * sizeof(float));  // x, dy read; dx read + written
}
BENCHMARK(BM_RmsnormForward)->Args({4096, 512})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RmsnormBackward)->Args({4096, 512})->UseRealTime()->Unit(benchmark::kMicrosecond);

// Args: T, heads, d (the query tensor of a 4096-token micro-batch).
void BM_RopeForward(benchmark::State& state) {
  const int64_t T = state.range(0), H = state.range(1), d = state.range(2);
  auto x = random_vector(T * H * d, -1, 1, 1);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t % 1024);
  for (auto _ : state) hdp::rope_forward(Tensor(x.data(), {T, H, d}), IndexTensor(pos.data(), {T}), 10000.0f);
  set_gbytes(state, 2.0 * T * H * d * sizeof(float));
}
BENCHMARK(BM_RopeForward)->Args({4096, 8, 64})->Args({4096, 4, 64})->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_SwigluForward(benchmark::State& state) {
  const int64_t T = state.range(0), F = state.range(1);
  auto g = random_vector(T * F, -4, 4, 1), u = random_vector(T * F, -1, 1, 2);
  std::vector<float> out(T * F);
  for (auto _ : state)
    hdp::swiglu_forward(Tensor(out.data(), {T, F}), Tensor(g.data(), {T, F}), Tensor(u.data(), {T, F}));
  set_gbytes(state, 3.0 * T * F * sizeof(float));
}
void BM_SwigluBackward(benchmark::State& state) {
  const int64_t T = state.range(0), F = state.range(1);
  auto g = random_vector(T * F, -4, 4, 1), u = random_vector(T * F, -1, 1, 2), dy = random_vector(T * F, -1, 1, 3);
  std::vector<float> dg(T * F), du(T * F);
  for (auto _ : state)
    hdp::swiglu_backward(Tensor(dg.data(), {T, F}), Tensor(du.data(), {T, F}), Tensor(dy.data(), {T, F}),
                         Tensor(g.data(), {T, F}), Tensor(u.data(), {T, F}));
  set_gbytes(state, 5.0 * T * F * sizeof(float));
}
BENCHMARK(BM_SwigluForward)->Args({4096, 1376})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SwigluBackward)->Args({4096, 1376})->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("gemm", hdp::cpu::gemm_library_description(hdp::cpu::kGemmLibrary));
  benchmark::AddCustomContext("openblas_core", hdp::cpu::blas_core_name());
  benchmark::AddCustomContext("openblas_threads", std::to_string(hdp::cpu::blas_num_threads()));
  benchmark::AddCustomContext("omp_threads", std::to_string(omp_get_max_threads()));
  benchmark::AddCustomContext("simd", std::string(hdp::cpu::simd_isa_name()) + " x" +
                                          std::to_string(hdp::cpu::simd_width()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
