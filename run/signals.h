#pragma once
// Stopping a run gracefully on a signal. Preemption and cancellation (Slurm's
// scancel and preemption send SIGTERM to every task, Ctrl-C sends SIGINT) should
// cost at most the step in flight, not everything since the last periodic
// checkpoint: the first signal only sets a flag, the training loop agrees on it
// across the ranks at the next step boundary, writes a checkpoint and returns
// (ByteRobust, ByteDance 2025: a job stopped on purpose should be resumable
// from where it stopped). A second signal ends the process at once.
//
// SIGUSR1 does the same because OpenMPI's mpirun forwards SIGUSR1 to every rank
// unchanged, whereas it turns SIGTERM and SIGINT into killing the job (SIGTERM to
// the ranks, SIGKILL one second later).

namespace hdp {

// Installs the handlers of SIGTERM, SIGINT and SIGUSR1 for this process. `announce`:
// the first signal writes one line to stderr (one rank of a job says it, not all).
// The first signal is only recorded (stop_signal()); a second one of any of them
// writes a line and exits at once with 128 + its number, without a checkpoint.
void install_stop_handlers(bool announce);

// The first stop signal received, 0 if none.
int stop_signal();

// "SIGTERM", "SIGINT", "SIGUSR1", or "a signal" for any other.
const char* signal_name(int signal);

}  // namespace hdp
