#include "parallel/progress.h"

#include <atomic>

#include "parallel/device_ops.h"
#include "parallel/op_tracer.h"

namespace hdp::progress {
namespace {

// One writer (the watched thread), any number of readers: a sequence lock. The
// sequence is odd while the writer updates the fields; a reader retries until it
// read them between two equal even values. Every field is an atomic, so a torn
// read is only ever retried, never undefined.
std::atomic<uint64_t> g_sequence{0};
std::atomic<const char*> g_context{"start-up"};
std::atomic<const char*> g_op{nullptr};
std::atomic<const char*> g_group{nullptr};
std::atomic<int> g_peer{-1};
std::atomic<int64_t> g_step{0};

thread_local bool t_watched = false;

template <class Fn>
void write(Fn&& fn) {
  const uint64_t s = g_sequence.load(std::memory_order_relaxed);
  g_sequence.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  fn();
  g_sequence.store(s + 2, std::memory_order_release);
}

}  // namespace

void watch_this_thread() { t_watched = true; }

void set_step(int64_t step) {
  if (!t_watched) return;
  write([&] { g_step.store(step, std::memory_order_relaxed); });
}

Context::Context(const char* what) {
  if (!t_watched) return;
  active_ = true;
  previous_ = g_context.load(std::memory_order_relaxed);
  write([&] { g_context.store(what, std::memory_order_relaxed); });
}

Context::~Context() {
  if (!active_) return;
  write([&] { g_context.store(previous_, std::memory_order_relaxed); });
}

Waiting::Waiting(const char* op, const char* group, int peer) {
  if (!t_watched) return;
  active_ = true;
  write([&] {
    g_op.store(op, std::memory_order_relaxed);
    g_group.store(group, std::memory_order_relaxed);
    g_peer.store(peer, std::memory_order_relaxed);
  });
}

Waiting::~Waiting() {
  if (!active_) return;
  write([&] { g_op.store(nullptr, std::memory_order_relaxed); });
}

Snapshot snapshot() {
  for (;;) {
    const uint64_t s1 = g_sequence.load(std::memory_order_acquire);
    if (s1 % 2 == 1) continue;
    const char* context = g_context.load(std::memory_order_relaxed);
    const char* op = g_op.load(std::memory_order_relaxed);
    const char* group = g_group.load(std::memory_order_relaxed);
    const int peer = g_peer.load(std::memory_order_relaxed);
    const int64_t step = g_step.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (g_sequence.load(std::memory_order_relaxed) != s1) continue;
    Snapshot out;
    out.counter = s1 / 2;
    out.step = step;
    out.phase = context ? context : "";
    if (op) {
      out.waiting = true;
      out.phase += std::string(": ") + (group ? group : "?") + " " + op;
      if (peer >= 0) out.phase += " rank " + std::to_string(peer);
    }
    if (const auto oldest = device_ops().oldest_unfinished(OpTracer::local_us())) {
      out.device_op = describe(oldest->op);
      out.device_op_age_s = oldest->age_s;
      out.phase += " (device: " + out.device_op + " unfinished)";
    }
    return out;
  }
}

}  // namespace hdp::progress
