// `trainer supervise` (trainer/supervisor.h): which endings are restarted, the
// restart limit, the environment a restart sees, SIGTERM forwarding, and the ETTR
// function (trainer/ettr.h) against a hand computation on a synthetic
// metrics.jsonl. The restart of a real training run, bit-identical to an
// uninterrupted one, is tests/supervise_train_test.sh.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "trainer/ettr.h"
#include "trainer/supervisor.h"

namespace hdp {
namespace {

using testing::run_command;
using testing::run_trainer;
using testing::scratch_dir;

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<std::string> read_words(const std::string& path) {
  std::vector<std::string> words;
  std::ifstream in(path);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// Steps 1..3 end at 1010, 1015 and 1020 and take 4, 5 and 2 s: [1006, 1010],
// [1010, 1015], [1018, 1020]. A line of an older run without "time" and a line cut
// short by a crash are not steps.
std::string synthetic_metrics(const std::string& dir) {
  const std::string path = dir + "/metrics.jsonl";
  std::ofstream(path) << "{\"step\": 0, \"loss\": 5.0, \"step_ms\": 100}\n"
                      << "{\"step\": 1, \"loss\": 5.5, \"step_ms\": 4000, \"time\": 1010.000}\n"
                      << "{\"step\": 2, \"loss\": 5.4, \"step_ms\": 5000, \"time\": 1015.000}\n"
                      << "{\"step\": 3, \"loss\": 5.3, \"step_ms\": 2000, \"time\": 1020.000}\n"
                      << "{\"step\": 4, \"loss\": 5.";
  return path;
}

TEST(Ettr, ReadsTheTimedStepsOfMetrics) {
  const std::vector<StepTiming> steps = read_step_timings(synthetic_metrics(scratch_dir("ettr_read")));
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[1].step, 2);
  EXPECT_DOUBLE_EQ(steps[1].end_s, 1015.0);
  EXPECT_DOUBLE_EQ(steps[1].duration_s, 5.0);
  EXPECT_TRUE(read_step_timings(scratch_dir("ettr_none") + "/metrics.jsonl").empty());
}

TEST(Ettr, MatchesTheHandComputation) {
  const std::vector<StepTiming> steps = read_step_timings(synthetic_metrics(scratch_dir("ettr_hand")));
  // Wall time 1000..1030, every step kept: (4 + 5 + 2) / 30.
  Ettr all = ettr_between(steps, 3, 1000, 1030);
  EXPECT_DOUBLE_EQ(all.wall_s, 30.0);
  EXPECT_DOUBLE_EQ(all.effective_s, 11.0);
  EXPECT_DOUBLE_EQ(all.ratio, 11.0 / 30.0);
  // Step 3 lost (the newest checkpoint is step 2's): (4 + 5) / 30.
  EXPECT_DOUBLE_EQ(ettr_between(steps, 2, 1000, 1030).ratio, 9.0 / 30.0);
  // Nothing checkpointed: nothing survives.
  EXPECT_DOUBLE_EQ(ettr_between(steps, 0, 1000, 1030).effective_s, 0.0);
  // A window from 1012: 3 s of step 2 and all of step 3, over 18 s.
  Ettr window = ettr_between(steps, 3, 1012, 1030);
  EXPECT_DOUBLE_EQ(window.effective_s, 5.0);
  EXPECT_DOUBLE_EQ(window.ratio, 5.0 / 18.0);
  // Supervision started at 1008, in the middle of step 1: 2 s of it count.
  EXPECT_DOUBLE_EQ(effective_seconds(steps, 3, 1008, 1030), 2.0 + 5.0 + 2.0);
  // A window ending inside step 2.
  EXPECT_DOUBLE_EQ(effective_seconds(steps, 3, 1000, 1012), 4.0 + 2.0);
  EXPECT_DOUBLE_EQ(ettr_between(steps, 3, 1000, 1000).ratio, 0.0);
}

TEST(Supervise, BackOffDoublesUpToTheLimit) {
  SupervisorOptions options;
  options.backoff_s = 3;
  options.max_backoff_s = 20;
  EXPECT_DOUBLE_EQ(backoff_before(options, 1), 3);
  EXPECT_DOUBLE_EQ(backoff_before(options, 2), 6);
  EXPECT_DOUBLE_EQ(backoff_before(options, 3), 12);
  EXPECT_DOUBLE_EQ(backoff_before(options, 4), 20);
  EXPECT_DOUBLE_EQ(backoff_before(options, 100), 20);
}

std::string supervise_args(const std::string& dir, int max_restarts) {
  return "supervise --max-restarts " + std::to_string(max_restarts) + " --backoff-s 0 --run-dir " + dir + " -- ";
}

TEST(Supervise, RestartsAFailingCommandAtMostMaxRestartsTimes) {
  const std::string dir = scratch_dir("supervise_limit");
  const auto r = run_trainer(supervise_args(dir, 2) + "sh -c 'echo $HDP_SUPERVISE_RESTART >> " + dir + "/runs; exit 1'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(read_words(dir + "/runs"), (std::vector<std::string>{"0", "1", "2"})) << r.output;
  const std::vector<nlohmann::json> lines = read_lines(dir + "/ettr.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["event"], "restart");
  EXPECT_EQ(lines[0]["restarts"], 1);
  EXPECT_EQ(lines[0]["cause"], "exit code 1");
  EXPECT_EQ(lines[1]["restarts"], 2);
  EXPECT_EQ(lines[2]["event"], "end");
  EXPECT_EQ(lines[2]["outcome"], "restarts exhausted");
  EXPECT_EQ(lines[2]["restarts"], 2);
  EXPECT_EQ(lines[2]["causes"].size(), 3u);
  EXPECT_EQ(lines[2]["exit_code"], 1);
}

TEST(Supervise, NeverRestartsBadInput) {
  const std::string dir = scratch_dir("supervise_bad_input");
  const auto r = run_trainer(supervise_args(dir, 5) + "sh -c 'echo run >> " + dir + "/runs; exit 2'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(read_words(dir + "/runs").size(), 1u);
  const std::vector<nlohmann::json> lines = read_lines(dir + "/ettr.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["outcome"], "bad input");
  EXPECT_EQ(lines[0]["restarts"], 0);
}

// Exit code 3: the run diverges (trainer/command_line.h). The same command would
// diverge again, so it is not restarted.
TEST(Supervise, NeverRestartsADivergingRun) {
  const std::string dir = scratch_dir("supervise_diverged");
  const auto r = run_trainer(supervise_args(dir, 5) + "sh -c 'echo run >> " + dir + "/runs; exit 3'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("supervise: the command ended with exit code 3 (diverged); not restarting"),
            std::string::npos) << r.output;
  EXPECT_EQ(read_words(dir + "/runs").size(), 1u);
  const std::vector<nlohmann::json> lines = read_lines(dir + "/ettr.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["outcome"], "diverged");
  EXPECT_EQ(lines[0]["exit_code"], 3);
}

TEST(Supervise, RestartsACommandKilledByASignalUntilItSucceeds) {
  const std::string dir = scratch_dir("supervise_killed");
  const auto r = run_trainer(supervise_args(dir, 5) + "sh -c 'echo $HDP_SUPERVISE_RESTART >> " + dir +
                             "/runs; [ $HDP_SUPERVISE_RESTART -ge 2 ] || kill -KILL $$'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_words(dir + "/runs"), (std::vector<std::string>{"0", "1", "2"})) << r.output;
  const std::vector<nlohmann::json> lines = read_lines(dir + "/ettr.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["cause"], "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(lines[2]["outcome"], "success");
  EXPECT_EQ(lines[2]["restarts"], 2);
  EXPECT_EQ(lines[2]["causes"], (nlohmann::json{"killed by signal 9 (SIGKILL)", "killed by signal 9 (SIGKILL)"}));
}

TEST(Supervise, ForwardsSigtermAndDoesNotRestart) {
  const std::string dir = scratch_dir("supervise_sigterm");
  // The command writes "ready", then waits; on SIGTERM it records it and exits 0.
  // The supervisor runs in the background; SIGTERM goes to it once "ready" exists.
  const std::string command =
      std::string(HDP_TRAINER_BINARY) + " " + supervise_args(dir, 5) + "sh -c 'trap \"echo term >> " + dir +
      "/runs; exit 0\" TERM; echo start >> " + dir + "/runs; touch " + dir + "/ready; while :; do sleep 0.05; done' & " +
      "pid=$!; while [ ! -e " + dir + "/ready ]; do sleep 0.05; done; kill -TERM $pid; wait $pid";
  const auto r = run_command(command);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_words(dir + "/runs"), (std::vector<std::string>{"start", "term"})) << r.output;
  const std::vector<nlohmann::json> lines = read_lines(dir + "/ettr.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["outcome"], "stopped");
}

// A command frozen whole (here a shell that stops itself after touching the
// heartbeat, as a SIGSTOPped single-process job whose watchdog is frozen with it)
// is killed once RUN_DIR/run.lock is older than --stall-timeout-s, and restarted;
// its stacks are taken first, from outside (it runs no signal handler):
// RUN_DIR/hang/frozen-run-0.txt names its thread and its state, stopped, and, where
// gdb is installed, holds its backtrace.
TEST(Supervise, KillsAndRestartsACommandWhoseHeartbeatStopsTakingItsStacksFirst) {
  const std::string dir = scratch_dir("supervise_frozen");
  const auto r = run_trainer("supervise --max-restarts 2 --backoff-s 0 --stall-timeout-s 1 --run-dir " + dir +
                             " -- sh -c 'echo $HDP_SUPERVISE_RESTART >> " + dir +
                             "/runs; [ $HDP_SUPERVISE_RESTART -ge 1 ] || { echo $$ > " + dir + "/pid; touch " + dir +
                             "/run.lock; kill -STOP $$; }'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("supervise: job frozen for "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" (" + dir + "/run.lock older than --stall-timeout-s 1); taking its stacks"),
            std::string::npos) << r.output;
  const std::string stacks = dir + "/hang/frozen-run-0.txt";
  EXPECT_NE(r.output.find("; stacks in " + stacks + " ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("); killing its process group"), std::string::npos) << r.output;
  const std::string pid = read_words(dir + "/pid").at(0);
  std::ifstream in(stacks);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("process " + pid + " (sh): sh -c ", 0), 0u) << text;
  EXPECT_NE(text.find("thread " + pid + " (sh): state T (stopped), wait channel "), std::string::npos) << text;
  if (run_command("command -v gdb").exit_code == 0) {
    EXPECT_NE(text.find("gdb backtraces:\n"), std::string::npos) << text;
    EXPECT_NE(text.find("#0 "), std::string::npos) << text;
  }
  EXPECT_EQ(read_words(dir + "/runs"), (std::vector<std::string>{"0", "1"})) << r.output;
  const std::vector<nlohmann::json> lines = read_lines(dir + "/ettr.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["event"], "restart");
  EXPECT_EQ(lines[0]["cause"].get<std::string>().rfind("frozen: no heartbeat for ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1]["outcome"], "success");
}

// A heartbeat the running command has not touched (a previous run's, an hour old)
// says nothing about it: the command is left to finish.
TEST(Supervise, APreviousRunsHeartbeatIsNotTheCommands) {
  const std::string dir = scratch_dir("supervise_old_heartbeat");
  ASSERT_EQ(run_command("touch -d '1 hour ago' " + dir + "/run.lock").exit_code, 0);
  const auto r = run_trainer("supervise --max-restarts 2 --backoff-s 0 --stall-timeout-s 1 --run-dir " + dir +
                             " -- sh -c 'echo run >> " + dir + "/runs; sleep 2.5'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_words(dir + "/runs").size(), 1u) << r.output;
}

// A supervisor killed outright cannot forward a stop: the command gets the stop
// signal when it dies (PR_SET_PDEATHSIG), so it ends and frees its locks.
TEST(Supervise, TheCommandEndsWithAKilledSupervisor) {
  const std::string dir = scratch_dir("supervise_killed_supervisor");
  const std::string command =
      std::string(HDP_TRAINER_BINARY) + " " + supervise_args(dir, 5) + "sh -c 'trap \"echo term >> " + dir +
      "/runs; exit 0\" TERM; echo $$ > " + dir + "/pid; while :; do sleep 0.05; done' & pid=$!; while [ ! -s " + dir +
      "/pid ]; do sleep 0.05; done; kill -KILL $pid; wait $pid; job=$(cat " + dir +
      "/pid); for i in $(seq 100); do kill -0 $job 2>/dev/null || break; sleep 0.05; done; kill -0 $job 2>/dev/null "
      "&& echo job alive || echo job gone";
  const auto r = run_command(command);
  EXPECT_NE(r.output.find("job gone"), std::string::npos) << r.output;
  EXPECT_EQ(read_words(dir + "/runs"), (std::vector<std::string>{"term"})) << r.output;
}

// A process the command leaves behind (here a background sleep; in a real job, a rank
// mpirun signalled but that has not died yet, which would hold the checkpoint lock
// against the restart) is ended before the supervisor goes on.
TEST(Supervise, EndsWhatTheCommandLeftRunning) {
  const std::string dir = scratch_dir("supervise_leftovers");
  const auto r = run_trainer(supervise_args(dir, 0) + "sh -c 'sleep 30 & echo $! > " + dir + "/sleeper; exit 1'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::vector<std::string> pid = read_words(dir + "/sleeper");
  ASSERT_EQ(pid.size(), 1u);
  EXPECT_NE(run_command("kill -0 " + pid[0] + " 2>/dev/null").exit_code, 0) << "process " << pid[0] << " still runs";
}

TEST(Supervise, RefusesACommandThatCannotRun) {
  const std::string dir = scratch_dir("supervise_missing");
  const auto r = run_trainer(supervise_args(dir, 5) + dir + "/no-such-program");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no-such-program': No such file or directory"), std::string::npos) << r.output;
}

TEST(Supervise, RefusesAMissingCommandOrRunDir) {
  const std::string dir = scratch_dir("supervise_usage");
  auto r = run_trainer("supervise --run-dir " + dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("expects the command to run after '--'"), std::string::npos) << r.output;
  r = run_trainer("supervise -- true");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--run-dir is required"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hdp
