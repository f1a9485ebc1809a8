#pragma once
// The stacks of a frozen job taken from outside it: what `trainer supervise`
// (trainer/supervisor.h) writes before it kills a job whose heartbeat stopped.
// Such a job is frozen whole (SIGSTOP, a cgroup freezer, every thread asleep in
// the kernel), so it runs no signal handler and cannot capture its own stacks as
// the hang watchdog does (run/thread_stacks.h); a job that still runs its threads
// is caught earlier by that watchdog itself (train.hang_timeout_s, run/hang_watchdog.h).
//
// For the job's process and each of its descendants (mpirun's ranks): from /proc,
// always, every thread's name, state, wait channel, system call (number, stack
// pointer, program counter) and, where the kernel shows it (root), its kernel
// stack; and, when gdb is on PATH, every thread's user-space backtrace (gdb
// attaches under ptrace, which an ancestor may use, reads the stacks and detaches,
// leaving the process as it was), within a time limit. gdb is not a dependency of
// the build: without it the file says so and holds what /proc shows.

#include <sys/types.h>

#include <string>
#include <vector>

namespace hdp {

// The processes whose parent is `parent` (by /proc/PID/stat).
std::vector<pid_t> child_processes(pid_t parent);

// Writes the stacks of `pid` and its descendants to `file` (its directory made).
// Returns what it holds, in a few words, for a log line; a file that cannot be
// written is said there, not thrown.
std::string write_process_stacks(pid_t pid, const std::string& file, int gdb_timeout_s);

}  // namespace hdp
