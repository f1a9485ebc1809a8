#include "trainer/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>

#include "data/hdf5_lock.h"
#include "data/hdf5_util.h"
#include "kernels/ops.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kFormatVersion = 1;
const char* const kMomentGroups[2] = {"/optimizer/exp_avg", "/optimizer/exp_avg_sq"};

// 64-bit FNV-style hash over 8-byte words (plus the tail), fast enough for GBs.
uint64_t checksum(const float* data, size_t count) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  const size_t n = count * sizeof(float);
  uint64_t h = 0xcbf29ce484222325ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

H5Handle h5_group(hid_t id, const std::string& what) { return {h5check(id, what), H5Gclose}; }

void write_tensor(hid_t file, const std::string& name, const std::vector<int64_t>& shape, const Tensor& t) {
  std::vector<float> host(t.numel());
  copy(Tensor(host.data(), {t.numel()}, Device::CPU), t);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Handle space = h5_space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), name);
  H5Handle dset = h5_dataset(
      H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name);
  h5check_status(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()), name);
  h5_write_attr_u64(dset.get(), "checksum", checksum(host.data(), host.size()));
}

// Reads a tensor written by write_tensor into `t`, checking shape and checksum.
void read_tensor(hid_t file, const std::string& path, const std::string& name, const std::vector<int64_t>& shape,
                 Tensor t) {
  if (!h5check_tri(H5Lexists(file, name.c_str(), H5P_DEFAULT), name)) {
    throw CheckpointError(path + ": tensor '" + name + "' is missing");
  }
  H5Handle dset = h5_dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), name);
  H5Handle space = h5_space(H5Dget_space(dset.get()), name);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(std::max(rank, 0));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  if (!std::equal(dims.begin(), dims.end(), shape.begin(), shape.end(),
                  [](hsize_t a, int64_t b) { return static_cast<int64_t>(a) == b; })) {
    std::string got, want;
    for (hsize_t d : dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    throw CheckpointError(path + ": tensor '" + name + "' has shape [" + got + "], the model needs [" + want + "]");
  }
  std::vector<float> host(t.numel());
  h5check_status(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()), name);
  if (!h5_has_attr(dset.get(), "checksum") || h5_read_attr_uint(dset.get(), "checksum") != checksum(host.data(), host.size())) {
    throw CheckpointError(path + ": tensor '" + name + "' fails its checksum; the file is corrupted");
  }
  copy(t, Tensor(host.data(), {t.numel()}, Device::CPU));
}

Tensor slice(const Tensor& flat, const ParameterInfo& p) {
  return Tensor(flat.data + p.offset, {p.numel}, flat.device);
}

std::optional<int64_t> step_of(const fs::path& file) {
  static const std::regex pattern(R"(step-(\d+)\.h5)");
  std::smatch m;
  const std::string name = file.filename().string();
  if (!std::regex_match(name, m, pattern)) return std::nullopt;
  return std::stoll(m[1]);
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (auto step = step_of(entry.path()); step && entry.is_regular_file()) found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::string checkpoint_path(const std::string& checkpoint_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld.h5", static_cast<long long>(step));
  return (fs::path(checkpoint_dir) / name).string();
}

std::string save_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model, const AdamW& optimizer,
                            const TrainingProgress& progress, const std::string& config_yaml, int64_t keep) {
  fs::create_directories(checkpoint_dir);
  const std::string path = checkpoint_path(checkpoint_dir, progress.step);
  const std::string tmp = path + ".tmp";
  try {
    Hdf5Lock lock;
    H5Handle file = h5_file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "create " + tmp);
    h5_write_attr_u64(file.get(), "format_version", kFormatVersion);
    h5_write_attr_u64(file.get(), "step", static_cast<uint64_t>(progress.step));
    h5_write_attr_u64(file.get(), "sampler_epoch", progress.sampler.epoch);
    h5_write_attr_u64(file.get(), "sampler_cursor", static_cast<uint64_t>(progress.sampler.cursor));
    h5_write_attr_u64(file.get(), "sampler_document_offset", static_cast<uint64_t>(progress.sampler.document_offset));
    h5_write_attr_u64(file.get(), "train_seed", progress.train_seed);
    h5_write_attr_u64(file.get(), "data_seed", progress.data_seed);
    h5_write_attr_string(file.get(), "config", config_yaml);
    for (const ParameterInfo& p : model.parameters()) write_tensor(file.get(), p.name, p.shape, model.parameter_tensor(p));
    H5Handle opt = h5_group(H5Gcreate2(file.get(), "/optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "optimizer");
    const Tensor moments[2] = {optimizer.exp_avg(), optimizer.exp_avg_sq()};
    for (int i = 0; i < 2; ++i) {
      H5Handle group = h5_group(H5Gcreate2(file.get(), kMomentGroups[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                kMomentGroups[i]);
      for (const ParameterInfo& p : model.parameters()) {
        write_tensor(group.get(), p.name, p.shape, slice(moments[i], p));
      }
    }
    opt.reset();
    file.close("close " + tmp);
  } catch (const Hdf5Error& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw CheckpointError("writing checkpoint " + path + ": " + e.what());
  }
  fs::rename(tmp, path);

  auto all = list_checkpoints(checkpoint_dir);
  const int64_t excess = static_cast<int64_t>(all.size()) - std::max<int64_t>(keep, 1);
  for (int64_t i = 0; i < excess; ++i) fs::remove(all[i].second);
  return path;
}

std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir) {
  auto all = list_checkpoints(checkpoint_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

TrainingProgress load_checkpoint(const std::string& path, LlamaModel& model, AdamW* optimizer) {
  if (!fs::exists(path)) throw CheckpointError(path + ": checkpoint file does not exist");
  TrainingProgress progress;
  try {
    Hdf5Lock lock;
    H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open " + path);
    const uint64_t version = h5_read_attr_uint(file.get(), "format_version");
    if (version != kFormatVersion) {
      throw CheckpointError(path + ": checkpoint format_version " + std::to_string(version) + ", this build reads " +
                            std::to_string(kFormatVersion));
    }
    progress.step = static_cast<int64_t>(h5_read_attr_uint(file.get(), "step"));
    progress.sampler.epoch = h5_read_attr_uint(file.get(), "sampler_epoch");
    progress.sampler.cursor = static_cast<int64_t>(h5_read_attr_uint(file.get(), "sampler_cursor"));
    progress.sampler.document_offset = static_cast<int64_t>(h5_read_attr_uint(file.get(), "sampler_document_offset"));
    progress.train_seed = h5_read_attr_uint(file.get(), "train_seed");
    progress.data_seed = h5_read_attr_uint(file.get(), "data_seed");
    for (const ParameterInfo& p : model.parameters()) {
      read_tensor(file.get(), path, p.name, p.shape, model.parameter_tensor(p));
    }
    if (optimizer) {
      const Tensor moments[2] = {optimizer->exp_avg(), optimizer->exp_avg_sq()};
      for (int i = 0; i < 2; ++i) {
        for (const ParameterInfo& p : model.parameters()) {
          read_tensor(file.get(), path, std::string(kMomentGroups[i]) + "/" + p.name, p.shape, slice(moments[i], p));
        }
      }
    }
  } catch (const Hdf5Error& e) {
    throw CheckpointError(path + ": not a readable checkpoint (truncated or corrupted?): " + e.what());
  }
  return progress;
}

std::string checkpoint_config(const std::string& path) {
  try {
    Hdf5Lock lock;
    H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open " + path);
    return h5_read_attr_string(file.get(), "config");
  } catch (const Hdf5Error& e) {
    throw CheckpointError(path + ": not a readable checkpoint: " + e.what());
  }
}

}  // namespace hdp
