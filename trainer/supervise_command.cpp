// `trainer supervise [options] -- COMMAND...`: automatic restart of a training
// command (trainer/supervisor.h). A C++ command rather than a script: it has to
// own the command's process group, forward signals to it race-free, tell an exit
// code from a killing signal, and compute ETTR from the run's metrics and
// checkpoint directory with the trainer's own readers.

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.h"
#include "trainer/command_line.h"
#include "trainer/commands.h"
#include "trainer/supervisor.h"

namespace hdp {
namespace {

const char* const kSuperviseHelp = R"(usage: trainer supervise [options] -- COMMAND...

Runs COMMAND (e.g. mpirun -np 2 trainer train CONFIG.yaml) and runs it again
when it fails: an exit code other than 0, 2 and 3, killed by a signal (a rank
killed, out of memory, the hang watchdog's abort), or frozen (RUN_DIR/run.lock,
which the job refreshes every step, older than --stall-timeout-s: its process
group is killed). Success, exit code 2 (bad input) and 3 (the run diverges) end
supervision. Restart k waits BACKOFF * 2^(k-1) seconds (at most
--max-backoff-s) and runs COMMAND with HDP_SUPERVISE_RESTART=k in its
environment, which makes `trainer train` resume (train.resume=auto) from the
newest complete checkpoint. SIGTERM and SIGINT are forwarded to COMMAND's
process group and end supervision without a restart. Killed outright, the
supervisor takes COMMAND down with it (COMMAND gets the stop signal).

Writes RUN_DIR/ettr.jsonl, one line per restart and one at the end: the effective
training time ratio (time of steps whose progress survives / wall time since
supervise started, and over the last hour), the restarts so far and the cause
of each failure.
  --max-restarts N      restarts before giving up (default 10)
  --backoff-s S         wait before the first restart, doubled each time (default 10)
  --max-backoff-s S     longest wait (default 600)
  --run-dir DIR         the run's train.run_dir, where metrics.jsonl is (required)
  --checkpoint-dir DIR  the run's train.checkpoint_dir (default RUN_DIR/checkpoints)
  --stall-timeout-s S   a heartbeat older than this is a frozen job (default 1800;
                        0: not watched); longer than a step with its checkpoint
  --stop-signal SIG     what COMMAND's group gets for SIGTERM/SIGINT: TERM, INT or USR1
                        (default: the signal received; USR1 for mpirun, which forwards
                        it to every rank but kills them a second after a TERM)
Exit code: COMMAND's last exit code, or 128 + the signal that ended it.
)";

double seconds_option(Arguments& args, const std::string& name, double fallback) {
  const std::optional<std::string> text = args.option(name);
  if (!text) return fallback;
  try {
    size_t used = 0;
    const double v = std::stod(*text, &used);
    if (used == text->size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(name + " expects a number of seconds >= 0, got '" + *text + "'");
}

int parse_stop_signal(const std::string& name) {
  if (name == "TERM" || name == "SIGTERM") return SIGTERM;
  if (name == "INT" || name == "SIGINT") return SIGINT;
  if (name == "USR1" || name == "SIGUSR1") return SIGUSR1;
  throw UsageError("--stop-signal '" + name + "' is not one of TERM, INT, USR1");
}

}  // namespace

int command_supervise(const std::vector<std::string>& raw) {
  // Everything after "--" is the command, untouched by option parsing.
  const auto dash = std::find(raw.begin(), raw.end(), std::string("--"));
  Arguments args(std::vector<std::string>(raw.begin(), dash));
  if (args.wants_help()) {
    std::fputs(kSuperviseHelp, stdout);
    return kExitSuccess;
  }
  setup_logging(0);
  return run_subcommand("supervise", [&] {
    SupervisorOptions options;
    // Bounded before the cast to int, which would wrap.
    const int64_t max_restarts = args.integer("--max-restarts", options.max_restarts, 0);
    if (max_restarts > std::numeric_limits<int>::max()) {
      throw UsageError("--max-restarts must be at most " + std::to_string(std::numeric_limits<int>::max()) +
                       ", got " + std::to_string(max_restarts));
    }
    options.max_restarts = static_cast<int>(max_restarts);
    options.backoff_s = seconds_option(args, "--backoff-s", options.backoff_s);
    options.max_backoff_s = seconds_option(args, "--max-backoff-s", options.max_backoff_s);
    options.stall_timeout_s = seconds_option(args, "--stall-timeout-s", options.stall_timeout_s);
    const std::optional<std::string> run_dir = args.option("--run-dir");
    const std::optional<std::string> checkpoint_dir = args.option("--checkpoint-dir");
    const std::optional<std::string> stop_signal = args.option("--stop-signal");
    args.expect_empty();
    if (!run_dir) throw UsageError("--run-dir is required (the run's train.run_dir, for ettr.jsonl)");
    if (dash == raw.end() || dash + 1 == raw.end()) throw UsageError("expects the command to run after '--'");
    options.command.assign(dash + 1, raw.end());
    options.run_dir = *run_dir;
    TrainConfig train;  // an empty train.checkpoint_dir: the run directory's default
    train.run_dir = *run_dir;
    train.checkpoint_dir = checkpoint_dir.value_or("");
    options.checkpoint_dir = resolved_checkpoint_dir(train);
    if (stop_signal) options.stop_signal = parse_stop_signal(*stop_signal);
    return supervise(options);
  });
}

}  // namespace hdp
