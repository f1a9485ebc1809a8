#pragma once
// The op interface the model is written against. Each function checks shapes,
// checks that all tensors live on one device, and dispatches to that device's
// backend (kernels/cpu, kernels/cuda). Forward and backward of an op sit side by
// side in one backend file. Tensors are contiguous and row-major, fp32 or
// bf16 (kernels/dtype.h), and each op checks their dtypes too (check_dtypes in
// kernels/ops.cpp): ops on activations and weights run in fp32 or bf16 (the bf16
// twins, kernels/cpu/bf16.cpp: fp32 arithmetic, one rounding where a bf16 result is
// stored); statistics (rstd, lse, the cross-entropy statistics), gradients of
// weights and the optimizer state are always fp32.
//
// Conventions
//   T  tokens in the micro-batch       H  hidden size
//   Hq query heads, Hkv key/value heads, d head dim
//   Weights are stored [out, in] as in Hugging Face checkpoints.
//   "adds into" means the result is accumulated (+=); otherwise it is overwritten.

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/tensor.h"
#include "spec/rope.h"

namespace hdp {

// ---- dense algebra -------------------------------------------------------------
// c = alpha * op(a) * op(b) + beta * c, with op(x) = x or x^T; all 2-D.
void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha = 1.0f,
            float beta = 0.0f);

// y[T, out] = x[T, in] * w[out, in]^T, plus `residual` (y's shape, not y itself) when
// given: the residual stream's add after a projection, done by the GEMM's epilogue on
// a GPU (no pass of its own). In bf16 the product and the residual are added in fp32
// and rounded once (the CPU twin does the same).
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& residual = Tensor());
// dx[T, in] = dy * w (adds into dx when accumulate_dx); dw[out, in] adds dy^T * x.
// An empty dx or dw (Tensor()) skips that gradient; x is then read for its shape only
// when dw is skipped (a caller may compute x after the dx half, as the SwiGLU MLP
// recomputes its activation from the gradient's loads).
void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx);

// y += x (same shape)
void add_inplace(Tensor y, const Tensor& x);
// y *= s
void scale_inplace(Tensor y, float s);
void fill(Tensor y, float value);
// dst <- src; the two may live on different devices (host <-> device copies).
void copy(Tensor dst, const Tensor& src);
void copy(IndexTensor dst, const IndexTensor& src);
// sum of x^2 accumulated in double
double sum_squares(const Tensor& x);
// Returns when the device has finished the work enqueued so far (ops on a GPU run
// asynchronously; a no-op on the CPU). A host wait (below): a training step times
// its device work with events instead (DeviceTimer).
void synchronize(Device device);
// dst <- src from host memory into device memory without waiting for the device: on a
// GPU the copy is enqueued on the compute stream, ordered before the ops enqueued after
// it, and src must be page-locked host memory (pinned_host_allocator) left unchanged
// until the copy has run (an event recorded after it has completed: UploadStaging).
// On the CPU and the guarded device it copies at once, as copy() does.
void copy_async(IndexTensor dst, const IndexTensor& src);

// ---- host reads ------------------------------------------------------------------
// A host read is an op that brings a value computed on `device` back to the host: a
// copy from device memory into host memory, or an op that returns a device value
// (sum_squares and the cross-entropy losses returning double). On a GPU each one
// waits for the compute stream to drain (cudaStreamSynchronize), which stalls the
// host's kernel launches and leaves the GPU idle until the next launch arrives, so
// a training step keeps them to one at its end (docs/internals.md, "Host reads").
// Every backend counts the same logical reads (a copy from CPU memory to CPU memory
// is none; an op returning a CPU value is one), so the CPU and the guarded device
// show in tests what a GPU would pay. The count is the calling thread's: a rank's,
// also where ranks run as threads of one process.
int64_t host_reads(Device device);
// A communicator that stages device memory through the host (MPI without NCCL:
// parallel/mpi_communicator.cpp) copies each collective's input out of the device:
// host reads too, but the communicator's, which a GPU run on NCCL (the default on
// cuda) does not make. Copies made while a StagedCopies lives in this thread count
// in staged_host_reads instead of host_reads, so that the guarded device, whose
// collectives always go through MPI, shows the count the GPU's computation pays.
class StagedCopies {
 public:
  StagedCopies();
  ~StagedCopies();
  StagedCopies(const StagedCopies&) = delete;
  StagedCopies& operator=(const StagedCopies&) = delete;
};
int64_t staged_host_reads(Device device);

// ---- host waits ----------------------------------------------------------------------
// A host wait is an op that blocks the host until the device has run work enqueued
// before it, which on a GPU stalls the kernel launches behind it: every host read
// (above), `synchronize`, a copy from host into device memory (copy(): the CUDA backend
// waits until the host buffer may be reused), and a DeviceEvent wait that finds its
// work not yet done. A training step keeps them to its one read-back at its end
// (docs/internals.md, "Host reads"). Counted per device and thread as host reads are,
// the communicator's staging (StagedCopies) apart: it is in staged_host_reads.
int64_t host_waits(Device device);

// ---- events and device time -------------------------------------------------------
// A point in a device's queue of work. On a GPU a CUDA event recorded on the compute
// stream; on the CPU and the guarded device, whose ops finish before they return, the
// host clock at record(). Created once and recorded again as often as needed.
class DeviceEvent {
 public:
  explicit DeviceEvent(Device device);
  ~DeviceEvent();
  DeviceEvent(DeviceEvent&& other) noexcept;
  DeviceEvent& operator=(DeviceEvent&& other) noexcept;
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  // Marks the point after the work enqueued so far (the host need not wait for it).
  void record();
  // Returns once the work before the last record() has run: a host wait (counted)
  // only when it had not yet; never on the CPU and the guarded device.
  void wait() const;
  Device device() const { return device_; }

 private:
  friend double elapsed_ms(const DeviceEvent& start, const DeviceEvent& end);
  Device device_;
  void* event_ = nullptr;  // CUDA: a cudaEvent_t
  int64_t host_ns_ = 0;    // CPU and guarded: steady_clock at record()
};
// Device time from start's record() to end's, in milliseconds; waits for end first (wait()).
double elapsed_ms(const DeviceEvent& start, const DeviceEvent& end);

// Device time of stretches of work, measured without waiting for them: start() and
// stop() record events around each stretch, and take_ms() reads them all at once, the
// sum of the stretches since the last take_ms(). Read after the step's read-back, the
// events have completed and take_ms() waits for nothing. The events are kept and
// recorded again after take_ms(), so steps of a shape seen before create none.
class DeviceTimer {
 public:
  explicit DeviceTimer(Device device) : device_(device) {}
  void start();
  void stop();
  double take_ms();
  // Forgets the stretches since the last take_ms() unread (after an exception).
  void discard() { recorded_ = 0; }

 private:
  Device device_;
  std::vector<DeviceEvent> events_;  // start, stop, start, stop, ...
  size_t recorded_ = 0;              // events recorded since the last take_ms()
};

// ---- sums on the device ------------------------------------------------------------
// A training step adds up its loss and its gradient's sum of squares on the device, in
// double (fp64 DoubleTensors, one element per sum), and reads them back together once
// at its end. Each op below forms its own sum from zero and then adds it into the
// element, so a sequence of calls adds in the order, and with the roundings, of the
// host loop `total += op()` it replaces: the results are bit-identical to it.
// y = value everywhere.
void fill(DoubleTensor y, double value);
// y += x (same shape).
void add_inplace(DoubleTensor y, const DoubleTensor& x);
// y[0] += value, a host value (enqueued with the op: no read).
void add_scalar(DoubleTensor y, double value);
// sum[0] += the sum of x^2 accumulated in double (as sum_squares(x) returns it).
void sum_squares(const Tensor& x, DoubleTensor sum);
// The values of x on the host, into out (x.numel() values): one host read, the step's
// one; nothing allocated.
void read_back(const DoubleTensor& x, std::span<double> out);
// The same into a new vector (tests, eval: not for the step).
inline std::vector<double> read_back(const DoubleTensor& x) {
  std::vector<double> values(static_cast<size_t>(x.numel()));
  read_back(x, values);
  return values;
}

// ---- embedding ---------------------------------------------------------------
// out[T, H] = table[token - vocab_begin] for tokens in [vocab_begin, vocab_begin + V_local), zero otherwise
// (vocab_begin lets a tensor-parallel rank hold a slice of the vocabulary).
void embedding_forward(Tensor out, const IndexTensor& tokens, const Tensor& table, int64_t vocab_begin);
// dtable[V_local, H] adds the rows of dout for the tokens it holds.
void embedding_backward(Tensor dtable, const IndexTensor& tokens, const Tensor& dout, int64_t vocab_begin);

// ---- RMSNorm (Hugging Face LlamaRMSNorm: y = w * x * rsqrt(mean(x^2) + eps)) ------
// x, y [T, H]; w [H]; rstd [T] receives rsqrt(mean(x^2) + eps) for backward.
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps);
// Adds into dx [T, H] and dw [H].
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd);

// ---- rotary position embedding (rotate-half pairing: element i with i + d/2) ----
// x [T, heads, d] rotated in place by angle positions[t] * f_j, f = rope.inverse_frequencies(d);
// and x2 [T, heads2, d] when given (the keys of x's queries) by the same angles in the
// same call: a GPU computes each token's cos and sin once for both.
void rope_forward(Tensor x, const IndexTensor& positions, const RopeSettings& rope, Tensor x2 = Tensor());
// The inverse rotation applied in place to a gradient (and to dx2 when given).
void rope_backward(Tensor dx, const IndexTensor& positions, const RopeSettings& rope, Tensor dx2 = Tensor());

// ---- causal attention over packed documents ------------------------------------
// On CUDA these two may run cuDNN's fused attention instead of our kernels, as the
// process-wide choice of kernels/attention_impl.h says (same semantics).
// q [T, Hq, d], k and v [T, Hkv, d]; query head h reads key/value head h / (Hq / Hkv).
// cu_seqlens [docs + 1]: document i holds rows [cu_seqlens[i], cu_seqlens[i+1]); attention
// never crosses a document and is causal inside it; scale d^-0.5.
// out [T, Hq, d]; lse [Hq, T] receives each row's log-sum-exp of scaled scores.
// Tiled with an on-line softmax: memory is linear in T.
//
// Sliding window (Mistral 7B: Jiang et al. 2023, "Mistral 7B"): with window W > 0 the
// query at position i sees only the keys at positions j with i - W < j <= i, i.e. at
// most W keys counting itself, and the cost is O(T W) instead of O(T^2) per document.
// This is Hugging Face transformers' MistralForCausalLM with sliding_window = W (its
// mask keeps kv_idx for q_idx iff kv_idx > q_idx - sliding_window, on top of the causal
// kv_idx <= q_idx; its FlashAttention call passes window_size = (sliding_window - 1, 0)),
// which is what Mistral checkpoints were trained with. The paper's wording ("positions
// between i - W and i") counts one key more; we follow the checkpoints.
// kNoWindow (0): full causal attention.
inline constexpr int64_t kNoWindow = 0;
void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const IndexTensor& cu_seqlens, int64_t window = kNoWindow);
// Overwrites dq, dk, dv (shapes of q, k, v) from dout, recomputing scores tile by tile.
void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                        int64_t window = kNoWindow);

// ---- attention between arbitrary row blocks (ring attention, context parallel) ---
// One rectangle of causal attention: query rows [q_begin, q_end) of q (and of out,
// lse, dq, dout) against key rows [k_begin, k_end) of k and v (and dk, dv), masked
// by true positions: query row i has position q_position + (i - q_begin), key row j
// has position k_position + (j - k_begin), and j is visible to i iff its position is
// <= i's and, with a window W > 0 (as above), > i's - W. Blocks of one call may share
// query rows (their softmax is merged) or key rows (their gradients are summed).
// Grouped-query mapping and scale as above. A block wholly outside the window (every
// key at least W positions before every query) contributes nothing and costs nothing.
struct AttentionBlock {
  int32_t q_begin = 0, q_end = 0;
  int32_t k_begin = 0, k_end = 0;
  int32_t q_position = 0, k_position = 0;
};
// out [Tq, Hq, d] and lse [Hq, Tq] hold, for every query row a block touches, the
// normalised result and log-sum-exp of the keys seen so far (lse = -inf and out = 0
// for none: see attention_reset_rows). The blocks' keys are merged in with an
// on-line softmax, so calling this once per key block (a ring step) gives exactly
// the attention over all of them. A row that sees no key of this call is unchanged.
void attention_forward_blocks(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::span<const AttentionBlock> blocks, int64_t window = kNoWindow);
// Sets out rows [begin, end) to 0 and their lse to -inf (no keys seen yet).
void attention_reset_rows(Tensor out, Tensor lse, int64_t begin, int64_t end);
// Adds into dq (query rows) and dk, dv (key rows) the gradients of the blocks' part
// of the attention, given the final out and lse of the query rows (over all keys,
// all calls). Summing over calls (ring steps) gives the full gradient.
void attention_backward_blocks(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               std::span<const AttentionBlock> blocks, int64_t window = kNoWindow);

// ---- SwiGLU -------------------------------------------------------------------
// out = silu(gate) * up, all [T, F]
void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up);
// Overwrites dgate and dup. Given `out`, also writes the forward's output into it,
// the same values as swiglu_forward from the same loads: a backward that recomputes
// the output instead of keeping it (it feeds the down projection's weight gradient)
// then reads gate and up once, not twice.
void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up,
                     Tensor out = Tensor());

// ---- mixture-of-experts row movement ----------------------------------------------
// The sparse MoE block (Shazeer et al. 2017, "Outrageously Large Neural Networks";
// Jiang et al. 2024, "Mixtral of Experts") moves rows between token order and expert
// order: each token's row goes to each of its k chosen experts and their outputs come
// back weighted by the router. These ops do that movement on any device. Rows, x, out
// and dout are the compute dtype (fp32 or bf16, all alike); scale, weights and
// dweights are fp32; indices int32. An index must name a row of the tensor it indexes:
// on the CPU (and the guarded device) every index is checked and a bad one throws
// std::invalid_argument naming the op and the row; a CUDA op cannot check without a
// round trip to the host, so there the caller guarantees it, and a row whose index is
// out of range reads nothing (zero) rather than memory outside the tensor.
//
// out [N, H] row r = scale[r] * x[index[r]] (scale empty, i.e. a default Tensor: 1), index [N] int32 rows of x [T, H].
// Used to dispatch tokens to experts (each token's row copied once per chosen expert), to permute rows
// between orders, and (with scale) for the experts' output gradients weight x dout.
void gather_rows(Tensor out, const Tensor& x, const IndexTensor& index, const Tensor& scale = Tensor());
// out [T, H] row t = sum over j < k of weights[t, j] * rows[index[t, j]] (weights empty: 1), index [T, k] int32
// rows of rows [N, H]; overwritten. Summed in j order in fp32, one rounding on store (deterministic, no atomics).
// The combine of expert outputs, and (weights empty) the backward of gather_rows for inputs gathered k times.
void combine_rows(Tensor out, const Tensor& rows, const IndexTensor& index, const Tensor& weights = Tensor());
// dweights [T, k] fp32, overwritten: <dout[t], rows[index[t, j]]>, the gradient of combine_rows by its weights.
void combine_rows_weight_backward(Tensor dweights, const Tensor& dout, const Tensor& rows, const IndexTensor& index);

// ---- fused softmax cross-entropy ------------------------------------------------
// Split in two passes so a vocabulary-parallel caller can reduce the per-row
// statistics across ranks between them. logits [T, V_local] hold vocabulary ids
// [vocab_begin, vocab_begin + V_local); targets [T] are global ids, -1 = no prediction.
//
// Pass 1: per row, row_max = max logit, row_sumexp = sum exp(logit - row_max),
// target_logit = the target's logit if this shard holds it, else 0. The vocabulary is
// streamed once with an on-line max, never materialising probabilities.
void cross_entropy_stats(Tensor row_max, Tensor row_sumexp, Tensor target_logit, const Tensor& logits,
                         const IndexTensor& targets, int64_t vocab_begin);
// Pass 2: given each row's global log-sum-exp lse [T], overwrites logits in place with
// grad_scale * (softmax - onehot(target)) (zero rows where target = -1).
void cross_entropy_backward_inplace(Tensor logits, const Tensor& lse, const IndexTensor& targets, int64_t vocab_begin,
                                    float grad_scale);
// Between the passes, when tp ranks each hold a vocabulary slice (all [T]):
// after row_max was all-reduced (max) into global_max, rescale this rank's sums to
// the common max: row_sumexp *= exp(row_max - global_max) (float, per element)...
void cross_entropy_rescale_sumexp(Tensor row_sumexp, const Tensor& row_max, const Tensor& global_max);
// ...and after row_sumexp and target_logit were all-reduced (sum): lse = global_max +
// log(row_sumexp) (float; lse may be row_max's memory), and the return value is the
// sum over rows with targets >= 0 of double(lse) - double(target_logit), added in
// row order in double (brought back to the host).
double cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                                 const Tensor& target_logit, const IndexTensor& targets);
// The same, adding the sum into loss_sum[0] on the device instead of returning it (no read).
void cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                               const Tensor& target_logit, const IndexTensor& targets, DoubleTensor loss_sum);
// Single-shard convenience: both passes; returns the sum over predicted rows of
// -log softmax(target) (in double) and leaves the scaled gradient in logits.
double cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT);
// The same, adding the loss into loss_sum[0] on the device instead of returning it (no read).
void cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT,
                                    DoubleTensor loss_sum);

// ---- AdamW (decoupled weight decay, bias correction) ----------------------------
// The update's plain arguments, all the caller's: the trainer's come from its
// AdamWHyperparameters (spec/optim_config.h) through adamw_step
// (parallel/zero_optimizer.h).
struct AdamWStep {
  float lr = 0;
  float beta1 = 0;
  float beta2 = 0;
  float eps = 0;
  float weight_decay = 0;
  int64_t step = 1;         // 1-based, for bias correction
  float grad_scale = 1.0f;  // applied to grad first (gradient clipping)
};
// param, grad, m, v have equal shapes (fp32); m and v are the first and second moments.
// Given param_bf16 (bf16, param's shape), also stores each updated parameter rounded
// to it (to nearest even, as copy does): mixed precision's compute copy refreshed in
// the update's pass instead of a pass of its own over the fp32 weights.
void adamw_update(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWStep& s,
                  Tensor param_bf16 = Tensor());

}  // namespace hdp
