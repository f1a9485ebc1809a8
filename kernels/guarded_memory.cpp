#include "kernels/guarded_memory.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>

namespace hdp::guarded {
namespace {

// The registry: a fixed table, so that the signal handler can read it without a
// lock (atomic bounds; a slot is published by storing its end last).
constexpr int kMaxRegions = 4096;
constexpr int kNameBytes = 96;

struct Region {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};  // 0: free slot
  size_t bytes = 0;
  char name[kNameBytes] = {};
};

Region g_regions[kMaxRegions];
std::mutex g_mutex;     // guards the table's writers and g_open
int g_open = 0;         // Access objects alive
bool g_handler_installed = false;
struct sigaction g_previous_handler;

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

void protect(const Region& r, int prot) {
  if (mprotect(reinterpret_cast<void*>(r.begin.load()), r.bytes, prot) != 0) {
    static const char msg[] = "guarded memory: mprotect failed\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    std::abort();
  }
}

void write_str(const char* s) { (void)!write(2, s, std::strlen(s)); }

void on_segv(int, siginfo_t* info, void*) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Region& r : g_regions) {
    const uintptr_t end = r.end.load(std::memory_order_acquire);
    if (end == 0) continue;
    const uintptr_t begin = r.begin.load(std::memory_order_relaxed);
    if (addr < begin || addr >= end) continue;
    char hex[2 + 16 + 1];
    hex[0] = '0';
    hex[1] = 'x';
    for (int i = 0; i < 16; ++i) hex[2 + i] = "0123456789abcdef"[(addr >> (60 - 4 * i)) & 0xf];
    hex[18] = '\0';
    write_str("host access to guarded device memory at ");
    write_str(hex);
    write_str(" (arena ");
    write_str(r.name[0] ? r.name : "unnamed");
    write_str("): a host-side read or write of device memory\n");
    signal(SIGABRT, SIG_DFL);
    std::abort();
  }
  // Not ours: hand over to the handler that was there before (the default one:
  // a crash) by reinstalling it; returning re-runs the faulting instruction under it.
  sigaction(SIGSEGV, &g_previous_handler, nullptr);
}

void install_handler_locked() {
  if (g_handler_installed) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous_handler);
  g_handler_installed = true;
}

Region* find_locked(uintptr_t begin) {
  for (Region& r : g_regions) {
    if (r.end.load() != 0 && r.begin.load() == begin) return &r;
  }
  return nullptr;
}

}  // namespace

void* allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t page = page_size();
  const size_t rounded = (bytes + page - 1) / page * page;
  std::lock_guard<std::mutex> lock(g_mutex);
  install_handler_locked();
  void* p = mmap(nullptr, rounded, g_open > 0 ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  for (Region& r : g_regions) {
    if (r.end.load() != 0) continue;
    r.bytes = rounded;
    r.name[0] = '\0';
    r.begin.store(reinterpret_cast<uintptr_t>(p), std::memory_order_relaxed);
    r.end.store(reinterpret_cast<uintptr_t>(p) + rounded, std::memory_order_release);
    return p;
  }
  munmap(p, rounded);
  throw std::length_error("guarded memory: more than 4096 regions");
}

void deallocate(void* region) {
  if (!region) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  Region* r = find_locked(reinterpret_cast<uintptr_t>(region));
  if (!r) {
    write_str("guarded memory: deallocate of an unknown region\n");
    std::abort();
  }
  r->end.store(0, std::memory_order_release);
  munmap(region, r->bytes);
  r->begin.store(0);
  r->bytes = 0;
}

void set_name(void* region, const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Region* r = find_locked(reinterpret_cast<uintptr_t>(region));
  if (!r) return;
  const size_t n = std::min(name.size(), static_cast<size_t>(kNameBytes - 1));
  std::memcpy(r->name, name.data(), n);
  r->name[n] = '\0';
}

bool contains(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Region& r : g_regions) {
    if (r.end.load() != 0 && a >= r.begin.load() && a < r.end.load()) return true;
  }
  return false;
}

Access::Access() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_open++ == 0) {
    for (const Region& r : g_regions) {
      if (r.end.load() != 0) protect(r, PROT_READ | PROT_WRITE);
    }
  }
}

Access::~Access() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_open == 0) {
    for (const Region& r : g_regions) {
      if (r.end.load() != 0) protect(r, PROT_NONE);
    }
  }
}

}  // namespace hdp::guarded
