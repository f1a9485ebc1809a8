// Softmax cross-entropy over a (possibly vocabulary-sharded) logits block on the GPU.
//
// Statistics: one block per row (grid-stride over rows). Each thread streams its
// strided share of the row once, 16 bytes at a time where the row allows, with an
// on-line max and a double sum of exp(x - max) (rescaled by exp(old - new) when a
// pack raises the max); the block then merges the threads' (max, sum) pairs. Rows
// without a target (-1) get the CPU's cheap finite stats (max 0, sumexp 1, target
// logit 0) without reading the row.
//
// Backward: grad_scale * exp(x - lse), minus grad_scale at the local target, written
// in one pass by whichever thread owns the element (no read-modify-write race);
// rows without a target are zeroed. A 2-D grid (rows x column chunks) keeps the GPU
// busy even when T is small.
//
// forward_backward fuses both per row (the row is still in L2 for the second pass),
// then one block sums the loss over rows in double in a fixed order (deterministic)
// and leaves [lse | row_sumexp | target_logit] in the scratch as the CPU does.
// That block writes the loss where the caller wants it: g_loss, read back by the
// variants returning double, or added into a sum on the device (kernels/ops.h), read
// back with the step's other sums at its end.
// exp/log are CUDA's expf/logf (the CPU uses its fast_expf, ~1.4 ulp), so the last
// bits may differ.
//
// The vocabulary-parallel glue between the passes (rescale of the sums to the global
// max, global log-sum-exp and loss) is elementwise plus one single-block loss sum
// like forward_backward's.
//
// bf16 logits (E = __nv_bfloat16, common.cuh), the LM head's output in mixed
// precision: every pass streams the bf16 row itself (no fp32 copy of the logits),
// widening each element; the on-line max, the sums, lse, the target logit and the
// loss are fp32/double as above, and the gradient is rounded once into the bf16
// logits (dlogits), as the CPU twin does.

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kRowThreads = 512;
constexpr int kBwdThreads = 256;
constexpr int kBwdPerThread = 8;  // column chunk of the backward grid: kBwdThreads * kBwdPerThread
constexpr int kLossThreads = 1024;

__device__ double g_loss;

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20)); }

// Merges (m2, s2) into (m, s): s is a sum of exp(x - m).
__device__ __forceinline__ void merge(float& m, double& s, float m2, double s2) {
  const float M = fmaxf(m, m2);
  if (M == -INFINITY) {  // both empty
    s += s2;
    return;
  }
  s = s * static_cast<double>(expf(m - M)) + s2 * static_cast<double>(expf(m2 - M));
  m = M;
}

// On-line max and sum of exp(x - max) of row x[0, V) over the block, K elements at a
// time (16-byte packs where V and the row allow, common.cuh: with_pack; V % K == 0):
// each pack's max first, the running sum rescaled once per pack that raises it. Every
// thread gets the result. `sm`, `ss` hold 32 entries each.
template <class E, int K>
__device__ void row_stats(const E* __restrict__ x, int64_t V, float& row_max, double& row_sum, float* sm,
                          double* ss) {
  using P = Elements<E, K>;
  float m = -INFINITY;
  double s = 0.0;
  for (int64_t p = threadIdx.x; p < V / K; p += blockDim.x) {
    const P pack = reinterpret_cast<const P*>(x)[p];
    float v[K], pack_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < K; ++j) {
      v[j] = to_f32(pack.v[j]);
      pack_max = fmaxf(pack_max, v[j]);
    }
    if (pack_max > m) {
      s *= static_cast<double>(expf(m - pack_max));  // m = -inf at first: expf(-inf) = 0
      m = pack_max;
    }
    // A -inf logit adds nothing (and must not make exp(-inf - -inf) = NaN); the max
    // adds exactly 1 (also an infinite one, where exp(inf - inf) would be NaN).
#pragma unroll
    for (int j = 0; j < K; ++j)
      if (v[j] > -INFINITY) s += v[j] == m ? 1.0 : static_cast<double>(expf(v[j] - m));
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const double s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();  // every thread has read the previous call's result
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < warps ? sm[lane] : -INFINITY;
    s = lane < warps ? ss[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const double s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      sm[0] = m;
      ss[0] = s;
    }
  }
  __syncthreads();
  row_max = sm[0];
  row_sum = ss[0];
}

__device__ __forceinline__ int64_t local_target(int32_t tgt, int64_t vocab_begin, int64_t V) {
  if (tgt < 0) return -1;
  const int64_t local = static_cast<int64_t>(tgt) - vocab_begin;
  return local >= 0 && local < V ? local : -1;
}

template <class E, int K>
__global__ void stats_kernel(float* __restrict__ row_max, float* __restrict__ row_sumexp,
                             float* __restrict__ target_logit, const E* __restrict__ logits,
                             const int32_t* __restrict__ targets, int64_t T, int64_t V, int64_t vocab_begin) {
  __shared__ float sm[32];
  __shared__ double ss[32];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int32_t tgt = targets[t];
    if (tgt < 0) {  // uniform over the block
      if (threadIdx.x == 0) {
        row_max[t] = 0.0f;
        row_sumexp[t] = 1.0f;
        target_logit[t] = 0.0f;
      }
      continue;
    }
    const E* x = logits + t * V;
    float m;
    double s;
    row_stats<E, K>(x, V, m, s, sm, ss);
    if (threadIdx.x == 0) {
      row_max[t] = m;
      row_sumexp[t] = static_cast<float>(s);
      const int64_t lt = local_target(tgt, vocab_begin, V);
      target_logit[t] = lt >= 0 ? to_f32(x[lt]) : 0.0f;
    }
  }
}

// x = grad_scale * exp(x - lse) - (grad_scale at the local target); zero rows without a target.
__device__ __forceinline__ float grad_value(float x, float lse, float grad_scale, bool is_target) {
  const float g = __fmul_rn(grad_scale, expf(x - lse));
  return is_target ? __fsub_rn(g, grad_scale) : g;
}

// Grid: blockIdx.x rows (grid-stride), blockIdx.y column chunks of kBwdThreads * kBwdPerThread (grid-stride).
template <class E>
__global__ void backward_kernel(E* __restrict__ logits, const float* __restrict__ lse,
                                const int32_t* __restrict__ targets, int64_t T, int64_t V, int64_t vocab_begin,
                                float grad_scale) {
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kBwdPerThread;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    E* x = logits + t * V;
    const int32_t tgt = targets[t];
    const int64_t lt = local_target(tgt, vocab_begin, V);
    const float l = lse[t];
    for (int64_t c0 = blockIdx.y * chunk; c0 < V; c0 += static_cast<int64_t>(gridDim.y) * chunk) {
      const int64_t c1 = c0 + chunk < V ? c0 + chunk : V;
      for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x)
        x[i] = from_f32<E>(tgt < 0 ? 0.0f : grad_value(to_f32(x[i]), l, grad_scale, i == lt));
    }
  }
}

// Both passes per row, K elements at a time as row_stats; scratch rows: row_max,
// row_sumexp, target_logit.
template <class E, int K>
__global__ void forward_backward_kernel(E* __restrict__ logits, const int32_t* __restrict__ targets,
                                        float* __restrict__ row_max, float* __restrict__ row_sumexp,
                                        float* __restrict__ target_logit, int64_t T, int64_t V, float grad_scale) {
  using P = Elements<E, K>;
  __shared__ float sm[32];
  __shared__ double ss[32];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    E* x = logits + t * V;
    P* xp = reinterpret_cast<P*>(x);
    const int32_t tgt = targets[t];
    if (tgt < 0) {  // uniform over the block
      if (threadIdx.x == 0) {
        row_max[t] = 0.0f;
        row_sumexp[t] = 1.0f;
        target_logit[t] = 0.0f;
      }
      for (int64_t i = threadIdx.x; i < V; i += blockDim.x) x[i] = from_f32<E>(0.0f);
      continue;
    }
    const int64_t lt = local_target(tgt, 0, V);
    // Read before row_stats' barriers, so before any thread overwrites the row below.
    const float tl = lt >= 0 ? to_f32(x[lt]) : 0.0f;
    float m;
    double s;
    row_stats<E, K>(x, V, m, s, sm, ss);
    const float sumexp = static_cast<float>(s);
    if (threadIdx.x == 0) {
      row_max[t] = m;
      row_sumexp[t] = sumexp;
      target_logit[t] = tl;
    }
    const float lse = __fadd_rn(m, logf(sumexp));  // _rn: no FMA contraction with logf's last step
    for (int64_t p = threadIdx.x; p < V / K; p += blockDim.x) {
      P pack = xp[p];
#pragma unroll
      for (int j = 0; j < K; ++j)
        pack.v[j] = from_f32<E>(grad_value(to_f32(pack.v[j]), lse, grad_scale, p * K + j == lt));
      xp[p] = pack;
    }
  }
}

// One block: loss = sum over rows with a target of lse - target_logit (lse in double),
// and row_max[t] becomes that row's lse (left 0 for rows without a target). The loss
// overwrites *out, or is added into it when `accumulate` (a sum on the device).
__global__ void loss_kernel(float* __restrict__ row_max, const float* __restrict__ row_sumexp,
                            const float* __restrict__ target_logit, const int32_t* __restrict__ targets, int64_t T,
                            double* out, bool accumulate) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    if (targets[t] < 0) continue;
    const double lse = __dadd_rn(static_cast<double>(row_max[t]), log(static_cast<double>(row_sumexp[t])));
    acc += lse - static_cast<double>(target_logit[t]);
    row_max[t] = static_cast<float>(lse);
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = accumulate ? __dadd_rn(*out, acc) : acc;
}

// row_sumexp *= exp(row_max - global_max), per row.
__global__ void rescale_kernel(float* __restrict__ row_sumexp, const float* __restrict__ row_max,
                               const float* __restrict__ global_max, int64_t T) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < T;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    row_sumexp[i] = __fmul_rn(row_sumexp[i], expf(__fsub_rn(row_max[i], global_max[i])));
  }
}

// One block: lse = global_max + log(sumexp) per row (float), and the loss sum over rows
// with a target of double(lse) - double(target_logit) in a fixed order (deterministic).
__global__ void global_loss_kernel(float* __restrict__ lse, const float* __restrict__ global_max,
                                   const float* __restrict__ row_sumexp, const float* __restrict__ target_logit,
                                   const int32_t* __restrict__ targets, int64_t T, double* out, bool accumulate) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const float l = __fadd_rn(global_max[t], logf(row_sumexp[t]));
    lse[t] = l;
    if (targets[t] >= 0) acc += static_cast<double>(l) - static_cast<double>(target_logit[t]);
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = accumulate ? __dadd_rn(*out, acc) : acc;
}

}  // namespace

void cross_entropy_rescale_sumexp(Tensor row_sumexp, const Tensor& row_max, const Tensor& global_max) {
  const int64_t T = row_sumexp.dim(0);
  if (T == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (T + kThreads - 1) / kThreads;
  rescale_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, compute_stream()>>>(
      row_sumexp.data, row_max.data, global_max.data, T);
  HDP_CUDA_CHECK_LAUNCH("cross_entropy_rescale_sumexp");
}

namespace {
// The loss kernels' destination when the loss is returned: g_loss.
double* loss_symbol() {
  void* address = nullptr;
  HDP_CUDA_CHECK(cudaGetSymbolAddress(&address, g_loss));
  return static_cast<double*>(address);
}

// g_loss on the host, once the stream has computed it.
double read_loss(cudaStream_t stream) {
  double loss = 0.0;
  HDP_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&loss, g_loss, sizeof(double), 0, cudaMemcpyDeviceToHost, stream));
  HDP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return loss;
}

void enqueue_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp, const Tensor& target_logit,
                         const IndexTensor& targets, double* out, bool accumulate) {
  global_loss_kernel<<<1, kLossThreads, 0, compute_stream()>>>(lse.data, global_max.data, row_sumexp.data,
                                                                target_logit.data, targets.data, lse.dim(0), out,
                                                                accumulate);
  HDP_CUDA_CHECK_LAUNCH("cross_entropy_global_loss");
}
}  // namespace

double cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                                 const Tensor& target_logit, const IndexTensor& targets) {
  if (lse.dim(0) == 0) return 0.0;
  enqueue_global_loss(lse, global_max, row_sumexp, target_logit, targets, loss_symbol(), false);
  return read_loss(compute_stream());
}

void cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                               const Tensor& target_logit, const IndexTensor& targets, DoubleTensor loss_sum) {
  if (lse.dim(0) > 0) enqueue_global_loss(lse, global_max, row_sumexp, target_logit, targets, loss_sum.data, true);
}

void cross_entropy_stats(Tensor row_max, Tensor row_sumexp, Tensor target_logit, const Tensor& logits,
                         const IndexTensor& targets, int64_t vocab_begin) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
  if (T == 0) return;
  with_element_type(logits.dtype, [&](auto e) {
    using E = decltype(e);
    with_pack<E>(V, {logits.raw()}, [&](auto k) {
      stats_kernel<E, decltype(k)::value><<<row_blocks(T), kRowThreads, 0, compute_stream()>>>(
          row_max.f32(), row_sumexp.f32(), target_logit.f32(), elements<E>(logits), targets.data, T, V, vocab_begin);
    });
  });
  HDP_CUDA_CHECK_LAUNCH("cross_entropy_stats");
}

void cross_entropy_backward_inplace(Tensor logits, const Tensor& lse, const IndexTensor& targets, int64_t vocab_begin,
                                    float grad_scale) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
  if (T == 0 || V == 0) return;
  const int64_t chunk = static_cast<int64_t>(kBwdThreads) * kBwdPerThread;
  const int64_t chunks = (V + chunk - 1) / chunk;
  const dim3 grid(row_blocks(T), static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
  with_element_type(logits.dtype, [&](auto e) {
    using E = decltype(e);
    backward_kernel<<<grid, kBwdThreads, 0, compute_stream()>>>(elements<E>(logits), lse.f32(), targets.data, T, V,
                                                                vocab_begin, grad_scale);
  });
  HDP_CUDA_CHECK_LAUNCH("cross_entropy_backward_inplace");
}

namespace {
void enqueue_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT,
                              double* out, bool accumulate) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
  cudaStream_t stream = compute_stream();
  float* row_max = scratch_3xT.data;
  float* row_sumexp = row_max + T;
  float* target_logit = row_max + 2 * T;
  with_element_type(logits.dtype, [&](auto e) {
    using E = decltype(e);
    with_pack<E>(V, {logits.raw()}, [&](auto k) {
      forward_backward_kernel<E, decltype(k)::value><<<row_blocks(T), kRowThreads, 0, stream>>>(
          elements<E>(logits), targets.data, row_max, row_sumexp, target_logit, T, V, grad_scale);
    });
  });
  HDP_CUDA_CHECK_LAUNCH("cross_entropy_forward_backward (rows)");
  loss_kernel<<<1, kLossThreads, 0, stream>>>(row_max, row_sumexp, target_logit, targets.data, T, out, accumulate);
  HDP_CUDA_CHECK_LAUNCH("cross_entropy_forward_backward (loss)");
}
}  // namespace

double cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT) {
  if (logits.dim(0) == 0) return 0.0;
  enqueue_forward_backward(logits, targets, grad_scale, scratch_3xT, loss_symbol(), false);
  return read_loss(compute_stream());
}

void cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT,
                                    DoubleTensor loss_sum) {
  if (logits.dim(0) > 0) enqueue_forward_backward(logits, targets, grad_scale, scratch_3xT, loss_sum.data, true);
}

}  // namespace hdp::cuda
