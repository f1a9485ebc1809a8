#include "trainer/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <stdexcept>
#include <thread>

#include "base/errors.h"
#include "checkpoint/directory.h"
#include "checkpoint/lock.h"
#include "trainer/command_line.h"
#include "trainer/ettr.h"
#include "trainer/process_stacks.h"

namespace hdp {
namespace {

// The process group of the running command (0: none) and the first stop signal
// received. Lock-free atomics: the handler reads and writes them.
std::atomic<pid_t> g_child_group{0};
std::atomic<int> g_stop_signal{0};
std::atomic<int> g_forward_as{0};  // 0: the signal received
// How long gdb may take over a frozen job's backtraces (trainer/process_stacks.h).
constexpr int kGdbTimeoutS = 60;
static_assert(std::atomic<pid_t>::is_always_lock_free);

// Forwards every SIGTERM/SIGINT (or SupervisorOptions::stop_signal in its place) to
// the command's process group, a second one too (the trainer takes a second signal
// as "stop at once"), and remembers the first.
void on_stop_signal(int signal) {
  const int saved_errno = errno;  // kill may set it under the interrupted code
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signal);
  const pid_t group = g_child_group.load();
  const int forward = g_forward_as.load();
  if (group > 0) ::kill(-group, forward ? forward : signal);
  errno = saved_errno;
}

void install_forwarding_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGINT}) sigaction(signal, &action, nullptr);
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The common signals' names; not sigabbrev_np, which needs glibc >= 2.32 (not on
// RHEL 8 or Ubuntu 20.04).
const char* signal_name(int signal) {
  switch (signal) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGBUS: return "SIGBUS";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return nullptr;
  }
}

std::string signal_text(int signal) {
  const char* name = signal_name(signal);
  return "signal " + std::to_string(signal) + (name ? std::string(" (") + name + ")" : "");
}

// How one run of the command ended.
struct Outcome {
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal killed it
  double frozen_s = 0;  // > 0: the supervisor killed it, its heartbeat this old
  int status() const { return signal ? 128 + signal : exit_code; }
  std::string text() const {
    if (frozen_s > 0) return "frozen: no heartbeat for " + std::to_string(static_cast<long>(frozen_s)) + " s, killed";
    return signal ? "killed by " + signal_text(signal) : "exit code " + std::to_string(exit_code);
  }
};

// Seconds since the job's heartbeat file was last touched, once this run has
// touched it (its modification time at or after `since`, the run's start);
// nullopt before that, as when the file is missing or a previous run's.
std::optional<double> heartbeat_age(const std::string& path, const timespec& since) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  const auto seconds = [](const timespec& t) { return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec); };
  if (seconds(st.st_mtim) < seconds(since)) return std::nullopt;
  timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return seconds(now) - seconds(st.st_mtim);
}

// Ends what a finished command left running. The supervisor is a child subreaper
// (prctl), so the command's orphaned descendants become its children: mpirun
// exits as soon as a rank fails, while the ranks it signalled may live on for a
// moment, and rank 0 would then still hold CHECKPOINT_DIR/trainer.lock against the
// restart (OpenMPI 4.1 puts each rank in a process group of its own, so killing
// mpirun's group does not reach them). Each is killed and reaped until none is left.
void end_leftovers() {
  for (std::vector<pid_t> left = child_processes(::getpid()); !left.empty(); left = child_processes(::getpid())) {
    for (pid_t pid : left) ::kill(pid, SIGKILL);
    for (pid_t pid : left) {
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

// Starts the command in a process group of its own (so that a signal reaches
// mpirun and everything it started here) and waits for it, killing it when its
// heartbeat stops (SupervisorOptions::stall_timeout_s). A command that cannot be
// started at all is bad input.
Outcome run_once(const SupervisorOptions& options, int restart) {
  const std::vector<std::string>& command = options.command;
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // Made before fork; the child's setenv still allocates, which is safe only because
  // the supervisor is single-threaded (no other thread can hold malloc's lock at fork).
  const std::string restart_text = std::to_string(restart);
  // The child reports a failed exec through this pipe (closed on a successful exec).
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  // Stop signals are held back until the child's group is recorded, so none is lost.
  sigset_t stops, previous;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  sigprocmask(SIG_BLOCK, &stops, &previous);
  const pid_t supervisor = ::getpid();
  const int death_signal = options.stop_signal ? options.stop_signal : SIGTERM;
  timespec started {};
  ::clock_gettime(CLOCK_REALTIME, &started);
  started.tv_nsec = 0;  // file times may be kept in whole seconds
  const pid_t pid = ::fork();
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(exec_pipe[0]);
    ::setpgid(0, 0);
    // A supervisor killed outright (kill -9, the out-of-memory killer) cannot forward
    // a stop: the command gets the stop signal as if it had, so that it ends and
    // frees its directories' locks for the next supervisor. Checked after setting
    // in case the supervisor died first.
    ::prctl(PR_SET_PDEATHSIG, death_signal);
    if (::getppid() != supervisor) ::_exit(128 + death_signal);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::setenv(kSuperviseRestartVariable, restart_text.c_str(), 1);
    // In a background process group, reading the terminal would stop the command
    // (SIGTTIN; mpirun forwards its stdin to rank 0): training reads no input.
    if (::isatty(STDIN_FILENO)) {
      const int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
    }
    ::execvp(argv[0], argv.data());
    const int error = errno;
    [[maybe_unused]] const ssize_t n = ::write(exec_pipe[1], &error, sizeof(error));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: whichever runs first, the group exists before a signal is forwarded
  g_child_group.store(pid);
  // A stop signal that came after the caller's check of g_stop_signal but before the
  // block above was recorded with no group to forward it to: forward it now, as the
  // handler would (one that came while blocked is pending, and the handler forwards it).
  if (const int stop = g_stop_signal.load()) {
    const int forward = g_forward_as.load();
    ::kill(-pid, forward ? forward : stop);
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  ::close(exec_pipe[1]);
  int exec_error = 0;
  ssize_t got;
  do got = ::read(exec_pipe[0], &exec_error, sizeof(exec_error));
  while (got < 0 && errno == EINTR);
  ::close(exec_pipe[0]);

  int status = 0;
  const std::string heartbeat = (std::filesystem::path(options.run_dir) / kRunDirLockFile).string();
  double frozen_s = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, options.stall_timeout_s > 0 && frozen_s == 0 ? WNOHANG : 0);
    if (done == pid) break;
    if (done < 0) {
      if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
      continue;
    }
    // A job frozen whole (a single process stopped or wedged) has no watchdog left
    // to end it: its heartbeat, refreshed by rank 0 every step, tells.
    const std::optional<double> age = heartbeat_age(heartbeat, started);
    if (age && *age > options.stall_timeout_s) {
      frozen_s = *age;
      // Its stacks first: what it is stuck in is the diagnosis (trainer/process_stacks.h).
      const std::string stacks = (std::filesystem::path(options.run_dir) / "hang" /
                                  ("frozen-run-" + std::to_string(restart) + ".txt")).string();
      spdlog::error("supervise: job frozen for {:.0f} s ({} older than --stall-timeout-s {:g}); taking its stacks",
                    *age, heartbeat, options.stall_timeout_s);
      const std::string taken = write_process_stacks(pid, stacks, kGdbTimeoutS);
      spdlog::error("supervise: job frozen for {:.0f} s; stacks in {} ({}); killing its process group", *age, stacks,
                    taken);
      ::kill(-pid, SIGKILL);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  g_child_group.store(0);
  end_leftovers();
  if (got == static_cast<ssize_t>(sizeof(exec_error))) {
    throw InputError("trainer supervise: cannot run '" + command[0] + "': " + std::strerror(exec_error));
  }
  Outcome outcome;
  outcome.frozen_s = frozen_s;
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  else outcome.exit_code = WEXITSTATUS(status);
  return outcome;
}

// The step whose progress survives a failure: the newest complete checkpoint's
// (step-NNNNNNNN, docs/checkpoint-format.md), 0 without one.
int64_t checkpointed_step(const std::string& checkpoint_dir) {
  return latest_checkpoint_step(checkpoint_dir).value_or(0);
}

class EttrLog {
 public:
  EttrLog(const SupervisorOptions& options, double start_s)
      : options_(options), start_s_(start_s), path_((std::filesystem::path(options.run_dir) / "ettr.jsonl").string()) {
    std::filesystem::create_directories(options.run_dir);
    // Close-on-exec (unlike std::ofstream's), so that mpirun and the ranks do not
    // inherit it; appended a whole line per write.
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) throw InputError("trainer supervise: cannot write " + path_ + " (--run-dir)");
  }
  ~EttrLog() { ::close(fd_); }
  EttrLog(const EttrLog&) = delete;
  EttrLog& operator=(const EttrLog&) = delete;

  // One line: `event` "restart" or "end"; `restarts` made so far (on a restart line,
  // counting the one it announces); `last_kept_step` the step whose progress
  // survives; `causes` the failures so far.
  void write(const std::string& event, int restarts, int64_t last_kept_step, const std::vector<std::string>& causes,
             nlohmann::ordered_json extra) {
    const double now = unix_now();
    const std::vector<StepTiming> steps =
        read_step_timings((std::filesystem::path(options_.run_dir) / "metrics.jsonl").string());
    // "Every step" is reported as the last step there is.
    int64_t last_step = 0;
    for (const StepTiming& t : steps) last_step = std::max(last_step, t.step);
    last_kept_step = std::min(last_kept_step, last_step);
    const Ettr all = ettr_between(steps, last_kept_step, start_s_, now);
    const Ettr hour = ettr_between(steps, last_kept_step, std::max(start_s_, now - 3600.0), now);
    nlohmann::ordered_json line = {{"time", now},
                           {"event", event},
                           {"restarts", restarts},
                           {"last_kept_step", last_kept_step},
                           {"wall_s", all.wall_s},
                           {"effective_s", all.effective_s},
                           {"ettr", all.ratio},
                           {"last_hour_wall_s", hour.wall_s},
                           {"last_hour_effective_s", hour.effective_s},
                           {"ettr_last_hour", hour.ratio},
                           {"causes", causes}};
    line.update(extra);
    const std::string text = line.dump() + '\n';
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error("trainer supervise: cannot write " + path_ + ": " + std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    spdlog::info("supervise: {} | ETTR {:.3f} ({:.1f} of {:.1f} s), last hour {:.3f} | progress kept to step {}", event,
                 all.ratio, all.effective_s, all.wall_s, hour.ratio, last_kept_step);
  }

 private:
  const SupervisorOptions& options_;
  double start_s_;
  std::string path_;
  int fd_ = -1;
};

// Sleeps `seconds`, or less when a stop signal arrives.
void back_off(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (g_stop_signal.load() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

double backoff_before(const SupervisorOptions& options, int restart) {
  return std::min(options.max_backoff_s, options.backoff_s * std::ldexp(1.0, std::min(restart - 1, 62)));
}

int supervise(const SupervisorOptions& options) {
  const double start_s = unix_now();
  EttrLog log(options, start_s);
  g_forward_as.store(options.stop_signal);
  install_forwarding_handlers();
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // see end_leftovers
  std::vector<std::string> causes;
  constexpr int64_t kAll = std::numeric_limits<int64_t>::max();
  for (int restart = 0;; ++restart) {
    if (g_stop_signal.load() != 0) {  // a signal before the first run started
      log.write("end", restart, checkpointed_step(options.checkpoint_dir), causes,
                {{"outcome", "stopped"}, {"exit_code", 128 + g_stop_signal.load()}});
      return 128 + g_stop_signal.load();
    }
    spdlog::info("supervise: run {} (restart {} of at most {}): {}", restart + 1, restart, options.max_restarts,
                 options.command[0]);
    const Outcome outcome = run_once(options, restart);
    const int stopped_by = g_stop_signal.load();
    if (outcome.signal == 0 && outcome.exit_code == 0) {
      log.write("end", restart, kAll, causes, {{"outcome", stopped_by ? "stopped" : "success"}, {"exit_code", 0}});
      return 0;
    }
    const int64_t kept = checkpointed_step(options.checkpoint_dir);
    if (stopped_by) {
      spdlog::info("supervise: stopped by {}; the command ended with {}", signal_text(stopped_by), outcome.text());
      log.write("end", restart, kept, causes, {{"outcome", "stopped"}, {"cause", outcome.text()}, {"exit_code", outcome.status()}});
      return outcome.status();
    }
    // Bad input and a diverging run end the same way however often they run.
    if (outcome.signal == 0 && (outcome.exit_code == kExitBadInput || outcome.exit_code == kExitDiverged)) {
      const char* what = outcome.exit_code == kExitBadInput ? "bad input" : "diverged";
      spdlog::error("supervise: the command ended with exit code {} ({}); not restarting", outcome.exit_code, what);
      log.write("end", restart, kept, causes, {{"outcome", what}, {"cause", outcome.text()}, {"exit_code", outcome.exit_code}});
      return outcome.exit_code;
    }
    causes.push_back(outcome.text());
    if (restart >= options.max_restarts) {
      spdlog::error("supervise: the command failed ({}) and {} restarts are used up; giving up", outcome.text(),
                    options.max_restarts);
      log.write("end", restart, kept, causes,
                {{"outcome", "restarts exhausted"}, {"cause", outcome.text()}, {"exit_code", outcome.status()}});
      return outcome.status();
    }
    const double wait_s = backoff_before(options, restart + 1);
    spdlog::warn("supervise: the command failed ({}); restart {} of {} in {:.1f} s, resuming from step {}",
                 outcome.text(), restart + 1, options.max_restarts, wait_s, kept);
    log.write("restart", restart + 1, kept, causes, {{"cause", outcome.text()}, {"exit_code", outcome.status()}, {"backoff_s", wait_s}});
    back_off(wait_s);
    if (const int signal = g_stop_signal.load()) {
      spdlog::info("supervise: stopped by {} while waiting to restart", signal_text(signal));
      log.write("end", restart, kept, causes, {{"outcome", "stopped"}, {"exit_code", 128 + signal}});
      return 128 + signal;
    }
  }
}

}  // namespace hdp
