#include "checkpoint/export.h"

#include <filesystem>

#include "checkpoint/format.h"
#include "data/hdf5_lock.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

// Every weight of the checkpoint behind `reader` as a whole tensor, in the order
// the parts list them (the caller holds Hdf5Lock).
void for_each_whole_tensor(CheckpointReader& reader,
                           const std::function<void(const CheckpointTensorInfo&, std::vector<float>&&)>& fn) {
  for (const std::string& name : reader.tensor_names()) {
    const TensorPieces& t = *reader.find(name);
    if (t.weights.empty()) continue;
    const std::vector<int64_t>& shape = t.weights.front().slice.global_shape;
    reader.check_shape(name, t, shape);
    Slice whole;
    whole.global_shape = shape;
    whole.end = whole.global_rows();
    const Box box = whole.box();
    auto w = reader.assemble(name, t.weights, box);
    reader.check_covered(w, box, 0, box.area(), "tensor '" + name + "'");
    fn(CheckpointTensorInfo{name, shape}, std::move(w.data));
  }
}

}  // namespace

CheckpointContents checkpoint_contents(const std::string& path) {
  Hdf5Lock lock;
  CheckpointReader reader(path);
  CheckpointContents contents;
  contents.progress = reader.manifest().progress;
  contents.config = reader.manifest().config;
  for (const std::string& name : reader.tensor_names()) {
    const TensorPieces& t = *reader.find(name);
    if (t.weights.empty()) continue;
    reader.check_shape(name, t, t.weights.front().slice.global_shape);
    contents.tensors.push_back({name, t.weights.front().slice.global_shape});
  }
  return contents;
}

void read_whole_tensors(const std::string& path,
                        const std::function<void(const CheckpointTensorInfo&, std::vector<float>&&)>& fn) {
  Hdf5Lock lock;
  CheckpointReader reader(path);
  for_each_whole_tensor(reader, fn);
}

void export_checkpoint(const std::string& path, const std::string& output) {
  const std::string tmp = output + ".tmp";
  Hdf5Lock lock;
  CheckpointReader reader(path);
  try {
    H5Handle out = h5_file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "creating " + tmp);
    h5_write_attr_u64(out.get(), "step", static_cast<uint64_t>(reader.manifest().progress.step));
    h5_write_attr_string(out.get(), "config", reader.manifest().config);
    for_each_whole_tensor(reader, [&](const CheckpointTensorInfo& t, std::vector<float>&& data) {
      write_dataset(out.get(), t.name, t.shape, data.data(), data.size());
    });
    out.close("closing " + tmp);
  } catch (const Hdf5Error& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw CheckpointError(output + ": writing the export failed: " + e.what());
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, output, ec);
  if (ec) throw CheckpointError(output + ": renaming " + tmp + " failed: " + ec.message());
}

}  // namespace hdp
