#include "checkpoint/format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>

#include "data/hdf5_lock.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

// The FNV-style step of the checksum: one 8-byte word into a 64-bit state.
uint64_t mix(uint64_t h, uint64_t w) {
  h = (h ^ w) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

// The checksum of a dataset as format_version `version` defines it
// (docs/checkpoint-format.md, "Checksum"). Version 2 is one chain of
// multiplications over the 8-byte words, about 1.6 GB/s (0.4 s of a core for
// configs/bench-llama.yaml's 641 MB, every background write). Version 3 runs four
// chains over interleaved words, which the core overlaps: about 4x as fast.
uint64_t checksum(const float* data, size_t count, int64_t version) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  const size_t n = count * sizeof(float);
  const uint64_t seed = 0xcbf29ce484222325ull ^ n;
  auto word = [bytes](size_t at) {
    uint64_t w;
    std::memcpy(&w, bytes + at, 8);
    return w;
  };
  uint64_t h = seed;
  size_t i = 0;
  if (version >= 3) {
    uint64_t lane[4] = {seed, seed + 1, seed + 2, seed + 3};
    for (; i + 32 <= n; i += 32) {
      for (int l = 0; l < 4; ++l) lane[l] = mix(lane[l], word(i + 8 * l));
    }
    h = lane[0];
    for (int l = 1; l < 4; ++l) h = mix(h, lane[l]);
  }
  for (; i + 8 <= n; i += 8) h = mix(h, word(i));
  for (; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

H5Handle h5_group(hid_t id, const std::string& what) { return {h5check(id, what), H5Gclose}; }

void write_attr_i64(hid_t obj, const char* name, std::span<const int64_t> values, bool scalar) {
  const std::string what = std::string("writing attribute '") + name + "'";
  const hsize_t n = values.size();
  H5Handle space = h5_space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), what);
  H5Handle attr = h5_attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), what);
  h5check_status(H5Awrite(attr.get(), H5T_NATIVE_INT64, values.data()), what);
  attr.close(what);
}
void write_attr_i64(hid_t obj, const char* name, int64_t value) {
  write_attr_i64(obj, name, std::span<const int64_t>(&value, 1), true);
}

std::vector<int64_t> read_attr_i64s(hid_t obj, const char* name) {
  const std::string what = std::string("attribute '") + name + "'";
  if (!h5_has_attr(obj, name)) throw Hdf5Error(what + " is missing");
  H5Handle attr = h5_attr(H5Aopen(obj, name, H5P_DEFAULT), "opening " + what);
  H5Handle type = h5_type(H5Aget_type(attr.get()), what);
  if (H5Tget_class(type.get()) != H5T_INTEGER) throw Hdf5Error(what + " is not an integer");
  H5Handle space = h5_space(H5Aget_space(attr.get()), what);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 1 || n > 64) throw Hdf5Error(what + " has " + std::to_string(n) + " values");
  std::vector<int64_t> values(static_cast<size_t>(n));
  h5check_status(H5Aread(attr.get(), H5T_NATIVE_INT64, values.data()), "reading " + what);
  return values;
}
int64_t read_attr_i64(hid_t obj, const char* name) {
  auto v = read_attr_i64s(obj, name);
  if (v.size() != 1) throw Hdf5Error(std::string("attribute '") + name + "' is not a single value");
  return v[0];
}

void write_slice_attrs(hid_t obj, const Slice& s) {
  write_attr_i64(obj, "global_shape", s.global_shape, false);
  write_attr_i64(obj, "shard_dim", s.shard_dim);
  write_attr_i64(obj, "shard_begin", s.begin);
  write_attr_i64(obj, "shard_end", s.end);
}

Slice read_slice_attrs(hid_t obj) {
  Slice s;
  s.global_shape = read_attr_i64s(obj, "global_shape");
  s.shard_dim = static_cast<int>(read_attr_i64(obj, "shard_dim"));
  s.begin = read_attr_i64(obj, "shard_begin");
  s.end = read_attr_i64(obj, "shard_end");
  if (s.shard_dim < 0) {
    s.begin = 0;
    s.end = s.global_rows();
  }
  return s;
}

std::vector<int64_t> dataset_dims(hid_t dset, const std::string& what) {
  H5Handle space = h5_space(H5Dget_space(dset), what);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw Hdf5Error(what + ": unreadable dataspace");
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

std::vector<std::string> link_names(hid_t group, const std::string& what) {
  H5G_info_t info;
  h5check_status(H5Gget_info(group, &info), "listing " + what);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) h5check(static_cast<hid_t>(len), "listing " + what);
    std::string name(static_cast<size_t>(len) + 1, '\0');
    h5check(static_cast<hid_t>(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                                                   name.size(), H5P_DEFAULT)),
            "listing " + what);
    name.resize(static_cast<size_t>(len));
    names.push_back(std::move(name));
  }
  return names;
}

// One copy of every weight is written: of a tp slice by the first rank of the
// data-parallel group that holds it (hdp, or for an expert under expert parallelism
// its expert-data-parallel group); of a tp-replicated tensor by tp rank 0 only;
// tied copies never.
bool writes_weights_of(const ParameterInfo& p, const CheckpointLayout& layout) {
  const GridCoords& c = layout.coords;
  const int dp_rank = p.expert ? layout.degrees.expert_dp_rank(c) : c.hdp_rank;
  return dp_rank == 0 && !p.tied_copy && (p.shard_dim >= 0 || c.tp_rank == 0);
}

}  // namespace

std::string part_name(int world_rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.h5", world_rank);
  return name;
}

bool part_holds_weights(const CheckpointLayout& layout) { return layout.degrees.expert_dp_rank(layout.coords) == 0; }

H5Handle write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& shape, const float* data,
                       size_t count) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Handle space = h5_space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), name);
  H5Handle dset = h5_dataset(
      H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name);
  h5check_status(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing " + name);
  h5_write_attr_u64(dset.get(), "checksum", checksum(data, count, kCheckpointFormatVersion));
  return dset;
}

void write_part(const std::string& file, const CheckpointSnapshot& s, const CheckpointLayout& layout,
                const std::function<void(const std::string& file)>& before_create) {
  const std::string tmp = file + ".tmp";
  const auto& params = s.parameters;
  if (before_create) before_create(tmp);
  try {
    Hdf5Lock lock;
    H5Handle f = h5_file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "creating " + tmp);
    write_attr_i64(f.get(), "format_version", kCheckpointFormatVersion);
    write_attr_i64(f.get(), "step", s.progress.step);
    write_attr_i64(f.get(), "world_rank", layout.world_rank);
    write_attr_i64(f.get(), "tp", layout.degrees.tp);
    write_attr_i64(f.get(), "pp", layout.degrees.pp);
    write_attr_i64(f.get(), "hdp", layout.degrees.hdp);
    write_attr_i64(f.get(), "tp_rank", layout.coords.tp_rank);
    write_attr_i64(f.get(), "pp_rank", layout.coords.pp_rank);
    write_attr_i64(f.get(), "hdp_rank", layout.coords.hdp_rank);

    // The moments of every rank's shard are written, once per tensor-parallel slice.
    auto writes = [&](const ParameterInfo& p) { return !p.tied_copy && (p.shard_dim >= 0 || layout.coords.tp_rank == 0); };

    if (part_holds_weights(layout)) {
      for (const ParameterInfo& p : params) {
        if (!writes_weights_of(p, layout)) continue;
        H5Handle dset = write_dataset(f.get(), p.name, p.shape, s.flat_parameters.data() + p.offset,
                                      static_cast<size_t>(p.numel));
        write_slice_attrs(dset.get(), slice_of(p));
      }
    }

    H5Handle opt = h5_group(H5Gcreate2(f.get(), "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "optimizer");
    std::map<size_t, H5Handle> groups;
    const HostBuffer* moments[2] = {&s.exp_avg, &s.exp_avg_sq};
    for (const ZeroAdamW::Segment& seg : s.segments) {
      if (seg.parameter >= params.size()) {
        throw CheckpointError(file + ": optimizer segment of parameter " + std::to_string(seg.parameter) +
                              ", the model has " + std::to_string(params.size()));
      }
      const ParameterInfo& p = params[seg.parameter];
      if (!writes(p) || seg.length <= 0) continue;
      auto it = groups.find(seg.parameter);
      if (it == groups.end()) {
        H5Handle g = h5_group(H5Gcreate2(opt.get(), p.name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                              "optimizer/" + p.name);
        write_slice_attrs(g.get(), slice_of(p));
        write_attr_i64(g.get(), "shape", p.shape, false);
        it = groups.emplace(seg.parameter, std::move(g)).first;
      }
      const int64_t start = seg.flat_offset - p.offset;
      for (int i = 0; i < 2; ++i) {
        const std::string name = std::string(kMomentNames[i]) + "." + std::to_string(start);
        H5Handle dset = write_dataset(it->second.get(), name, {seg.length}, moments[i]->data() + seg.state_offset,
                                      static_cast<size_t>(seg.length));
        write_attr_i64(dset.get(), "start", start);
      }
    }
    groups.clear();
    opt.close("closing optimizer group");
    f.close("closing " + tmp);
  } catch (const Hdf5Error& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw CheckpointError(file + ": writing the checkpoint part failed: " + e.what());
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) throw CheckpointError(file + ": renaming " + tmp + " failed: " + ec.message());
}

// ---------------------------------------------------------------------------
// Reading.

template <class Fn>
void CheckpointReader::in_file(size_t part, Fn&& fn) {
  try {
    fn();
  } catch (const Hdf5Error& e) {
    throw CheckpointError(files_[part] + ": not a readable checkpoint part (truncated or corrupted?): " +
                          e.what());
  }
}

hid_t CheckpointReader::file(size_t part) {
  if (!handles_[part]) {
    handles_[part] = h5_file(H5Fopen(files_[part].c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "opening");
  }
  return handles_[part].get();
}

TensorPieces& CheckpointReader::entry(const std::string& name) {
  auto [it, inserted] = index_.try_emplace(name);
  if (inserted) order_.push_back(name);
  return it->second;
}

void CheckpointReader::bad(size_t part, const std::string& msg) const {
  throw CheckpointError(files_[part] + ": " + msg);
}

CheckpointReader::CheckpointReader(const std::string& path) : path_(path), manifest_(read_manifest(path)) {
  for (const std::string& part : manifest_.parts) {
    const std::string file = (fs::path(path) / part).string();
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      throw CheckpointError(file + ": checkpoint part is missing (listed in " + kManifestFile + ")");
    }
    files_.push_back(file);
  }
  handles_.resize(files_.size());
  versions_.resize(files_.size());
  for (size_t i = 0; i < files_.size(); ++i) in_file(i, [&] { index_part(i); });
}

const TensorPieces* CheckpointReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &it->second;
}

void CheckpointReader::check_shape(const std::string& name, const TensorPieces& t, const std::vector<int64_t>& global_shape) const {
  auto check = [&](const Piece& p) {
    if (p.slice.global_shape != global_shape) {
      throw CheckpointError(files_[p.part] + ": tensor '" + name + "' has shape " +
                            shape_text(p.slice.global_shape) + " in the checkpoint, the model needs " +
                            shape_text(global_shape));
    }
  };
  for (const Piece& p : t.weights) check(p);
  for (const auto& list : t.moments) {
    for (const Piece& p : list) check(p);
  }
}

CheckpointReader::Assembled CheckpointReader::assemble(const std::string& name, const std::vector<Piece>& pieces, const Box& box) {
  Assembled a;
  a.data.assign(static_cast<size_t>(box.area()), 0.0f);
  a.count.assign(static_cast<size_t>(box.area()), 0);
  for (const Piece& p : pieces) {
    if (!p.slice.range_box(p.start, p.length).intersects(box)) continue;
    const std::vector<float> data = read_piece(name, p);
    p.slice.for_each_run(p.start, p.length, box, [&](int64_t local, int64_t at, int64_t n) {
      std::copy_n(data.begin() + (local - p.start), n, a.data.begin() + at);
      for (int64_t k = 0; k < n; ++k) a.count[at + k] = static_cast<uint8_t>(std::min(a.count[at + k] + 1, 2));
    });
  }
  return a;
}

void CheckpointReader::check_covered(const Assembled& a, const Box& box, int64_t at, int64_t n, const std::string& what) const {
  for (int64_t k = at; k < at + n; ++k) {
    if (a.count[k] != 1) {
      const int64_t row = box.r0 + k / box.width(), col = box.c0 + k % box.width();
      throw CheckpointError(path_ + ": " + what + " element [" + std::to_string(row) + ", " +
                            std::to_string(col) + "] is " + (a.count[k] == 0 ? "not stored" : "stored twice") +
                            " in the checkpoint");
    }
  }
}

void CheckpointReader::index_part(size_t part) {
  const hid_t f = file(part);
  const int64_t version = read_attr_i64(f, "format_version");
  if (version < kOldestReadableCheckpointFormat || version > kCheckpointFormatVersion) {
    bad(part, "format_version " + std::to_string(version) + ", this build reads " +
                  std::to_string(kOldestReadableCheckpointFormat) + " to " + std::to_string(kCheckpointFormatVersion));
  }
  versions_[part] = version;
  const int64_t step = read_attr_i64(f, "step");
  if (step != manifest_.progress.step) {
    bad(part, "belongs to step " + std::to_string(step) + ", the manifest to step " +
                  std::to_string(manifest_.progress.step));
  }
  for (const std::string& name : link_names(f, "/")) {
    if (name == "optimizer") continue;
    H5Handle dset = h5_dataset(H5Dopen2(f, name.c_str(), H5P_DEFAULT), "opening " + name);
    Piece p;
    p.part = part;
    p.dataset = name;
    p.slice = read_slice_attrs(dset.get());
    if (std::string why = p.slice.problem(); !why.empty()) bad(part, "tensor '" + name + "' " + why);
    if (dataset_dims(dset.get(), name) != p.slice.local_shape()) {
      bad(part, "tensor '" + name + "' has shape " + shape_text(dataset_dims(dset.get(), name)) +
                    ", its slice attributes say " + shape_text(p.slice.local_shape()));
    }
    p.length = p.slice.numel();
    entry(name).weights.push_back(std::move(p));
  }
  if (!h5check_tri(H5Lexists(f, "optimizer", H5P_DEFAULT), "optimizer")) return;
  H5Handle opt = h5_group(H5Gopen2(f, "optimizer", H5P_DEFAULT), "opening optimizer");
  for (const std::string& name : link_names(opt.get(), "optimizer")) {
    H5Handle g = h5_group(H5Gopen2(opt.get(), name.c_str(), H5P_DEFAULT), "opening optimizer/" + name);
    const Slice slice = read_slice_attrs(g.get());
    if (std::string why = slice.problem(); !why.empty()) bad(part, "optimizer state of '" + name + "' " + why);
    TensorPieces& t = entry(name);
    for (const std::string& ds : link_names(g.get(), "optimizer/" + name)) {
      int which = -1;
      for (int i = 0; i < 2; ++i) {
        if (ds.rfind(std::string(kMomentNames[i]) + ".", 0) == 0 &&
            ds.find_first_not_of("0123456789", std::strlen(kMomentNames[i]) + 1) == std::string::npos) {
          which = i;
        }
      }
      if (which < 0) continue;
      const std::string full = "optimizer/" + name + "/" + ds;
      H5Handle dset = h5_dataset(H5Dopen2(g.get(), ds.c_str(), H5P_DEFAULT), "opening " + full);
      Piece p;
      p.part = part;
      p.dataset = full;
      p.slice = slice;
      p.start = read_attr_i64(dset.get(), "start");
      const std::vector<int64_t> dims = dataset_dims(dset.get(), full);
      if (dims.size() != 1 || p.start < 0 || p.start + dims[0] > slice.numel()) {
        bad(part, "'" + full + "' holds elements outside its slice " + shape_text(slice.local_shape()));
      }
      p.length = dims[0];
      t.moments[which].push_back(std::move(p));
    }
  }
}

std::vector<float> CheckpointReader::read_piece(const std::string& name, const Piece& p) {
  std::vector<float> data(static_cast<size_t>(p.length));
  in_file(p.part, [&] {
    H5Handle dset = h5_dataset(H5Dopen2(file(p.part), p.dataset.c_str(), H5P_DEFAULT), "opening " + p.dataset);
    h5check_status(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()),
                   "reading " + p.dataset);
    if (!h5_has_attr(dset.get(), "checksum") ||
        h5_read_attr_uint(dset.get(), "checksum") != checksum(data.data(), data.size(), versions_[p.part])) {
      const std::string what = p.dataset == name ? "tensor '" + name + "'"
                                                 : "tensor '" + name + "' ('" + p.dataset + "')";
      throw CheckpointError(files_[p.part] + ": " + what + " fails its checksum; the file is corrupted");
    }
  });
  return data;
}

}  // namespace hdp
