#pragma once
// Helpers for tests that run the trainer binary and read what it wrote: the
// mpirun prefix, the shared demo corpus, the small model every parallel layout
// can split, per-step metrics, and exported weights. Header-only: only the test
// programs that link the trainer library (and so HDF5) include it.

#include <hdf5.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
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

// The overrides that make configs/tiny-llama.yaml a model every layout can split
// (4 layers, 4 heads over 2 KV heads, FFN 128) on short sequences, quickly.
inline std::string small_model_overrides() {
  return " --set model.hidden_size=64 --set model.num_heads=4 --set model.num_kv_heads=2"
         " --set model.ffn_hidden_size=128 --set data.max_seq_len=128 --set data.micro_batch_tokens=256"
         " --set data.global_batch_tokens=1024 --set optim.warmup_steps=2 --set train.peak_flops=1e11"
         " --set train.log_every=100 --set train.threads=1";
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
