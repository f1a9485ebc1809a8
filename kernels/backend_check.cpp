#include "kernels/backend_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <span>

#include "kernels/allocator.h"
#include "kernels/attention_impl.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/ops.h"

namespace hdp {
namespace {

// fp32 results that differ only in summation order: a few ulps of the tensor's
// scale, more for long reductions (GEMM inner dimension, attention over keys).
constexpr double kTolPointwise = 2e-6;
constexpr double kTolReduction = 2e-5;
// Products on TF32 tensor cores (10-bit mantissa, rounding 2^-11 per operand):
// about 1e-3 of the tensor's scale after a reduction, as cuBLAS's TF32 GEMMs.
constexpr double kTolTf32 = 5e-3;
// A bf16 result against the CPU's bf16 twin (kernels/cpu/bf16.cpp): both round
// once from fp32 values that differ only as the fp32 rows above do, so an element
// lands on the same bf16 value or one bf16 step apart where the fp32 values
// straddle a rounding boundary. A step is 2^-7 of a value at most (8 significant
// bits), 0.0078 of the tensor's scale at its largest element; anything wrong in a
// kernel (a wrong mask, a missed rounding, fp32 read as bf16) is far larger.
constexpr double kTolBf16 = 1e-2;

// A check's result in `dtype` (fp32 or bf16) held to the fp32 tolerance `tol`, or
// to at least one bf16 step when it is stored in bf16.
double stored_tolerance(DType dtype, double tol) { return dtype == DType::BF16 ? std::max(tol, kTolBf16) : tol; }

// The op's name with the precision it ran in, and for attention through cuDNN the
// implementation ("attention_forward out [bf16, cudnn]").
std::string named(const char* op, DType dtype, AttentionImpl impl = AttentionImpl::Own) {
  std::string marks = dtype == DType::BF16 ? "bf16" : "";
  if (impl != AttentionImpl::Own)
    marks += std::string(marks.empty() ? "" : ", ") + enum_name(kAttentionImplNames, impl);
  return marks.empty() ? op : std::string(op) + " [" + marks + "]";
}

// The same tensor on the CPU and on the device under test.
struct Twin {
  Tensor host, dev;
};
struct IndexTwin {
  IndexTensor host, dev;
};

// Owns the memory of one check's tensors.
class Workspace {
 public:
  Workspace(Device device, std::mt19937& rng) : device_(device), rng_(rng) {}

  Twin random(std::initializer_list<int64_t> dims, float lo = -1.0f, float hi = 1.0f) {
    Twin t = make(dims);
    std::uniform_real_distribution<float> u(lo, hi);
    for (int64_t i = 0; i < t.host.numel(); ++i) t.host.data[i] = u(rng_);
    copy(t.dev, t.host);
    return t;
  }
  Twin constant(std::initializer_list<int64_t> dims, float value) {
    Twin t = make(dims);
    fill(t.host, value);
    fill(t.dev, value);
    return t;
  }
  // Random values in `dtype`: fp32 or bf16 on both sides.
  Twin random_as(DType dtype, std::initializer_list<int64_t> dims, float lo = -1.0f, float hi = 1.0f) {
    return dtype == DType::BF16 ? random_bf16(dims, lo, hi) : random(dims, lo, hi);
  }
  // bf16 on both sides, from random values (host bf16 memory lives in host_bf16_).
  Twin random_bf16(std::initializer_list<int64_t> dims, float lo = -1.0f, float hi = 1.0f) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    host_bf16_.emplace_back(static_cast<size_t>(std::max<int64_t>(n, 1)));
    std::uniform_real_distribution<float> u(lo, hi);
    for (int64_t i = 0; i < n; ++i) host_bf16_.back()[static_cast<size_t>(i)] = to_bf16(u(rng_));
    Twin t;
    t.host = Tensor::of_bf16(host_bf16_.back().data(), dims, Device::CPU);
    arenas_.emplace_back(device_, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(bf16), "check");
    t.dev = arenas_.back().tensor(dims, DType::BF16);
    copy(t.dev, t.host);
    return t;
  }

  IndexTwin indices(const std::vector<int32_t>& values) {
    const int64_t n = static_cast<int64_t>(values.size());
    host_int_.emplace_back(values);
    IndexTwin t;
    t.host = IndexTensor(host_int_.back().data(), {n}, Device::CPU);
    arenas_.emplace_back(device_, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(int32_t), "check");
    t.dev = arenas_.back().index_tensor({n});
    copy(t.dev, t.host);
    return t;
  }

 private:
  Twin make(std::initializer_list<int64_t> dims) {
    Twin t;
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    host_.emplace_back(static_cast<size_t>(std::max<int64_t>(n, 1)));
    t.host = Tensor(host_.back().data(), dims, Device::CPU);
    arenas_.emplace_back(device_, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float), "check");
    t.dev = arenas_.back().tensor(dims);
    return t;
  }

  Device device_;
  std::mt19937& rng_;
  std::deque<std::vector<float>> host_;
  std::deque<std::vector<int32_t>> host_int_;
  std::deque<std::vector<bf16>> host_bf16_;
  std::deque<Arena> arenas_;
};

// A tensor's values as fp32 in host memory (bf16 is fetched as it is stored, then
// widened exactly on the host).
std::vector<float> host_values(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  if (t.dtype == DType::BF16) {
    std::vector<bf16> raw(static_cast<size_t>(n));
    copy(Tensor::of_bf16(raw.data(), {n}, Device::CPU), t.view({n}));
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = to_float(raw[static_cast<size_t>(i)]);
  } else {
    copy(Tensor(out.data(), {n}, Device::CPU), t.view({n}));
  }
  return out;
}

class Checker {
 public:
  Checker(Device device, uint64_t seed) : device_(device), rng_(static_cast<uint32_t>(seed)) {}

  Device device() const { return device_; }
  Workspace workspace() { return Workspace(device_, rng_); }
  std::mt19937& rng() { return rng_; }

  // While set (tolerance > 0), products may run in a lower precision: every row is
  // marked with `label` and held to at least `tolerance`.
  void relax(double tolerance, std::string label) {
    relaxed_tolerance_ = tolerance;
    label_ = std::move(label);
  }

  // Compares a twin's device half with its CPU half.
  void compare(const std::string& op, const std::string& shape, const Twin& t, double tolerance) {
    const std::vector<float> want = host_values(t.host), got = host_values(t.dev);
    double max_abs = 0, scale = 0;
    bool finite = true;
    for (int64_t i = 0; i < t.host.numel(); ++i) {
      const double ref = want[static_cast<size_t>(i)], x = got[static_cast<size_t>(i)];
      if (std::isnan(ref) && std::isnan(x)) continue;
      if (std::isinf(ref) && x == ref) continue;  // -inf lse of rows that see no key
      if (!std::isfinite(x) || !std::isfinite(ref)) {
        finite = false;
        continue;
      }
      max_abs = std::max(max_abs, std::abs(x - ref));
      scale = std::max(scale, std::abs(ref));
    }
    add(op, shape, max_abs, scale, tolerance, finite);
  }
  void compare_scalar(const std::string& op, const std::string& shape, double got, double ref, double tolerance) {
    add(op, shape, std::abs(got - ref), std::abs(ref), tolerance, std::isfinite(got));
  }
  // A check that could not run, and why (it passes: a fallback, not a wrong result).
  void skip(const std::string& op, const std::string& shape, const std::string& why) {
    OpCheck c;
    c.op = op + label_;
    c.shape = shape;
    c.pass = true;
    c.skipped = why;
    results.push_back(c);
  }

  // In bf16, before a compared result feeds the next op: the device takes the CPU's
  // values, so the next op is checked on equal inputs. A one-step difference that a
  // rounding boundary made (kTolBf16) would otherwise be carried into the next
  // op's inputs and compared again there. fp32 checks keep their chains.
  void share_reference(DType dtype, const Twin& t) {
    if (dtype == DType::BF16) copy(t.dev, t.host);
  }

  std::vector<OpCheck> results;

 private:
  void add(const std::string& op, const std::string& shape, double max_abs, double scale, double tolerance,
           bool finite) {
    OpCheck c;
    c.op = op + label_;
    tolerance = std::max(tolerance, relaxed_tolerance_);
    c.shape = shape;
    c.max_abs = finite ? max_abs : std::numeric_limits<double>::infinity();
    c.max_rel = scale > 0 ? c.max_abs / scale : c.max_abs;
    c.tolerance = tolerance;
    c.pass = finite && c.max_rel <= tolerance;
    results.push_back(c);
  }

  Device device_;
  std::mt19937 rng_;
  double relaxed_tolerance_ = 0;
  std::string label_;
};

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> items) {
  std::string s;
  for (const auto& [name, value] : items) {
    if (!s.empty()) s += ' ';
    s.append(name).append("=").append(std::to_string(value));
  }
  return s;
}

void check_dense(Checker& c) {
  struct Case {
    int64_t M, N, K;
  };
  for (const Case& k : {Case{37, 53, 29}, Case{256, 384, 512}, Case{1, 7, 300}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        Workspace w = c.workspace();
        const Twin a = ta ? w.random({k.K, k.M}) : w.random({k.M, k.K});
        const Twin b = tb ? w.random({k.N, k.K}) : w.random({k.K, k.N});
        const Twin out = w.random({k.M, k.N});
        matmul(out.host, a.host, ta, b.host, tb, 0.75f, 0.5f);
        matmul(out.dev, a.dev, ta, b.dev, tb, 0.75f, 0.5f);
        c.compare(std::string("matmul ") + (ta ? "T" : "N") + (tb ? "T" : "N"),
                  dims({{"M", k.M}, {"N", k.N}, {"K", k.K}}), out, kTolReduction);
      }
    }
  }
  for (int64_t T : {int64_t{5}, int64_t{333}}) {
    const int64_t in = 96, out_features = 160;
    const std::string shape = dims({{"T", T}, {"in", in}, {"out", out_features}});
    Workspace w = c.workspace();
    const Twin x = w.random({T, in}), wt = w.random({out_features, in}), y = w.random({T, out_features});
    linear_forward(y.host, x.host, wt.host);
    linear_forward(y.dev, x.dev, wt.dev);
    c.compare("linear_forward", shape, y, kTolReduction);
    const Twin residual = w.random({T, out_features}), with_residual = w.random({T, out_features});
    linear_forward(with_residual.host, x.host, wt.host, residual.host);
    linear_forward(with_residual.dev, x.dev, wt.dev, residual.dev);
    c.compare("linear_forward (residual)", shape, with_residual, kTolReduction);
    for (bool accumulate : {false, true}) {
      const Twin dy = w.random({T, out_features}), dx = w.random({T, in}), dw = w.random({out_features, in});
      linear_backward(dx.host, dw.host, dy.host, x.host, wt.host, accumulate);
      linear_backward(dx.dev, dw.dev, dy.dev, x.dev, wt.dev, accumulate);
      const std::string how = accumulate ? " (accumulate)" : "";
      c.compare("linear_backward dx" + how, shape, dx, kTolReduction);
      c.compare("linear_backward dw" + how, shape, dw, kTolReduction);
    }
    const Twin dy = w.random({T, out_features}), dw = w.random({out_features, in});
    linear_backward(Tensor(), dw.host, dy.host, x.host, wt.host, false);
    linear_backward(Tensor(), dw.dev, dy.dev, x.dev, wt.dev, false);
    c.compare("linear_backward dw (no dx)", shape, dw, kTolReduction);
    const Twin dx = w.random({T, in});
    linear_backward(dx.host, Tensor(), dy.host, x.host, wt.host, true);
    linear_backward(dx.dev, Tensor(), dy.dev, x.dev, wt.dev, true);
    c.compare("linear_backward dx (no dw)", shape, dx, kTolReduction);
  }
}

void check_elementwise(Checker& c) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1 << 20} + 3}) {
    const std::string shape = dims({{"n", n}});
    Workspace w = c.workspace();
    const Twin y = w.random({n}), x = w.random({n});
    add_inplace(y.host, x.host);
    add_inplace(y.dev, x.dev);
    c.compare("add_inplace", shape, y, kTolPointwise);
    scale_inplace(y.host, -1.7f);
    scale_inplace(y.dev, -1.7f);
    c.compare("scale_inplace", shape, y, kTolPointwise);
    c.compare_scalar("sum_squares", shape, sum_squares(y.dev), sum_squares(y.host), 1e-9);
    fill(y.host, 0.3f);
    fill(y.dev, 0.3f);
    c.compare("fill", shape, y, 0);
    fill(y.host, 0.0f);  // zero: a memset on CUDA
    fill(y.dev, 0.0f);
    c.compare("fill zero", shape, y, 0);
    const Twin z = w.random({n});
    copy(y.dev, z.dev);  // device to device
    copy(y.host, z.host);
    c.compare("copy", shape, y, 0);
  }
}

void check_embedding(Checker& c, DType dt) {
  const int64_t V_local = 50, H = 72, T = 200, vocab_begin = 30;
  const std::string shape = dims({{"T", T}, {"V_local", V_local}, {"H", H}, {"vocab_begin", vocab_begin}});
  Workspace w = c.workspace();
  std::vector<int32_t> tokens(T);
  std::uniform_int_distribution<int32_t> tok(0, 120);  // some outside the shard
  for (int32_t& t : tokens) t = tok(c.rng());
  const IndexTwin ids = w.indices(tokens);
  const Twin table = w.random_as(dt, {V_local, H}), out = w.random_as(dt, {T, H});
  embedding_forward(out.host, ids.host, table.host, vocab_begin);
  embedding_forward(out.dev, ids.dev, table.dev, vocab_begin);
  c.compare(named("embedding_forward", dt), shape, out, 0);  // rows move unchanged
  // The weight gradient is fp32 in either precision.
  const Twin dout = w.random_as(dt, {T, H}), dtable = w.random({V_local, H});
  embedding_backward(dtable.host, ids.host, dout.host, vocab_begin);
  embedding_backward(dtable.dev, ids.dev, dout.dev, vocab_begin);
  c.compare(named("embedding_backward", dt), shape, dtable, kTolPointwise * 10);
}

void check_rmsnorm(Checker& c, DType dt) {
  // H = 8192: the CUDA backward's weight-gradient sums take more than 48 KB of shared
  // memory (an opt-in); T = 67 leaves its last chunk of 8 rows short.
  for (int64_t H : {int64_t{96}, int64_t{2048}, int64_t{4099}, int64_t{8192}}) {
    const int64_t T = 67;
    const std::string shape = dims({{"T", T}, {"H", H}});
    Workspace w = c.workspace();
    const Twin x = w.random_as(dt, {T, H}, -2, 2), wt = w.random_as(dt, {H}, 0.5f, 1.5f), y = w.random_as(dt, {T, H}),
               rstd = w.random({T});
    rmsnorm_forward(y.host, rstd.host, x.host, wt.host, 1e-5f);
    rmsnorm_forward(y.dev, rstd.dev, x.dev, wt.dev, 1e-5f);
    c.compare(named("rmsnorm_forward y", dt), shape, y, stored_tolerance(dt, kTolPointwise));
    c.compare(named("rmsnorm_forward rstd", dt), shape, rstd, kTolPointwise);
    c.share_reference(dt, rstd);
    // dx adds into its bf16 values in fp32 and rounds the sum once; dw is fp32.
    const Twin dy = w.random_as(dt, {T, H}), dx = w.random_as(dt, {T, H}), dw = w.random({H});
    rmsnorm_backward(dx.host, dw.host, dy.host, x.host, wt.host, rstd.host);
    rmsnorm_backward(dx.dev, dw.dev, dy.dev, x.dev, wt.dev, rstd.dev);
    c.compare(named("rmsnorm_backward dx", dt), shape, dx, stored_tolerance(dt, kTolReduction));
    c.compare(named("rmsnorm_backward dw", dt), shape, dw, kTolReduction);
  }
}

void check_rope(Checker& c, DType dt) {
  // d = 12: half a head is no whole 16-byte pack (CUDA rotates pair by pair).
  for (int64_t d : {int64_t{12}, int64_t{16}, int64_t{128}}) {
    const int64_t T = 77, heads = 3;
    const std::string shape = dims({{"T", T}, {"heads", heads}, {"d", d}});
    Workspace w = c.workspace();
    std::vector<int32_t> positions(T);
    std::uniform_int_distribution<int32_t> pos(0, 100000);
    for (int32_t& p : positions) p = pos(c.rng());
    const IndexTwin p = w.indices(positions);
    const Twin x = w.random_as(dt, {T, heads, d});
    rope_forward(x.host, p.host, 500000.0f);
    rope_forward(x.dev, p.dev, 500000.0f);
    // Large angles: sincosf on the GPU and glibc's differ by an ulp of the angle's reduction.
    c.compare(named("rope_forward", dt), shape, x, stored_tolerance(dt, 1e-5));
    c.share_reference(dt, x);
    rope_backward(x.host, p.host, 10000.0f);
    rope_backward(x.dev, p.dev, 10000.0f);
    c.compare(named("rope_backward", dt), shape, x, stored_tolerance(dt, 1e-5));
    // Queries and keys in one call (2 key heads after the 3 query heads).
    const Twin keys = w.random_as(dt, {T, 2, d});
    rope_forward(x.host, p.host, 10000.0f, keys.host);
    rope_forward(x.dev, p.dev, 10000.0f, keys.dev);
    c.compare(named("rope_forward (queries and keys) q", dt), shape, x, stored_tolerance(dt, 1e-5));
    c.compare(named("rope_forward (queries and keys) k", dt), shape, keys, stored_tolerance(dt, 1e-5));
    rope_backward(x.host, p.host, 10000.0f, keys.host);
    rope_backward(x.dev, p.dev, 10000.0f, keys.dev);
    c.compare(named("rope_backward (queries and keys) q", dt), shape, x, stored_tolerance(dt, 1e-5));
    c.compare(named("rope_backward (queries and keys) k", dt), shape, keys, stored_tolerance(dt, 1e-5));
  }
}

void check_swiglu(Checker& c, DType dt) {
  // T x F = 32032 elements, whole 16-byte packs on CUDA; 32123, three elements past them.
  for (int64_t F : {int64_t{352}, int64_t{353}}) {
    const int64_t T = 91;
    const std::string shape = dims({{"T", T}, {"F", F}});
    Workspace w = c.workspace();
    const Twin gate = w.random_as(dt, {T, F}, -6, 6), up = w.random_as(dt, {T, F}), out = w.random_as(dt, {T, F});
    swiglu_forward(out.host, gate.host, up.host);
    swiglu_forward(out.dev, gate.dev, up.dev);
    c.compare(named("swiglu_forward", dt), shape, out, stored_tolerance(dt, kTolPointwise * 5));
    const Twin dout = w.random_as(dt, {T, F}), dgate = w.random_as(dt, {T, F}), dup = w.random_as(dt, {T, F});
    swiglu_backward(dgate.host, dup.host, dout.host, gate.host, up.host);
    swiglu_backward(dgate.dev, dup.dev, dout.dev, gate.dev, up.dev);
    c.compare(named("swiglu_backward dgate", dt), shape, dgate, stored_tolerance(dt, kTolPointwise * 5));
    c.compare(named("swiglu_backward dup", dt), shape, dup, stored_tolerance(dt, kTolPointwise * 5));
    // The MLP's backward: the forward's output recomputed by the backward kernel.
    const Twin recomputed = w.random_as(dt, {T, F});
    swiglu_backward(dgate.host, dup.host, dout.host, gate.host, up.host, recomputed.host);
    swiglu_backward(dgate.dev, dup.dev, dout.dev, gate.dev, up.dev, recomputed.dev);
    c.compare(named("swiglu_backward out (recomputed)", dt), shape, recomputed,
              stored_tolerance(dt, kTolPointwise * 5));
    c.compare(named("swiglu_backward dgate (with out)", dt), shape, dgate, stored_tolerance(dt, kTolPointwise * 5));
  }
}

// The MoE block's row movement as a routing makes it: every token picks k = 2 of 4
// experts, dispatch gathers each token's row once per choice into expert order
// (N = T * k rows, each token's index repeated), the combine sums each token's
// expert rows back weighted by the router, and its weight gradient; plus a gather
// with a scale per row from an index with arbitrary repeats. H = 72 is no multiple
// of a warp or a vector. T = 0 (no token reached this rank) must work too.
void check_moe_rows(Checker& c, DType dt) {
  for (int64_t T : {int64_t{37}, int64_t{0}}) {
    const int64_t k = 2, experts = 4, H = 72, N = T * k;
    const std::string shape = dims({{"T", T}, {"k", k}, {"H", H}});
    Workspace w = c.workspace();
    // Pairs (t, j) in expert order: dispatch[r] is the token of the r-th pair, and
    // slot[t * k + j] where pair (t, j) landed.
    std::vector<int32_t> choice(static_cast<size_t>(N)), dispatch, slot(static_cast<size_t>(N)),
        repeats(static_cast<size_t>(N));
    std::uniform_int_distribution<int32_t> expert(0, static_cast<int32_t>(experts - 1));
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(std::max<int64_t>(T - 1, 0)));
    for (int64_t t = 0; t < T; ++t) {
      choice[t * k] = expert(c.rng());
      do choice[t * k + 1] = expert(c.rng());
      while (choice[t * k + 1] == choice[t * k]);
    }
    for (int32_t e = 0; e < experts; ++e)
      for (int64_t p = 0; p < N; ++p)
        if (choice[p] == e) {
          slot[p] = static_cast<int32_t>(dispatch.size());
          dispatch.push_back(static_cast<int32_t>(p / k));
        }
    for (int32_t& r : repeats) r = token(c.rng());
    IndexTwin to_experts = w.indices(dispatch), back = w.indices(slot), any = w.indices(repeats);
    back.host = back.host.view({T, k});
    back.dev = back.dev.view({T, k});

    const Twin x = w.random_as(dt, {T, H}), rows = w.random_as(dt, {N, H}), scale = w.random({N}, -2, 2);
    gather_rows(rows.host, x.host, to_experts.host);
    gather_rows(rows.dev, x.dev, to_experts.dev);
    c.compare(named("gather_rows (dispatch)", dt), shape, rows, 0);  // rows move unchanged
    const Twin scaled = w.random_as(dt, {N, H});
    gather_rows(scaled.host, x.host, any.host, scale.host);
    gather_rows(scaled.dev, x.dev, any.dev, scale.dev);
    c.compare(named("gather_rows (scale)", dt), shape, scaled, stored_tolerance(dt, kTolPointwise));
    c.share_reference(dt, scaled);

    const Twin weights = w.random({T, k}, 0, 1), out = w.random_as(dt, {T, H});
    combine_rows(out.host, rows.host, back.host, weights.host);
    combine_rows(out.dev, rows.dev, back.dev, weights.dev);
    c.compare(named("combine_rows", dt), shape, out, stored_tolerance(dt, kTolPointwise));
    combine_rows(out.host, scaled.host, back.host);
    combine_rows(out.dev, scaled.dev, back.dev);
    c.compare(named("combine_rows (no weights)", dt), shape, out, stored_tolerance(dt, kTolPointwise));

    const Twin dout = w.random_as(dt, {T, H}), dweights = w.random({T, k});
    combine_rows_weight_backward(dweights.host, dout.host, rows.host, back.host);
    combine_rows_weight_backward(dweights.dev, dout.dev, rows.dev, back.dev);
    c.compare(named("combine_rows_weight_backward", dt), shape, dweights, kTolReduction);  // fp32 either way
  }
}

// The tolerance of attention's bf16-stored results (out, dq, dk, dv) with head dim
// d: on CUDA with d = 64 or 128 the bf16 tensor-core kernels round P and dS to bf16
// as mma operands, beyond the store's one rounding
// (kBf16TensorCoreAttentionTolerance, derived in tests/kernels_mma_fragments_test.cpp),
// and so does cuDNN at every d; otherwise the stored tolerance.
double attention_tolerance(const Checker& c, DType dt, int64_t d, AttentionImpl impl) {
  if (dt == DType::BF16 && c.device() == Device::CUDA && (d == 64 || d == 128 || impl == AttentionImpl::Cudnn))
    return kBf16TensorCoreAttentionTolerance;
  return stored_tolerance(dt, kTolReduction);
}

// The shape of an attention check, with its sliding window (W) if it has one.
std::string with_window(std::string shape, int64_t window) {
  return window == kNoWindow ? shape : shape + " W=" + std::to_string(window);
}

// Attention over packed documents with our kernels (AttentionImpl::Own) or through
// cuDNN (AttentionImpl::Cudnn, bf16 on CUDA): a case cuDNN refuses is a skipped row.
void check_attention(Checker& c, DType dt, AttentionImpl impl) {
  const AttentionImplScope scope(impl);
  struct Case {
    std::vector<int32_t> doc_lengths;
    int64_t Hq, Hkv, d;
    int64_t window = kNoWindow;
    // The inputs are the first T rows of buffers of 2T whose other rows are NaN: a
    // kernel that loads rows past its documents (cuDNN's graphs are built for T
    // rounded up to a power of two) must not let them into a result.
    bool nan_past_t = false;
  };
  const std::vector<Case> cases = {
      {{1, 17, 64, 130, 3}, 4, 2, 16},
      {{300}, 2, 2, 64},
      {{5, 250, 1, 96}, 8, 2, 128},
      {{1000}, 4, 1, 128},
      // Sliding windows (Mistral): shorter than some documents and not a tile multiple,
      // one tile wide, and a band across many tiles (d = 64, 128 take the tensor-core
      // paths on CUDA: bf16 always, fp32 with TF32 on).
      {{1, 17, 64, 130, 3}, 4, 2, 16, 20},
      {{300, 45}, 2, 2, 64, 64},
      {{5, 250, 1, 96}, 8, 2, 128, 33},
      {{1000}, 4, 1, 128, 256},
      // Empty documents (a data loader's zero-length ones) at both ends and between.
      {{0, 40, 0, 200, 77, 0}, 8, 2, 128},
      {{1500}, 4, 1, 128, kNoWindow, true},
      {{5, 250, 1, 96}, 8, 2, 128, kNoWindow, true},
  };
  for (const Case& k : cases) {
    std::vector<int32_t> cu{0};
    for (int32_t n : k.doc_lengths) cu.push_back(cu.back() + n);
    const int64_t T = cu.back();
    const int64_t docs = static_cast<int64_t>(k.doc_lengths.size());
    const std::string shape =
        with_window(dims({{"T", T}, {"docs", docs}, {"Hq", k.Hq}, {"Hkv", k.Hkv}, {"d", k.d}}), k.window) +
        (k.nan_past_t ? " NaN past T" : "");
    Workspace w = c.workspace();
    const double tol = attention_tolerance(c, dt, k.d, impl);  // out, dq, dk, dv; lse is fp32 in either precision
    const IndexTwin cs = w.indices(cu);
    // An input of T rows (Case::nan_past_t: the first T of 2T, the rest NaN).
    auto input = [&](int64_t heads, float lo, float hi) {
      if (!k.nan_past_t) return w.random_as(dt, {T, heads, k.d}, lo, hi);
      const Twin whole = w.random_as(dt, {2 * T, heads, k.d}, lo, hi);
      fill(whole.host.rows(T, 2 * T), std::numeric_limits<float>::quiet_NaN());
      fill(whole.dev.rows(T, 2 * T), std::numeric_limits<float>::quiet_NaN());
      return Twin{whole.host.rows(0, T), whole.dev.rows(0, T)};
    };
    const Twin q = input(k.Hq, -2, 2), kk = input(k.Hkv, -2, 2), v = input(k.Hkv, -1, 1),
               out = w.random_as(dt, {T, k.Hq, k.d}), lse = w.random({k.Hq, T});
    attention_forward(out.host, lse.host, q.host, kk.host, v.host, cs.host, k.window);
    try {
      attention_forward(out.dev, lse.dev, q.dev, kk.dev, v.dev, cs.dev, k.window);
    } catch (const CudnnAttentionRefused& refused) {
      c.skip(named("attention_forward", dt, impl), shape, refused.what());
      continue;
    }
    c.compare(named("attention_forward out", dt, impl), shape, out, tol);
    c.compare(named("attention_forward lse", dt, impl), shape, lse, kTolReduction);
    c.share_reference(dt, out);
    c.share_reference(dt, lse);
    const Twin dout = input(k.Hq, -1, 1), dq = w.random_as(dt, {T, k.Hq, k.d}),
               dk = w.random_as(dt, {T, k.Hkv, k.d}), dv = w.random_as(dt, {T, k.Hkv, k.d});
    attention_backward(dq.host, dk.host, dv.host, dout.host, q.host, kk.host, v.host, out.host, lse.host, cs.host,
                       k.window);
    try {
      attention_backward(dq.dev, dk.dev, dv.dev, dout.dev, q.dev, kk.dev, v.dev, out.dev, lse.dev, cs.dev, k.window);
    } catch (const CudnnAttentionRefused& refused) {
      c.skip(named("attention_backward", dt, impl), shape, refused.what());
      continue;
    }
    c.compare(named("attention_backward dq", dt, impl), shape, dq, tol);
    c.compare(named("attention_backward dk", dt, impl), shape, dk, tol);
    c.compare(named("attention_backward dv", dt, impl), shape, dv, tol);
  }
}

// The documents' attention through cuDNN's fused attention, in bf16 (the one
// precision it is used in), against the CPU's bf16 twin; without a usable cuDNN,
// one skipped row that says why.
void check_cudnn_attention(Checker& c) {
  const CudnnRuntime& runtime = cuda::cudnn_runtime();
  if (!runtime.unavailable.empty()) return c.skip(named("attention", DType::BF16, AttentionImpl::Cudnn), "",
                                                  runtime.unavailable);
  check_attention(c, DType::BF16, AttentionImpl::Cudnn);
}

// Ring attention's use: query rows merged over two calls (an own step and a
// remote step), blocks sharing query rows and key rows, a block partly masked
// by positions, rows that see no key at all. With a window of 40 the fully
// visible rectangles fall wholly outside it (they must contribute nothing), the
// diagonal blocks become bands, and rows 140..149 see no key. In bf16 each call
// rounds out (and dq, dk, dv) once, after merging (summing) all its blocks in fp32.
void check_attention_blocks(Checker& c, int64_t window, DType dt) {
  const AttentionImplScope scope(AttentionImpl::Own);
  const int64_t Tq = 150, Tk = 140, Hq = 4, Hkv = 2, d = 64;
  const std::string shape = with_window(dims({{"Tq", Tq}, {"Tk", Tk}, {"Hq", Hq}, {"Hkv", Hkv}, {"d", d}}), window);
  const double tol = attention_tolerance(c, dt, d, AttentionImpl::Own);  // out, dq, dk, dv
  Workspace w = c.workspace();
  const Twin q = w.random_as(dt, {Tq, Hq, d}, -2, 2), k = w.random_as(dt, {Tk, Hkv, d}, -2, 2),
             v = w.random_as(dt, {Tk, Hkv, d}), out = w.random_as(dt, {Tq, Hq, d}), lse = w.random({Hq, Tq});
  const std::vector<AttentionBlock> first = {
      {0, 60, 0, 60, 0, 0},        // a diagonal block
      {60, 140, 0, 45, 200, 10},   // fully visible rectangle
      {60, 140, 45, 140, 200, 150}, // shares query rows with the one above; partly masked
  };
  const std::vector<AttentionBlock> second = {
      {0, 60, 60, 100, 0, 30},     // rows 0..29 see no key, rows 30.. a growing prefix
      {100, 150, 0, 140, 1000, 0}, // rows 140..149 see only this call
  };
  attention_reset_rows(out.host, lse.host, 0, Tq);
  attention_reset_rows(out.dev, lse.dev, 0, Tq);
  attention_forward_blocks(out.host, lse.host, q.host, k.host, v.host, first, window);
  attention_forward_blocks(out.dev, lse.dev, q.dev, k.dev, v.dev, first, window);
  c.compare(named("attention_forward_blocks out (1 call)", dt), shape, out, tol);
  c.share_reference(dt, out);
  c.share_reference(dt, lse);
  attention_forward_blocks(out.host, lse.host, q.host, k.host, v.host, second, window);
  attention_forward_blocks(out.dev, lse.dev, q.dev, k.dev, v.dev, second, window);
  c.compare(named("attention_forward_blocks out (2 calls)", dt), shape, out, tol);
  c.compare(named("attention_forward_blocks lse (2 calls)", dt), shape, lse, kTolReduction);
  c.share_reference(dt, out);
  c.share_reference(dt, lse);
  const Twin dout = w.random_as(dt, {Tq, Hq, d}), dq = w.random_as(dt, {Tq, Hq, d}), dk = w.random_as(dt, {Tk, Hkv, d}),
             dv = w.random_as(dt, {Tk, Hkv, d});
  for (const auto* blocks : {&first, &second}) {
    attention_backward_blocks(dq.host, dk.host, dv.host, dout.host, q.host, k.host, v.host, out.host, lse.host,
                              *blocks, window);
    attention_backward_blocks(dq.dev, dk.dev, dv.dev, dout.dev, q.dev, k.dev, v.dev, out.dev, lse.dev, *blocks,
                              window);
    if (blocks == &first && dt == DType::BF16) {  // the second call adds into the first's rounded sums
      c.compare(named("attention_backward_blocks dq (1 call)", dt), shape, dq, tol);
      c.compare(named("attention_backward_blocks dk (1 call)", dt), shape, dk, tol);
      c.compare(named("attention_backward_blocks dv (1 call)", dt), shape, dv, tol);
      c.share_reference(dt, dq);
      c.share_reference(dt, dk);
      c.share_reference(dt, dv);
    }
  }
  c.compare(named("attention_backward_blocks dq", dt), shape, dq, tol);
  c.compare(named("attention_backward_blocks dk", dt), shape, dk, tol);
  c.compare(named("attention_backward_blocks dv", dt), shape, dv, tol);
}

// bf16: the logits (the LM head's output) are bf16 and dlogits is written back into
// them rounded once; the statistics, lse and the loss are fp32 in either precision.
void check_cross_entropy(Checker& c, DType dt) {
  for (int64_t V : {int64_t{1000}, int64_t{32000}}) {
    const int64_t T = 45, vocab_begin = 700;
    const std::string shape = dims({{"T", T}, {"V_local", V}, {"vocab_begin", vocab_begin}});
    Workspace w = c.workspace();
    std::vector<int32_t> targets(T);
    std::uniform_int_distribution<int32_t> target(-1, static_cast<int32_t>(vocab_begin + V + 300));
    for (int32_t& t : targets) t = target(c.rng());
    const IndexTwin tg = w.indices(targets);
    const Twin logits = w.random_as(dt, {T, V}, -8, 8), row_max = w.random({T}), sumexp = w.random({T}),
               target_logit = w.random({T});
    cross_entropy_stats(row_max.host, sumexp.host, target_logit.host, logits.host, tg.host, vocab_begin);
    cross_entropy_stats(row_max.dev, sumexp.dev, target_logit.dev, logits.dev, tg.dev, vocab_begin);
    c.compare(named("cross_entropy_stats max", dt), shape, row_max, 0);
    c.compare(named("cross_entropy_stats sumexp", dt), shape, sumexp, kTolReduction);
    c.compare(named("cross_entropy_stats target", dt), shape, target_logit, 0);
    const Twin lse = w.random({T}, 8, 12);
    cross_entropy_backward_inplace(logits.host, lse.host, tg.host, vocab_begin, 0.01f);
    cross_entropy_backward_inplace(logits.dev, lse.dev, tg.dev, vocab_begin, 0.01f);
    c.compare(named("cross_entropy_backward_inplace", dt), shape, logits, stored_tolerance(dt, kTolPointwise * 5));
  }
  for (int64_t V : {int64_t{97}, int64_t{32000}}) {
    const int64_t T = 130;
    const std::string shape = dims({{"T", T}, {"V", V}});
    Workspace w = c.workspace();
    std::vector<int32_t> targets(T);
    std::uniform_int_distribution<int32_t> target(-1, static_cast<int32_t>(V - 1));
    for (int32_t& t : targets) t = target(c.rng());
    const IndexTwin tg = w.indices(targets);
    const Twin logits = w.random_as(dt, {T, V}, -8, 8), scratch = w.random({3 * T});
    const double ref = cross_entropy_forward_backward(logits.host, tg.host, 0.5f, scratch.host);
    const double got = cross_entropy_forward_backward(logits.dev, tg.dev, 0.5f, scratch.dev);
    c.compare_scalar(named("cross_entropy_forward_backward loss", dt), shape, got, ref, 1e-6);
    c.compare(named("cross_entropy_forward_backward grad", dt), shape, logits,
              stored_tolerance(dt, kTolPointwise * 5));
  }
  if (dt == DType::F32) {  // the vocabulary-parallel glue (fp32 statistics only) after the tp all-reduces
    const int64_t T = 1000;
    const std::string shape = dims({{"T", T}});
    Workspace w = c.workspace();
    std::vector<int32_t> targets(T);
    std::uniform_int_distribution<int32_t> target(-1, 31999);
    for (int32_t& t : targets) t = target(c.rng());
    const IndexTwin tg = w.indices(targets);
    const Twin row_max = w.random({T}, -4, 8), headroom = w.random({T}, 0, 3), sumexp = w.random({T}, 1, 3000),
               target_logit = w.random({T}, -8, 8), global_max = w.random({T});
    copy(global_max.host, row_max.host);  // global max = row max + headroom >= row max
    add_inplace(global_max.host, headroom.host);
    copy(global_max.dev, global_max.host);
    cross_entropy_rescale_sumexp(sumexp.host, row_max.host, global_max.host);
    cross_entropy_rescale_sumexp(sumexp.dev, row_max.dev, global_max.dev);
    c.compare("cross_entropy_rescale_sumexp", shape, sumexp, kTolPointwise);
    const double ref = cross_entropy_global_loss(row_max.host, global_max.host, sumexp.host, target_logit.host, tg.host);
    const double got = cross_entropy_global_loss(row_max.dev, global_max.dev, sumexp.dev, target_logit.dev, tg.dev);
    c.compare("cross_entropy_global_loss lse", shape, row_max, kTolPointwise);
    c.compare_scalar("cross_entropy_global_loss loss", shape, got, ref, 1e-6);
  }
}

void check_adamw(Checker& c) {
  const int64_t n = 100003;
  const std::string shape = dims({{"n", n}});
  Workspace w = c.workspace();
  const Twin p = w.random({n}), g = w.random({n}, -1e-3f, 1e-3f), m = w.random({n}, -1e-3f, 1e-3f),
             v = w.random({n}, 0, 1e-6f);
  AdamWStep s;
  s.lr = 3e-4f;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.step = 7;
  s.grad_scale = 0.8f;
  adamw_update(p.host, g.host, m.host, v.host, s);
  adamw_update(p.dev, g.dev, m.dev, v.dev, s);
  c.compare("adamw_update param", shape, p, kTolPointwise);
  c.compare("adamw_update m", shape, m, kTolPointwise);
  c.compare("adamw_update v", shape, v, kTolPointwise);
  // With mixed precision's bf16 copy written by the same pass, from element offset 0
  // and 2 of it (on CUDA its 4-element packs are 8-byte aligned at 0, not at 2).
  for (int64_t offset : {int64_t{0}, int64_t{2}}) {
    const std::string at = " (copy at offset " + std::to_string(offset) + ")";
    const Twin copy = w.random_bf16({n + 2}), p2 = w.random({n});
    s.step = 8;
    adamw_update(p2.host, g.host, m.host, v.host, s, copy.host.rows(offset, offset + n));
    adamw_update(p2.dev, g.dev, m.dev, v.dev, s, copy.dev.rows(offset, offset + n));
    c.compare("adamw_update param" + at, shape, p2, kTolPointwise);
    c.compare("adamw_update bf16 copy" + at + " [bf16]", shape, copy, kTolBf16);
  }
}

// The bf16 GEMMs (on CUDA: cuBLASLt with bf16 operands and fp32 accumulation), the
// elementwise ops and the conversions against the CPU's bf16 twins; the other ops'
// bf16 rows come from their checks above run in bf16.
void check_bf16_dense_and_elementwise(Checker& c) {
  for (int64_t T : {int64_t{5}, int64_t{333}}) {
    const int64_t in = 96, out_features = 160;
    const std::string shape = dims({{"T", T}, {"in", in}, {"out", out_features}});
    Workspace w = c.workspace();
    const Twin x = w.random_bf16({T, in}), wt = w.random_bf16({out_features, in}), y = w.random_bf16({T, out_features});
    linear_forward(y.host, x.host, wt.host);
    linear_forward(y.dev, x.dev, wt.dev);
    c.compare("linear_forward [bf16]", shape, y, kTolBf16);
    const Twin residual = w.random_bf16({T, out_features}), with_residual = w.random_bf16({T, out_features});
    linear_forward(with_residual.host, x.host, wt.host, residual.host);
    linear_forward(with_residual.dev, x.dev, wt.dev, residual.dev);
    c.compare("linear_forward (residual) [bf16]", shape, with_residual, kTolBf16);
    const Twin dy = w.random_bf16({T, out_features}), dx = w.random_bf16({T, in});
    const Twin dw = w.random({out_features, in});  // weight gradients stay fp32
    linear_backward(dx.host, dw.host, dy.host, x.host, wt.host, true);
    linear_backward(dx.dev, dw.dev, dy.dev, x.dev, wt.dev, true);
    c.compare("linear_backward dx (accumulate) [bf16]", shape, dx, kTolBf16);
    c.compare("linear_backward dw (fp32) [bf16]", shape, dw, kTolReduction);
    const Twin a = w.random_bf16({T, in}), b = w.random_bf16({out_features, in}), cc = w.random_bf16({T, out_features});
    matmul(cc.host, a.host, false, b.host, true, 0.75f, 0.5f);
    matmul(cc.dev, a.dev, false, b.dev, true, 0.75f, 0.5f);
    c.compare("matmul NT [bf16]", shape, cc, kTolBf16);
  }
  for (int64_t n : {int64_t{1}, int64_t{1 << 20} + 3}) {
    const std::string shape = dims({{"n", n}});
    Workspace w = c.workspace();
    const Twin y = w.random_bf16({n}), x = w.random_bf16({n});
    add_inplace(y.host, x.host);
    add_inplace(y.dev, x.dev);
    c.compare("add_inplace [bf16]", shape, y, 0);  // one fp32 sum, one rounding: exact
    scale_inplace(y.host, -1.7f);
    scale_inplace(y.dev, -1.7f);
    c.compare("scale_inplace [bf16]", shape, y, 0);
    fill(y.host, 0.3f);
    fill(y.dev, 0.3f);
    c.compare("fill [bf16]", shape, y, 0);
    fill(y.host, 0.0f);
    fill(y.dev, 0.0f);
    c.compare("fill zero [bf16]", shape, y, 0);
    // fp32 -> bf16 (rounding to nearest even) and back (exact), on the device.
    const Twin f = w.random({n}, -100.0f, 100.0f), g = w.random({n});
    copy(y.host, f.host);
    copy(y.dev, f.dev);
    c.compare("copy fp32 -> bf16", shape, y, 0);
    copy(g.host, y.host);
    copy(g.dev, y.dev);
    c.compare("copy bf16 -> fp32", shape, g, 0);
    // The same across the host boundary (how the MPI communicator stages bf16 device
    // tensors through fp32 host blocks): host fp32 -> device bf16, device bf16 -> host fp32.
    const Twin h = w.random({n}, -100.0f, 100.0f);
    copy(y.host, h.host);
    copy(y.dev, h.host);
    c.compare("copy fp32 (host) -> bf16", shape, y, 0);
    std::vector<float> widened(static_cast<size_t>(n));
    copy(Tensor(widened.data(), {n}, Device::CPU), y.dev);
    copy(g.host, y.host);
    copy(g.dev, Tensor(widened.data(), {n}, Device::CPU));
    c.compare("copy bf16 -> fp32 (host)", shape, g, 0);
  }
}

// The sums a training step keeps on the device (kernels/ops.h): filled, added into by
// sum_squares, the cross-entropy losses, add_scalar and add_inplace, and read back once,
// against the same ops on host doubles.
void check_device_sums(Checker& c) {
  const int64_t n = 1000, T = 130, V = 97;
  const std::string shape = dims({{"n", n}, {"T", T}, {"V", V}});
  Workspace w = c.workspace();
  std::vector<double> host_sums(3);
  const DoubleTensor ref(host_sums.data(), {3}, Device::CPU);
  Arena arena(c.device(), Arena::kAlignment, "check sums");
  const DoubleTensor got = arena.double_tensor({3});
  std::vector<int32_t> targets(T);
  std::uniform_int_distribution<int32_t> target(-1, static_cast<int32_t>(V - 1));
  for (int32_t& t : targets) t = target(c.rng());
  const IndexTwin tg = w.indices(targets);
  const Twin x = w.random({n}), y = w.random({n + 7}), logits = w.random({T, V}, -8, 8), scratch = w.random({3 * T}),
             global_max = w.random({T}, 4, 8), sumexp = w.random({T}, 1, 3000), target_logit = w.random({T}, -8, 8),
             lse = w.random({T});
  fill(ref, 0.25);
  fill(got, 0.25);
  sum_squares(x.host, ref.rows(0, 1));
  sum_squares(y.host, ref.rows(0, 1));
  sum_squares(x.dev, got.rows(0, 1));
  sum_squares(y.dev, got.rows(0, 1));
  cross_entropy_forward_backward(logits.host, tg.host, 0.5f, scratch.host, ref.rows(1, 2));
  cross_entropy_forward_backward(logits.dev, tg.dev, 0.5f, scratch.dev, got.rows(1, 2));
  cross_entropy_global_loss(lse.host, global_max.host, sumexp.host, target_logit.host, tg.host, ref.rows(1, 2));
  cross_entropy_global_loss(lse.dev, global_max.dev, sumexp.dev, target_logit.dev, tg.dev, got.rows(1, 2));
  add_scalar(ref.rows(2, 3), -1.5);
  add_scalar(got.rows(2, 3), -1.5);
  add_inplace(ref.rows(0, 2), ref.rows(1, 3));
  add_inplace(got.rows(0, 2), got.rows(1, 3));
  const std::vector<double> r = read_back(ref), g = read_back(got);
  c.compare_scalar("device sums: sum_squares + cross-entropy", shape, g[0], r[0], 1e-6);
  c.compare_scalar("device sums: cross-entropy losses + add_scalar", shape, g[1], r[1], 1e-6);
  c.compare_scalar("device sums: fill + add_scalar", shape, g[2], r[2], 0);
}

}  // namespace

std::vector<OpCheck> check_backend(Device device, uint64_t seed) {
  Checker c(device, seed);
  // Cheap and fundamental first: a broken copy or GEMM explains the rest.
  check_elementwise(c);
  check_device_sums(c);
  check_dense(c);
  // Every op in fp32, then in bf16 against the CPU's bf16 twins.
  for (DType dt : {DType::F32, DType::BF16}) {
    if (dt == DType::BF16) check_bf16_dense_and_elementwise(c);
    check_embedding(c, dt);
    check_rmsnorm(c, dt);
    check_rope(c, dt);
    check_swiglu(c, dt);
    check_moe_rows(c, dt);
    check_cross_entropy(c, dt);
    if (dt == DType::F32) check_adamw(c);  // the optimizer state is fp32 in either precision
    check_attention(c, dt, AttentionImpl::Own);
    check_attention_blocks(c, kNoWindow, dt);
    check_attention_blocks(c, 40, dt);
  }
  if (device == Device::CUDA) {
    // The same products with train.tf32 on: GEMMs and fp32 attention (d = 64, 128) on
    // TF32 tensor cores. bf16 attention does not depend on the flag (d = 64, 128 run
    // the bf16 tensor-core kernels either way; its rows above cover them).
    const bool was = cuda::tf32();
    cuda::set_tf32(true);
    c.relax(kTolTf32, " [tf32]");
    check_dense(c);
    check_attention(c, DType::F32, AttentionImpl::Own);
    check_attention_blocks(c, kNoWindow, DType::F32);
    check_attention_blocks(c, 40, DType::F32);
    c.relax(0, "");
    cuda::set_tf32(was);
    check_cudnn_attention(c);
  }
  return c.results;
}

std::string format_checks(const std::vector<OpCheck>& checks) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-42s %-46s %11s %11s %9s  %s\n", "op", "shape", "max abs", "max rel", "tol",
                "result");
  out += line;
  for (const OpCheck& c : checks) {
    if (c.skipped.empty())
      std::snprintf(line, sizeof line, "%-42s %-46s %11.3e %11.3e %9.1e  %s\n", c.op.c_str(), c.shape.c_str(),
                    c.max_abs, c.max_rel, c.tolerance, c.pass ? "pass" : "FAIL");
    else
      std::snprintf(line, sizeof line, "%-42s %-46s %33s  skipped: ", c.op.c_str(), c.shape.c_str(), "");
    out += line;
    if (!c.skipped.empty()) out += c.skipped + "\n";
  }
  return out;
}

}  // namespace hdp
