#pragma once
// `trainer supervise`: runs a training command and, when it fails, runs it again so
// that it resumes from its newest complete checkpoint, with exponential back-off,
// up to a number of restarts (ByteRobust, ByteDance 2025: automatic restart after
// a failure, with the effective training time ratio as the measure of how much
// of the wall time trained).
//
// What is a failure: the command ends with an exit code other than 0 (success), 2
// (bad input) and 3 (the run diverges), which the same command would meet again
// (trainer/command_line.h), or is killed by a
// signal (a rank killed outright, the out-of-memory killer, the hang watchdog's
// abort). SIGTERM and SIGINT sent to the supervisor are forwarded to the
// command's process group, as they are or as SupervisorOptions::stop_signal (a
// trainer writes a checkpoint and stops at the next step boundary), and end
// supervision: no restart follows them. The command runs in a process group of
// its own, so that a terminal's Ctrl-C reaches it only through the supervisor.
//
// Every restart runs the command with HDP_SUPERVISE_RESTART=<restarts so far> in
// its environment (0 for the first run); `trainer train` takes train.resume=auto
// when it is above 0, so a restart continues the run whatever the config says.
//
// A job frozen whole (a single process stopped or wedged, whose hang watchdog is
// frozen with it) is seen by its heartbeat: RUN_DIR/run.lock, which rank 0 of a
// training job refreshes every step (checkpoint/lock.h). Once the running command
// has touched it, a heartbeat older than SupervisorOptions::stall_timeout_s makes
// the supervisor take the stacks of the command and its descendants from outside
// (RUN_DIR/hang/frozen-run-N.txt, trainer/process_stacks.h) and kill the
// command's process group, a failure like any other. The
// command dies with the supervisor: killed outright, the supervisor cannot forward
// a stop, so the command is given the stop signal then (PR_SET_PDEATHSIG; it
// reaches the command's own process, mpirun or the trainer), and its directories'
// locks do not keep out the next supervisor's job.
//
// RUN_DIR/ettr.jsonl gets one line per restart and one at the end (trainer/ettr.h).

#include <cstdint>
#include <string>
#include <vector>

namespace hdp {

struct SupervisorOptions {
  std::vector<std::string> command;  // program and arguments, run with execvp
  int max_restarts = 10;
  double backoff_s = 10;      // before restart k (1, 2, ...): backoff_s * 2^(k-1), at most max_backoff_s
  double max_backoff_s = 600;
  std::string run_dir;         // where the command writes metrics.jsonl; ettr.jsonl goes there
  std::string checkpoint_dir;  // where the command's checkpoints are: what survives a failure
  // What the command's group gets when the supervisor receives SIGTERM or SIGINT; 0:
  // that signal. SIGUSR1 suits mpirun (OpenMPI 4), which forwards SIGUSR1 to every
  // rank but turns SIGTERM into killing them a second later (run/signals.h).
  int stop_signal = 0;
  // A heartbeat (RUN_DIR/run.lock) older than this kills the command; 0: not
  // watched. It must be longer than the slowest step with its checkpoint, and than
  // a job's start-up from taking the lock to its first step (a checkpoint loaded).
  double stall_timeout_s = 1800;
};

// The environment variable a restarted command finds (see above).
inline constexpr const char* kSuperviseRestartVariable = "HDP_SUPERVISE_RESTART";

// Seconds to wait before restart `restart` (1 for the first).
double backoff_before(const SupervisorOptions& options, int restart);

// Runs the command until it succeeds, fails with bad input or diverges, is stopped by a
// forwarded signal or has failed max_restarts + 1 times. Returns the last run's
// exit code, or 128 + the signal that killed it.
int supervise(const SupervisorOptions& options);

}  // namespace hdp
