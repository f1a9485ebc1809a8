#include "run/thread_stacks.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hdp {
namespace {

constexpr int kMaxFrames = 64;

// The one capture in flight: the thread asked, its frames, and whether it answered.
// A handler writes only when the asked thread is itself, so a late answer of a
// thread given up on cannot land in the next thread's frames unnoticed: the
// request number it read must still be the current one.
struct Capture {
  std::atomic<pid_t> tid{0};
  std::atomic<uint64_t> request{0};
  std::atomic<uint64_t> answered{0};
  void* frames[kMaxFrames];
  int count = 0;
};
Capture g_capture;

pid_t current_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

int capture_signal() { return SIGRTMIN + 4; }

// Async-signal-safe except for backtrace()'s first call, which loads libgcc;
// prepare_thread_stacks() makes that call before any handler can run.
void on_capture_signal(int) {
  const int saved_errno = errno;
  const uint64_t request = g_capture.request.load(std::memory_order_acquire);
  if (g_capture.tid.load(std::memory_order_acquire) == current_tid()) {
    g_capture.count = backtrace(g_capture.frames, kMaxFrames);
    g_capture.answered.store(request, std::memory_order_release);
  }
  errno = saved_errno;
}

std::vector<pid_t> thread_ids() {
  std::vector<pid_t> out;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') out.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
    }
    closedir(dir);
  }
  return out;
}

std::string thread_name(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

std::string executable_path() {
  char buffer[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
}

std::string demangle(const std::string& name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) return name;
  std::string s(out);
  std::free(out);
  return s;
}

std::string hex(uintptr_t value) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%lx", static_cast<unsigned long>(value));
  return text;
}

// One frame, located by dladdr: its module, the exported symbol before it (if
// any) and its offset into the module.
struct Frame {
  std::string module;
  std::string symbol;     // demangled, with "+0x.." from the symbol; empty if none
  uintptr_t offset = 0;   // from the module's load address
  bool in_executable = false;
};

Frame locate(void* address, const void* executable_base) {
  Frame f;
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fbase == nullptr) {
    f.symbol = hex(reinterpret_cast<uintptr_t>(address));
    return f;
  }
  const auto at = reinterpret_cast<uintptr_t>(address);
  f.module = info.dli_fname ? info.dli_fname : "?";
  f.offset = at - reinterpret_cast<uintptr_t>(info.dli_fbase);
  f.in_executable = info.dli_fbase == executable_base;
  if (info.dli_sname != nullptr) {
    f.symbol = demangle(info.dli_sname) + "+" + hex(at - reinterpret_cast<uintptr_t>(info.dli_saddr));
  }
  return f;
}

// addr2line's function names for offsets into the executable, in order; empty
// when it is not installed or fails.
std::vector<std::string> addr2line(const std::string& exe, const std::vector<std::string>& offsets) {
  std::vector<std::string> names;
  if (offsets.empty() || exe.empty()) return names;
  std::string command = "addr2line -C -f -e '" + exe + "'";
  for (const std::string& o : offsets) command += " " + o;
  command += " 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return names;
  std::vector<std::string> lines;
  char line[4096];
  while (std::fgets(line, sizeof(line), pipe)) {
    std::string l(line);
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
    lines.push_back(l);
  }
  ::pclose(pipe);
  if (lines.size() != 2 * offsets.size()) return names;
  for (size_t i = 0; i < offsets.size(); ++i) {
    const std::string& where = lines[2 * i + 1];
    names.push_back(lines[2 * i] + (where.rfind("??", 0) == 0 ? "" : " at " + where));
  }
  return names;
}

struct ThreadStack {
  pid_t tid = 0;
  std::string name;
  bool answered = false;
  std::vector<void*> frames;
};

}  // namespace

void prepare_thread_stacks() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[2];
    backtrace(warm, 2);
    struct sigaction action {};
    action.sa_handler = on_capture_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(capture_signal(), &action, nullptr);
  });
}

std::string thread_stacks_text() {
  prepare_thread_stacks();
  // One capture at a time in the process.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const pid_t self = current_tid(), process = ::getpid();
  std::vector<ThreadStack> stacks;
  for (pid_t tid : thread_ids()) {
    ThreadStack t;
    t.tid = tid;
    t.name = thread_name(tid);
    if (tid == self) {
      void* frames[kMaxFrames];
      const int n = backtrace(frames, kMaxFrames);
      t.frames.assign(frames, frames + n);
      t.answered = true;
    } else {
      const uint64_t request = g_capture.request.load() + 1;
      g_capture.request.store(request, std::memory_order_release);
      g_capture.tid.store(tid, std::memory_order_release);
      if (::syscall(SYS_tgkill, process, tid, capture_signal()) == 0) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
        while (g_capture.answered.load(std::memory_order_acquire) != request &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      g_capture.tid.store(0, std::memory_order_release);
      if (g_capture.answered.load(std::memory_order_acquire) == request) {
        t.frames.assign(g_capture.frames, g_capture.frames + g_capture.count);
        t.answered = true;
      }
    }
    stacks.push_back(std::move(t));
  }

  // Symbolise: dladdr for every frame (exported symbols of shared libraries),
  // addr2line for the executable's (it also knows functions in anonymous
  // namespaces). A return address points after its call: look up the byte before.
  Dl_info self_info{};
  dladdr(reinterpret_cast<void*>(&on_capture_signal), &self_info);
  std::string exe = executable_path();
  std::vector<std::vector<Frame>> located(stacks.size());
  std::vector<std::string> exe_offsets;
  for (size_t i = 0; i < stacks.size(); ++i) {
    for (void* address : stacks[i].frames) {
      located[i].push_back(locate(address, self_info.dli_fbase));
      const Frame& f = located[i].back();
      if (f.in_executable && f.symbol.empty()) exe_offsets.push_back(hex(f.offset - 1));
    }
  }
  const std::vector<std::string> exe_names = addr2line(exe, exe_offsets);
  std::map<std::string, std::string> by_offset;
  for (size_t k = 0; k < exe_names.size(); ++k) by_offset[exe_offsets[k]] = exe_names[k];

  std::string out;
  for (size_t i = 0; i < stacks.size(); ++i) {
    const ThreadStack& t = stacks[i];
    out += "thread " + std::to_string(t.tid) + " (" + t.name + ")" + (t.tid == process ? " [main]" : "") +
           (t.tid == self ? " [watchdog, this dump]" : "") + ":\n";
    if (!t.answered) {
      out += "  (did not answer the capture signal within 0.5 s)\n";
      continue;
    }
    for (size_t k = 0; k < located[i].size(); ++k) {
      const Frame& f = located[i][k];
      std::string text = f.symbol;
      if (text.empty()) {
        auto it = f.in_executable ? by_offset.find(hex(f.offset - 1)) : by_offset.end();
        text = it != by_offset.end() && it->second.rfind("??", 0) != 0 ? it->second : "+" + hex(f.offset);
      }
      const size_t slash = f.module.rfind('/');
      out += "  #" + std::to_string(k) + " " + text + " in " +
             (slash == std::string::npos ? f.module : f.module.substr(slash + 1)) + "\n";
    }
  }
  return out;
}

}  // namespace hdp
