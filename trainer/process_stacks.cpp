#include "trainer/process_stacks.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace hdp {
namespace {

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The numeric entries of a /proc directory (processes, or a process's threads).
std::vector<pid_t> numeric_entries(const std::string& dir) {
  std::vector<pid_t> found;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return found;
  while (const dirent* entry = ::readdir(d)) {
    char* end = nullptr;
    const long id = std::strtol(entry->d_name, &end, 10);
    if (*end == '\0' && id > 0) found.push_back(static_cast<pid_t>(id));
  }
  ::closedir(d);
  return found;
}

// /proc/.../stat after the command name: "S 1234 ..." (state, parent, ...).
bool stat_fields(const std::string& stat_path, char* state, long* parent) {
  const std::string text = file_text(stat_path);
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
  return paren != std::string::npos && std::sscanf(text.c_str() + paren + 1, " %c %ld", state, parent) == 2;
}

const char* state_name(char state) {
  switch (state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "uninterruptible sleep";
    case 'T': return "stopped";
    case 't': return "traced";
    case 'Z': return "zombie";
    default: return "other";
  }
}

// The arguments of `pid`, space-separated (/proc/PID/cmdline separates them with NULs).
std::string command_line(pid_t pid) {
  std::string text = file_text("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : text) c = c == '\0' ? ' ' : c;
  return trimmed(text);
}

// `pid` and its descendants, parents first.
std::vector<pid_t> process_tree(pid_t pid) {
  std::vector<pid_t> tree = {pid};
  for (size_t i = 0; i < tree.size(); ++i) {
    for (pid_t child : child_processes(tree[i])) tree.push_back(child);
  }
  return tree;
}

// What /proc tells of each thread of `pid`.
std::string proc_threads(pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid);
  std::ostringstream out;
  for (pid_t tid : numeric_entries(base + "/task")) {
    const std::string task = base + "/task/" + std::to_string(tid);
    char state = '?';
    long parent = 0;
    stat_fields(task + "/stat", &state, &parent);
    out << "thread " << tid << " (" << trimmed(file_text(task + "/comm")) << "): state " << state << " ("
        << state_name(state) << "), wait channel " << trimmed(file_text(task + "/wchan"))
        << ", syscall " << trimmed(file_text(task + "/syscall")) << "\n";
    const std::string kernel = trimmed(file_text(task + "/stack"));
    if (!kernel.empty()) out << "  kernel stack:\n" << kernel << "\n";
  }
  return out.str();
}

// The directory on PATH that holds an executable `name`, or "".
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// gdb's backtraces of every thread of `pid` (its output, errors included).
std::string gdb_backtraces(const std::string& gdb, pid_t pid, int timeout_s) {
  const std::string command = "timeout -s KILL " + std::to_string(timeout_s) + " " + gdb + " -p " +
                              std::to_string(pid) + " -batch -nx -ex 'thread apply all bt' </dev/null 2>&1";
  std::string output;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
    ::pclose(pipe);
  }
  return output;
}

}  // namespace

std::vector<pid_t> child_processes(pid_t parent) {
  std::vector<pid_t> found;
  for (pid_t pid : numeric_entries("/proc")) {
    char state = 0;
    long ppid = 0;
    if (stat_fields("/proc/" + std::to_string(pid) + "/stat", &state, &ppid) && ppid == parent) found.push_back(pid);
  }
  return found;
}

std::string write_process_stacks(pid_t pid, const std::string& file, int gdb_timeout_s) {
  const std::vector<pid_t> tree = process_tree(pid);
  const std::string gdb = on_path("gdb");
  std::ostringstream out;
  for (pid_t p : tree) {
    out << "process " << p << " (" << trimmed(file_text("/proc/" + std::to_string(p) + "/comm")) << "): "
        << command_line(p) << "\n"
        << proc_threads(p);
    if (!gdb.empty()) out << "gdb backtraces:\n" << gdb_backtraces(gdb, p, gdb_timeout_s);
    out << "\n";
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  std::ofstream(file) << out.str();
  if (!std::ifstream(file)) return "no stacks: " + file + " cannot be written";
  const std::string what = std::to_string(tree.size()) + " process(es)";
  return gdb.empty() ? "/proc thread states of " + what + " (no gdb on PATH for user-space frames)"
                     : "gdb backtraces and /proc thread states of " + what;
}

}  // namespace hdp
