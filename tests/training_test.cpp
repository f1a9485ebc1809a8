// End to end through the trainer binary: the demo corpus is learnable, resume is
// exact, broken checkpoints and bad command lines are refused with exit code 2.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include "base/fault_injection.h"
#include "data/dataset.h"
#include "test_util.h"
#include "trainer_runs.h"
#include "checkpoint/manifest.h"
#include "checkpoint/protocol.h"
#include "config/config.h"
#include "model/model.h"
#include "parallel/local_communicator.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;
using testing::run_trainer;
using testing::scratch_dir;

const std::string kTinyConfig = std::string(HDP_SOURCE_DIR) + "/configs/tiny-llama.yaml";

// A small demo corpus shared by the tests of this file (made once).
const std::string& corpus() {
  static const std::string path = [] {
    // One per process: ctest runs the tests of this file as separate processes in parallel.
    const std::string dir = scratch_dir("training-corpus-" + std::to_string(getpid()));
    const std::string p = dir + "/corpus.h5";
    auto r = run_trainer("make-corpus --output " + p + " --documents 1500 --max-length 2048");
    if (r.exit_code != 0) throw std::runtime_error("make-corpus failed: " + r.output);
    return p;
  }();
  return path;
}

// Common overrides: a quick run in `dir` on the shared corpus.
std::string run_args(const std::string& dir, int steps, const std::string& extra = "") {
  return "train " + kTinyConfig + " --set data.path=" + corpus() + " --set train.run_dir=" + dir +
         " --set train.checkpoint_dir=" + dir + "/ckpt --set train.steps=" + std::to_string(steps) +
         " --set train.peak_flops=1e11 --set train.log_every=100 " + extra;
}

std::vector<std::string> metric_lines(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

double field(const std::string& line, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("\"" + key + "\": ([-0-9.eE+]+)"))) {
    throw std::runtime_error("no " + key + " in " + line);
  }
  return std::stod(m[1]);
}

// Two checkpoints hold bit-identical weights and second moments (and, with
// same_progress, the same step and sampler position).
void expect_same_checkpoint(const std::string& a_ckpt, const std::string& b_ckpt, bool same_progress = true) {
  const Config config = parse_config_text(checkpoint_config(a_ckpt), "checkpoint", {}, false);
  LocalCommunicator hdp("hdp"), world("world");
  LlamaModel ma(config.model, 64), mb(config.model, 64);
  ZeroAdamW oa(flat_parameters(ma.parameter_table()), ma.flat_parameters().numel(), config.optim, hdp, world, 1 << 20);
  ZeroAdamW ob(flat_parameters(mb.parameter_table()), mb.flat_parameters().numel(), config.optim, hdp, world, 1 << 20);
  const TrainingProgress pa = load_checkpoint(a_ckpt, ma, &oa);
  const TrainingProgress pb = load_checkpoint(b_ckpt, mb, &ob);
  if (same_progress) {
    EXPECT_EQ(pa.step, pb.step);
    EXPECT_EQ(pa.sampler, pb.sampler);
  }
  for (int64_t i = 0; i < ma.flat_parameters().numel(); ++i) {
    ASSERT_EQ(ma.flat_parameters().data[i], mb.flat_parameters().data[i]) << "parameter element " << i;
  }
  for (int64_t i = 0; i < oa.exp_avg_sq().numel(); ++i) {
    ASSERT_EQ(oa.exp_avg_sq().data[i], ob.exp_avg_sq().data[i]) << "second moment element " << i;
  }
}

std::string step_dir(const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "/ckpt/step-%08lld", static_cast<long long>(step));
  return run_dir + name;
}

TEST(Training, DemoCorpusLossFallsClearly) {
  const std::string dir = scratch_dir("training-learns");
  auto r = run_trainer(run_args(dir, 60, "--set train.checkpoint_every=0 --set optim.warmup_steps=10"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 60u);
  for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_ms", "mfu",
                          "peak_mem_bytes"}) {
    EXPECT_NO_THROW(field(lines.back(), key)) << key;
  }
  const double first = field(lines.front(), "loss");
  double last = 0;
  for (size_t i = lines.size() - 5; i < lines.size(); ++i) last += field(lines[i], "loss") / 5;
  // A fresh model predicts about uniformly over 258 ids: ln 258 = 5.55.
  EXPECT_NEAR(first, std::log(258.0), 0.3);
  // The unigram entropy of the corpus is about 4.2 nats; learning means going well below it.
  EXPECT_LT(last, 3.0) << "first " << first << ", mean of last five " << last;
}

// configs/tiny-mistral.yaml: the sliding window (128) is shorter than most
// sequences (up to 512 tokens), and the model still learns the corpus.
TEST(Training, TinyMistralWithASlidingWindowLearns) {
  const std::string dir = scratch_dir("training-mistral");
  const std::string config = std::string(HDP_SOURCE_DIR) + "/configs/tiny-mistral.yaml";
  auto r = run_trainer("train " + config + " --set data.path=" + corpus() + " --set train.run_dir=" + dir +
                       " --set train.checkpoint_dir=" + dir + "/ckpt --set train.steps=60 --set train.peak_flops=1e11"
                       " --set train.log_every=100 --set train.checkpoint_every=60 --set optim.warmup_steps=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The checkpoint records the window with the model.
  const Config saved = parse_config_text(checkpoint_config(step_dir(dir, 60)), "checkpoint", {}, false);
  EXPECT_EQ(saved.model.arch, "mistral");
  EXPECT_EQ(saved.model.sliding_window, std::optional<int64_t>(128));
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 60u);
  const double first = field(lines.front(), "loss");
  double last = 0;
  for (size_t i = lines.size() - 5; i < lines.size(); ++i) last += field(lines[i], "loss") / 5;
  EXPECT_NEAR(first, std::log(258.0), 0.3);
  EXPECT_LT(last, 3.0) << "first " << first << ", mean of last five " << last;
}

// configs/tiny-mixtral.yaml: 4 experts, top-2. The loss falls, the load-balancing
// loss is reported beside it (E sum_e f_e P_e is k = 2 when the routing is balanced),
// every expert gets tokens, and the load evens out: the busiest expert's count over the
// mean stays below 2 (a router collapsed onto 2 experts would give exactly 2) and is at
// most 1.3 over the last 10 steps. Measured (this corpus, 2026-11-22): aux 1.998 to
// 2.055; max/mean 1.11 at step 1, peaking at 1.65 at step 9, 1.05 to 1.23 over steps
// 31-40.
TEST(Training, TinyMixtralLearnsWithBalancedExperts) {
  const std::string dir = scratch_dir("training-mixtral");
  const std::string config = std::string(HDP_SOURCE_DIR) + "/configs/tiny-mixtral.yaml";
  auto r = run_trainer("train " + config + " --set data.path=" + corpus() + " --set train.run_dir=" + dir +
                       " --set train.checkpoint_dir=" + dir + "/ckpt --set train.steps=40 --set train.peak_flops=1e11"
                       " --set train.log_every=100 --set train.checkpoint_every=0 --set optim.warmup_steps=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 40u);
  const double first = field(lines.front(), "loss");
  double last = 0;
  for (size_t i = lines.size() - 5; i < lines.size(); ++i) last += field(lines[i], "loss") / 5;
  EXPECT_NEAR(first, std::log(258.0) + 0.02 * 2, 0.3);
  EXPECT_LT(last, 3.2) << "first " << first << ", mean of last five " << last;
  for (const std::string& line : lines) {
    EXPECT_GT(field(line, "aux_loss"), 1.9);
    EXPECT_LT(field(line, "aux_loss"), 2.5);
    EXPECT_LT(field(line, "expert_load_max_over_mean"), 2.0);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, std::regex("\"expert_tokens\": \\[(\\d+), (\\d+), (\\d+), (\\d+)\\]")));
    int64_t total = 0;
    for (int e = 1; e <= 4; ++e) {
      EXPECT_GT(std::stoll(m[e]), 0);
      total += std::stoll(m[e]);
    }
    // Every input token of every layer reaches its 2 experts (dropless).
    EXPECT_EQ(total, 2 * 4 * static_cast<int64_t>(field(line, "input_tokens")));
  }
  for (size_t i = lines.size() - 10; i < lines.size(); ++i)
    EXPECT_LE(field(lines[i], "expert_load_max_over_mean"), 1.3) << "step " << i + 1;
}

TEST(Training, ResumeIsBitIdentical) {
  const std::string straight = scratch_dir("training-straight"), split = scratch_dir("training-split");
  const std::string common = "--set data.global_batch_tokens=2048 --set train.keep_checkpoints=5 ";
  auto a = run_trainer(run_args(straight, 8, common + "--set train.checkpoint_every=8"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b1 = run_trainer(run_args(split, 5, common + "--set train.checkpoint_every=5"));
  ASSERT_EQ(b1.exit_code, 0) << b1.output;
  auto b2 = run_trainer(run_args(split, 8, common + "--set train.checkpoint_every=8"));
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  EXPECT_NE(b2.output.find("resumed from"), std::string::npos) << b2.output;

  const auto la = metric_lines(straight), lb = metric_lines(split);
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(field(la[i], "loss"), field(lb[i], "loss")) << "step " << i + 1;
    EXPECT_EQ(field(la[i], "grad_norm"), field(lb[i], "grad_norm")) << "step " << i + 1;
  }

  expect_same_checkpoint(straight + "/ckpt/step-00000008", split + "/ckpt/step-00000008");
}

// Resuming with another train.steps used to restart the cosine decay silently: a
// resume whose learning rate would jump is refused, naming the keys, unless the
// decay is kept (optim.decay_steps) or the change is allowed.
TEST(Training, AResumeWhoseLearningRateWouldJumpIsRefusedNamingTheKeys) {
  const std::string dir = scratch_dir("training-schedule-jump");
  // lr 2e-3 to min_lr 2e-4 (tiny-llama), warmup 2: a 6-step run decays over steps 3-6.
  const std::string common = "--set data.global_batch_tokens=1024 --set optim.warmup_steps=2 "
                             "--set train.checkpoint_every=3 ";
  auto first = run_trainer(run_args(dir, 6, common));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const TrainingProgress recorded = read_manifest(step_dir(dir, 6)).progress;
  ASSERT_TRUE(recorded.lr_schedule.has_value());
  EXPECT_EQ(recorded.lr_schedule->steps, 6);
  EXPECT_EQ(recorded.lr_schedule->schedule.kind, LrScheduleKind::Cosine);

  auto longer = run_trainer(run_args(dir, 12, common));
  EXPECT_EQ(longer.exit_code, 2) << longer.output;
  // Step 7: min_lr after the 6-step decay, half way down a 10-step one.
  for (const char* part : {"resuming ", "step-00000006 (step 6) changes the learning rate of step 7 from 0.0002 to 0.0011",
                           "train.steps 6 -> 12", "cosine decay over steps 3-6; this config: cosine decay over steps 3-12",
                           "set optim.decay_steps: 4 to keep its decay", "train.allow_schedule_change: true"}) {
    EXPECT_NE(longer.output.find(part), std::string::npos) << part << "\n" << longer.output;
  }
  EXPECT_EQ(metric_lines(dir).size(), 6u);

  auto kept = run_trainer(run_args(dir, 12, common + "--set optim.decay_steps=4"));
  ASSERT_EQ(kept.exit_code, 0) << kept.output;
  EXPECT_NE(kept.output.find("continues from step 7's rate"), std::string::npos) << kept.output;
  const std::vector<double> lr = testing::metric_values(dir, "lr");
  ASSERT_EQ(lr.size(), 12u);
  for (size_t i = 5; i < 12; ++i) EXPECT_NEAR(lr[i], 2e-4, 1e-12) << "step " << i + 1;

  auto allowed = run_trainer(run_args(dir, 15, common + "--set optim.decay_steps=4 --set optim.min_lr=1e-4 "
                                                        "--set train.allow_schedule_change=true"));
  ASSERT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_NE(allowed.output.find("optim.min_lr 0.0002 -> 0.0001; train.steps 12 -> 15"), std::string::npos)
      << allowed.output;
  EXPECT_NE(allowed.output.find("resuming with the new schedule (train.allow_schedule_change: true)"),
            std::string::npos) << allowed.output;
  EXPECT_NEAR(testing::metric_values(dir, "lr").back(), 1e-4, 1e-12);
}

// The run directory by default holds the checkpoints (RUN_DIR/checkpoints), the
// effective config (config.yaml), rank 0's log (train.log, appended by every start,
// step lines with elapsed time and ETA) and, asked for, TensorBoard's event files.
TEST(Training, TheRunDirectoryKeepsCheckpointsConfigLogAndTensorBoardFiles) {
  const std::string dir = scratch_dir("training-run-dir");
  auto run = [&](int steps) {
    return run_trainer("train " + kTinyConfig + " --set data.path=" + corpus() + " --set train.run_dir=" + dir +
                       " --set train.steps=" + std::to_string(steps) +
                       " --set train.peak_flops=1e11 --set train.checkpoint_every=2 --set optim.schedule=constant"
                       " --set optim.warmup_steps=0 --set data.global_batch_tokens=1024 --set metrics.tensorboard=true");
  };
  auto first = run(2);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/step-00000002/manifest.yaml"));
  const std::string config = testing::file_text(dir + "/config.yaml");
  EXPECT_NE(config.find("checkpoint_dir: \"\"\n"), std::string::npos) << config;  // RUN_DIR/checkpoints
  EXPECT_NE(config.find("tensorboard: true\n"), std::string::npos) << config;
  auto second = run(3);  // resumes from step 2
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(testing::file_text(dir + "/config.yaml").find("steps: 3\n"), std::string::npos);
  const std::string log = testing::file_text(dir + "/train.log");
  const std::regex step_line("step +([0-9]+)/([0-9]+) \\| loss .* \\| [0-9]+ s elapsed, ETA [0-9]+ s");
  std::vector<std::string> steps;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), step_line); it != std::sregex_iterator(); ++it) {
    steps.push_back((*it)[1].str() + "/" + (*it)[2].str());
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"1/2", "2/2", "3/3"})) << log;
  int event_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/tensorboard")) {
    event_files += entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(event_files, 2);
}

// Preemption: SIGTERM mid-run finishes the step, writes a checkpoint of it, exits
// 0; a resumed run then continues exactly like one that was never stopped.
TEST(Training, SigtermStopsAtAStepBoundaryWithACheckpointAndResumesBitIdentically) {
  const std::string stopped = scratch_dir("training-sigterm"), straight = scratch_dir("training-sigterm-straight");
  // min_lr = lr: after the warm-up the learning rate does not depend on
  // train.steps, which differs between the runs compared.
  const std::string common = "--set data.global_batch_tokens=2048 --set optim.min_lr=2e-3 --set optim.warmup_steps=2 "
                             "--set train.checkpoint_every=100000 ";
  testing::BackgroundRun run(std::string(HDP_TRAINER_BINARY) + " " + run_args(stopped, 100000, common),
                             stopped + "/log.txt");
  ASSERT_TRUE(testing::wait_for_steps(run, stopped, 2, 300)) << testing::file_text(stopped + "/log.txt");
  kill(run.pid(), SIGTERM);
  ASSERT_EQ(run.wait(300), 0) << testing::file_text(stopped + "/log.txt");
  const std::string log = testing::file_text(stopped + "/log.txt");
  const auto lines = metric_lines(stopped);
  const int64_t n = static_cast<int64_t>(lines.size());
  ASSERT_GE(n, 2);
  EXPECT_EQ(field(lines.back(), "step"), n);
  EXPECT_NE(log.find("stopped by SIGTERM after step " + std::to_string(n) + " of 100000"), std::string::npos) << log;
  // The only checkpoint is the one of the step it stopped after.
  ASSERT_TRUE(fs::exists(step_dir(stopped, n) + "/manifest.yaml")) << log;
  EXPECT_EQ(std::distance(fs::directory_iterator(stopped + "/ckpt"), fs::directory_iterator()), 1);

  auto resumed = run_trainer(run_args(stopped, static_cast<int>(n) + 3, common));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  auto whole = run_trainer(run_args(straight, static_cast<int>(n) + 3, common));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const auto la = metric_lines(straight), lb = metric_lines(stopped);
  ASSERT_EQ(la.size(), static_cast<size_t>(n + 3));
  ASSERT_EQ(lb.size(), static_cast<size_t>(n + 3));
  for (size_t i = 0; i < la.size(); ++i) {
    EXPECT_EQ(field(lb[i], "step"), static_cast<double>(i + 1));
    EXPECT_EQ(field(la[i], "loss"), field(lb[i], "loss")) << "step " << i + 1;
  }
  expect_same_checkpoint(step_dir(straight, n + 3), step_dir(stopped, n + 3));
}

// A stop signal while a checkpoint is being written: every checkpoint write takes
// kSlowCheckpointMs longer (HDP_FAULT_INJECT=0:1-100000:slow-checkpoint), and
// SIGTERM is sent as soon as the write of a checkpoint after the first (step K)
// begins, so it arrives while that write runs (a step takes far less than the
// write). The step it stops after comes later than K, when the default
// train.checkpoint_budget defers checkpoints (one was just written); the stop step
// is saved all the same, after the write in flight, which is completed and not
// abandoned; the process exits 0 only once both are committed, and the run resumed
// from the stop step goes on exactly like one that never stopped.
TEST(Training, SigtermDuringACheckpointWriteWaitsForItThenSavesTheStopStepAndResumesBitIdentically) {
  const std::string stopped = scratch_dir("training-sigterm-busy"), straight = scratch_dir("training-sigterm-busy-straight");
  const std::string common = "--set data.global_batch_tokens=1024 --set optim.min_lr=2e-3 --set optim.warmup_steps=2 "
                             "--set train.checkpoint_every=1 --set train.keep_checkpoints=100000 ";
  testing::BackgroundRun run("env HDP_FAULT_INJECT=0:1-100000:slow-checkpoint " + std::string(HDP_TRAINER_BINARY) +
                                 " " + run_args(stopped, 100000, common),
                             stopped + "/log.txt");
  const std::regex begins("sleeps [0-9]+ ms before writing its part of the checkpoint of step ([0-9]+)");
  int64_t k = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (k < 2 && run.running() && std::chrono::steady_clock::now() < end) {
    const std::string text = testing::file_text(stopped + "/log.txt");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), begins); it != std::sregex_iterator(); ++it) {
      k = std::max<int64_t>(k, std::stoll((*it)[1]));
    }
    if (k < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(k, 2) << testing::file_text(stopped + "/log.txt");
  kill(run.pid(), SIGTERM);
  ASSERT_EQ(run.wait(300), 0) << testing::file_text(stopped + "/log.txt");
  const std::string log = testing::file_text(stopped + "/log.txt");
  const int64_t n = static_cast<int64_t>(metric_lines(stopped).size());
  ASSERT_GT(n, k) << log;
  EXPECT_TRUE(fs::exists(step_dir(stopped, k) + "/manifest.yaml")) << log;
  EXPECT_NE(log.find("stopped by SIGTERM after step " + std::to_string(n) + " of 100000"), std::string::npos) << log;
  ASSERT_TRUE(fs::exists(step_dir(stopped, n) + "/manifest.yaml")) << log;
  EXPECT_NE(log.find("rank 0 sleeps " + std::to_string(kSlowCheckpointMs) + " ms before writing its part of the "
                     "checkpoint of step " + std::to_string(n)),
            std::string::npos) << log;
  // Every checkpoint begun was completed: none is left half-written.
  int64_t complete = 0;
  for (const auto& entry : fs::directory_iterator(stopped + "/ckpt")) {
    if (entry.path().filename().string().rfind("step-", 0) != 0) continue;
    EXPECT_EQ(entry.path().extension(), "") << entry.path();
    complete += fs::exists(entry.path() / "manifest.yaml");
  }
  size_t begun = 0;
  for (size_t at = 0; (at = log.find("ms before writing its part", at)) != std::string::npos; ++at) ++begun;
  EXPECT_EQ(static_cast<size_t>(complete), begun) << log;
  EXPECT_GE(complete, 3) << "step 1's, step K's and the stop step's: " << log;

  auto resumed = run_trainer(run_args(stopped, static_cast<int>(n) + 3, common));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + step_dir(stopped, n) + " at step " + std::to_string(n)),
            std::string::npos) << resumed.output;
  auto whole = run_trainer(run_args(straight, static_cast<int>(n) + 3, common));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const auto la = metric_lines(straight), lb = metric_lines(stopped);
  ASSERT_EQ(la.size(), static_cast<size_t>(n + 3));
  ASSERT_EQ(lb.size(), static_cast<size_t>(n + 3));
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(field(la[i], "loss"), field(lb[i], "loss")) << "step " << i + 1;
  expect_same_checkpoint(step_dir(straight, n + 3), step_dir(stopped, n + 3));
}

// A run that crashed after its last checkpoint reruns the steps since; each
// step is in metrics.jsonl once, with the values of the rerun.
TEST(Training, MetricsAfterACrashAndResumeHoldEachStepOnce) {
  const std::string dir = scratch_dir("training-metrics-rerun");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=3 ";
  // Steps 1-4 run, the checkpoint is of step 3, the process dies as step 5 begins.
  auto crashed = testing::run_command("HDP_FAULT_INJECT=0:5 " + std::string(HDP_TRAINER_BINARY) + " " + run_args(dir, 6, common));
  ASSERT_EQ(crashed.exit_code, kInjectedExitCode) << crashed.output;
  ASSERT_EQ(metric_lines(dir).size(), 4u);
  // A line cut short, as a process killed in the middle of a write leaves it.
  std::ofstream(dir + "/metrics.jsonl", std::ios::app) << "{\"step\": 5, \"loss\": 4.1";
  auto resumed = run_trainer(run_args(dir, 6, common));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 6u);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(field(lines[i], "step"), static_cast<double>(i + 1));
}

// One micro-batch's loss poisoned with NaN at step 3 (HDP_FAULT_INJECT=0:3:nan):
// the step's update is skipped, training goes on, the metrics count it.
TEST(Training, ANanLossSkipsTheStepsUpdateAndTrainingContinues) {
  const std::string dir = scratch_dir("training-nan");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=1 "
                             "--set train.checkpoint_budget=0 --set train.keep_checkpoints=10 ";
  auto r = testing::run_command("HDP_FAULT_INJECT=0:3:nan " + std::string(HDP_TRAINER_BINARY) + " " + run_args(dir, 6, common));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 3: update skipped (loss nan"), std::string::npos) << r.output;
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_NE(lines[2].find("\"loss\": null"), std::string::npos) << lines[2];
  EXPECT_EQ(field(lines[1], "skipped_steps"), 0);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(field(lines[i], "skipped_steps"), 1) << "step " << i + 1;
  for (size_t i = 3; i < 6; ++i) EXPECT_TRUE(std::isfinite(field(lines[i], "loss"))) << "step " << i + 1;
  // Its weights are step 2's, which produced the bad step: never checkpointed as step 3.
  EXPECT_NE(r.output.find("step 3: no checkpoint of a step the numerical guard flagged"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(step_dir(dir, 2) + "/manifest.yaml"));
  EXPECT_FALSE(fs::exists(step_dir(dir, 3)));
  EXPECT_TRUE(fs::exists(step_dir(dir, 4) + "/manifest.yaml"));
  auto exported = run_trainer("export " + step_dir(dir, 6) + " --output " + dir + "/export.h5");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const auto weights = testing::read_weights(dir + "/export.h5");
  ASSERT_FALSE(weights.empty());
  for (const auto& [name, w] : weights) {
    for (float x : w) ASSERT_TRUE(std::isfinite(x)) << name;
  }
}

TEST(Training, TooManyBadStepsInARowStopTheRunNamingTheStep) {
  const std::string dir = scratch_dir("training-nan-stop");
  auto r = testing::run_command("HDP_FAULT_INJECT=0:3:nan " + std::string(HDP_TRAINER_BINARY) + " " +
                                run_args(dir, 6, "--set data.global_batch_tokens=1024 --set train.max_bad_steps=1"));
  EXPECT_EQ(r.exit_code, 3) << "the run diverges: " << r.output;
  EXPECT_NE(r.output.find("the run diverges: step 3: 1 bad step(s) in a row (train.max_bad_steps = 1"),
            std::string::npos) << r.output;
  EXPECT_EQ(metric_lines(dir).size(), 3u);
}

// The manifest's text, and one sampler field of it.
std::string manifest_of(const std::string& ckpt) { return testing::file_text(ckpt + "/manifest.yaml"); }
std::string manifest_field(const std::string& manifest, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(manifest, m, std::regex("\n *" + key + ": ([^\n]*)"))) return "";
  return m[1];
}

// Two bad steps in a row (HDP_FAULT_INJECT=0:3-4:nan poisons steps 3 and 4 once)
// at train.max_bad_steps = 2: the run rolls back to the checkpoint of step 2,
// skips the global batches of the bad steps and trains steps 3-6 on the batches
// after them; the metrics hold each step once and count the rollback, the log
// names the batches' documents, and the checkpoint rolled back to records the
// skipped batches, so that a run resumed from it skips them as well.
TEST(Training, MaxBadStepsInARowRollBackToTheLastGoodCheckpointAndSkipTheirBatches) {
  const std::string dir = scratch_dir("training-rollback"), resumed = scratch_dir("training-rollback-resumed");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=1 "
                             "--set train.checkpoint_budget=0 "
                             "--set train.keep_checkpoints=10 --set train.max_bad_steps=2 ";
  auto r = testing::run_command("HDP_FAULT_INJECT=0:3-4:nan " + std::string(HDP_TRAINER_BINARY) + " " +
                                run_args(dir, 6, common));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 3: update skipped (loss nan, gradient norm nan: not finite); global batch of documents "),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 4: 2 bad step(s) in a row (train.max_bad_steps = 2; the last: loss nan"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rolling back to " + step_dir(dir, 2) + " (step 2) and skipping the global batches of "
                          "step(s) 3, 4 from now on (rollback 1 of this run; 2 skipped batch(es) in all): step 3: "
                          "documents "),
            std::string::npos) << r.output;
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 6u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(field(lines[i], "step"), static_cast<double>(i + 1));
    EXPECT_TRUE(std::isfinite(field(lines[i], "loss"))) << lines[i];
    EXPECT_EQ(field(lines[i], "skipped_steps"), 0) << lines[i];
    EXPECT_EQ(field(lines[i], "rollbacks"), i < 2 ? 0 : 1) << lines[i];
    EXPECT_EQ(field(lines[i], "skipped_batches"), i < 2 ? 0 : 2) << lines[i];
  }
  // The checkpoint rolled back to records both batches (3 numbers each), and
  // every later one carries the record and the spike window (2 + 4 losses).
  const std::string m2 = manifest_of(step_dir(dir, 2)), m6 = manifest_of(step_dir(dir, 6));
  EXPECT_EQ(manifest_field(m2, "rollbacks"), "1") << m2;
  const std::string skipped = manifest_field(m2, "skipped_batches");
  EXPECT_EQ(std::count(skipped.begin(), skipped.end(), ','), 5) << m2;
  EXPECT_EQ(manifest_field(m6, "skipped_batches"), manifest_field(m2, "skipped_batches")) << m6;
  const std::string window = manifest_field(m6, "loss_window");
  EXPECT_EQ(std::count(window.begin(), window.end(), ','), 5) << m6;

  // A run resumed from the checkpoint of step 2 alone (no fault now) skips the
  // same batches: the same losses and the same final state, bit for bit.
  fs::create_directories(resumed + "/ckpt");
  fs::copy(step_dir(dir, 2), step_dir(resumed, 2), fs::copy_options::recursive);
  auto again = run_trainer(run_args(resumed, 6, common));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const auto relines = metric_lines(resumed);
  ASSERT_EQ(relines.size(), 4u) << again.output;
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(field(relines[i], "loss"), field(lines[i + 2], "loss")) << "step " << i + 3;
  expect_same_checkpoint(step_dir(dir, 6), step_dir(resumed, 6));
}

// AdamW's bias correction counts updates, not steps. X skips step 3's update
// (NaN) and trains step 4 on the fourth batch; Y resumes from X's step-2
// checkpoint with the third batch recorded as skipped, so its step 3 trains the
// same fourth batch from the same state. With a constant learning rate (min_lr =
// lr after the warm-up) both must reach bit-identical weights: the counter must
// be 3 in both (it would be 4 in X if skipped steps advanced it).
TEST(Training, ASkippedStepDoesNotAdvanceTheAdamWStepCounter) {
  const std::string x = scratch_dir("training-adam-skip"), y = scratch_dir("training-adam-skipped-batch");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=1 "
                             "--set train.checkpoint_budget=0 "
                             "--set train.keep_checkpoints=10 --set optim.warmup_steps=1 --set optim.lr=2e-3 "
                             "--set optim.min_lr=2e-3 ";
  auto rx = testing::run_command("HDP_FAULT_INJECT=0:3:nan " + std::string(HDP_TRAINER_BINARY) + " " + run_args(x, 4, common));
  ASSERT_EQ(rx.exit_code, 0) << rx.output;
  ASSERT_NE(rx.output.find("step 3: update skipped"), std::string::npos) << rx.output;
  // Y: X's step-2 checkpoint, with the batch that starts where it stopped marked as skipped.
  fs::create_directories(y + "/ckpt");
  fs::copy(step_dir(x, 2), step_dir(y, 2), fs::copy_options::recursive);
  std::string manifest = manifest_of(step_dir(y, 2));
  const std::string start = manifest_field(manifest, "epoch") + ", " + manifest_field(manifest, "cursor") + ", " +
                            manifest_field(manifest, "document_offset");
  const size_t at = manifest.find("skipped_batches: []");
  ASSERT_NE(at, std::string::npos) << manifest;
  manifest.replace(at, std::string("skipped_batches: []").size(), "skipped_batches: [" + start + "]");
  std::ofstream(step_dir(y, 2) + "/manifest.yaml") << manifest;
  auto ry = run_trainer(run_args(y, 3, common));
  ASSERT_EQ(ry.exit_code, 0) << ry.output;
  expect_same_checkpoint(step_dir(x, 4), step_dir(y, 3), /*same_progress=*/false);
}

// Asynchronous checkpoints (checkpoint/writer.h), every step: they hold
// exactly what synchronous ones hold (the snapshot is the state at the step
// boundary, not a later one); a process killed while writing one
// (HDP_FAULT_INJECT=0:3:ckpt exits once its part of step 3's checkpoint is
// written, before the commit) leaves it unfinished under step-00000003.tmp, never
// under its final name; the resumed run takes step 2's and ends bit-identical to
// a run that never stopped.
TEST(Training, AsyncCheckpointsEqualSyncOnesAndAKillDuringAWriteLeavesNoHalfCheckpoint) {
  const std::string straight = scratch_dir("training-async-straight"), sync = scratch_dir("training-async-sync"),
                    killed = scratch_dir("training-async-killed");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=1 "
                             "--set train.checkpoint_budget=0 "
                             "--set train.keep_checkpoints=10 ";
  auto a = run_trainer(run_args(straight, 6, common));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("(in the background)"), std::string::npos) << a.output;
  auto s = run_trainer(run_args(sync, 6, common + "--set train.async_checkpoints=false"));
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.output.find("in the background"), std::string::npos) << s.output;
  for (int step : {1, 3, 6}) expect_same_checkpoint(step_dir(straight, step), step_dir(sync, step));

  auto k = testing::run_command("HDP_FAULT_INJECT=0:3:ckpt " + std::string(HDP_TRAINER_BINARY) + " " +
                                run_args(killed, 6, common));
  ASSERT_EQ(k.exit_code, kInjectedExitCode) << k.output;
  EXPECT_NE(k.output.find("exits abruptly while writing the checkpoint of step 3"), std::string::npos) << k.output;
  EXPECT_FALSE(fs::exists(step_dir(killed, 3))) << "a half-written checkpoint under its final name";
  EXPECT_TRUE(fs::exists(step_dir(killed, 3) + ".tmp/rank-00000.h5"));
  EXPECT_FALSE(fs::exists(step_dir(killed, 3) + ".tmp/manifest.yaml"));
  auto resumed = run_trainer(run_args(killed, 6, common));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + step_dir(killed, 2) + " at step 2"), std::string::npos)
      << resumed.output;
  const auto la = metric_lines(straight), lb = metric_lines(killed);
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(field(lb[i], "loss"), field(la[i], "loss")) << "step " << i + 1;
  expect_same_checkpoint(step_dir(straight, 6), step_dir(killed, 6));
  EXPECT_FALSE(fs::exists(step_dir(killed, 3) + ".tmp")) << "the unfinished directory is cleaned up";
}

// A background write that fails (here: a file stands where the checkpoint's
// temporary directory must go) ends the run at the next step with exit code 2
// and the path; it is never lost.
TEST(Training, AFailedBackgroundCheckpointWriteEndsTheRunWithCode2NamingThePath) {
  const std::string dir = scratch_dir("training-async-fails");
  const std::string log = dir + "/log.txt";
  testing::BackgroundRun run(std::string(HDP_TRAINER_BINARY) + " " +
                                 run_args(dir, 100000, "--set data.global_batch_tokens=1024 --set train.checkpoint_every=1 "
                                                       "--set train.checkpoint_budget=0"),
                             log);
  ASSERT_TRUE(testing::wait_for_steps(run, dir, 1, 300)) << testing::file_text(log);
  for (int step = 1; step <= 400; ++step) std::ofstream(step_dir(dir, step) + ".tmp") << "in the way\n";
  const size_t blocked_from = metric_lines(dir).size() + 1;  // a step whose checkpoint cannot be written
  ASSERT_EQ(run.wait(300), 2) << testing::file_text(log);
  const std::string output = testing::file_text(log);
  EXPECT_NE(output.find(".tmp: cannot create"), std::string::npos) << output;
  EXPECT_NE(output.find(dir + "/ckpt/step-"), std::string::npos) << output;
  // Reported within two steps of the failing one (the write runs beside the next step).
  EXPECT_LE(metric_lines(dir).size(), blocked_from + 2) << output;
}

// Every line of metrics.jsonl is whole (ends its JSON object).
void expect_whole_lines(const std::string& run_dir) {
  const std::string text = testing::file_text(run_dir + "/metrics.jsonl");
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "a line cut short: " << text;
  for (const std::string& line : metric_lines(run_dir)) EXPECT_EQ(line.back(), '}') << line;
}

// A disk that fills up while a checkpoint part is written (HDP_FAULT_INJECT
// RANK:STEP:full-checkpoint puts the part on /dev/full, whose writes fail with
// ENOSPC) ends the run with exit code 2 naming the part, written in the background
// or not; nothing is lost: the checkpoint before it is whole, no half checkpoint
// stands under a final name, and the run resumes from there.
TEST(Training, AFullDiskDuringACheckpointEndsTheRunWithCode2AndLosesNothing) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const std::string dir = scratch_dir(std::string("training-full-disk-checkpoint-") + (async ? "async" : "sync"));
    const std::string common = testing::small_model_overrides() + " --set train.checkpoint_every=1 "
                                                                  "--set train.checkpoint_budget=0 "
                               "--set train.keep_checkpoints=10 --set train.async_checkpoints=" +
                               (async ? "true" : "false");
    auto full = testing::run_command("HDP_FAULT_INJECT=0:2:full-checkpoint " + std::string(HDP_TRAINER_BINARY) + " " +
                                     run_args(dir, 4, common));
    ASSERT_EQ(full.exit_code, 2) << full.output;
    EXPECT_NE(full.output.find(step_dir(dir, 2) + ".tmp/rank-00000.h5: writing the checkpoint part failed"),
              std::string::npos) << full.output;
    EXPECT_NE(full.output.find("No space left on device"), std::string::npos) << full.output;
    EXPECT_TRUE(fs::exists(step_dir(dir, 1) + "/manifest.yaml"));
    EXPECT_FALSE(fs::exists(step_dir(dir, 2))) << "a half-written checkpoint under its final name";
    EXPECT_FALSE(fs::exists(step_dir(dir, 2) + ".tmp/rank-00000.h5.tmp")) << "the part's temporary file is removed";
    expect_whole_lines(dir);
    auto resumed = run_trainer(run_args(dir, 4, common));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from " + step_dir(dir, 1) + " at step 1"), std::string::npos)
        << resumed.output;
    const auto lines = metric_lines(dir);
    ASSERT_EQ(lines.size(), 4u);
    for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(field(lines[i], "step"), static_cast<double>(i + 1));
  }
}

// train.checkpoint_budget: 0 keeps the exact interval: with step 2's write made
// slow (HDP_FAULT_INJECT=0:2:slow-checkpoint), step 3's checkpoint waits for it
// instead of being deferred, and every step is saved. ParallelCheckpoints
// (training_parallel_test.cpp) tests the budget.
TEST(Training, ACheckpointBudgetOfZeroSavesEveryDueStepWaitingForTheWriteInFlight) {
  const std::string dir = scratch_dir("training-checkpoint-budget-zero");
  const std::string common = testing::small_model_overrides() + " --set train.checkpoint_every=1 "
                             "--set train.keep_checkpoints=10 --set train.checkpoint_budget=0";
  auto r = testing::run_command("HDP_FAULT_INJECT=0:2:slow-checkpoint " + std::string(HDP_TRAINER_BINARY) + " " +
                                run_args(dir, 4, common));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("checkpoint deferred"), std::string::npos) << r.output;
  for (int step = 1; step <= 4; ++step) EXPECT_TRUE(fs::exists(step_dir(dir, step) + "/manifest.yaml")) << step;
  EXPECT_EQ(testing::metric_values(dir, "checkpoints_deferred"), (std::vector<double>{0, 0, 0, 0}));
  const std::vector<double> time = testing::metric_values(dir, "time");
  ASSERT_EQ(time.size(), 4u);
  // Step 2's write starts after step 2's metrics and takes kSlowCheckpointMs; step 3's
  // checkpoint, before step 4's metrics, waited for it.
  EXPECT_GE((time[3] - time[1]) * 1e3, kSlowCheckpointMs) << r.output;
}

// The training thread does not wait for a checkpoint write in flight: the writer
// holds its part of step 3's checkpoint until the training thread has finished step
// 6 (HDP_FAULT_INJECT=0:3-6:held-checkpoint), and says how many steps finished
// meanwhile: all three, 4 to 6. A training thread that waited for the write would
// finish none of them before the writer gave up (after kHeldCheckpointLimitS); the
// count, not a time, is what shows it. Step 6's checkpoint (train.checkpoint_budget
// 0) waits for step 3's write, and both are whole.
TEST(Training, StepsGoOnWhileACheckpointIsWrittenInTheBackground) {
  const std::string dir = scratch_dir("training-steps-during-a-write");
  const std::string common = testing::small_model_overrides() + " --set train.checkpoint_every=3 "
                             "--set train.keep_checkpoints=10 --set train.checkpoint_budget=0";
  auto r = testing::run_command("HDP_FAULT_INJECT=0:3-6:held-checkpoint " + std::string(HDP_TRAINER_BINARY) + " " +
                                run_args(dir, 7, common));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 0 held its part of the checkpoint of step 3 while the training thread finished 3 "
                          "steps (up to step 6)"),
            std::string::npos) << r.output;
  for (int step : {3, 6, 7}) EXPECT_TRUE(fs::exists(step_dir(dir, step) + "/manifest.yaml")) << step << r.output;
  EXPECT_EQ(metric_lines(dir).size(), 7u);
}

// A full disk under run_dir (HDP_FAULT_INJECT RANK:STEP:full-metrics) is an error,
// never a run that reports success with its record cut: exit code 2 naming
// metrics.jsonl and the step, every line in the file whole, and a resume continues it.
TEST(Training, AFullDiskForTheMetricsEndsTheRunWithCode2AndNeverTearsALine) {
  const std::string dir = scratch_dir("training-full-disk-metrics");
  const std::string common = testing::small_model_overrides() + " --set train.checkpoint_every=2";
  auto full = testing::run_command("HDP_FAULT_INJECT=0:3:full-metrics " + std::string(HDP_TRAINER_BINARY) + " " +
                                   run_args(dir, 5, common));
  ASSERT_EQ(full.exit_code, 2) << full.output;
  EXPECT_NE(full.output.find(dir + "/metrics.jsonl: cannot write the metrics of step 3 (No space left on device)"),
            std::string::npos) << full.output;
  EXPECT_EQ(metric_lines(dir).size(), 2u);
  expect_whole_lines(dir);
  auto resumed = run_trainer(run_args(dir, 5, common));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 5u);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(field(lines[i], "step"), static_cast<double>(i + 1));
}

// A file size limit (ulimit -f) is the other way a write runs out of room: the
// trainer ignores SIGXFSZ, so the write fails with EFBIG and is reported like a
// full disk. 8 MiB lets MPI start (its shared memory files are a few MiB) and cuts
// the tiny model's checkpoint part (about 9.6 MB) half way: HDF5 fails in the
// middle of a file, whose clean-up at exit used to crash the process (exit 139).
TEST(Training, AFileSizeLimitHalfWayThroughACheckpointPartIsReportedLikeAFullDisk) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const std::string dir = scratch_dir(std::string("training-file-size-limit-") + (async ? "async" : "sync"));
    auto r = testing::run_command("bash -c 'ulimit -f 8192 && exec " + std::string(HDP_TRAINER_BINARY) + " " +
                                  run_args(dir, 3, std::string("--set data.global_batch_tokens=1024 --set "
                                                               "train.checkpoint_every=1 "
                                                               "--set train.checkpoint_budget=0 --set train.async_checkpoints=") +
                                                       (async ? "true" : "false")) +
                                  "'");
    ASSERT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(step_dir(dir, 1) + ".tmp/rank-00000.h5: writing the checkpoint part failed: "),
              std::string::npos) << r.output;
    EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(step_dir(dir, 1)));
    EXPECT_FALSE(fs::exists(step_dir(dir, 1) + ".tmp/rank-00000.h5.tmp"));
    expect_whole_lines(dir);
  }
}

// A step-N directory without a manifest was not committed by the trainer (it
// renames a checkpoint to its final name only with the manifest in): the run warns
// naming it, never resumes from it, never deletes it, and moves it aside to
// step-N.incomplete rather than overwrite it with the checkpoint of step N.
TEST(Training, AStepDirectoryWithoutAManifestIsWarnedAboutAndNeverOverwritten) {
  const std::string dir = scratch_dir("training-manifestless");
  const std::string common = testing::small_model_overrides() + " --set train.checkpoint_every=1 "
                                                                "--set train.checkpoint_budget=0 "
                             "--set train.keep_checkpoints=1";
  for (int step : {2, 9}) {
    fs::create_directories(step_dir(dir, step));
    std::ofstream(step_dir(dir, step) + "/notes.txt") << "mine " << step << "\n";
  }
  auto first = run_trainer(run_args(dir, 3, common));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (int step : {2, 9}) {
    EXPECT_NE(first.output.find(step_dir(dir, step) + " has no manifest.yaml, so it is not a complete checkpoint: not "
                                "resumed from and not deleted"),
              std::string::npos) << first.output;
  }
  EXPECT_NE(first.output.find(step_dir(dir, 2) + " had no manifest.yaml (not a complete checkpoint): moved to " +
                              step_dir(dir, 2) + ".incomplete to write the checkpoint of step 2"),
            std::string::npos) << first.output;
  EXPECT_EQ(testing::file_text(step_dir(dir, 2) + ".incomplete/notes.txt"), "mine 2\n");
  EXPECT_TRUE(fs::exists(step_dir(dir, 3) + "/manifest.yaml"));
  EXPECT_FALSE(fs::exists(step_dir(dir, 2))) << "the checkpoint of step 2 is pruned (keep_checkpoints 1)";

  auto second = run_trainer(run_args(dir, 4, common));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from " + step_dir(dir, 3) + " at step 3"), std::string::npos) << second.output;
  EXPECT_EQ(testing::file_text(step_dir(dir, 9) + "/notes.txt"), "mine 9\n");
  EXPECT_EQ(testing::file_text(step_dir(dir, 2) + ".incomplete/notes.txt"), "mine 2\n");
}

// A checkpoint directory is one job's while it runs (checkpoint/lock.h):
// a second job is refused with exit 2 naming the holder's host and pid; the lock
// goes when the first job ends; a lock left by a dead process of this host is
// taken over.
TEST(Training, ASecondJobIsKeptOutOfACheckpointDirectoryInUse) {
  const std::string dir = scratch_dir("training-lock"), other = scratch_dir("training-lock-other");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=1 "
                             "--set train.checkpoint_budget=0 ";
  const std::string log = dir + "/log.txt";
  testing::BackgroundRun first(std::string(HDP_TRAINER_BINARY) + " " + run_args(dir, 100000, common), log);
  ASSERT_TRUE(testing::wait_for_steps(first, dir, 1, 300)) << testing::file_text(log);
  char host[256] = "";
  gethostname(host, sizeof(host));
  // The second job: its own run_dir, the first one's checkpoint_dir.
  auto second = run_trainer(run_args(other, 3, common + "--set train.checkpoint_dir=" + dir + "/ckpt"));
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("train.checkpoint_dir '" + dir + "/ckpt' is in use by another job: host " +
                               std::string(host) + ", pid " + std::to_string(first.pid())),
            std::string::npos) << second.output;
  kill(first.pid(), SIGTERM);
  ASSERT_EQ(first.wait(300), 0) << testing::file_text(log);
  EXPECT_FALSE(fs::exists(dir + "/ckpt/trainer.lock")) << "the lock goes with the job";

  // A lock whose process is gone (this host): taken over.
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  std::ofstream(dir + "/ckpt/trainer.lock") << "host " << host << "\npid " << gone << "\n";
  const int steps = static_cast<int>(metric_lines(dir).size()) + 1;
  auto third = run_trainer(run_args(dir, steps, common));
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_NE(third.output.find("taking over the lock of host " + std::string(host) + " pid " + std::to_string(gone) +
                              " (that process is gone)"),
            std::string::npos) << third.output;
  EXPECT_FALSE(fs::exists(dir + "/ckpt/trainer.lock"));
}

// A run whose checkpoint_dir holds another run's checkpoints (another train.seed
// here) is refused with exit 2 naming the difference, unless asked.
TEST(Training, ACheckpointDirectoryOfAnotherRunIsRefusedUnlessAsked) {
  const std::string dir = scratch_dir("training-other-run");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=2 ";
  auto first = run_trainer(run_args(dir, 2, common + "--set train.seed=1"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto other = run_trainer(run_args(dir, 4, common + "--set train.seed=2"));
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("train.checkpoint_dir '" + dir + "/ckpt' holds the checkpoints of another run: the "
                              "newest, " + step_dir(dir, 2) + ", was written with another config (train.seed 1 "
                              "there, 2 here)"),
            std::string::npos) << other.output;
  auto never = run_trainer(run_args(dir, 4, common + "--set train.seed=2 --set train.resume=never"));
  EXPECT_EQ(never.exit_code, 2) << "starting afresh beside them would mix the runs: " << never.output;
  auto same = run_trainer(run_args(dir, 4, common + "--set train.seed=1"));
  EXPECT_EQ(same.exit_code, 0) << "the same run resumes: " << same.output;
  auto asked = run_trainer(run_args(dir, 6, common + "--set train.seed=2 --set train.reuse_checkpoint_dir=true"));
  ASSERT_EQ(asked.exit_code, 0) << asked.output;
  EXPECT_NE(asked.output.find("resumed from " + step_dir(dir, 4)), std::string::npos) << asked.output;
}

TEST(Training, CorruptedAndTruncatedCheckpointsAreRefused) {
  const std::string dir = scratch_dir("training-corrupt");
  auto r = run_trainer(run_args(dir, 2, "--set data.global_batch_tokens=1024 --set train.checkpoint_every=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = dir + "/ckpt/step-00000002/rank-00000.h5";
  ASSERT_TRUE(fs::exists(ckpt));
  const auto size = fs::file_size(ckpt);

  // Flip bytes in the middle of the tensor data: the checksum catches it.
  {
    std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    const char garbage[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    f.write(garbage, sizeof(garbage));
  }
  auto corrupted = run_trainer(run_args(dir, 4));
  EXPECT_EQ(corrupted.exit_code, 2) << corrupted.output;
  EXPECT_NE(corrupted.output.find(ckpt), std::string::npos) << corrupted.output;
  EXPECT_NE(corrupted.output.find("checksum"), std::string::npos) << corrupted.output;

  fs::resize_file(ckpt, size / 3);
  auto truncated = run_trainer(run_args(dir, 4));
  EXPECT_EQ(truncated.exit_code, 2) << truncated.output;
  EXPECT_NE(truncated.output.find(ckpt), std::string::npos) << truncated.output;
}

// A global batch below one micro-batch is allowed (micro_batch_tokens is a rank's
// capacity, not its share) but never silent: the run warns naming both keys.
TEST(Training, AGlobalBatchBelowTheMicroBatchIsWarnedAbout) {
  const std::string dir = scratch_dir("training-small-global-batch");
  auto r = run_trainer(run_args(dir, 1, "--set data.global_batch_tokens=1024 --set data.micro_batch_tokens=2048 "
                                        "--set train.checkpoint_every=0"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data.global_batch_tokens 1024 is below data.micro_batch_tokens 2048: a step holds at most "
                          "1024 tokens, so every micro-batch is at most 50% full"),
            std::string::npos) << r.output;
}

TEST(Training, InitFromTakesWeightsButNotProgress) {
  const std::string src = scratch_dir("training-init-src"), dst = scratch_dir("training-init-dst");
  auto a = run_trainer(run_args(src, 3, "--set data.global_batch_tokens=1024 --set train.checkpoint_every=3"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b = run_trainer(run_args(dst, 2, "--set data.global_batch_tokens=1024 --set train.checkpoint_every=0 "
                                        "--set train.init_from=" + src + "/ckpt/step-00000003"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto lines = metric_lines(dst);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(field(lines.front(), "step"), 1);
  // Trained weights start lower than a fresh model's ln(258).
  EXPECT_LT(field(lines.front(), "loss"), std::log(258.0) - 0.2);
}

// A learning rate that blows the run up (30 on tiny-llama: the loss goes from 5.55
// at step 1 to about 40 at step 2) is caught by the default guard from the second
// step on, against the first: the updates of steps 2-4 are skipped and, with no
// checkpoint before them, the run stops with exit code 3, the run diverges.
TEST(Training, ADivergingRunIsCaughtByDefaultAndEndsWithExitCode3) {
  const std::string dir = scratch_dir("training-diverges");
  auto r = run_trainer(run_args(dir, 10, "--set data.global_batch_tokens=1024 --set optim.lr=30 "
                                         "--set train.checkpoint_every=0"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("step 2: update skipped (loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" is above train.spike_factor 3 x the median "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the run diverges: step 4: 3 bad step(s) in a row (train.max_bad_steps = 3"),
            std::string::npos) << r.output;
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_GT(field(lines[1], "loss"), 3 * field(lines[0], "loss"));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(field(lines[i], "skipped_steps"), static_cast<double>(i)) << lines[i];
}

// With a checkpoint every step the diverging run checkpoints step 1, whose update
// already blew the weights up (no guard can tell before step 2 shows it), but none
// of the steps it flags. Step 1's checkpoint is unconfirmed (the guard had judged
// no step when it was saved, and passes none after it), so there is nothing to roll
// back to: the run stops at once with exit code 3, which `trainer supervise` does
// not retry (the same run would diverge the same way).
TEST(Training, ADivergingRunCheckpointsNoFlaggedStepAndSuperviseDoesNotRestartIt) {
  const std::string dir = scratch_dir("training-diverges-supervised");
  auto r = run_trainer("supervise --max-restarts 3 --backoff-s 0 --run-dir " + dir + " -- " + HDP_TRAINER_BINARY +
                       " " + run_args(dir, 30, "--set data.global_batch_tokens=1024 --set optim.lr=30 "
                                               "--set train.checkpoint_every=1 "
                                               "--set train.checkpoint_budget=0 --set train.keep_checkpoints=30"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("the run diverges: step 4: 3 bad step(s) in a row"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopping: no confirmed checkpoint before step 2 in " + dir + "/ckpt to roll back to "
                          "(passed by: " + step_dir(dir, 1) + " (unconfirmed: the numerical guard had passed no step "
                          "after the run's first when it was saved, nor since))"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rolling back to"), std::string::npos) << r.output;
  EXPECT_EQ(metric_lines(dir).size(), 4u);
  EXPECT_NE(r.output.find("supervise: the command ended with exit code 3 (diverged); not restarting"),
            std::string::npos) << r.output;
  EXPECT_EQ(testing::run_command("grep -c '\"event\"' " + dir + "/ettr.jsonl").output, "1\n");
  EXPECT_NE(testing::file_text(dir + "/ettr.jsonl").find("\"outcome\":\"diverged\""), std::string::npos);
  EXPECT_EQ(manifest_field(manifest_of(step_dir(dir, 1)), "guard_confirmed"), "false");
  for (int step = 2; step <= 30; ++step) EXPECT_FALSE(fs::exists(step_dir(dir, step))) << "step " << step;
}

// Learning rate 3 on tiny-llama: steps 1-3 pass the guard (losses 5.56, 5.04,
// 10.9), but the update of step 3 blew the weights up (step 4: about 54). The
// checkpoint of step 3 was saved once the guard was warm, so the first rollback
// returns to it; the bad steps come back at once, so it is marked suspect and the
// next rollback goes past it to step 2, then (the replayed update of step 3 blows
// up alike) to step 1. With no checkpoint left the run stops with exit code 3,
// every checkpoint marked suspect, and `resume: auto` passes them by.
TEST(Training, ACheckpointFoundBadLaterIsMarkedSuspectAndTheRollbackGoesPastIt) {
  const std::string dir = scratch_dir("training-suspect");
  const std::string common = "--set data.global_batch_tokens=1024 --set optim.lr=3 --set train.checkpoint_every=1 "
                             "--set train.checkpoint_budget=0 "
                             "--set train.max_bad_steps=2 ";
  auto r = run_trainer(run_args(dir, 30, common));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  const auto rolled_back_to = [&](int step) {
    return r.output.find("rolling back to " + step_dir(dir, step) + " (step " + std::to_string(step) + ")");
  };
  const auto suspect = [&](int step) {
    return r.output.find(step_dir(dir, step) + " is suspect: a rollback to it (bad steps 4-5) ran into bad steps again "
                         "from step 4, before passing step 5");
  };
  ASSERT_NE(rolled_back_to(3), std::string::npos) << r.output;
  ASSERT_NE(suspect(3), std::string::npos) << r.output;
  ASSERT_NE(rolled_back_to(2), std::string::npos) << r.output;
  ASSERT_NE(suspect(2), std::string::npos) << r.output;
  ASSERT_NE(rolled_back_to(1), std::string::npos) << r.output;
  ASSERT_NE(suspect(1), std::string::npos) << r.output;
  EXPECT_LT(rolled_back_to(3), suspect(3));
  EXPECT_LT(suspect(3), rolled_back_to(2));
  EXPECT_LT(rolled_back_to(2), suspect(2));
  EXPECT_LT(suspect(2), rolled_back_to(1));
  EXPECT_LT(rolled_back_to(1), suspect(1));
  EXPECT_NE(r.output.find("stopping: no confirmed checkpoint before step 1 in " + dir + "/ckpt to roll back to. "),
            std::string::npos) << r.output;
  EXPECT_EQ(manifest_field(manifest_of(step_dir(dir, 1)), "suspect"),
            "a rollback to it (bad steps 4-5) ran into bad steps again from step 4, before passing step 5");
  for (int step : {2, 3}) {
    EXPECT_EQ(manifest_field(manifest_of(step_dir(dir, step)), "suspect"),
              "trained from the checkpoint of step 1, which is suspect") << step;
  }

  auto again = run_trainer(run_args(dir, 1, common));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("resume: auto passes by 3 suspect checkpoint(s): " + step_dir(dir, 3) + " (suspect: "),
            std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("resumed from"), std::string::npos) << again.output;
}

// A run directory is one job's while it runs (checkpoint/lock.h, RUN_DIR/run.lock):
// a second job there, even with a checkpoint directory of its own, is refused with
// exit 2 naming the holder; the first job's metrics go on whole.
TEST(Training, ASecondJobIsKeptOutOfARunDirectoryInUse) {
  const std::string dir = scratch_dir("training-run-lock"), other = scratch_dir("training-run-lock-other");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=0 ";
  const std::string log = other + "/log.txt";
  testing::BackgroundRun first(std::string(HDP_TRAINER_BINARY) + " " + run_args(dir, 100000, common), log);
  ASSERT_TRUE(testing::wait_for_steps(first, dir, 1, 300)) << testing::file_text(log);
  char host[256] = "";
  gethostname(host, sizeof(host));
  auto second = run_trainer(run_args(dir, 3, common + "--set train.checkpoint_dir=" + other + "/ckpt"));
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("train.run_dir '" + dir + "' is in use by another job: host " + std::string(host) +
                               ", pid " + std::to_string(first.pid()) + " (lock file " + dir + "/run.lock"),
            std::string::npos) << second.output;
  const size_t before = metric_lines(dir).size();
  ASSERT_TRUE(testing::wait_for_steps(first, dir, before + 1, 300)) << testing::file_text(log);
  kill(first.pid(), SIGTERM);
  ASSERT_EQ(first.wait(300), 0) << testing::file_text(log);
  const auto lines = metric_lines(dir);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(field(lines[i], "step"), static_cast<double>(i + 1));
  EXPECT_FALSE(fs::exists(dir + "/run.lock")) << "the lock goes with the job";
}

// A job that resumes from a checkpoint directory holds its lock while it runs,
// checkpoints off or not: a job that would write there meanwhile is refused.
TEST(Training, AJobResumingFromACheckpointDirectoryHoldsItsLock) {
  const std::string dir = scratch_dir("training-resume-lock"), other = scratch_dir("training-resume-lock-other");
  const std::string common = "--set data.global_batch_tokens=1024 ";
  auto finished = run_trainer(run_args(dir, 2, common + "--set train.checkpoint_every=2"));
  ASSERT_EQ(finished.exit_code, 0) << finished.output;
  const std::string log = other + "/log.txt";
  testing::BackgroundRun reader(std::string(HDP_TRAINER_BINARY) + " " +
                                    run_args(dir, 100000, common + "--set train.checkpoint_every=0"),
                                log);
  ASSERT_TRUE(testing::wait_for_steps(reader, dir, 3, 300)) << testing::file_text(log);
  EXPECT_NE(testing::file_text(log).find("resumed from " + step_dir(dir, 2)), std::string::npos);
  auto writer = run_trainer(run_args(other, 4, common + "--set train.checkpoint_every=1 --set train.checkpoint_dir=" +
                                                   dir + "/ckpt"));
  EXPECT_EQ(writer.exit_code, 2) << writer.output;
  EXPECT_NE(writer.output.find("train.checkpoint_dir '" + dir + "/ckpt' is in use by another job"), std::string::npos)
      << writer.output;
  kill(reader.pid(), SIGTERM);
  EXPECT_EQ(reader.wait(300), 0) << testing::file_text(log);
  EXPECT_FALSE(fs::exists(step_dir(dir, 3))) << "nothing was written there";
}

// train.resume: never over a finished run of the same config would replace its
// checkpoints and metrics: refused with exit 2 naming the directories, both left
// as they were, unless train.start_over says to delete them and start from step 0.
TEST(Training, ResumeNeverOverAFinishedRunIsRefusedUnlessToldToStartOver) {
  const std::string dir = scratch_dir("training-start-over");
  const std::string common = "--set data.global_batch_tokens=1024 --set train.checkpoint_every=2 ";
  auto finished = run_trainer(run_args(dir, 2, common));
  ASSERT_EQ(finished.exit_code, 0) << finished.output;
  const std::string metrics = testing::file_text(dir + "/metrics.jsonl");
  const std::string manifest = manifest_of(step_dir(dir, 2));
  auto never = run_trainer(run_args(dir, 3, common + "--set train.resume=never"));
  EXPECT_EQ(never.exit_code, 2) << never.output;
  EXPECT_NE(never.output.find("train.resume: 'never' starts at step 0, but train.checkpoint_dir '" + dir +
                              "/ckpt' holds the checkpoints of a previous run of this config (the newest " +
                              step_dir(dir, 2) + "), which this run's checkpoints and its metrics in train.run_dir '" +
                              dir + "' would replace; set train.start_over: true"),
            std::string::npos) << never.output;
  EXPECT_EQ(testing::file_text(dir + "/metrics.jsonl"), metrics);
  EXPECT_EQ(manifest_of(step_dir(dir, 2)), manifest);
  auto over = run_trainer(run_args(dir, 3, common + "--set train.resume=never --set train.start_over=true"));
  ASSERT_EQ(over.exit_code, 0) << over.output;
  EXPECT_NE(over.output.find("train.start_over: deleted 1 checkpoint(s) of a previous run in " + dir + "/ckpt"),
            std::string::npos) << over.output;
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(field(lines[i], "step"), static_cast<double>(i + 1));
  EXPECT_TRUE(fs::exists(step_dir(dir, 3) + "/manifest.yaml"));
}

// train.threads above 4 per core this rank may run on only contend (and tens of
// thousands crash libgomp): refused with exit 2 naming the key and the cores.
TEST(Training, MoreThreadsThanFourPerCoreAreRefused) {
  const std::string dir = scratch_dir("training-threads");
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int cores = CPU_COUNT(&set);
  if (4 * cores + 1 > 1024) GTEST_SKIP() << cores << " cores: the 1024 limit comes first";
  auto r = run_trainer(run_args(dir, 1, "--set train.threads=" + std::to_string(4 * cores + 1)));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train.threads: " + std::to_string(4 * cores + 1) + " threads on rank 0, which may run on " +
                          std::to_string(cores) + " core(s): more than 4 per core only contend; choose at most " +
                          std::to_string(4 * cores)),
            std::string::npos) << r.output;
}

struct BadInvocation {
  std::string name, args, expect;
};

// gtest prints the parameter into the test names ctest lists; without this it
// prints the struct's raw bytes, which change between runs.
void PrintTo(const BadInvocation& b, std::ostream* os) { *os << b.name; }

class CommandLine : public ::testing::TestWithParam<BadInvocation> {};

TEST_P(CommandLine, BadInputExitsWithCode2AndNamesTheProblem) {
  const std::string dir = scratch_dir("training-cli-" + GetParam().name);
  {
    std::ofstream(dir + "/unknown-key.yaml") << "model:\n  hidden_size: 64\n  hiden: 3\ndata:\n  path: " << corpus() << "\n";
    std::ofstream(dir + "/bad-heads.yaml") << "model:\n  num_heads: 6\ndata:\n  path: " << corpus() << "\n";
    std::ofstream(dir + "/small-vocab.yaml") << "model:\n  vocab_size: 100\ndata:\n  path: " << corpus() << "\n";
    std::ofstream(dir + "/notes.jsonl") << "{\"text\": \"fine\"}\n{\"text\": broken}\n";
    std::ofstream(dir + "/notes.txt") << "a document\n";
    std::ofstream(dir + "/a-file") << "not a directory\n";
    std::ofstream(dir + "/in.bin") << "a document whose name a Megatron dataset would take\n";
    // The same file under other names: a hard link and a symbolic link.
    fs::create_hard_link(dir + "/notes.txt", dir + "/notes-hard.txt");
    fs::create_symlink("notes.txt", dir + "/notes-sym.txt");
    // A valid dataset without documents (prepare-data refuses to write one).
    TokenDatasetWriter empty = TokenDatasetWriter::create(dir + "/empty.h5", 258, "byte", 256, 257);
    empty.finish();
  }
  std::string args = GetParam().args;
  args = std::regex_replace(args, std::regex("DIR"), dir);
  args = std::regex_replace(args, std::regex("CORPUS"), corpus());
  auto r = run_trainer(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(std::regex_replace(GetParam().expect, std::regex("DIR"), dir)), std::string::npos)
      << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CommandLine,
    ::testing::Values(
        BadInvocation{"NoCommand", "", "usage"},
        BadInvocation{"UnknownCommand", "fly", "unknown command 'fly'"},
        BadInvocation{"TrainWithoutConfig", "train", "exactly one CONFIG.yaml"},
        BadInvocation{"UnknownKey", "train DIR/unknown-key.yaml", "DIR/unknown-key.yaml:3: model.hiden"},
        BadInvocation{"HeadsNotDividingHidden", "train DIR/bad-heads.yaml", "model.num_heads"},
        BadInvocation{"MissingDataFile", "train " + kTinyConfig + " --set data.path=DIR/none.h5", "DIR/none.h5"},
        BadInvocation{"DatasetIdsExceedVocab", "train DIR/small-vocab.yaml", "model.vocab_size"},
        BadInvocation{"BadOverride", "train " + kTinyConfig + " --set model.hidden_size", "model.hidden_size"},
        BadInvocation{"WorldSizeMismatch", "train " + kTinyConfig + " --set data.path=CORPUS --set parallel.hdp=2",
                      "= 2 ranks, but the job has 1"},
        BadInvocation{"BadJsonl", "prepare-data --input DIR/notes.jsonl --output DIR/out.h5", "DIR/notes.jsonl:2"},
        BadInvocation{"MissingInput", "prepare-data --input DIR/absent.txt --output DIR/out.h5", "DIR/absent.txt"},
        BadInvocation{"CorpusWithoutOutput", "make-corpus --documents 5", "--output"},
        BadInvocation{"CorpusBadNumber", "make-corpus --output DIR/c.h5 --documents many", "--documents"},
        BadInvocation{"ConfigIsADirectory", "train DIR", "DIR: is a directory, not a config file"},
        BadInvocation{"UnwritableRunDir", "train " + kTinyConfig + " --set data.path=CORPUS --set train.run_dir=DIR/a-file/run",
                      "train.run_dir: cannot create the directory 'DIR/a-file/run'"},
        BadInvocation{"UnwritableCheckpointDir",
                      "train " + kTinyConfig + " --set data.path=CORPUS --set train.run_dir=DIR/run "
                      "--set train.checkpoint_dir=DIR/a-file/ckpt --set train.checkpoint_every=5",
                      "train.checkpoint_dir: cannot create the directory 'DIR/a-file/ckpt'"},
        BadInvocation{"EmptyDataset", "train " + kTinyConfig + " --set data.path=DIR/empty.h5 --set train.run_dir=DIR/run --set train.checkpoint_dir=DIR/ckpt",
                      "dataset 'DIR/empty.h5' holds no tokens"},
        BadInvocation{"PrepareOutputIsAnInput", "prepare-data --input DIR/notes.txt --output DIR/notes.txt",
                      "--output 'DIR/notes.txt' is the input"},
        BadInvocation{"PrepareOutputIsAnInputsHardLink", "prepare-data --input DIR/notes.txt --output DIR/notes-hard.txt",
                      "--output 'DIR/notes-hard.txt' is the input 'DIR/notes.txt'"},
        BadInvocation{"PrepareOutputIsAnInputsSymlink", "prepare-data --input DIR/notes-sym.txt --output DIR/notes.txt",
                      "--output 'DIR/notes.txt' is the input 'DIR/notes-sym.txt'"},
        // The Megatron writer creates OUTPUT.bin and OUTPUT.idx: neither may be an input.
        BadInvocation{"PrepareMegatronOutputIsAnInput",
                      "prepare-data --output-format megatron --input DIR/in.bin --output DIR/in",
                      "--output 'DIR/in' writes 'DIR/in.bin', which is the input 'DIR/in.bin'"},
        BadInvocation{"PrepareOutputExists", "prepare-data --input DIR/notes.txt --output DIR/empty.h5",
                      "--output 'DIR/empty.h5': 'DIR/empty.h5' exists; pass --overwrite"},
        // Sizes no machine holds, refused before anything is sized by them.
        BadInvocation{"ModelLayersBeyondTheLimit",
                      "train " + kTinyConfig + " --set data.path=CORPUS --set model.num_layers=1000000000",
                      "model.num_layers: 1000000000 is above 65536"},
        BadInvocation{"ThreadsBeyondTheLimit", "train " + kTinyConfig + " --set data.path=CORPUS --set train.threads=100000",
                      "train.threads: 100000 is not between 0 and 1024"},
        BadInvocation{"ThreadsFarAboveTheCores",
                      "train " + kTinyConfig + " --set data.path=CORPUS --set train.threads=20000",
                      "train.threads: 20000 is not between 0 and 1024"},
        // About 320,000 GiB of parameters: more than any address space, so the arena
        // cannot be had even where the kernel overcommits memory.
        BadInvocation{"ModelLargerThanMemory",
                      "train " + kTinyConfig + " --set data.path=CORPUS --set train.run_dir=DIR/run "
                      "--set train.checkpoint_dir=DIR/ckpt "
                      "--set model.num_layers=20000 --set model.hidden_size=16384 --set model.num_heads=128 "
                      "--set model.num_kv_heads=128 --set model.ffn_hidden_size=65536",
                      "the 'parameters' arena needs 343600039002112 bytes (320002.5 GiB) of cpu memory"},
        // Sizes whose element counts overflow 64 bits: refused by the config, naming
        // the sizes and the bytes, before any count wraps around.
        BadInvocation{"ModelSizesOverflow",
                      "train " + kTinyConfig + " --set data.path=CORPUS --set model.hidden_size=1000000000",
                      "model.hidden_size: too large to count: model.hidden_size 1000000000, model.ffn_hidden_size 352, "
                      "model.vocab_size 258, model.num_layers 4 make 1.2e+19 parameters, whose weights, gradients and "
                      "AdamW moments need 1.92e+20 bytes, beyond 64-bit sizes"},
        // Counts that fit but cannot be had: the activation arena's OutOfMemory, not a
        // bare std::bad_alloc from a host list sized before it.
        BadInvocation{"MicroBatchLargerThanMemory",
                      "train " + kTinyConfig + " --set data.path=CORPUS --set train.run_dir=DIR/run "
                      "--set data.micro_batch_tokens=10000000000000",
                      "the 'activations' arena needs"},
        BadInvocation{"MicroBatchLogitsOverflow",
                      "train " + kTinyConfig + " --set data.path=CORPUS --set data.micro_batch_tokens=100000000000000000",
                      "data.micro_batch_tokens: too large to count: data.micro_batch_tokens 100000000000000000"},
        // Existing directories this user cannot write in (/proc refuses new files even to root).
        BadInvocation{"RunDirNotWritable", "train " + kTinyConfig + " --set data.path=CORPUS --set train.run_dir=/proc",
                      "train.run_dir: cannot write in the directory '/proc'"},
        BadInvocation{"CheckpointDirNotWritable",
                      "train " + kTinyConfig + " --set data.path=CORPUS --set train.run_dir=DIR/run "
                      "--set train.checkpoint_dir=/proc/self --set train.checkpoint_every=5",
                      "train.checkpoint_dir: cannot write in the directory '/proc/self'"}),
    [](const auto& info) { return info.param.name; });

TEST(CommandLine, HelpAndVersion) {
  auto help = run_trainer("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("prepare-data"), std::string::npos);
  auto train_help = run_trainer("train --help");
  EXPECT_EQ(train_help.exit_code, 0);
  EXPECT_NE(train_help.output.find("--set"), std::string::npos);
  auto version = run_trainer("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find("trainer "), std::string::npos);
}

}  // namespace
}  // namespace hdp
