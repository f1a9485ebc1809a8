// trainer selftest: proves a device backend on this machine. Every op against
// the CPU backend (kernels/backend_check.h), fp32 and bf16, then a small LLaMA
// trained for a few steps on both devices from the same weights and batches, in
// fp32 and in bf16 mixed precision: losses, gradients and weights must agree, then
// the copy engine and selective activation offload on the device against the CPU.
// Prints one table and exits 1 on any failure.

#include "trainer/selftest.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/backend_check.h"
#include "kernels/copy_engine.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/ops.h"
#include "kernels/upload_staging.h"
#include "model/model.h"
#include "parallel/zero_optimizer.h"

namespace hdp {
namespace {

// A device tensor's values, read back.
std::vector<float> on_host(const Tensor& dev) {
  std::vector<float> got(static_cast<size_t>(dev.numel()));
  copy(Tensor(got.data(), {dev.numel()}, Device::CPU), dev.view({dev.numel()}));
  return got;
}

// A device tensor against its CPU twin: max |a - b| relative to max |b|.
OpCheck compare_tensors(const std::string& what, const std::string& shape, const Tensor& dev, const Tensor& cpu,
                        double tolerance) {
  const std::vector<float> got = on_host(dev);
  OpCheck c{what, shape, 0, 0, tolerance, true, {}};
  double scale = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double x = got[static_cast<size_t>(i)], ref = cpu.data[i];
    if (!std::isfinite(x)) c.pass = false;
    c.max_abs = std::max(c.max_abs, std::abs(x - ref));
    scale = std::max(scale, std::abs(ref));
  }
  c.max_rel = scale > 0 ? c.max_abs / scale : c.max_abs;
  c.pass = c.pass && c.max_rel <= tolerance;
  return c;
}

// Weights after AdamW steps on both devices from the same `initial` weights:
// ||dev - cpu|| / ||cpu - initial||, the difference as a share of what the steps
// moved. AdamW normalises each element's step, so an element whose gradient is
// near zero turns a rounding difference into a whole step of lr the other way: a
// few such elements are noise, while a wrong optimizer or gradient moves the
// weights elsewhere altogether (a difference of the order of the movement, 1).
OpCheck compare_weight_updates(const std::string& what, const std::string& shape, const Tensor& dev,
                               const Tensor& cpu, const std::vector<float>& initial, double tolerance) {
  const std::vector<float> got = on_host(dev);
  OpCheck c{what + " (norm-wise, of the updates)", shape, 0, 0, tolerance, true, {}};
  double diff_sq = 0, moved_sq = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double x = got[static_cast<size_t>(i)], ref = cpu.data[i];
    if (!std::isfinite(x)) c.pass = false;
    c.max_abs = std::max(c.max_abs, std::abs(x - ref));
    diff_sq += (x - ref) * (x - ref);
    moved_sq += (ref - initial[static_cast<size_t>(i)]) * (ref - initial[static_cast<size_t>(i)]);
  }
  c.max_rel = moved_sq > 0 ? std::sqrt(diff_sq / moved_sq) : std::sqrt(diff_sq);
  c.pass = c.pass && moved_sq > 0 && c.max_rel <= tolerance;
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

// The checks' model: grouped-query attention (4 query heads over 2 kv heads of
// dimension 32), a vocabulary that is not a multiple of any tile.
ModelConfig small_gqa_model(int64_t layers) {
  ModelConfig m;
  m.vocab_size = 300;
  m.hidden_size = 128;
  m.num_layers = layers;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.ffn_hidden_size = 352;
  return m;
}

// Tolerances of check_model_training. fp32: both sides differ only in summation
// order (~1e-7 per op). bf16: both round the same fp32 values to bf16, but a value
// that the summation order puts on the other side of a rounding boundary moves by
// a bf16 step (2^-8 of it, ~3e4 times the fp32 noise), and later layers carry it:
// rare steps of 2^-8 in the gradients (1e-2 of the largest). The weights are
// compared as a share of what 5 AdamW steps moved them (6.3% of their norm here),
// where a wrong optimizer or gradient is off by the order of 1: measured on an
// H200, the GPU differed from the CPU by 8.8e-5 of the movement in fp32 and 2.8e-2
// in bf16, and on the CPU bf16 itself differs from fp32 by 4.1e-2 of it.
struct TrainingTolerances {
  double loss, gradients, weights;
};
TrainingTolerances training_tolerances(DType precision) {
  if (precision == DType::BF16) return {1e-4, 1e-2, 1e-1};
  return {1e-5, 1e-4, 1e-3};
}

}  // namespace

std::vector<OpCheck> check_model_training(Device device, uint64_t seed, DType precision, bool mixtral,
                                          AttentionImpl attention) {
  const AttentionImplScope attention_scope(attention);
  ModelConfig m = small_gqa_model(3);
  std::string shape = "L=3 H=128 Hq=4 Hkv=2 V=300 T=450";
  if (mixtral) {
    m.arch = "mixtral";
    m.num_experts = 4;
    m.experts_per_token = 2;
    m.ffn_hidden_size = 176;
    m.router_aux_loss_coef = 0.02;
    shape += " E=4 k=2 F=176";
  }
  std::string marks = precision == DType::BF16 ? "bf16" : "";
  if (attention != AttentionImpl::Own)
    marks += std::string(marks.empty() ? "" : ", ") + enum_name(kAttentionImplNames, attention);
  const std::string tag = std::string(mixtral ? " [mixtral]" : "") + (marks.empty() ? "" : " [" + marks + "]");
  const TrainingTolerances tol = training_tolerances(precision);
  const std::vector<int32_t> lengths = {1, 200, 37, 150, 62};
  const int64_t capacity = 512;
  LlamaModel cpu_model(m, capacity, {}, 1, nullptr, {}, Device::CPU, precision);
  LlamaModel dev_model(m, capacity, {}, 1, nullptr, {}, device, precision);
  cpu_model.init_weights(seed);
  dev_model.init_weights(seed);
  const int64_t n = cpu_model.flat_parameters().numel();
  const std::vector<float> initial(cpu_model.flat_parameters().data, cpu_model.flat_parameters().data + n);
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
    // The bf16 weights follow the fp32 master weights on each device (the engine
    // does this at the start of every step; nothing to do in fp32).
    cpu_model.refresh_compute_weights();
    dev_model.refresh_compute_weights();
    cpu_model.zero_grad();
    dev_model.zero_grad();
    const double cpu_loss = cpu_model.forward_backward(batch.view(), scale);
    const double dev_loss = dev_model.forward_backward(batch.view(), scale);
    out.push_back({"model step " + std::to_string(step) + " loss" + tag, shape, std::abs(dev_loss - cpu_loss),
                   std::abs(dev_loss - cpu_loss) / std::abs(cpu_loss), tol.loss,
                   std::abs(dev_loss - cpu_loss) <= tol.loss * std::abs(cpu_loss), {}});
    if (step == 1) {
      out.push_back(compare_tensors("model step 1 gradients" + tag, shape, dev_model.flat_gradients(),
                                    cpu_model.flat_gradients(), tol.gradients));
    }
    // AdamW with the trainer's default hyper-parameters.
    const AdamWStep s = adamw_step(AdamWHyperparameters{}, 1e-3, step, 1.0f);
    adamw_update(cpu_model.flat_parameters(), cpu_model.flat_gradients(), Tensor(cpu_m.data(), {n}, Device::CPU),
                 Tensor(cpu_v.data(), {n}, Device::CPU), s);
    adamw_update(dev_model.flat_parameters(), dev_model.flat_gradients(), dev_m, dev_v, s);
  }
  out.push_back(compare_weight_updates("model weights after 5 steps" + tag, shape, dev_model.flat_parameters(),
                                       cpu_model.flat_parameters(), initial, tol.weights));
  return out;
}

std::vector<OpCheck> check_offload(Device device, uint64_t seed) {
  std::vector<OpCheck> out;
  auto exact = [](const std::string& what, const std::string& shape, double got, double want) {
    const double diff = std::abs(got - want);
    return OpCheck{what, shape, diff, want != 0 ? diff / std::abs(want) : diff, 0, diff == 0, {}};
  };

  // The copy engine alone, in a pattern that fails when an ordering is missing:
  // each round doubles `a` on the compute stream and copies it out (the copy must
  // start after the doubling), wipes `a` (compute must wait for the copy-out),
  // copies it back into `b` and from there into `a` (compute must wait for the
  // copy-in). Doubling is exact, so after the rounds a = x * 2^rounds exactly. 4 MiB
  // copies take far longer than the kernels around them, so a missing wait shows.
  {
    const int64_t n = int64_t{1} << 20;
    const int rounds = 8;
    const std::string shape = "n=" + std::to_string(n) + " rounds=" + std::to_string(rounds);
    Arena dev(device, 2 * static_cast<size_t>(n) * sizeof(float) + 2 * Arena::kAlignment, "selftest copies");
    Arena host = device == Device::CUDA
                     ? Arena::pinned_host(static_cast<size_t>(n) * sizeof(float), "selftest pinned host")
                     : Arena(Device::CPU, static_cast<size_t>(n) * sizeof(float), "selftest host");
    const Tensor a = dev.tensor({n}), b = dev.tensor({n}), h = host.tensor({n});
    std::vector<float> x(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& v : x) v = uniform(rng);
    for (size_t i = 0; i < x.size(); ++i) want[i] = std::ldexp(x[i], rounds);
    copy(a, Tensor(x.data(), {n}, Device::CPU));
    CopyEngine engine(device);
    size_t events_after_first = 0;
    for (int r = 0; r < rounds; ++r) {
      scale_inplace(a, 2.0f);
      engine.copy_async(h, a).wait();
      fill(a, 0.0f);
      engine.copy_async(b, h).wait();
      copy(a, b);
      if (r == 0) events_after_first = engine.events_created();
    }
    engine.synchronize();
    const Tensor expected(want.data(), {n}, Device::CPU);
    out.push_back(compare_tensors("copy engine round trips (device)", shape, a, expected, 0));
    out.push_back(compare_tensors("copy engine round trips (host)", shape, h, expected, 0));
    out.push_back(exact("copy engine events created after round 1", shape,
                        static_cast<double>(engine.events_created()), static_cast<double>(events_after_first)));
  }

  // A micro-batch's uploads without a host wait (kernels/upload_staging.h): each round
  // refills one staging buffer with other token ids and the embedding reads them on
  // the device, adding into `sum`: an upload that ran after the embedding, or a buffer
  // refilled before its copy had run, adds other rows. Device events time the rounds
  // (DeviceTimer, as busy_ms): some device time, read without a wait.
  {
    const int64_t vocab = 64, H = 32, T = 8192, rounds = 8;
    const std::string shape = "T=" + std::to_string(T) + " H=" + std::to_string(H) + " rounds=" + std::to_string(rounds);
    Arena dev(device, static_cast<size_t>(vocab + 2 * T) * H * sizeof(float) + T * sizeof(int32_t) + 8 * Arena::kAlignment,
              "selftest uploads");
    const Tensor table = dev.tensor({vocab, H}), rows = dev.tensor({T, H}), sum = dev.tensor({T, H});
    const IndexTensor tokens = dev.index_tensor({T});
    std::vector<float> host_table(static_cast<size_t>(vocab * H)), want(static_cast<size_t>(T * H), 0.0f);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& v : host_table) v = uniform(rng);
    copy(table, Tensor(host_table.data(), {vocab, H}, Device::CPU));
    fill(sum, 0.0f);
    UploadStaging staging(device, T);
    DeviceTimer timer(device);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t r = 0; r < rounds; ++r) {
      for (int64_t t = 0; t < T; ++t) {
        ids[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7 + r * 13) % vocab);
        for (int64_t j = 0; j < H; ++j) want[static_cast<size_t>(t * H + j)] += host_table[static_cast<size_t>(ids[static_cast<size_t>(t)] * H + j)];
      }
      timer.start();
      staging.begin();
      staging.upload(tokens, ids);
      embedding_forward(rows, tokens, table, 0);
      add_inplace(sum, rows);
      timer.stop();
    }
    out.push_back(compare_tensors("uploads through staging, read by the embedding", shape, sum,
                                  Tensor(want.data(), {T, H}, Device::CPU), 1e-6));
    const int64_t waits = host_waits(device);
    const double busy_ms = timer.take_ms();  // after compare_tensors' read: the events have run
    OpCheck timed = exact("device time of the rounds (events) read without a wait", shape,
                          static_cast<double>(host_waits(device) - waits), 0);
    timed.pass = timed.pass && busy_ms > 0;
    out.push_back(timed);
  }

  // Selective activation offload: two micro-batches with half their rows parked in
  // (pinned) host memory for layers 0 and 1 of 4, gradients accumulated, against
  // the CPU model without offload and against the device model without offload
  // (the same kernels, so equal up to the order of atomic adds in the embedding
  // gradient).
  const ModelConfig m = small_gqa_model(4);
  // 448 tokens: 224-row halves keep every offloaded tensor 64-byte aligned.
  const std::vector<std::vector<int32_t>> batches = {{1, 200, 37, 150, 60}, {90, 250, 108}};
  const std::string shape = "L=4 H=128 Hq=4 Hkv=2 V=300 T=448 ratio=0.5";
  const int64_t capacity = 512;
  LongSequenceOptions offload;
  offload.max_tokens = capacity;
  offload.offload = true;
  LlamaModel cpu_model(m, capacity, {}, 1, nullptr, {}, Device::CPU);
  LlamaModel dev_plain(m, capacity, {}, 1, nullptr, {}, device);
  LlamaModel dev_offload(m, capacity, {}, 1, nullptr, offload, device);
  for (LlamaModel* model : {&cpu_model, &dev_plain, &dev_offload}) {
    model->init_weights(seed);
    model->zero_grad();
  }
  std::mt19937 rng(static_cast<uint32_t>(seed) + 17);
  int64_t offloaded_rows = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const HostBatch batch = random_batch(batches[i], m.vocab_size, rng);
    const float scale = 1.0f / 444.0f;
    MicroBatchView with = batch.view();
    with.offload_ratio = 0.5;
    offloaded_rows += static_cast<int64_t>(batch.tokens.size()) / 2;
    const double cpu_loss = cpu_model.forward_backward(batch.view(), scale);
    const double plain_loss = dev_plain.forward_backward(batch.view(), scale);
    dev_offload.set_batch(0, with);
    const double loss = read_back(dev_offload.forward(0, scale, true).value())[0];
    dev_offload.backward(0);
    const std::string mb = "offload mb " + std::to_string(i + 1);
    const double diff = std::abs(loss - cpu_loss);
    out.push_back(
        {mb + " loss", shape, diff, diff / std::abs(cpu_loss), 1e-5, diff <= 1e-5 * std::abs(cpu_loss), {}});
    const double plain_diff = std::abs(loss - plain_loss);
    out.push_back({mb + " loss vs device w/o offload", shape, plain_diff, plain_diff / std::abs(plain_loss), 1e-6,
                   plain_diff <= 1e-6 * std::abs(plain_loss), {}});
  }
  out.push_back(compare_tensors("offload gradients (2 mbs)", shape, dev_offload.flat_gradients(),
                                cpu_model.flat_gradients(), 1e-4));
  std::vector<float> plain_grads(static_cast<size_t>(dev_plain.flat_gradients().numel()));
  copy(Tensor(plain_grads.data(), {dev_plain.flat_gradients().numel()}, Device::CPU), dev_plain.flat_gradients());
  out.push_back(compare_tensors("offload gradients vs device w/o offload", shape, dev_offload.flat_gradients(),
                                Tensor(plain_grads.data(), {dev_plain.flat_gradients().numel()}, Device::CPU), 1e-6));
  // Layers 0 and 1 each park the offloaded rows of x_in, ln1, x_mid, ln2 (H each), q
  // and attn (heads x d), k and v (kv heads x d), gate and up (ffn).
  const int64_t row_floats = 4 * m.hidden_size + 2 * m.hidden_size + 2 * (m.num_kv_heads * m.head_dim()) +
                             2 * m.ffn_hidden_size;
  const int64_t want_bytes = (m.num_layers - 2) * offloaded_rows * row_floats * static_cast<int64_t>(sizeof(float));
  out.push_back(exact("offloaded bytes", shape, static_cast<double>(dev_offload.activation_usage().offloaded_bytes),
                      static_cast<double>(want_bytes)));
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
  for (DType precision : {DType::F32, DType::BF16}) {
    const std::vector<OpCheck> model = check_model_training(Device::CUDA, options.seed, precision);
    checks.insert(checks.end(), model.begin(), model.end());
  }
  // bf16 training with attention on cuDNN, what train.attention: auto runs where cuDNN
  // takes the model's calls (its packed batch holds 450 tokens).
  const ModelConfig m = small_gqa_model(3);
  if (cudnn_attention_supported(cuda::cudnn_runtime(),
                                {DType::BF16, 450, m.num_heads, m.num_kv_heads, m.head_dim(), false, true}, nullptr)) {
    const std::vector<OpCheck> model =
        check_model_training(Device::CUDA, options.seed, DType::BF16, false, AttentionImpl::Cudnn);
    checks.insert(checks.end(), model.begin(), model.end());
  }
  // Mixtral in fp32 (in bf16 a router logit that the summation order puts on the other
  // side of a rounding boundary can flip a token's expert, which is not a kernel fault;
  // the bf16 row-movement ops have rows of their own above).
  const std::vector<OpCheck> moe = check_model_training(Device::CUDA, options.seed, DType::F32, true);
  checks.insert(checks.end(), moe.begin(), moe.end());
  const std::vector<OpCheck> offload = check_offload(Device::CUDA, options.seed);
  checks.insert(checks.end(), offload.begin(), offload.end());
  std::fputs(format_checks(checks).c_str(), stdout);
  const auto failed = std::count_if(checks.begin(), checks.end(), [](const OpCheck& c) { return !c.pass; });
  std::printf("%zu passed, %td failed\n", checks.size() - static_cast<size_t>(failed), failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace hdp
