#include "run/signals.h"

#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

namespace hdp {
namespace {

// Lock-free, so reading and writing them in a signal handler is safe. The first
// signal claims g_first_signal, announces itself, and only then publishes
// g_stop_signal: whoever sees the stop has the announcement on stderr already (a
// process that exits at once on the stop lost it otherwise).
std::atomic<int> g_first_signal{0};
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<bool> g_announce{false};

// Only async-signal-safe calls in the handler: write(2) and _exit(2).
void write_stderr(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

void on_stop_signal(int signal) {
  int none = 0;
  if (g_first_signal.compare_exchange_strong(none, signal)) {
    if (g_announce.load()) {
      write_stderr("trainer: ");
      write_stderr(signal_name(signal));
      write_stderr(" received: finishing the current step, writing a checkpoint, then stopping "
                   "(a second signal stops at once, without a checkpoint)\n");
    }
    g_stop_signal.store(signal);
    return;
  }
  write_stderr("trainer: ");
  write_stderr(signal_name(signal));
  write_stderr(" received a second time: exiting at once, without a checkpoint\n");
  ::_exit(128 + signal);
}

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&set, signal);
  return set;
}

}  // namespace

void install_stop_handlers(bool announce) {
  g_announce.store(announce);
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls (file reads in the prefetch thread, MPI's
  // polling): the handler only records the signal.
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) sigaction(signal, &action, nullptr);
  // The threads that compute never take these signals: a signal interrupting oneDNN's
  // AVX-512 GEMM kernels corrupted the heap (measured on AMD Zen 4: about one run in
  // five stopped by SIGTERM aborted in a later GEMM's free(), never without a signal,
  // never on AVX2 machines). They are blocked here in this thread and in OpenMP's
  // workers, and so in every thread created from now on; a thread of their own waits
  // for them, and threads that existed before (MPI's) may still run the handler.
  static std::once_flag once;
  std::call_once(once, [] {
    const sigset_t set = stop_signals();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
#pragma omp parallel
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
      for (;;) {
        int signal = 0;
        if (sigwait(&set, &signal) == 0) on_stop_signal(signal);
      }
    }).detach();
  });
}

int stop_signal() { return g_stop_signal.load(); }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace hdp
