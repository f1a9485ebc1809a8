#pragma once
// The stacks of every thread of this process, symbolised, as text: what the hang
// watchdog (run/hang_watchdog.h) writes to RUN_DIR/hang/rank-N.txt. Comparing
// the stacks of all ranks of a hung job is how ByteRobust (ByteDance, 2025) finds
// the faulty machine in minutes instead of hours.
//
// How: each other thread is sent a real-time signal whose handler records its own
// return addresses (glibc backtrace()); the caller waits for each in turn, up to
// half a second (a thread that does not answer is listed as such). Addresses in
// shared libraries are named by dladdr (their exported symbols); those
// in the executable by addr2line (binutils) when it is installed, which also
// knows the functions in anonymous namespaces, else left as offsets.

#include <string>

namespace hdp {

// Installs the capture signal's handler and loads what backtrace() needs, so that
// a later capture allocates nothing inside the handler. Call once at start-up;
// thread_stacks_text() calls it too.
void prepare_thread_stacks();

// "thread 1234 (trainer) [main]:\n  #0 ...\n" for every thread of the process.
// Call from a thread that is not stuck (the watchdog's).
std::string thread_stacks_text();

}  // namespace hdp
