// trainer selftest: proves a device backend on this machine. Every op against
// the CPU backend (kernels/backend_check.h), then a small LLaMA trained for a few
// steps on both devices from the same weights and batches: losses, gradients and
// weights must agree. Prints one table and exits 1 on any failure.

#include "trainer/selftest.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_check.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"
#include "trainer/model.h"

namespace hdp {
namespace {

// A device tensor against its CPU twin. Elementwise: max |a - b| relative to
// max |b|. Norm-wise: ||a - b|| / ||b||, for weights after AdamW steps, where an
// element whose gradient is near zero turns reduction-order noise into a whole
// step of lr (the parallel equality tests compare weights the same way).
enum class Measure { Elementwise, NormWise };

OpCheck compare_tensors(const std::string& what, const std::string& shape, const Tensor& dev, const Tensor& cpu,
                        double tolerance, Measure measure = Measure::Elementwise) {
  std::vector<float> got(static_cast<size_t>(dev.numel()));
  copy(Tensor(got.data(), {dev.numel()}, Device::CPU), dev.view({dev.numel()}));
  OpCheck c{what, shape, 0, 0, tolerance, true};
  double scale = 0, diff_sq = 0, ref_sq = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double x = got[static_cast<size_t>(i)], ref = cpu.data[i];
    if (!std::isfinite(x)) c.pass = false;
    c.max_abs = std::max(c.max_abs, std::abs(x - ref));
    scale = std::max(scale, std::abs(ref));
    diff_sq += (x - ref) * (x - ref);
    ref_sq += ref * ref;
  }
  if (measure == Measure::NormWise) {
    c.op += " (norm-wise)";
    c.max_rel = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  } else {
    c.max_rel = scale > 0 ? c.max_abs / scale : c.max_abs;
  }
  c.pass = c.pass && c.max_rel <= tolerance;
  return c;
}

// A batch of whole documents of uneven lengths packed back to back.
struct HostBatch {
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
  MicroBatchView view() const { return {tokens, targets, positions, cu_seqlens, nullptr, 0}; }
};

HostBatch random_batch(const std::vector<int32_t>& lengths, int64_t vocab, std::mt19937& rng) {
  HostBatch b;
  b.cu_seqlens.push_back(0);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  for (int32_t n : lengths) {
    for (int32_t i = 0; i < n; ++i) {
      b.tokens.push_back(token(rng));
      b.positions.push_back(i);
      b.targets.push_back(i + 1 < n ? token(rng) : -1);
    }
    b.cu_seqlens.push_back(b.cu_seqlens.back() + n);
  }
  return b;
}

}  // namespace

std::vector<OpCheck> check_model_training(Device device, uint64_t seed) {
  ModelConfig m;
  m.vocab_size = 300;
  m.hidden_size = 128;
  m.num_layers = 3;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.ffn_hidden_size = 352;
  const std::string shape = "L=3 H=128 Hq=4 Hkv=2 V=300 T=450";
  const std::vector<int32_t> lengths = {1, 200, 37, 150, 62};
  const int64_t capacity = 512;
  LlamaModel cpu_model(m, capacity, {}, 1, nullptr, {}, Device::CPU);
  LlamaModel dev_model(m, capacity, {}, 1, nullptr, {}, device);
  cpu_model.init_weights(seed);
  dev_model.init_weights(seed);
  const int64_t n = cpu_model.flat_parameters().numel();
  std::vector<float> cpu_m(n, 0.0f), cpu_v(n, 0.0f);
  Arena moments(device, 2 * static_cast<size_t>(n) * sizeof(float) + 2 * Arena::kAlignment, "selftest moments");
  const Tensor dev_m = moments.tensor({n}), dev_v = moments.tensor({n});
  fill(dev_m, 0.0f);
  fill(dev_v, 0.0f);

  std::vector<OpCheck> out;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int step = 1; step <= 5; ++step) {
    const HostBatch batch = random_batch(lengths, m.vocab_size, rng);
    const float scale = 1.0f / 444.0f;  // predictions: 450 tokens minus one per document
    cpu_model.zero_grad();
    dev_model.zero_grad();
    const double cpu_loss = cpu_model.forward_backward(batch.view(), scale);
    const double dev_loss = dev_model.forward_backward(batch.view(), scale);
    out.push_back({"model step " + std::to_string(step) + " loss", shape, std::abs(dev_loss - cpu_loss),
                   std::abs(dev_loss - cpu_loss) / std::abs(cpu_loss), 1e-5,
                   std::abs(dev_loss - cpu_loss) <= 1e-5 * std::abs(cpu_loss)});
    if (step == 1) {
      out.push_back(compare_tensors("model step 1 gradients", shape, dev_model.flat_gradients(),
                                    cpu_model.flat_gradients(), 1e-4));
    }
    AdamWStep s;
    s.lr = 1e-3f;
    s.weight_decay = 0.1f;
    s.step = step;
    adamw_update(cpu_model.flat_parameters(), cpu_model.flat_gradients(), Tensor(cpu_m.data(), {n}, Device::CPU),
                 Tensor(cpu_v.data(), {n}, Device::CPU), s);
    adamw_update(dev_model.flat_parameters(), dev_model.flat_gradients(), dev_m, dev_v, s);
  }
  out.push_back(compare_tensors("model weights after 5 steps", shape, dev_model.flat_parameters(),
                                cpu_model.flat_parameters(), 1e-5, Measure::NormWise));
  return out;
}

int run_selftest(const SelftestOptions& options) {
  std::string why;
  if (!cuda::available(&why)) {
    std::printf("selftest: no CUDA device (%s): nothing to check beyond the CPU backend, whose own tests are the "
                "kernels_* programs of the test suite\n",
                why.c_str());
    return 0;
  }
  cuda::initialize(0);
  cuda::set_tf32(false);
  std::printf("selftest: CUDA backend on %s against the CPU backend (seed %llu)\n", cuda::device_description().c_str(),
              static_cast<unsigned long long>(options.seed));
  std::vector<OpCheck> checks = check_backend(Device::CUDA, options.seed);
  const std::vector<OpCheck> model = check_model_training(Device::CUDA, options.seed);
  checks.insert(checks.end(), model.begin(), model.end());
  std::fputs(format_checks(checks).c_str(), stdout);
  const auto failed = std::count_if(checks.begin(), checks.end(), [](const OpCheck& c) { return !c.pass; });
  std::printf("%zu passed, %td failed\n", checks.size() - static_cast<size_t>(failed), failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace hdp
