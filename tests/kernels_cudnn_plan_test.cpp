// The host side of attention through cuDNN, which runs everywhere (the device side
// needs a GPU: trainer selftest's "cudnn" rows): the graph key
// (kernels/cuda/cudnn_attention_plan.h) equal for equal shapes and different for
// any field that changes the graph; the ragged offsets and lengths cuDNN reads for
// packed documents, on hand-computed cases with grouped-query heads and empty
// documents; the transposes between cuDNN's statistics and our lse on
// hand-computed values; the process-wide choice of implementation and the decision
// of cudnn_attention_supported() for a supported call and each refused one
// (kernels/attention_impl.h).

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/attention_impl.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_attention_plan.h"
#include "kernels/ops.h"

namespace {

using hdp::AttentionImpl;
using hdp::CudnnAttentionCall;
using hdp::CudnnRuntime;
using hdp::DType;
namespace plan = hdp::cudnn_plan;

// ---- graph key ---------------------------------------------------------------------

// cuDNN versions before and since zero-length sequences (graph_batch pads with them).
constexpr int64_t kCudnn919 = 91900, kCudnn925 = 92500;

TEST(KernelsCudnnPlan, BatchIsTheDocumentsRoundedUpToAPowerOfTwoWhereZeroLengthSequencesPad) {
  const std::vector<std::pair<int64_t, int64_t>> docs_batch = {{0, 1}, {1, 1}, {2, 2}, {3, 4},  {4, 4},
                                                               {5, 8}, {8, 8}, {9, 16}, {1000, 1024}};
  for (const auto& [docs, batch] : docs_batch) {
    EXPECT_EQ(plan::graph_batch(docs, kCudnn925), batch) << docs << " documents";
    EXPECT_EQ(plan::graph_batch(docs, kCudnn919), docs) << docs << " documents, no padding before 9.25";
  }
}

TEST(KernelsCudnnPlan, EqualShapesGiveEqualKeys) {
  const plan::GraphKey a = plan::graph_key(false, 4096, 5, 32, 8, 128, 0, kCudnn925);
  const plan::GraphKey b = plan::graph_key(false, 4096, 5, 32, 8, 128, 0, kCudnn925);
  EXPECT_EQ(a, b);
  EXPECT_EQ(plan::GraphKeyHash{}(a), plan::GraphKeyHash{}(b));
  // 5..8 documents share the graph of a batch of 8 (the rest are empty sequences).
  EXPECT_EQ(a, plan::graph_key(false, 4096, 8, 32, 8, 128, 0, kCudnn925));
  EXPECT_EQ(a.batch, 8);
  // A window no pair of the T rows is apart is no window.
  EXPECT_EQ(a, plan::graph_key(false, 4096, 5, 32, 8, 128, 4096, kCudnn925));
  EXPECT_EQ(a, plan::graph_key(false, 4096, 5, 32, 8, 128, 1 << 20, kCudnn925));
  // 2049..4096 packed rows share the graph of 4096 rows (upper bounds for the ragged
  // sequences); 4097 rows take the next.
  EXPECT_EQ(a, plan::graph_key(false, 2049, 5, 32, 8, 128, 0, kCudnn925));
  EXPECT_EQ(a, plan::graph_key(false, 3000, 8, 32, 8, 128, 0, kCudnn925));
  EXPECT_EQ(plan::graph_key(false, 4097, 5, 32, 8, 128, 0, kCudnn925).tokens, 8192);
  EXPECT_EQ(plan::graph_key(false, 1, 1, 32, 8, 128, 0, kCudnn925).tokens, 1);
  // A window of at least the graph's rows is none; one between T and the graph's rows
  // stays (it masks no pair of the T rows either).
  EXPECT_EQ(plan::graph_key(false, 3000, 5, 32, 8, 128, 3500, kCudnn925).window, 3500);
  // Before cuDNN 9.25 every number of documents has its graph.
  EXPECT_NE(plan::graph_key(false, 4096, 5, 32, 8, 128, 0, kCudnn919),
            plan::graph_key(false, 4096, 8, 32, 8, 128, 0, kCudnn919));
}

TEST(KernelsCudnnPlan, EveryFieldThatChangesTheGraphChangesTheKey) {
  const plan::GraphKey base = plan::graph_key(false, 4096, 5, 32, 8, 128, 0, kCudnn925);
  const std::vector<std::pair<const char*, plan::GraphKey>> changed = {
      {"backward", plan::graph_key(true, 4096, 5, 32, 8, 128, 0, kCudnn925)},
      {"batch", plan::graph_key(false, 4096, 9, 32, 8, 128, 0, kCudnn925)},
      {"batch (fewer)", plan::graph_key(false, 4096, 4, 32, 8, 128, 0, kCudnn925)},
      {"batch (no padding)", plan::graph_key(false, 4096, 5, 32, 8, 128, 0, kCudnn919)},
      {"tokens", plan::graph_key(false, 2048, 5, 32, 8, 128, 0, kCudnn925)},
      {"query heads", plan::graph_key(false, 4096, 5, 16, 8, 128, 0, kCudnn925)},
      {"key/value heads", plan::graph_key(false, 4096, 5, 32, 4, 128, 0, kCudnn925)},
      {"head dim", plan::graph_key(false, 4096, 5, 32, 8, 64, 0, kCudnn925)},
      {"window", plan::graph_key(false, 4096, 5, 32, 8, 128, 4095, kCudnn925)},
      {"another window", plan::graph_key(false, 4096, 5, 32, 8, 128, 1024, kCudnn925)},
  };
  for (const auto& [what, key] : changed) {
    EXPECT_NE(key, base) << what;
    EXPECT_NE(plan::GraphKeyHash{}(key), plan::GraphKeyHash{}(base)) << what;
    EXPECT_NE(plan::describe(key), plan::describe(base)) << what;
  }
  EXPECT_NE(changed[8].second, changed[9].second);
  EXPECT_EQ(plan::describe(changed[9].second), "forward B=8 T=4096 Hq=32 Hkv=8 d=128 W=1024");
}

// ---- ragged offsets ------------------------------------------------------------------

struct Entry {
  int64_t q_offset, kv_offset, stats_offset;
  int32_t length;
};

void expect_entries(const std::vector<int32_t>& cu, int64_t batch, int64_t q_heads, int64_t kv_heads,
                    int64_t head_dim, const std::vector<Entry>& want) {
  const int64_t docs = static_cast<int64_t>(cu.size()) - 1;
  ASSERT_EQ(static_cast<int64_t>(want.size()), batch + 1);
  for (int64_t b = 0; b <= batch; ++b) {
    const plan::RaggedEntry e = plan::ragged_entry(cu.data(), docs, b, q_heads, kv_heads, head_dim);
    const Entry& w = want[static_cast<size_t>(b)];
    EXPECT_EQ(e.q_offset, w.q_offset) << "sequence " << b;
    EXPECT_EQ(e.kv_offset, w.kv_offset) << "sequence " << b;
    EXPECT_EQ(e.stats_offset, w.stats_offset) << "sequence " << b;
    if (b < batch) {  // the closing entry has offsets only
      EXPECT_EQ(e.length, w.length) << "sequence " << b;
    }
  }
}

TEST(KernelsCudnnPlan, RaggedOffsetsOfGroupedQueryHeadsWithAnEmptyDocument) {
  // Documents of 3, 0 and 7 tokens; Hq = 4, Hkv = 2, d = 8: a token is 32 elements of
  // q, 16 of k and v, 4 statistics. Batch 4: the fourth sequence is padding.
  expect_entries({0, 3, 3, 10}, plan::graph_batch(3, kCudnn925), 4, 2, 8,
                 {{0, 0, 0, 3}, {96, 48, 12, 0}, {96, 48, 12, 7}, {320, 160, 40, 0}, {320, 160, 40, 0}});
}

TEST(KernelsCudnnPlan, RaggedOffsetsWithEmptyDocumentsAtBothEnds) {
  // Documents of 0, 5, 0 and 2 tokens; Hq = Hkv = 2, d = 16: 32 elements a token.
  expect_entries({0, 0, 5, 5, 7}, plan::graph_batch(4, kCudnn925), 2, 2, 16,
                 {{0, 0, 0, 0}, {0, 0, 0, 5}, {160, 160, 10, 0}, {160, 160, 10, 2}, {224, 224, 14, 0}});
}

TEST(KernelsCudnnPlan, RaggedOffsetsPadAFullBatchOfOne) {
  // One document of 6 tokens, multi-query (Hkv = 1): batch 1, offsets 0 and T.
  expect_entries({0, 6}, plan::graph_batch(1, kCudnn925), 8, 1, 64, {{0, 0, 0, 6}, {3072, 384, 48, 0}});
}

// ---- statistics layout ---------------------------------------------------------------

// What the statistics kernels do (kernels/cuda/cudnn_attention_layout.cu), on the host.
std::vector<float> stats_to_lse(const std::vector<float>& stats, std::vector<float> lse,
                                const std::vector<int32_t>& cu, int64_t T, int64_t Hq) {
  const int64_t docs = static_cast<int64_t>(cu.size()) - 1;
  for (int64_t i = 0; i < T * Hq; ++i)
    if (plan::in_documents(i % T, cu.data(), docs))
      lse[static_cast<size_t>(i)] = stats[static_cast<size_t>(plan::stats_to_lse_source(i, T, Hq))];
  return lse;
}
std::vector<float> lse_to_stats(const std::vector<float>& lse, int64_t T, int64_t Hq) {
  std::vector<float> stats(lse.size());
  for (int64_t i = 0; i < T * Hq; ++i)
    stats[static_cast<size_t>(i)] = lse[static_cast<size_t>(plan::lse_to_stats_source(i, T, Hq))];
  return stats;
}

// cuDNN takes each ragged table as 16-byte aligned without checking: for every batch
// each table starts on a 16-byte boundary, holds its entries, and none overlaps the
// next (packed back to back, the second table of a batch of 8 began at 72 bytes).
TEST(KernelsCudnnPlan, EachRaggedTableStartsOnASixteenByteBoundary) {
  for (int64_t batch : {1, 2, 3, 7, 8, 64}) {
    const plan::RaggedTablesLayout l = plan::ragged_tables_layout(batch);
    const size_t offsets_bytes = static_cast<size_t>(batch + 1) * sizeof(int64_t);
    EXPECT_EQ(l.q_offset, 0u);
    for (size_t start : {l.kv_offset, l.stats_offset, l.length}) EXPECT_EQ(start % 16, 0u) << "batch " << batch;
    EXPECT_GE(l.kv_offset, l.q_offset + offsets_bytes) << "batch " << batch;
    EXPECT_GE(l.stats_offset, l.kv_offset + offsets_bytes) << "batch " << batch;
    EXPECT_GE(l.length, l.stats_offset + offsets_bytes) << "batch " << batch;
    EXPECT_EQ(l.bytes, l.length + static_cast<size_t>(batch) * sizeof(int32_t)) << "batch " << batch;
  }
  EXPECT_EQ(plan::ragged_tables_layout(8).kv_offset, 80u);  // 9 entries, padded to 80 bytes
}

TEST(KernelsCudnnPlan, StatisticsTransposeToHeadMajorLse) {
  // cuDNN's stats [T = 3, Hq = 2] token-major; our lse [Hq, T] head-major.
  const std::vector<float> stats = {10, 11, 20, 21, 30, 31};  // value = 10 (t + 1) + h
  const std::vector<float> lse = stats_to_lse(stats, std::vector<float>(6, -1), {0, 1, 3}, 3, 2);
  EXPECT_EQ(lse, (std::vector<float>{10, 20, 30, 11, 21, 31}));
  EXPECT_EQ(lse_to_stats(lse, 3, 2), stats);
}

TEST(KernelsCudnnPlan, StatisticsLeaveTheLseOfRowsPastTheDocuments) {
  // Documents cover rows 0..2 of T = 4 (row 3 is ring attention's): its lse stays.
  const std::vector<float> stats = {10, 11, 20, 21, 30, 31, 99, 99};
  EXPECT_EQ(stats_to_lse(stats, std::vector<float>(8, -7), {0, 2, 3}, 4, 2),
            (std::vector<float>{10, 20, 30, -7, 11, 21, 31, -7}));
}

TEST(KernelsCudnnPlan, StatisticsTransposesAreInversePermutations) {
  for (const auto& [T, Hq] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 7}, {5, 1}, {37, 12}}) {
    std::vector<int> seen(static_cast<size_t>(T * Hq), 0);
    for (int64_t i = 0; i < T * Hq; ++i) {
      const int64_t j = plan::stats_to_lse_source(i, T, Hq);
      ASSERT_GE(j, 0);
      ASSERT_LT(j, T * Hq);
      ++seen[static_cast<size_t>(j)];
      EXPECT_EQ(plan::lse_to_stats_source(j, T, Hq), i) << "T=" << T << " Hq=" << Hq;
    }
    for (int n : seen) EXPECT_EQ(n, 1) << "T=" << T << " Hq=" << Hq;
  }
}

// ---- the choice and the decision ---------------------------------------------------------

// Sets the choice for one test and restores the default after.
struct ImplGuard {
  explicit ImplGuard(AttentionImpl impl) { hdp::set_attention_impl(impl); }
  ~ImplGuard() { hdp::set_attention_impl(AttentionImpl::Auto); }
};

TEST(KernelsCudnnPlan, ChoiceDefaultsToAutoAndIsNamed) {
  EXPECT_EQ(hdp::attention_impl(), AttentionImpl::Auto);
  {
    const ImplGuard guard(AttentionImpl::Own);
    EXPECT_EQ(hdp::attention_impl(), AttentionImpl::Own);
  }
  EXPECT_EQ(hdp::enum_value(hdp::kAttentionImplNames, "cudnn"), AttentionImpl::Cudnn);
  EXPECT_EQ(hdp::enum_value(hdp::kAttentionImplNames, "own"), AttentionImpl::Own);
  EXPECT_EQ(hdp::enum_value(hdp::kAttentionImplNames, "auto"), AttentionImpl::Auto);
  EXPECT_FALSE(hdp::enum_value(hdp::kAttentionImplNames, "flash").has_value());
}

CudnnRuntime hopper() { return {"", 90, 91900}; }
CudnnAttentionCall llama_call() {
  CudnnAttentionCall call;
  call.dtype = DType::BF16;
  call.tokens = 4096;
  call.q_heads = 32;
  call.kv_heads = 8;
  call.head_dim = 128;
  return call;
}

TEST(KernelsCudnnPlan, SupportedCall) {
  std::string why = "stale";
  EXPECT_TRUE(hdp::cudnn_attention_supported(hopper(), llama_call(), &why));
  EXPECT_EQ(why, "");
  CudnnRuntime blackwell = hopper();
  blackwell.sm_version = 100;
  CudnnAttentionCall small = llama_call();
  small.head_dim = 16;
  small.tokens = 2;
  EXPECT_TRUE(hdp::cudnn_attention_supported(blackwell, small, nullptr));
}

// Each refusal, and a phrase of its reason.
TEST(KernelsCudnnPlan, EachRefusedCallSaysWhy) {
  struct Refused {
    const char* what;
    CudnnRuntime runtime;
    CudnnAttentionCall call;
    const char* reason;
  };
  std::vector<Refused> cases;
  const auto add = [&](const char* what, const char* reason, auto change) {
    Refused r{what, hopper(), llama_call(), reason};
    change(r.runtime, r.call);
    cases.push_back(r);
  };
  add("no cuDNN", "this build has no cuDNN", [](CudnnRuntime& r, CudnnAttentionCall&) {
    r.unavailable = "this build has no cuDNN attention";
  });
  add("ring attention blocks", "blocks interface", [](CudnnRuntime&, CudnnAttentionCall& c) { c.blocks = true; });
  add("fp32", "fp32 operands", [](CudnnRuntime&, CudnnAttentionCall& c) { c.dtype = DType::F32; });
  add("Ampere", "sm_80", [](CudnnRuntime& r, CudnnAttentionCall&) { r.sm_version = 80; });
  add("consumer Blackwell", "sm_120", [](CudnnRuntime& r, CudnnAttentionCall&) { r.sm_version = 120; });
  add("old cuDNN", "older than", [](CudnnRuntime& r, CudnnAttentionCall&) { r.version = 91001; });
  add("head dim not a multiple of 8", "head dim 20", [](CudnnRuntime&, CudnnAttentionCall& c) { c.head_dim = 20; });
  add("head dim over 128", "head dim 256", [](CudnnRuntime&, CudnnAttentionCall& c) { c.head_dim = 256; });
  add("heads not grouped", "not a multiple", [](CudnnRuntime&, CudnnAttentionCall& c) {
    c.q_heads = 6;
    c.kv_heads = 4;
  });
  add("one token", "T=1", [](CudnnRuntime&, CudnnAttentionCall& c) { c.tokens = 1; });
  add("misaligned operand", "16 bytes", [](CudnnRuntime&, CudnnAttentionCall& c) { c.aligned = false; });
  for (const Refused& r : cases) {
    std::string why;
    EXPECT_FALSE(hdp::cudnn_attention_supported(r.runtime, r.call, &why)) << r.what;
    EXPECT_NE(why.find(r.reason), std::string::npos) << r.what << ": " << why;
    EXPECT_FALSE(hdp::cudnn_attention_supported(r.runtime, r.call, nullptr)) << r.what;
  }
}

TEST(KernelsCudnnPlan, RuntimeWithoutDeviceIsUnavailable) {
  // No GPU here: either the build has no cuDNN or the probe finds no device; either
  // way every call is refused with that reason.
  const CudnnRuntime& runtime = hdp::cuda::cudnn_runtime();
  ASSERT_FALSE(runtime.unavailable.empty());
  std::string why;
  EXPECT_FALSE(hdp::cudnn_attention_supported(runtime, llama_call(), &why));
  EXPECT_EQ(why, runtime.unavailable);
}

// The choice is the CUDA backend's: on the CPU, cudnn runs the CPU kernels, equal
// to own's bit for bit, and neither refuses.
TEST(KernelsCudnnPlan, CpuAttentionIgnoresTheChoice) {
  const int64_t T = 40, Hq = 4, Hkv = 2, d = 16;
  std::vector<int32_t> cu = {0, 15, 40};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> q(T * Hq * d), k(T * Hkv * d), v(T * Hkv * d);
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = u(rng);
  const auto run = [&](AttentionImpl impl) {
    const ImplGuard guard(impl);
    std::vector<float> out(T * Hq * d), lse(Hq * T);
    hdp::attention_forward(hdp::Tensor(out.data(), {T, Hq, d}), hdp::Tensor(lse.data(), {Hq, T}),
                           hdp::Tensor(q.data(), {T, Hq, d}), hdp::Tensor(k.data(), {T, Hkv, d}),
                           hdp::Tensor(v.data(), {T, Hkv, d}), hdp::IndexTensor(cu.data(), {3}));
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  };
  EXPECT_EQ(run(AttentionImpl::Cudnn), run(AttentionImpl::Own));
}

}  // namespace
