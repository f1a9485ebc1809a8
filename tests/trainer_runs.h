#pragma once
// Helpers for tests that run the trainer binary and read what it wrote: the
// mpirun prefix, the shared demo corpus, the small model every parallel layout
// can split, per-step metrics, and exported weights. Header-only: only the test
// programs that link the trainer library (and so HDF5) include it.

#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <stdexcept>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "data/hdf5_lock.h"
#include "data/hdf5_util.h"
#include "test_util.h"

namespace hdp::testing {

// The command prefix that starts `ranks` trainer processes: root in CI containers,
// more ranks than cores everywhere.
inline std::string mpirun(int ranks) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  return std::string(HDP_MPIEXEC) + " --oversubscribe -np " + std::to_string(ranks) + " " + HDP_TRAINER_BINARY;
}

// The demo corpus with short documents (600 of at most 600 bytes), written once per test process.
inline const std::string& small_corpus() {
  static const std::string path = [] {
    const std::string dir = scratch_dir("small-corpus-" + std::to_string(getpid()));
    auto r = run_trainer("make-corpus --output " + dir + "/corpus.h5 --documents 600 --max-length 600");
    if (r.exit_code != 0) throw std::runtime_error("make-corpus failed: " + r.output);
    return dir + "/corpus.h5";
  }();
  return path;
}

// A corpus with documents longer than a micro-batch (400 of up to 6000 bytes), for
// rings of hybrid-data-parallel ranks; written once per test process.
inline const std::string& long_corpus() {
  static const std::string path = [] {
    const std::string dir = scratch_dir("long-corpus-" + std::to_string(getpid()));
    auto r = run_trainer("make-corpus --output " + dir + "/long.h5 --documents 400 --max-length 6000 --seed 7");
    if (r.exit_code != 0) throw std::runtime_error("make-corpus failed: " + r.output);
    return dir + "/long.h5";
  }();
  return path;
}

// The overrides that make configs/tiny-llama.yaml a model every layout can split
// (4 layers, 4 heads over 2 KV heads, FFN 128) on short sequences, quickly.
inline std::string small_model_overrides() {
  return " --set model.hidden_size=64 --set model.num_heads=4 --set model.num_kv_heads=2"
         " --set model.ffn_hidden_size=128 --set data.max_seq_len=128 --set data.micro_batch_tokens=256"
         " --set data.global_batch_tokens=1024 --set optim.warmup_steps=2 --set train.peak_flops=1e11"
         " --set train.log_every=100 --set train.threads=1";
}

// A 5-step run of configs/tiny-llama.yaml on the small corpus with
// small_model_overrides under mpirun of tp x pp x hdp ranks (and loader_servers more,
// the remote loader's, when above 0), in `dir`, with `settings` after the layout; its
// output. Throws naming `what` when the run fails.
inline std::string train_five_steps(const std::string& dir, int tp, int pp, int hdp, const std::string& settings,
                                    const std::string& what, int loader_servers = 0) {
  const std::string args = "train " + std::string(HDP_SOURCE_DIR) + "/configs/tiny-llama.yaml --set data.path=" +
                           small_corpus() + " --set train.run_dir=" + dir + " --set train.checkpoint_dir=" + dir +
                           "/ckpt --set train.steps=5" + small_model_overrides() + " --set parallel.tp=" +
                           std::to_string(tp) + " --set parallel.pp=" + std::to_string(pp) + " --set parallel.hdp=" +
                           std::to_string(hdp) + " " + settings +
                           (loader_servers > 0 ? " --set loader.mode=remote --set loader.servers=" +
                                                     std::to_string(loader_servers)
                                               : std::string());
  auto r = run_command(mpirun(tp * pp * hdp + loader_servers) + " " + args);
  if (r.exit_code != 0) throw std::runtime_error(what + " run failed: " + r.output);
  return r.output;
}

// The value of `key` at every step of RUN_DIR/metrics.jsonl.
inline std::vector<double> metric_values(const std::string& run_dir, const std::string& key) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<double> out;
  std::smatch m;
  const std::regex pattern("\"" + key + "\": ([-0-9.eE+]+)");
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, pattern)) out.push_back(std::stod(m[1]));
  }
  return out;
}

// A command run in the background with its output in a file, for tests that
// signal a run while it trains. The destructor kills it if it is still running.
class BackgroundRun {
 public:
  BackgroundRun(const std::string& command, const std::string& log) {
    // `exec`: the pid is the command's own (the trainer or mpirun), not a shell's.
    const std::string script = "exec " + command + " > " + log + " 2>&1";
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    if (pid_ < 0) throw std::runtime_error("fork failed");
  }
  BackgroundRun(const BackgroundRun&) = delete;
  BackgroundRun& operator=(const BackgroundRun&) = delete;
  ~BackgroundRun() {
    if (running()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  bool running() { return exit_code_ == kRunning && !reap(WNOHANG); }
  // The processes it started (mpirun's ranks).
  std::vector<pid_t> children() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(pid_) + "/children");
    std::vector<pid_t> out;
    for (pid_t p; in >> p;) out.push_back(p);
    return out;
  }
  // The exit code, -1 when a signal ended it, or -2 when it was still running
  // after timeout_s (then it is killed). The timeout only keeps a broken run from
  // hanging the test.
  int wait(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (running()) {
      if (std::chrono::steady_clock::now() > end) {
        kill(pid_, SIGKILL);
        reap(0);
        return -2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exit_code_;
  }

 private:
  static constexpr int kRunning = -100;
  bool reap(int flags) {
    int status = 0;
    if (waitpid(pid_, &status, flags) != pid_) return false;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return true;
  }
  pid_t pid_ = -1;
  int exit_code_ = kRunning;
};

// Lines in RUN_DIR/metrics.jsonl (one per step run).
inline size_t metric_line_count(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// Waits until `run` has written at least `steps` metrics lines; false if it ended
// first or timeout_s passed (a generous bound against hangs, not a measurement).
inline bool wait_for_steps(BackgroundRun& run, const std::string& run_dir, size_t steps, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (metric_line_count(run_dir) < steps) {
    if (!run.running() || std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The whole text of a file ("" if it cannot be read).
inline std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every dataset of an exported checkpoint (whole tensors under Hugging Face names).
inline std::map<std::string, std::vector<float>> read_weights(const std::string& path) {
  Hdf5Lock lock;
  H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path);
  std::map<std::string, std::vector<float>> out;
  H5Literate(
      file.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
        H5O_info_t info;
        H5Oget_info_by_name2(group, name, &info, H5O_INFO_BASIC, H5P_DEFAULT);
        if (info.type != H5O_TYPE_DATASET) return 0;
        H5Handle d = h5_dataset(H5Dopen2(group, name, H5P_DEFAULT), name);
        H5Handle space = h5_space(H5Dget_space(d.get()), name);
        std::vector<float> values(H5Sget_simple_extent_npoints(space.get()));
        H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
        (*static_cast<std::map<std::string, std::vector<float>>*>(data))[name] = std::move(values);
        return 0;
      },
      &out);
  return out;
}

}  // namespace hdp::testing
