// Checkpoints under simulated parallel layouts: every (tp, pp, hdp) rank of a
// layout is built in this one process (a model slice plus a ZeRO-1 optimizer
// posing as its hdp rank), each writes its part, and another layout loads them.

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "data/hdf5_lock.h"
#include "parallel/local_communicator.h"
#include "test_util.h"
#include "checkpoint/directory.h"
#include "checkpoint/export.h"
#include "checkpoint/manifest.h"
#include "checkpoint/protocol.h"
#include "model/model.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSeed = 1234;
const std::string kConfigText = "model:\n  hidden_size: 16\n  # a comment\ntrain:\n  steps: 10\n";

ModelConfig tiny_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 41;  // odd: vocabulary slices of unequal size under tp 2
  c.hidden_size = 16;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 32;
  c.tie_embeddings = tied;
  return c;
}

// One simulated rank.
struct Rank {
  CheckpointLayout layout;
  ModelPartition partition;
  std::unique_ptr<LocalCommunicator> hdp_comm, world_comm;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ZeroAdamW> optimizer;
};

ModelPartition partition_for(const ModelConfig& c, const ParallelDegrees& g, int tp_rank, int pp_rank) {
  ModelPartition part;
  part.tp_rank = tp_rank;
  part.tp_size = g.tp;
  part.first_layer = c.num_layers * pp_rank / g.pp;
  part.num_layers = c.num_layers * (pp_rank + 1) / g.pp - part.first_layer;
  part.has_embedding = pp_rank == 0;
  part.has_head = pp_rank == g.pp - 1;
  return part;
}

// Ranks in world order (ParallelDegrees::coords).
std::vector<Rank> make_ranks(const ModelConfig& c, const ParallelDegrees& g, int64_t bucket_floats) {
  std::vector<Rank> ranks(g.world());
  for (int r = 0; r < g.world(); ++r) {
    Rank& k = ranks[r];
    k.layout.degrees = g;
    k.layout.coords = g.coords(r);
    k.layout.world_rank = r;
    k.partition = partition_for(c, g, k.layout.coords.tp_rank, k.layout.coords.pp_rank);
    k.hdp_comm = std::make_unique<LocalCommunicator>("hdp", k.layout.coords.hdp_rank, g.hdp);
    k.world_comm = std::make_unique<LocalCommunicator>("world");
    k.model = std::make_unique<LlamaModel>(c, 8, k.partition, 1, nullptr);
    k.optimizer = std::make_unique<ZeroAdamW>(flat_parameters(k.model->parameter_table()),
                                              k.model->flat_parameters().numel(),
                                              AdamWHyperparameters{.weight_decay = 0}, *k.hdp_comm, *k.world_comm,
                                              bucket_floats);
  }
  return ranks;
}

// Where local flat element i of a parameter's slice sits in the whole tensor.
int64_t global_index(const ParameterInfo& p, int64_t i) {
  int64_t local_cols = 1, global_cols = 1;
  for (size_t d = 1; d < p.shape.size(); ++d) {
    local_cols *= p.shape[d];
    global_cols *= p.global_shape[d];
  }
  int64_t row = i / local_cols, col = i % local_cols;
  if (p.shard_dim == 0) row += p.shard_begin;
  if (p.shard_dim == 1) col += p.shard_begin;
  return row * global_cols + col;
}

// The moment a test stores for element `index` of tensor `name`: depends on the
// tensor and the element only, never on the layout. Exactly representable.
float moment_value(const std::string& name, int64_t index, int which) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  h ^= static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(which) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 31)) * 0x94d049bb133111ebull;
  h ^= h >> 29;
  const float u = static_cast<float>(h >> 40) * 0x1.0p-24f;  // [0, 1)
  return which == 0 ? u - 0.5f : u * 1e-3f;
}

void fill_state(std::vector<Rank>& ranks) {
  for (Rank& k : ranks) {
    k.model->init_weights(kSeed);
    const auto& params = k.model->parameters();
    float* m = k.optimizer->exp_avg().data;
    float* v = k.optimizer->exp_avg_sq().data;
    for (const auto& s : k.optimizer->segments()) {
      const ParameterInfo& p = params[s.parameter];
      for (int64_t j = 0; j < s.length; ++j) {
        const int64_t g = global_index(p, s.flat_offset - p.offset + j);
        m[s.state_offset + j] = moment_value(p.name, g, 0);
        v[s.state_offset + j] = moment_value(p.name, g, 1);
      }
    }
  }
}

// Junk everywhere, so that a load that misses anything shows.
void scramble(std::vector<Rank>& ranks) {
  for (Rank& k : ranks) {
    fill(k.model->flat_parameters(), -7.0f);
    fill(k.optimizer->exp_avg(), -7.0f);
    fill(k.optimizer->exp_avg_sq(), -7.0f);
  }
}

TrainingProgress sample_progress(int64_t step) {
  TrainingProgress p;
  p.step = step;
  p.sampler.epoch = 3;
  p.sampler.cursor = 1000 + step;
  p.sampler.document_offset = 17;
  p.train_seed = 0xfedcba9876543210ull;  // above INT64_MAX: must survive YAML
  p.data_seed = 99;
  return p;
}

// Offline save: every rank writes its part with world == nullptr, rank 0 last commits.
std::string save_all(const std::string& dir, std::vector<Rank>& ranks, int64_t step, int64_t keep = 3,
                     const std::string& config = kConfigText) {
  std::string path;
  for (int r = static_cast<int>(ranks.size()) - 1; r >= 0; --r) {
    path = save_checkpoint(dir, *ranks[r].model, *ranks[r].optimizer, sample_progress(step), config, keep,
                           ranks[r].layout);
  }
  return path;
}

void load_all(const std::string& path, std::vector<Rank>& ranks, int64_t step) {
  for (Rank& k : ranks) {
    TrainingProgress got = load_checkpoint(path, *k.model, k.optimizer.get());
    TrainingProgress want = sample_progress(step);
    EXPECT_EQ(got.step, want.step);
    EXPECT_EQ(got.sampler, want.sampler);
    EXPECT_EQ(got.train_seed, want.train_seed);
    EXPECT_EQ(got.data_seed, want.data_seed);
  }
}

bool bit_equal(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Every weight equals a freshly initialised model of the same partition, every
// moment the test's function of (tensor, global element).
void expect_state(const ModelConfig& c, const std::vector<Rank>& ranks) {
  for (const Rank& k : ranks) {
    SCOPED_TRACE("world rank " + std::to_string(k.layout.world_rank));
    LlamaModel ref(c, 8, k.partition, 1, nullptr);
    ref.init_weights(kSeed);
    const auto& params = k.model->parameters();
    for (const ParameterInfo& p : params) {
      EXPECT_TRUE(bit_equal(k.model->parameter_tensor(p).data, ref.parameter_tensor(ref.parameter(p.name)).data,
                            p.numel))
          << p.name << (p.tied_copy ? " (tied copy)" : "");
    }
    const float* m = k.optimizer->exp_avg().data;
    const float* v = k.optimizer->exp_avg_sq().data;
    for (const auto& s : k.optimizer->segments()) {
      const ParameterInfo& p = params[s.parameter];
      int64_t wrong = 0;
      for (int64_t j = 0; j < s.length; ++j) {
        const int64_t g = global_index(p, s.flat_offset - p.offset + j);
        const float want_m = moment_value(p.name, g, 0), want_v = moment_value(p.name, g, 1);
        wrong += std::memcmp(&m[s.state_offset + j], &want_m, 4) != 0;
        wrong += std::memcmp(&v[s.state_offset + j], &want_v, 4) != 0;
      }
      EXPECT_EQ(wrong, 0) << "moments of " << p.name << " [" << s.flat_offset - p.offset << ", +" << s.length << ")";
    }
  }
}

// Save under `from`, load under `to`, compare everything.
std::string reshard(const std::string& dir, bool tied, ParallelDegrees from, int64_t from_bucket, ParallelDegrees to, int64_t to_bucket,
                    int64_t step = 10) {
  const ModelConfig c = tiny_config(tied);
  auto src = make_ranks(c, from, from_bucket);
  fill_state(src);
  const std::string path = save_all(dir, src, step);
  EXPECT_EQ(path, checkpoint_path(dir, step));
  auto dst = make_ranks(c, to, to_bucket);
  scramble(dst);
  load_all(path, dst, step);
  expect_state(c, dst);
  return path;
}

std::string expect_checkpoint_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no CheckpointError";
  return "";
}

// The file offset of a dataset's raw data (contiguous layout).
int64_t data_offset(const std::string& file, const std::string& dataset) {
  Hdf5Lock lock;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  EXPECT_GE(d, 0) << dataset;
  const haddr_t offset = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  EXPECT_NE(offset, HADDR_UNDEF);
  return static_cast<int64_t>(offset);
}

void flip_bytes(const std::string& file, int64_t offset, int n) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(io.good());
  for (int i = 0; i < n; ++i) {
    io.seekg(offset + i);
    char byte = 0;
    io.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    io.seekp(offset + i);
    io.write(&byte, 1);
  }
}

// ---------------------------------------------------------------------------

TEST(Checkpoint, SingleRankRoundTrip) {
  const std::string dir = testing::scratch_dir("ckpt_single");
  const std::string path = reshard(dir, false, {1, 1, 1}, 1 << 20, {1, 1, 1}, 1 << 20);
  EXPECT_TRUE(fs::is_regular_file(path + "/manifest.yaml"));
  EXPECT_TRUE(fs::is_regular_file(path + "/rank-00000.h5"));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(checkpoint_config(path), kConfigText);
  EXPECT_EQ(latest_checkpoint(dir), path);
}

TEST(Checkpoint, SingleRankRoundTripTied) {
  reshard(testing::scratch_dir("ckpt_single_tied"), true, {1, 1, 1}, 1 << 20, {1, 1, 1}, 1 << 20);
}

TEST(Checkpoint, SingleRankPartHoldsWholeTensorsUnderHuggingFaceNames) {
  const std::string dir = testing::scratch_dir("ckpt_hf_names");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {1, 1, 1}, 1 << 20);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 1);
  Hdf5Lock lock;
  hid_t f = H5Fopen((path + "/rank-00000.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  for (const ParameterInfo& p : ranks[0].model->parameters()) {
    hid_t d = H5Dopen2(f, p.name.c_str(), H5P_DEFAULT);
    ASSERT_GE(d, 0) << p.name;
    std::vector<float> data(p.numel);
    ASSERT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
    EXPECT_TRUE(bit_equal(data.data(), ranks[0].model->parameter_tensor(p).data, p.numel)) << p.name;
    H5Dclose(d);
  }
  H5Fclose(f);
}

TEST(Checkpoint, Tp2Pp2Hdp2ToTp1Pp2Hdp4AndBack) {
  const std::string dir = testing::scratch_dir("ckpt_reshard");
  const ModelConfig c = tiny_config(false);
  reshard(dir, false, {2, 2, 2}, 1000, {1, 2, 4}, 64, 10);
  // Save under tp1 pp2 hdp4 and load back under tp2 pp2 hdp2.
  auto mid = make_ranks(c, {1, 2, 4}, 64);
  fill_state(mid);
  const std::string path = save_all(dir, mid, 20);
  auto back = make_ranks(c, {2, 2, 2}, 1000);
  scramble(back);
  load_all(path, back, 20);
  expect_state(c, back);
}

TEST(Checkpoint, Tp2Pp2Hdp2ToSingleRank) {
  reshard(testing::scratch_dir("ckpt_to_single"), false, {2, 2, 2}, 1000, {1, 1, 1}, 1 << 20);
}

TEST(Checkpoint, SingleRankToTp2Pp2Hdp2) {
  reshard(testing::scratch_dir("ckpt_from_single"), false, {1, 1, 1}, 1 << 20, {2, 2, 2}, 300);
}

TEST(Checkpoint, TiedEmbeddingsAcrossPipelineStages) {
  const std::string dir = testing::scratch_dir("ckpt_tied_pp");
  // The last stage's tied copy is never written; it loads the embedding and its moments.
  reshard(dir, true, {2, 2, 2}, 1000, {1, 1, 1}, 1 << 20, 1);
  reshard(dir, true, {1, 1, 1}, 1 << 20, {2, 2, 1}, 64, 2);
  reshard(dir, true, {1, 2, 2}, 100, {2, 2, 2}, 1000, 3);
  // The last stage's part holds no embedding.
  const std::string last = checkpoint_path(dir, 3) + "/rank-00003.h5";  // tp1: rank 3 = pp 1, hdp 1
  Hdf5Lock lock;
  hid_t f = H5Fopen(last.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_EQ(H5Lexists(f, "model.embed_tokens.weight", H5P_DEFAULT), 0);
  EXPECT_EQ(H5Lexists(f, "lm_head.weight", H5P_DEFAULT), 0);
  H5Fclose(f);
}

TEST(Checkpoint, SmallBucketsCutZeroShardsThroughTensors) {
  const ModelConfig c = tiny_config(false);
  auto probe = make_ranks(c, {1, 1, 3}, 50);
  int cuts = 0;
  for (const Rank& k : probe) {
    for (const auto& s : k.optimizer->segments()) {
      const ParameterInfo& p = k.model->parameters()[s.parameter];
      cuts += s.flat_offset != p.offset || s.length != p.numel;
    }
  }
  EXPECT_GT(cuts, 10);
  reshard(testing::scratch_dir("ckpt_small_buckets"), false, {1, 1, 3}, 50, {2, 1, 2}, 37);
  reshard(testing::scratch_dir("ckpt_small_buckets2"), true, {2, 2, 3}, 37, {1, 1, 2}, 1000);
}

TEST(Checkpoint, PruningKeepsNewestAndLatestIgnoresIncomplete) {
  const std::string dir = testing::scratch_dir("ckpt_prune");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {1, 1, 2}, 1000);
  fill_state(ranks);
  EXPECT_EQ(latest_checkpoint(dir), std::nullopt);
  EXPECT_EQ(latest_checkpoint(dir + "/does-not-exist"), std::nullopt);
  EXPECT_EQ(latest_checkpoint_step(dir), std::nullopt);
  fs::create_directories(checkpoint_path(dir, 1) + ".tmp");   // stale, older: deleted
  fs::create_directories(checkpoint_path(dir, 90) + ".tmp");  // a newer unfinished one: ignored, kept
  fs::create_directories(checkpoint_path(dir, 80));           // no manifest: ignored, kept
  for (int64_t step = 2; step <= 6; ++step) save_all(dir, ranks, step, 2);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 1) + ".tmp"));
  for (int64_t step = 2; step <= 4; ++step) EXPECT_FALSE(fs::exists(checkpoint_path(dir, step))) << step;
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 5) + "/manifest.yaml"));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 6) + "/manifest.yaml"));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 90) + ".tmp"));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 80)));
  EXPECT_EQ(latest_checkpoint(dir), checkpoint_path(dir, 6));
  EXPECT_EQ(latest_checkpoint_step(dir), std::optional<int64_t>(6));  // not 80 (no manifest) nor 90 (.tmp)
}

// A committed checkpoint of `step` as far as the directory's bookkeeping sees it:
// its manifest (no parts behind it).
void write_bare_checkpoint(const std::string& dir, int64_t step, bool guard_confirmed) {
  Manifest m;
  m.format_version = kCheckpointFormatVersion;
  m.progress.step = step;
  m.progress.guard_confirmed = guard_confirmed;
  m.parts = {"rank-00000.h5"};
  m.config = "a: 1\n";
  fs::create_directories(checkpoint_path(dir, step));
  write_manifest(checkpoint_path(dir, step), m);
}

// Checkpoints 4-6 saved before the numerical guard was warm, 1-3 after: pruning to
// the newest 2 keeps 5 and 6 and also 3, the newest a rollback may return to.
TEST(Checkpoint, PruningKeepsTheNewestConfirmedCheckpointBehindUnconfirmedOnes) {
  const std::string dir = testing::scratch_dir("ckpt_prune_confirmed");
  for (int64_t step = 1; step <= 6; ++step) write_bare_checkpoint(dir, step, step <= 3);
  prune_checkpoints(dir, 2, 6);
  for (int64_t step : {1, 2, 4}) EXPECT_FALSE(fs::exists(checkpoint_path(dir, step))) << step;
  for (int64_t step : {3, 5, 6}) EXPECT_TRUE(fs::exists(checkpoint_path(dir, step) + "/manifest.yaml")) << step;
  // Once 6 is confirmed, 3 is no longer needed.
  EXPECT_EQ(confirm_checkpoints(dir), (std::vector<std::string>{checkpoint_path(dir, 5), checkpoint_path(dir, 6)}));
  EXPECT_TRUE(read_manifest(checkpoint_path(dir, 6)).progress.guard_confirmed);
  prune_checkpoints(dir, 2, 6);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 3)));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 5)));
}

// A rollback returns to the newest confirmed checkpoint before the step that is not
// suspect; marking one suspect marks those trained from it too, and `resume: auto`
// passes them by as well, saying which.
TEST(Checkpoint, RollbacksAndResumesPassSuspectAndUnconfirmedCheckpointsBy) {
  const std::string dir = testing::scratch_dir("ckpt_suspect");
  for (int64_t step = 1; step <= 4; ++step) write_bare_checkpoint(dir, step, step != 3);
  std::vector<std::string> passed;
  EXPECT_EQ(rollback_checkpoint_before(dir, 4, {}, &passed), checkpoint_path(dir, 2));
  ASSERT_EQ(passed.size(), 1u);
  EXPECT_EQ(passed[0], checkpoint_path(dir, 3) + " (unconfirmed: the numerical guard had passed no step after the "
                                                 "run's first when it was saved, nor since)");
  passed.clear();
  EXPECT_EQ(rollback_checkpoint_before(dir, 4, {2}, &passed), checkpoint_path(dir, 1));
  EXPECT_EQ(passed.size(), 2u);

  EXPECT_EQ(mark_suspect_from(dir, 2, "bad steps again"), 2);
  EXPECT_EQ(read_manifest(checkpoint_path(dir, 2)).suspect, "bad steps again");
  EXPECT_EQ(read_manifest(checkpoint_path(dir, 4)).suspect, "trained from the checkpoint of step 2, which is suspect");
  EXPECT_EQ(read_manifest(checkpoint_path(dir, 1)).suspect, "");
  passed.clear();
  EXPECT_EQ(rollback_checkpoint_before(dir, 5, {}, &passed), checkpoint_path(dir, 1));
  EXPECT_EQ(passed.size(), 3u);
  passed.clear();
  EXPECT_EQ(latest_resumable_checkpoint(dir, &passed), checkpoint_path(dir, 1));
  EXPECT_EQ(passed, (std::vector<std::string>{
                        checkpoint_path(dir, 4) + " (suspect: trained from the checkpoint of step 2, which is suspect)",
                        checkpoint_path(dir, 3) + " (suspect: trained from the checkpoint of step 2, which is suspect)",
                        checkpoint_path(dir, 2) + " (suspect: bad steps again)"}));
  // Tools that read a checkpoint (eval, export) still see the newest one.
  EXPECT_EQ(latest_checkpoint(dir), checkpoint_path(dir, 4));
  passed.clear();
  EXPECT_EQ(rollback_checkpoint_before(dir, 5, {1}, &passed), std::nullopt);
}

TEST(Checkpoint, OfflinePartsCommitOnlyWithRankZero) {
  const std::string dir = testing::scratch_dir("ckpt_offline");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {1, 1, 2}, 1000);
  fill_state(ranks);
  save_checkpoint(dir, *ranks[1].model, *ranks[1].optimizer, sample_progress(7), kConfigText, 2, ranks[1].layout);
  EXPECT_TRUE(fs::is_regular_file(checkpoint_path(dir, 7) + ".tmp/rank-00001.h5"));
  EXPECT_EQ(latest_checkpoint(dir), std::nullopt);
  // A stray file of an earlier attempt does not survive the commit.
  std::ofstream(checkpoint_path(dir, 7) + ".tmp/rank-00005.h5") << "junk";
  save_checkpoint(dir, *ranks[0].model, *ranks[0].optimizer, sample_progress(7), kConfigText, 2, ranks[0].layout);
  EXPECT_EQ(latest_checkpoint(dir), checkpoint_path(dir, 7));
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 7) + "/rank-00005.h5"));
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 7) + ".tmp"));
}

TEST(Checkpoint, RankZeroRefusesToCommitWithoutEveryPart) {
  const std::string dir = testing::scratch_dir("ckpt_incomplete_commit");
  auto ranks = make_ranks(tiny_config(false), {1, 1, 2}, 1000);
  fill_state(ranks);
  const std::string msg = expect_checkpoint_error([&] {
    save_checkpoint(dir, *ranks[0].model, *ranks[0].optimizer, sample_progress(7), kConfigText, 2, ranks[0].layout);
  });
  EXPECT_NE(msg.find("rank-00001.h5"), std::string::npos) << msg;
  EXPECT_EQ(latest_checkpoint(dir), std::nullopt);
}

TEST(Checkpoint, RerunOfAStepReplacesIt) {
  const std::string dir = testing::scratch_dir("ckpt_rerun");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {1, 1, 1}, 1000);
  fill_state(ranks);
  save_all(dir, ranks, 5, 3, "first: 1\n");
  const std::string path = save_all(dir, ranks, 5, 3, "second: 2\n");
  EXPECT_EQ(checkpoint_config(path), "second: 2\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Checkpoint, ConfigTextSurvivesTheManifestExactly) {
  const std::string dir = testing::scratch_dir("ckpt_config_text");
  auto ranks = make_ranks(tiny_config(false), {1, 1, 1}, 1000);
  fill_state(ranks);
  int64_t step = 1;
  for (const std::string& text : {std::string("a: 1"), std::string("  indented: first line\nb: 2\n\n\n"),
                                 std::string(""), std::string("x: \"quoted: text\" # c\n\ty: tab\n")}) {
    EXPECT_EQ(checkpoint_config(save_all(dir, ranks, step++, 10, text)), text);
  }
}

TEST(Checkpoint, ManifestRecordsTheScheduleAndOlderOnesLoadWithout) {
  const std::string dir = testing::scratch_dir("ckpt_schedule");
  Manifest m;
  m.format_version = kCheckpointFormatVersion;
  m.progress.step = 40;
  m.parts = {"rank-00000.h5"};
  m.config = "a: 1\n";
  fs::create_directories(dir + "/with");
  m.progress.lr_schedule = RunSchedule{{.kind = LrScheduleKind::Wsd, .lr = 3e-4, .min_lr = 1e-5, .warmup_steps = 7,
                                        .decay_steps = 0, .decay_fraction = 0.25},
                                       900};
  write_manifest(dir + "/with", m);
  const Manifest back = read_manifest(dir + "/with");
  ASSERT_TRUE(back.progress.lr_schedule.has_value());
  const RunSchedule& r = *back.progress.lr_schedule;
  EXPECT_EQ(r.schedule.kind, LrScheduleKind::Wsd);
  EXPECT_EQ(r.schedule.lr, 3e-4);
  EXPECT_EQ(r.schedule.min_lr, 1e-5);
  EXPECT_EQ(r.schedule.warmup_steps, 7);
  EXPECT_EQ(r.schedule.decay_steps, 0);
  EXPECT_EQ(r.schedule.decay_fraction, 0.25);
  EXPECT_EQ(r.steps, 900);
  // A manifest written before the record (no lr_schedule key) still reads.
  fs::create_directories(dir + "/without");
  m.progress.lr_schedule.reset();
  write_manifest(dir + "/without", m);
  std::ifstream in(dir + "/without/manifest.yaml");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("lr_schedule"), std::string::npos) << text;
  const Manifest old = read_manifest(dir + "/without");
  EXPECT_FALSE(old.progress.lr_schedule.has_value());
  EXPECT_EQ(old.progress.step, 40);
  // An unknown schedule name is refused, naming the file and the key.
  std::string bad = text + "lr_schedule: {schedule: cosinus, lr: 1, min_lr: 0, warmup_steps: 0, decay_steps: 0, "
                           "decay_fraction: 0, steps: 1}\n";
  std::ofstream(dir + "/without/manifest.yaml") << bad;
  const std::string msg = expect_checkpoint_error([&] { read_manifest(dir + "/without"); });
  EXPECT_NE(msg.find("manifest.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lr_schedule.schedule: unknown schedule 'cosinus'"), std::string::npos) << msg;
}

TEST(Checkpoint, CorruptedWeightFailsItsChecksum) {
  const std::string dir = testing::scratch_dir("ckpt_corrupt");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {2, 1, 1}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 1);
  const std::string part = path + "/rank-00001.h5";
  const std::string tensor = "model.layers.2.mlp.up_proj.weight";
  flip_bytes(part, data_offset(part, tensor) + 40, 3);
  auto dst = make_ranks(c, {1, 1, 1}, 1000);
  const std::string msg = expect_checkpoint_error([&] { load_checkpoint(path, *dst[0].model, nullptr); });
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
  EXPECT_NE(msg.find(tensor), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
}

TEST(Checkpoint, CorruptedMomentFailsItsChecksum) {
  const std::string dir = testing::scratch_dir("ckpt_corrupt_moment");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {1, 1, 2}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 1);
  const std::string part = path + "/rank-00001.h5";
  // Whatever moment dataset rank 1 holds first for the last tensor it has a piece of.
  const auto& seg = ranks[1].optimizer->segments().back();
  const ParameterInfo& p = ranks[1].model->parameters()[seg.parameter];
  const std::string ds = "optimizer/" + p.name + "/exp_avg_sq." + std::to_string(seg.flat_offset - p.offset);
  flip_bytes(part, data_offset(part, ds), 4);
  auto dst = make_ranks(c, {1, 1, 1}, 1000);
  // Weights alone still load: the moments are not read.
  EXPECT_NO_THROW(load_checkpoint(path, *dst[0].model, nullptr));
  const std::string msg =
      expect_checkpoint_error([&] { load_checkpoint(path, *dst[0].model, dst[0].optimizer.get()); });
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
  EXPECT_NE(msg.find(p.name), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
}

// The checksum of format_version 2 (docs/checkpoint-format.md, "Checksum"): one
// chain over the 8-byte words, then the tail bytes.
uint64_t format2_checksum(const std::vector<float>& data) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  const size_t n = data.size() * sizeof(float);
  uint64_t h = 0xcbf29ce484222325ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

std::vector<std::string> link_names_of(hid_t group) {
  std::vector<std::string> names;
  H5Literate(group, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr,
             [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
               static_cast<std::vector<std::string>*>(out)->push_back(name);
               return 0;
             },
             &names);
  return names;
}

// Rewrites a part as format_version 2 wrote it: that version in the root
// attribute (`version`) and every dataset's checksum by format2_checksum.
void rewrite_as_format2(const std::string& part, int64_t version) {
  Hdf5Lock lock;
  hid_t f = H5Fopen(part.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << part;
  std::vector<std::string> datasets;
  for (const std::string& name : link_names_of(f)) {
    if (name != "optimizer") {
      datasets.push_back(name);
      continue;
    }
    hid_t opt = H5Gopen2(f, "optimizer", H5P_DEFAULT);
    for (const std::string& tensor : link_names_of(opt)) {
      hid_t g = H5Gopen2(opt, tensor.c_str(), H5P_DEFAULT);
      for (const std::string& moment : link_names_of(g)) datasets.push_back("optimizer/" + tensor + "/" + moment);
      H5Gclose(g);
    }
    H5Gclose(opt);
  }
  for (const std::string& name : datasets) {
    hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
    hid_t space = H5Dget_space(d);
    std::vector<float> data(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
    H5Sclose(space);
    EXPECT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0) << name;
    const uint64_t sum = format2_checksum(data);
    hid_t a = H5Aopen(d, "checksum", H5P_DEFAULT);
    EXPECT_GE(H5Awrite(a, H5T_NATIVE_UINT64, &sum), 0) << name;
    H5Aclose(a);
    H5Dclose(d);
  }
  hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT64, &version), 0);
  H5Aclose(a);
  H5Fclose(f);
}

// A checkpoint written by a build of format_version 2 (its checksums one chain of
// words; version 3's are four interleaved chains, for speed) still loads, weights
// and moments alike; its parts' checksums are checked as version 2 defines them,
// so the same part claiming version 3 fails its checksum.
TEST(Checkpoint, AFormatVersion2CheckpointStillLoadsAndIsCheckedByItsOwnChecksum) {
  const std::string dir = testing::scratch_dir("ckpt_format2");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {1, 1, 2}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 4);
  for (const char* part : {"/rank-00000.h5", "/rank-00001.h5"}) rewrite_as_format2(path + part, 2);
  std::ifstream in(path + "/manifest.yaml");
  const std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string current = "format_version: " + std::to_string(kCheckpointFormatVersion);
  ASSERT_EQ(manifest.rfind(current, 0), 0u) << manifest;
  std::ofstream(path + "/manifest.yaml") << "format_version: 2" + manifest.substr(current.size());
  auto dst = make_ranks(c, {1, 1, 1}, 1000);
  scramble(dst);
  load_all(path, dst, 4);
  expect_state(c, dst);

  rewrite_as_format2(path + "/rank-00001.h5", kCheckpointFormatVersion);
  const std::string msg =
      expect_checkpoint_error([&] { load_checkpoint(path, *dst[0].model, dst[0].optimizer.get()); });
  EXPECT_NE(msg.find(path + "/rank-00001.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fails its checksum"), std::string::npos) << msg;
}

TEST(Checkpoint, TruncatedPartIsRefused) {
  const std::string dir = testing::scratch_dir("ckpt_truncated");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {1, 2, 1}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 1);
  const std::string part = path + "/rank-00001.h5";
  fs::resize_file(part, fs::file_size(part) / 2);
  auto dst = make_ranks(c, {1, 1, 1}, 1000);
  const std::string msg = expect_checkpoint_error([&] { load_checkpoint(path, *dst[0].model, nullptr); });
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
}

TEST(Checkpoint, MissingPartIsRefused) {
  const std::string dir = testing::scratch_dir("ckpt_missing_part");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {2, 1, 1}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 1);
  fs::remove(path + "/rank-00001.h5");
  auto dst = make_ranks(c, {2, 1, 1}, 1000);
  const std::string msg = expect_checkpoint_error([&] { load_checkpoint(path, *dst[0].model, nullptr); });
  EXPECT_NE(msg.find("rank-00001.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(Checkpoint, MissingOrBrokenManifestIsRefused) {
  const std::string dir = testing::scratch_dir("ckpt_manifest");
  const ModelConfig c = tiny_config(false);
  auto ranks = make_ranks(c, {1, 1, 1}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 1);
  std::string msg = expect_checkpoint_error([&] { load_checkpoint(dir + "/step-00000077", *ranks[0].model, nullptr); });
  EXPECT_NE(msg.find("step-00000077"), std::string::npos) << msg;
  std::ofstream(path + "/manifest.yaml") << "format_version: 2\nstep: [unclosed\n";
  msg = expect_checkpoint_error([&] { load_checkpoint(path, *ranks[0].model, nullptr); });
  EXPECT_NE(msg.find(path + "/manifest.yaml"), std::string::npos) << msg;
  msg = expect_checkpoint_error([&] { checkpoint_config(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  fs::remove(path + "/manifest.yaml");
  msg = expect_checkpoint_error([&] { load_checkpoint(path, *ranks[0].model, nullptr); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_EQ(latest_checkpoint(dir), std::nullopt);
}

TEST(Checkpoint, ShapeMismatchNamesTheTensor) {
  const std::string dir = testing::scratch_dir("ckpt_shape");
  auto ranks = make_ranks(tiny_config(false), {1, 1, 1}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 1);
  ModelConfig bigger = tiny_config(false);
  bigger.vocab_size = 48;
  auto dst = make_ranks(bigger, {2, 1, 1}, 1000);
  const std::string msg = expect_checkpoint_error([&] { load_checkpoint(path, *dst[0].model, nullptr); });
  EXPECT_NE(msg.find("model.embed_tokens.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[41, 16]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[48, 16]"), std::string::npos) << msg;
}

TEST(Checkpoint, MissingTensorIsNamed) {
  const std::string dir = testing::scratch_dir("ckpt_missing_tensor");
  auto ranks = make_ranks(tiny_config(true), {1, 1, 1}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 1);
  auto dst = make_ranks(tiny_config(false), {1, 2, 1}, 1000);  // wants lm_head.weight
  EXPECT_NO_THROW(load_checkpoint(path, *dst[0].model, dst[0].optimizer.get()));
  const std::string msg = expect_checkpoint_error([&] { load_checkpoint(path, *dst[1].model, nullptr); });
  EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
}

void expect_export_matches(bool tied) {
  const std::string dir = testing::scratch_dir(tied ? "ckpt_export_tied" : "ckpt_export");
  const ModelConfig c = tiny_config(tied);
  auto ranks = make_ranks(c, {2, 2, 2}, 1000);
  fill_state(ranks);
  const std::string path = save_all(dir, ranks, 42);
  const std::string out = dir + "/export.h5";
  export_checkpoint(path, out);
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  LlamaModel whole(c, 8);
  whole.init_weights(kSeed);
  Hdf5Lock lock;
  hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5G_info_t info;
  ASSERT_GE(H5Gget_info(f, &info), 0);
  EXPECT_EQ(info.nlinks, whole.parameters().size());  // weights only: no optimizer state
  for (const ParameterInfo& p : whole.parameters()) {
    hid_t d = H5Dopen2(f, p.name.c_str(), H5P_DEFAULT);
    ASSERT_GE(d, 0) << p.name;
    hid_t space = H5Dget_space(d);
    std::vector<hsize_t> dims(H5Sget_simple_extent_ndims(space));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    H5Sclose(space);
    EXPECT_EQ(std::vector<int64_t>(dims.begin(), dims.end()), p.global_shape) << p.name;
    std::vector<float> data(p.numel);
    ASSERT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
    EXPECT_TRUE(bit_equal(data.data(), whole.parameter_tensor(p).data, p.numel)) << p.name;
    H5Dclose(d);
  }
  uint64_t step = 0;
  hid_t a = H5Aopen(f, "step", H5P_DEFAULT);
  ASSERT_GE(a, 0);
  H5Aread(a, H5T_NATIVE_UINT64, &step);
  H5Aclose(a);
  EXPECT_EQ(step, 42u);
  a = H5Aopen(f, "config", H5P_DEFAULT);
  ASSERT_GE(a, 0);
  hid_t type = H5Aget_type(a);
  std::string config(H5Tget_size(type), '\0');
  H5Aread(a, type, config.data());
  H5Tclose(type);
  H5Aclose(a);
  EXPECT_EQ(std::string(config.c_str()), kConfigText);
  H5Fclose(f);
}

TEST(Checkpoint, ExportWritesWholeTensors) { expect_export_matches(false); }
TEST(Checkpoint, ExportWritesWholeTensorsTied) { expect_export_matches(true); }

}  // namespace
}  // namespace hdp
