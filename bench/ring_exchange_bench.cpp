// Ring attention's exchange, measured: bytes/s per rank of the K/V block exchange
// and how much of it hides behind the block attention of a ring step, over any
// communicator (MPI now; NCCL on GPUs: --comm nccl --device cuda).
//
// Each rank holds a block of T query rows and a K/V block of T rows (kv heads x
// head dim). A ring step sends the K/V block it holds to the next rank and receives
// the previous rank's into the other buffer, as one Communicator::exchange (K and V
// two transfers, as parallel/ring_attention.cpp posts them), while it computes the
// attention of its queries against the block it holds (attention_forward_blocks,
// every key visible: the off-diagonal blocks of causal ring attention). N ranks
// make N - 1 steps a pass. Three timings a step per block size, each the slowest
// rank's and the best of --passes passes (the modes interleaved, after a warm-up
// pass, so that outside load skews none of them more than the others):
//   exchange  the steps with the exchange only (posted, waited for at once);
//   compute   the steps with the attention only;
//   overlap   the ring as it runs: post the exchange, compute, wait.
// bandwidth = what a rank sends a step / exchange time a step; hidden = (exchange +
// compute - overlap) / exchange, the share of the transfer that ran under the
// compute (1: all of it, 0: none). Device work is synchronised before each clock
// read, so the times are the device's under NCCL too.
//   mpirun -np N ring_exchange_bench [--comm mpi|nccl] [--device cpu|cuda]
//       [--tokens 4096,16384] [--query-tokens Q] [--heads 16] [--kv-heads 8] [--head-dim 128]
//       [--passes 5]
// --query-tokens computes with the first Q query rows only (default: all T), which
// shrinks the compute without the transfer: where compute dwarfs the exchange (CPUs)
// the hidden share is within the timings' noise, so Q brings the two near each other.
// The defaults are bench-llama-1b's attention (configs/bench-llama-1b.yaml).
// docs/performance.md records the numbers; bench/gpu_parallel_check.sh runs it with NCCL.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/rng.h"
#include "kernels/allocator.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"
#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"
#include "parallel/runtime.h"

namespace hdp {
namespace {

struct Options {
  std::string comm = "mpi";
  Device device = Device::CPU;
  std::vector<int64_t> tokens = {4096, 16384};
  int64_t query_tokens = 0;  // 0: as many as the block's
  int64_t heads = 16, kv_heads = 8, head_dim = 128;
  int passes = 5;
};

// The query rows a step computes with, for a block of `tokens` rows.
int64_t query_rows(const Options& o, int64_t tokens) {
  return o.query_tokens > 0 ? std::min(o.query_tokens, tokens) : tokens;
}

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "ring_exchange_bench: %s\nusage: ring_exchange_bench [--comm mpi|nccl] [--device cpu|cuda] "
               "[--tokens T1,T2,...] [--query-tokens Q] [--heads H] [--kv-heads K] [--head-dim D] [--passes P]\n",
               problem.c_str());
  std::exit(2);
}

int64_t positive(const char* flag, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v <= 0) usage(std::string(flag) + " " + text + ": not a positive integer");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + ": missing its value");
    const std::string value = argv[i + 1];
    if (flag == "--comm") {
      if (value != "mpi" && value != "nccl") usage("--comm " + value + ": choose mpi or nccl");
      o.comm = value;
    } else if (flag == "--device") {
      if (value == "cpu") o.device = Device::CPU;
      else if (value == "cuda") o.device = Device::CUDA;
      else usage("--device " + value + ": choose cpu or cuda");
    } else if (flag == "--tokens") {
      o.tokens.clear();
      for (size_t at = 0; at <= value.size();) {
        const size_t comma = std::min(value.find(',', at), value.size());
        o.tokens.push_back(positive("--tokens", value.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (flag == "--query-tokens") {
      o.query_tokens = positive("--query-tokens", value);
    } else if (flag == "--heads") {
      o.heads = positive("--heads", value);
    } else if (flag == "--kv-heads") {
      o.kv_heads = positive("--kv-heads", value);
    } else if (flag == "--head-dim") {
      o.head_dim = positive("--head-dim", value);
    } else if (flag == "--passes") {
      o.passes = static_cast<int>(positive("--passes", value));
    } else {
      usage("unknown option " + flag);
    }
  }
  if (o.heads % o.kv_heads != 0) usage("--heads must be a multiple of --kv-heads");
  if (o.comm == "nccl" && o.device != Device::CUDA) usage("--comm nccl needs --device cuda");
  return o;
}

void sync(Device device) {
  if (device == Device::CUDA) synchronize(device);
}

// Values in [-1, 1] for `t`, made in the host tensor `scratch` (at least as large)
// and copied to t's device.
void fill(Tensor t, uint64_t seed, const Tensor& scratch) {
  Tensor h = scratch.view({scratch.numel()}).rows(0, t.numel());
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) h.data[i] = static_cast<float>(rng.range(-1000, 1000)) * 1e-3f;
  copy(t.view({t.numel()}), h);
}

struct Figures {
  double exchange_s = 0, compute_s = 0, overlap_s = 0;  // a step, the slowest rank
};

Figures measure(Communicator& comm, const Options& o, int64_t tokens) {
  const int64_t rows = query_rows(o, tokens);
  const int n = comm.size(), me = comm.rank();
  const int next = (me + 1) % n, previous = (me + n - 1) % n;
  const size_t bytes = static_cast<size_t>(tokens * (o.heads * 2 + o.kv_heads * 4) * o.head_dim + o.heads * tokens) *
                           sizeof(float) + (size_t{1} << 20);
  Arena arena(o.device, bytes, "ring exchange bench");
  Arena host(Device::CPU, static_cast<size_t>(tokens * o.heads * o.head_dim) * sizeof(float) + 4096,
             "ring exchange bench host");
  const Tensor scratch = host.tensor({tokens * o.heads * o.head_dim});
  Tensor q = arena.tensor({rows, o.heads, o.head_dim});
  Tensor out = arena.tensor({rows, o.heads, o.head_dim});
  Tensor lse = arena.tensor({o.heads, rows});
  Tensor k[2] = {arena.tensor({tokens, o.kv_heads, o.head_dim}), arena.tensor({tokens, o.kv_heads, o.head_dim})};
  Tensor v[2] = {arena.tensor({tokens, o.kv_heads, o.head_dim}), arena.tensor({tokens, o.kv_heads, o.head_dim})};
  fill(q, 100 + me, scratch);
  fill(k[0], 200 + me, scratch);
  fill(v[0], 300 + me, scratch);
  fill(k[1], 400 + me, scratch);
  fill(v[1], 500 + me, scratch);
  attention_reset_rows(out, lse, 0, rows);
  // Every key precedes every query: the full rectangle of an earlier rank's block.
  const AttentionBlock block{0, static_cast<int32_t>(rows), 0, static_cast<int32_t>(tokens),
                             static_cast<int32_t>(tokens), 0};

  int held = 0;  // the buffer holding the block this step computes with and sends
  auto post = [&] {
    const Transfer sends[2] = {{k[held], next, 0}, {v[held], next, 1}};
    const Transfer receives[2] = {{k[1 - held], previous, 0}, {v[1 - held], previous, 1}};
    return comm.exchange(sends, receives);
  };
  auto compute = [&] { attention_forward_blocks(out, lse, q, k[held], v[held], std::span(&block, 1)); };
  enum Mode { kExchange, kCompute, kOverlap };
  // One pass (n - 1 steps) in `mode`; its time a step, the slowest rank's.
  auto pass = [&](Mode mode) {
    sync(o.device);
    comm.all_reduce_sum(0.0);  // the ranks start together
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < n - 1; ++s) {
      if (mode == kCompute) {
        compute();
        continue;
      }
      CommRequest request = post();
      if (mode == kOverlap) compute();
      request.wait();
      held = 1 - held;
    }
    sync(o.device);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    comm.all_reduce(std::span<double>(&seconds, 1), ReduceOp::Max);
    return seconds / (n - 1);
  };
  pass(kOverlap);  // warm-up: staging blocks, NCCL channels, GEMM heuristics
  // The best of the passes of each mode, interleaved, so that load from outside
  // (other jobs on the node) inflates none of the three more than the others.
  Figures f{INFINITY, INFINITY, INFINITY};
  for (int p = 0; p < o.passes; ++p) {
    f.exchange_s = std::min(f.exchange_s, pass(kExchange));
    f.compute_s = std::min(f.compute_s, pass(kCompute));
    f.overlap_s = std::min(f.overlap_s, pass(kOverlap));
  }
  return f;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);  // before MPI: a bad flag exits 2 on every rank alike
  MpiRuntime runtime(&argc, &argv);
  const ProcessInfo& process = runtime.info();
  if (process.world_size < 2) usage("run it under mpirun with 2 or more ranks");
  if (o.device == Device::CUDA) {
    std::string why;
    if (!cuda::available(&why)) usage("--device cuda: no usable CUDA device (" + why + ")");
    cuda::initialize(process.local_rank % cuda::device_count());
  }
  std::unique_ptr<Communicator> comm;
  auto world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world");
  if (o.comm == "nccl") {
    if (!nccl_compiled()) usage("--comm nccl: this build has no NCCL");
    comm = make_nccl_communicator(std::move(world));
  } else {
    comm = std::move(world);
  }
  if (process.rank == 0) {
    std::printf("ring exchange: %d ranks, %s on %s, %lld query heads, K/V %lld heads x %lld, fp32, best of %d passes of "
                "%d steps\n",
                process.world_size, o.comm.c_str(), o.device == Device::CUDA ? "cuda" : "cpu",
                static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads),
                static_cast<long long>(o.head_dim), o.passes, process.world_size - 1);
    std::printf("| block tokens | query rows | K+V sent a step per rank | exchange a step | bytes/s per rank | compute a step | "
                "overlapped step | hidden |\n|---|---|---|---|---|---|---|---|\n");
  }
  for (const int64_t tokens : o.tokens) {
    const Figures f = measure(*comm, o, tokens);
    const double sent = 2.0 * static_cast<double>(tokens * o.kv_heads * o.head_dim) * sizeof(float);
    // Not clamped: outside [0, 1] it is the timings' noise, which the reader should see.
    const double hidden = (f.exchange_s + f.compute_s - f.overlap_s) / f.exchange_s;
    if (process.rank == 0) {
      std::printf("| %lld | %lld | %.1f MiB | %.2f ms | %.2f GB/s | %.2f ms | %.2f ms | %.0f%% |\n",
                  static_cast<long long>(tokens),
                  static_cast<long long>(query_rows(o, tokens)),
                  sent / (1 << 20), f.exchange_s * 1e3, sent / f.exchange_s / 1e9,
                  f.compute_s * 1e3, f.overlap_s * 1e3, 100 * hidden);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace hdp

int main(int argc, char** argv) {
  try {
    return hdp::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ring_exchange_bench: %s\n", e.what());
    hdp::abort_job(1);
  }
}
