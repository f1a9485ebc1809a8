// Throughput of Mixtral's sparse MoE block (model/moe.h) forward + backward beside
// the dense SwiGLU MLP of the same active FLOPs (Jiang et al. 2024, "Mixtral of
// Experts": a token runs k of E experts of FFN F, so the MLP with FFN k F does the
// same matmul work). What the block adds is the router (H x E per token), the top-k
// routing, grouping the tokens by expert and scattering the outputs back, and E
// smaller GEMMs per projection instead of one. docs/performance.md records a run.
//
// FLOPs per iteration: matmuls 2 m n k forward, twice that backward, so
// 18 T H F_active for the three projections (F_active = k F) and 6 T H E for the router.

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "bench/random_data.h"
#include "kernels/ops.h"
#include "model/moe.h"

namespace {

using hdp::Tensor;

void set_rates(benchmark::State& state, double flops_per_iter, int64_t tokens) {
  const double n = static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iter * n * 1e-9, benchmark::Counter::kIsRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens) * n, benchmark::Counter::kIsRate);
}

// Args: T tokens, H hidden, F expert FFN, E experts, k experts per token.
void BM_MoeForwardBackward(benchmark::State& state) {
  const int64_t T = state.range(0), H = state.range(1), F = state.range(2), E = state.range(3), k = state.range(4);
  const float scale = 1.0f / static_cast<float>(H);
  std::vector<std::vector<float>> store;  // weights and gradients
  auto tensor = [&](int64_t rows, int64_t cols, uint32_t seed) {
    store.push_back(random_vector(static_cast<size_t>(rows * cols), -scale, scale, seed));
    return Tensor(store.back().data(), {rows, cols});
  };
  store.reserve(2 * (1 + 3 * E));
  hdp::MoeTensors w, g;
  w.gate = tensor(E, H, 1);
  g.gate = tensor(E, H, 2);
  for (int64_t e = 0; e < E; ++e) {
    const uint32_t s = static_cast<uint32_t>(10 + 6 * e);
    w.w1.push_back(tensor(F, H, s));
    w.w3.push_back(tensor(F, H, s + 1));
    w.w2.push_back(tensor(H, F, s + 2));
    g.w1.push_back(tensor(F, H, s + 3));
    g.w3.push_back(tensor(F, H, s + 4));
    g.w2.push_back(tensor(H, F, s + 5));
  }
  auto x = random_vector(T * H, -1, 1, 7), dout = random_vector(T * H, -1, 1, 8);
  std::vector<float> out(T * H), dx(T * H);
  const hdp::MoeShape shape{H, F, E, k};
  hdp::MoeWorkspace workspace(shape, T, hdp::Device::CPU, hdp::DType::F32, false);
  hdp::MoeBlock block(shape, T, workspace);
  for (auto _ : state) {
    block.forward(Tensor(out.data(), {T, H}), Tensor(x.data(), {T, H}), w);
    block.backward(Tensor(dx.data(), {T, H}), g, Tensor(dout.data(), {T, H}), Tensor(x.data(), {T, H}), w, {});
  }
  set_rates(state, 18.0 * T * H * F * k + 6.0 * T * H * E, T);
}

// The dense SwiGLU MLP forward + backward as the model runs it. Args: T, H, F.
void BM_DenseMlpForwardBackward(benchmark::State& state) {
  const int64_t T = state.range(0), H = state.range(1), F = state.range(2);
  const float scale = 1.0f / static_cast<float>(H);
  auto x = random_vector(T * H, -1, 1, 1), dy = random_vector(T * H, -1, 1, 2);
  auto wg = random_vector(F * H, -scale, scale, 3), wu = random_vector(F * H, -scale, scale, 4),
       wd = random_vector(H * F, -scale, scale, 5);
  std::vector<float> dwg(F * H), dwu(F * H), dwd(H * F), gate(T * F), up(T * F), act(T * F), y(T * H);
  std::vector<float> dact(T * F), dgate(T * F), dup(T * F), dx(T * H);
  const Tensor tx(x.data(), {T, H}), tg(gate.data(), {T, F}), tu(up.data(), {T, F}), ta(act.data(), {T, F});
  for (auto _ : state) {
    hdp::linear_forward(tg, tx, Tensor(wg.data(), {F, H}));
    hdp::linear_forward(tu, tx, Tensor(wu.data(), {F, H}));
    hdp::swiglu_forward(ta, tg, tu);
    hdp::linear_forward(Tensor(y.data(), {T, H}), ta, Tensor(wd.data(), {H, F}));
    hdp::linear_backward(Tensor(dact.data(), {T, F}), Tensor(dwd.data(), {H, F}), Tensor(dy.data(), {T, H}), ta,
                         Tensor(wd.data(), {H, F}), false);
    hdp::swiglu_backward(Tensor(dgate.data(), {T, F}), Tensor(dup.data(), {T, F}), Tensor(dact.data(), {T, F}), tg, tu);
    hdp::linear_backward(Tensor(dx.data(), {T, H}), Tensor(dwg.data(), {F, H}), Tensor(dgate.data(), {T, F}), tx,
                         Tensor(wg.data(), {F, H}), false);
    hdp::linear_backward(Tensor(dx.data(), {T, H}), Tensor(dwu.data(), {F, H}), Tensor(dup.data(), {T, F}), tx,
                         Tensor(wu.data(), {F, H}), true);
  }
  set_rates(state, 18.0 * T * H * F, T);
}

// tiny-mixtral's block (configs/tiny-mixtral.yaml: H 128, 4 experts of 176, top 2)
// at its 2048-token micro-batch; bench-llama's width with 8 experts; and a wider
// one with Mixtral's FFN / hidden ratio of 3.5 (14336 / 4096). Each dense MLP has
// FFN k F.
BENCHMARK(BM_MoeForwardBackward)
    ->Args({2048, 128, 176, 4, 2})
    ->Args({2048, 512, 1792, 8, 2})
    ->Args({1024, 1024, 3584, 8, 2})
    ->ArgNames({"T", "H", "F", "E", "k"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DenseMlpForwardBackward)
    ->Args({2048, 128, 352})
    ->Args({2048, 512, 3584})
    ->Args({1024, 1024, 7168})
    ->ArgNames({"T", "H", "F"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
