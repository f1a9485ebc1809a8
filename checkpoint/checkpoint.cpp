#include "checkpoint/checkpoint.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <span>

#include "base/yaml_reader.h"
#include "data/hdf5_lock.h"
#include "data/hdf5_util.h"
#include "kernels/ops.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFormatVersion = 2;
constexpr const char* kManifest = "manifest.yaml";
constexpr const char* kTiedEmbedding = "model.embed_tokens.weight";
const char* const kMomentNames[2] = {"exp_avg", "exp_avg_sq"};

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

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string part_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.h5", rank);
  return name;
}

// ---------------------------------------------------------------------------
// Slices and boxes. A tensor is viewed as a matrix: [d0, d1 * d2 * ...] (a 1-D
// tensor [n] is [n, 1]). A tensor-parallel slice is a block of rows (shard_dim 0),
// a block of columns (shard_dim 1, 2-D tensors only) or the whole (-1); its local
// copy is that block, row-major. A Box is a rectangle of the global matrix.

struct Box {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  int64_t width() const { return c1 - c0; }
  int64_t area() const { return (r1 - r0) * (c1 - c0); }
  bool empty() const { return r1 <= r0 || c1 <= c0; }
  bool intersects(const Box& o) const {
    return std::max(r0, o.r0) < std::min(r1, o.r1) && std::max(c0, o.c0) < std::min(c1, o.c1);
  }
  Box hull(const Box& o) const {
    if (empty()) return o;
    if (o.empty()) return *this;
    return {std::min(r0, o.r0), std::max(r1, o.r1), std::min(c0, o.c0), std::max(c1, o.c1)};
  }
};

struct Slice {
  std::vector<int64_t> global_shape;
  int shard_dim = -1;
  int64_t begin = 0, end = 0;

  int64_t global_rows() const { return global_shape.empty() ? 1 : global_shape[0]; }
  int64_t global_cols() const {
    int64_t n = 1;
    for (size_t i = 1; i < global_shape.size(); ++i) n *= global_shape[i];
    return n;
  }
  int64_t row0() const { return shard_dim == 0 ? begin : 0; }
  int64_t col0() const { return shard_dim == 1 ? begin : 0; }
  int64_t rows() const { return shard_dim == 0 ? end - begin : global_rows(); }
  int64_t cols() const { return shard_dim == 1 ? end - begin : global_cols(); }
  int64_t numel() const { return rows() * cols(); }
  std::vector<int64_t> local_shape() const {
    std::vector<int64_t> s = global_shape;
    if (shard_dim >= 0) s[shard_dim] = end - begin;
    return s;
  }
  Box box() const { return {row0(), row0() + rows(), col0(), col0() + cols()}; }
  // Empty string when the spec is consistent.
  std::string problem() const {
    if (global_shape.empty()) return "has no shape";
    for (int64_t d : global_shape) {
      if (d <= 0) return "has shape " + shape_string(global_shape);
    }
    if (shard_dim < -1 || shard_dim > 1 || (shard_dim == 1 && global_shape.size() != 2)) {
      return "has shard_dim " + std::to_string(shard_dim) + " for shape " + shape_string(global_shape);
    }
    if (shard_dim >= 0 && (begin < 0 || end <= begin || end > global_shape[shard_dim])) {
      return "has the slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of dimension " +
             std::to_string(shard_dim) + " of " + shape_string(global_shape);
    }
    return "";
  }

  // The rectangle holding local flat elements [start, start + count).
  Box range_box(int64_t start, int64_t count) const {
    if (count <= 0) return {};
    const int64_t w = cols();
    const int64_t first = start / w, last = (start + count - 1) / w;
    int64_t lo = 0, hi = w;
    if (first == last) {
      lo = start % w;
      hi = lo + count;
    }
    return {row0() + first, row0() + last + 1, col0() + lo, col0() + hi};
  }

  // Calls fn(local_index, box_index, n) for every run of n elements that are both
  // among local flat elements [start, start + count) and inside `box`.
  template <class Fn>
  void for_each_run(int64_t start, int64_t count, const Box& box, Fn&& fn) const {
    if (count <= 0) return;
    const int64_t w = cols();
    const int64_t first = std::max(start / w, box.r0 - row0());
    const int64_t last = std::min((start + count - 1) / w, box.r1 - 1 - row0());
    for (int64_t row = first; row <= last; ++row) {
      const int64_t g = row0() + row;
      if (g < box.r0 || g >= box.r1) continue;
      const int64_t lo = std::max(start, row * w) - row * w;
      const int64_t hi = std::min(start + count, (row + 1) * w) - row * w;
      const int64_t a = std::max(col0() + lo, box.c0), b = std::min(col0() + hi, box.c1);
      if (a < b) fn(row * w + (a - col0()), (g - box.r0) * box.width() + (a - box.c0), b - a);
    }
  }
};

Slice slice_of(const ParameterInfo& p) {
  Slice s;
  s.global_shape = p.global_shape;
  s.shard_dim = p.shard_dim;
  s.begin = p.shard_dim >= 0 ? p.shard_begin : 0;
  s.end = p.shard_dim >= 0 ? p.shard_end : (p.global_shape.empty() ? 0 : p.global_shape[0]);
  return s;
}

// ---------------------------------------------------------------------------
// HDF5 helpers (the caller holds Hdf5Lock).

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

H5Handle write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& shape, const float* data,
                       size_t count) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Handle space = h5_space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), name);
  H5Handle dset = h5_dataset(
      H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name);
  h5check_status(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing " + name);
  h5_write_attr_u64(dset.get(), "checksum", checksum(data, count));
  return dset;
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

// ---------------------------------------------------------------------------
// Writing a part.

// One copy of every weight is written: of a tp slice by the first rank of the
// data-parallel group that holds it (hdp, or for an expert under expert parallelism
// its expert-data-parallel group); of a tp-replicated tensor by tp rank 0 only;
// tied copies never.
bool writes_weights_of(const ParameterInfo& p, const CheckpointLayout& layout) {
  const GridCoords& c = layout.coords;
  const int dp_rank = p.expert ? layout.degrees.expert_dp_rank(c) : c.hdp_rank;
  return dp_rank == 0 && !p.tied_copy && (p.shard_dim >= 0 || c.tp_rank == 0);
}
bool writes_any_weight(const CheckpointLayout& layout) { return layout.degrees.expert_dp_rank(layout.coords) == 0; }

void write_part(const std::string& file, const CheckpointSnapshot& s, const CheckpointLayout& layout,
                const CheckpointHooks& hooks) {
  const std::string tmp = file + ".tmp";
  const auto& params = s.parameters;
  if (hooks.before_part) hooks.before_part(tmp);
  try {
    Hdf5Lock lock;
    H5Handle f = h5_file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "creating " + tmp);
    write_attr_i64(f.get(), "format_version", kFormatVersion);
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

    if (writes_any_weight(layout)) {
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
// The manifest.

struct Manifest {
  int64_t format_version = 0;
  TrainingProgress progress;
  ParallelDegrees degrees;
  std::vector<std::string> parts;
  std::string config;
};

std::string emit_manifest(const Manifest& m, bool literal_config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format_version" << YAML::Value << m.format_version;
  out << YAML::Key << "step" << YAML::Value << m.progress.step;
  out << YAML::Key << "sampler" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "epoch" << YAML::Value << m.progress.sampler.epoch;
  out << YAML::Key << "cursor" << YAML::Value << m.progress.sampler.cursor;
  out << YAML::Key << "document_offset" << YAML::Value << m.progress.sampler.document_offset;
  out << YAML::EndMap;
  out << YAML::Key << "train_seed" << YAML::Value << m.progress.train_seed;
  out << YAML::Key << "data_seed" << YAML::Value << m.progress.data_seed;
  out << YAML::Key << "skipped_steps" << YAML::Value << m.progress.skipped_steps;
  out << YAML::Key << "rollbacks" << YAML::Value << m.progress.rollbacks;
  // Three numbers per skipped batch: epoch, cursor, document_offset of its start.
  out << YAML::Key << "skipped_batches" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const SamplerState& s : m.progress.skipped_batches) {
    out << static_cast<int64_t>(s.epoch) << s.cursor << s.document_offset;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "loss_window" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double loss : m.progress.loss_window) out << loss;
  out << YAML::EndSeq;
  out << YAML::Key << "layout" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "tp" << YAML::Value << m.degrees.tp;
  out << YAML::Key << "pp" << YAML::Value << m.degrees.pp;
  out << YAML::Key << "hdp" << YAML::Value << m.degrees.hdp;
  out << YAML::EndMap;
  out << YAML::Key << "parts" << YAML::Value << YAML::BeginSeq;
  for (const std::string& p : m.parts) out << p;
  out << YAML::EndSeq;
  out << YAML::Key << "config" << YAML::Value;
  if (literal_config) out << YAML::Literal;
  else out << YAML::DoubleQuoted;
  out << m.config;
  out << YAML::EndMap;
  if (!out.good()) throw CheckpointError(std::string("writing the checkpoint manifest: ") + out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

Manifest read_manifest_map(const YamlMap& root) {
  Manifest m;
  m.format_version = root.get<int64_t>("format_version");
  if (m.format_version != kFormatVersion)
    root.fail("format_version", std::to_string(m.format_version) + " is not readable",
              "this build reads format_version " + std::to_string(kFormatVersion));
  m.progress.step = root.get<int64_t>("step");
  const YamlMap sampler = root.map("sampler");
  m.progress.sampler.epoch = sampler.get<uint64_t>("epoch");
  m.progress.sampler.cursor = sampler.get<int64_t>("cursor");
  m.progress.sampler.document_offset = sampler.get<int64_t>("document_offset");
  m.progress.train_seed = root.get<uint64_t>("train_seed");
  m.progress.data_seed = root.get<uint64_t>("data_seed");
  // Absent from manifests written before the numerical guard existed.
  m.progress.skipped_steps = root.get_or<int64_t>("skipped_steps", 0);
  // Absent from manifests written before rollbacks: none, and an empty window.
  m.progress.rollbacks = root.get_or<int64_t>("rollbacks", 0);
  const auto skipped = root.get_or<std::vector<int64_t>>("skipped_batches", {});
  if (skipped.size() % 3 != 0) {
    root.fail("skipped_batches", "holds " + std::to_string(skipped.size()) + " numbers",
              "three per skipped batch: epoch, cursor, document_offset");
  }
  for (size_t i = 0; i < skipped.size(); i += 3) {
    m.progress.skipped_batches.push_back({static_cast<uint64_t>(skipped[i]), skipped[i + 1], skipped[i + 2]});
  }
  m.progress.loss_window = root.get_or<std::vector<double>>("loss_window", {});
  const YamlMap layout = root.map("layout");
  m.degrees.tp = layout.get<int>("tp");
  m.degrees.pp = layout.get<int>("pp");
  m.degrees.hdp = layout.get<int>("hdp");
  m.parts = root.get<std::vector<std::string>>("parts");
  if (m.parts.empty()) root.fail("parts", "the manifest lists no parts");
  for (const std::string& p : m.parts)
    if (p.empty() || p.find('/') != std::string::npos || p == "." || p == "..")
      root.fail("parts", "the manifest lists a bad part name '" + p + "'");
  m.config = root.get<std::string>("config");
  return m;
}

// A broken manifest is a broken checkpoint: the reader's ConfigError (file:line,
// key, problem) becomes a CheckpointError with the same message.
Manifest parse_manifest(const std::string& text, const std::string& what) {
  try {
    return read_manifest_map(YamlDocument::parse(text, what).root_map());
  } catch (const ConfigError& e) {
    throw CheckpointError(e.what());
  }
}

// The manifest as YAML: the config as a literal block when that keeps it exactly,
// else double-quoted (e.g. leading indentation or trailing blank lines: a quoted
// scalar keeps them).
std::string manifest_text(const Manifest& m, const std::string& where) {
  std::string text = emit_manifest(m, true);
  bool exact = false;
  try {
    exact = parse_manifest(text, "manifest").config == m.config;
  } catch (const CheckpointError&) {
  }
  if (!exact) {
    text = emit_manifest(m, false);
    if (parse_manifest(text, "manifest").config != m.config) {
      throw CheckpointError(where + ": the config text does not survive YAML quoting");
    }
  }
  return text;
}

Manifest read_manifest(const std::string& path) {
  const std::string file = (fs::path(path) / kManifest).string();
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw CheckpointError(path + ": no such checkpoint directory");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CheckpointError(path + ": no " + kManifest + " (not a complete checkpoint)");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_manifest(text, file);
}

void write_text_file(const std::string& file, const std::string& text) {
  const std::string tmp = file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw CheckpointError(tmp + ": cannot write");
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) throw CheckpointError(file + ": renaming " + tmp + " failed: " + ec.message());
}

// ---------------------------------------------------------------------------
// Listing checkpoints.

struct Listed {
  int64_t step;
  fs::path path;
  bool complete;  // final name with a manifest
  bool tmp;       // step-N.tmp
};

std::vector<Listed> list_checkpoints(const std::string& dir) {
  static const std::regex pattern(R"(step-(\d+)(\.tmp)?)");
  std::vector<Listed> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern)) continue;
    std::error_code e2;
    if (!entry.is_directory(e2)) continue;
    Listed l{std::stoll(m[1]), entry.path(), false, m[2].matched};
    l.complete = !l.tmp && fs::is_regular_file(entry.path() / kManifest, e2);
    found.push_back(std::move(l));
  }
  std::sort(found.begin(), found.end(), [](const Listed& a, const Listed& b) { return a.step < b.step; });
  return found;
}

// `path`, or path-2, path-3, ...: the first that does not exist.
std::string unused_name(const std::string& path) {
  std::error_code ec;
  std::string name = path;
  for (int i = 2; fs::exists(name, ec); ++i) name = path + "-" + std::to_string(i);
  return name;
}

// Deletes a listed checkpoint. A complete one is renamed to step-N.tmp first, so
// that a crash half way leaves an unfinished directory (the next prune removes
// it), never a step-N without its manifest. False when it could not be deleted.
bool delete_listed(const Listed& l) {
  std::error_code ec;
  fs::path doomed = l.path;
  if (l.complete) {
    doomed += ".tmp";
    fs::remove_all(doomed, ec);
    fs::rename(l.path, doomed, ec);
    if (ec) {
      doomed = l.path;
      fs::remove(l.path / kManifest, ec);  // then at least never taken for complete
    }
  }
  fs::remove_all(doomed, ec);
  return !ec;
}

// Keeps the newest `keep` complete checkpoints (and the one just written); deletes
// older complete ones and unfinished .tmp directories of earlier steps. Failures
// to delete are not errors: the next save tries again.
void prune(const std::string& dir, int64_t keep, int64_t current_step) {
  auto all = list_checkpoints(dir);
  int64_t kept = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->complete) {
      if (it->step == current_step || kept < std::max<int64_t>(keep, 1)) {
        ++kept;
        continue;
      }
      delete_listed(*it);
    } else if (it->tmp && it->step < current_step) {
      delete_listed(*it);
    }
  }
}

// ---------------------------------------------------------------------------
// Reading: an index of which part holds which piece of which tensor.

struct Piece {
  size_t part = 0;
  std::string dataset;  // path inside the part
  Slice slice;
  int64_t start = 0, length = 0;  // local flat elements [start, start + length) of the slice
};

struct TensorPieces {
  std::vector<Piece> weights;
  std::vector<Piece> moments[2];  // exp_avg, exp_avg_sq
};

class CheckpointReader {
 public:
  // The caller holds Hdf5Lock for the reader's whole life.
  explicit CheckpointReader(const std::string& path) : path_(path), manifest_(read_manifest(path)) {
    for (const std::string& part : manifest_.parts) {
      const std::string file = (fs::path(path) / part).string();
      std::error_code ec;
      if (!fs::is_regular_file(file, ec)) {
        throw CheckpointError(file + ": checkpoint part is missing (listed in " + kManifest + ")");
      }
      files_.push_back(file);
    }
    handles_.resize(files_.size());
    for (size_t i = 0; i < files_.size(); ++i) in_file(i, [&] { index_part(i); });
  }

  const Manifest& manifest() const { return manifest_; }
  const std::vector<std::string>& tensor_names() const { return order_; }
  const TensorPieces* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &it->second;
  }

  // Checks that every stored piece of `name` has this global shape.
  void check_shape(const std::string& name, const TensorPieces& t, const std::vector<int64_t>& global_shape) const {
    auto check = [&](const Piece& p) {
      if (p.slice.global_shape != global_shape) {
        throw CheckpointError(files_[p.part] + ": tensor '" + name + "' has shape " +
                              shape_string(p.slice.global_shape) + " in the checkpoint, the model needs " +
                              shape_string(global_shape));
      }
    };
    for (const Piece& p : t.weights) check(p);
    for (const auto& list : t.moments) {
      for (const Piece& p : list) check(p);
    }
  }

  // The box of the global tensor, assembled from every piece that meets it;
  // `count` says how many pieces covered each element.
  struct Assembled {
    std::vector<float> data;
    std::vector<uint8_t> count;
  };
  Assembled assemble(const std::string& name, const std::vector<Piece>& pieces, const Box& box) {
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

  // Throws unless every element in [at, at + n) of the box was stored exactly once.
  void check_covered(const Assembled& a, const Box& box, int64_t at, int64_t n, const std::string& what) const {
    for (int64_t k = at; k < at + n; ++k) {
      if (a.count[k] != 1) {
        const int64_t row = box.r0 + k / box.width(), col = box.c0 + k % box.width();
        throw CheckpointError(path_ + ": " + what + " element [" + std::to_string(row) + ", " +
                              std::to_string(col) + "] is " + (a.count[k] == 0 ? "not stored" : "stored twice") +
                              " in the checkpoint");
      }
    }
  }

 private:
  template <class Fn>
  void in_file(size_t part, Fn&& fn) {
    try {
      fn();
    } catch (const Hdf5Error& e) {
      throw CheckpointError(files_[part] + ": not a readable checkpoint part (truncated or corrupted?): " +
                            e.what());
    }
  }

  hid_t file(size_t part) {
    if (!handles_[part]) {
      handles_[part] = h5_file(H5Fopen(files_[part].c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "opening");
    }
    return handles_[part].get();
  }

  TensorPieces& entry(const std::string& name) {
    auto [it, inserted] = index_.try_emplace(name);
    if (inserted) order_.push_back(name);
    return it->second;
  }

  void bad(size_t part, const std::string& msg) const {
    throw CheckpointError(files_[part] + ": " + msg);
  }

  void index_part(size_t part) {
    const hid_t f = file(part);
    const int64_t version = read_attr_i64(f, "format_version");
    if (version != kFormatVersion) {
      bad(part, "format_version " + std::to_string(version) + ", this build reads " + std::to_string(kFormatVersion));
    }
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
        bad(part, "tensor '" + name + "' has shape " + shape_string(dataset_dims(dset.get(), name)) +
                      ", its slice attributes say " + shape_string(p.slice.local_shape()));
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
          bad(part, "'" + full + "' holds elements outside its slice " + shape_string(slice.local_shape()));
        }
        p.length = dims[0];
        t.moments[which].push_back(std::move(p));
      }
    }
  }

  std::vector<float> read_piece(const std::string& name, const Piece& p) {
    std::vector<float> data(static_cast<size_t>(p.length));
    in_file(p.part, [&] {
      H5Handle dset = h5_dataset(H5Dopen2(file(p.part), p.dataset.c_str(), H5P_DEFAULT), "opening " + p.dataset);
      h5check_status(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()),
                     "reading " + p.dataset);
      if (!h5_has_attr(dset.get(), "checksum") ||
          h5_read_attr_uint(dset.get(), "checksum") != checksum(data.data(), data.size())) {
        const std::string what = p.dataset == name ? "tensor '" + name + "'"
                                                   : "tensor '" + name + "' ('" + p.dataset + "')";
        throw CheckpointError(files_[p.part] + ": " + what + " fails its checksum; the file is corrupted");
      }
    });
    return data;
  }

  std::string path_;
  Manifest manifest_;
  std::vector<std::string> files_;
  std::vector<H5Handle> handles_;
  std::map<std::string, TensorPieces> index_;
  std::vector<std::string> order_;  // first seen, parts in rank order
};

}  // namespace

std::string checkpoint_path(const std::string& checkpoint_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return (fs::path(checkpoint_dir) / name).string();
}

static void to_host(const Tensor& t, HostBuffer& host) {
  if (t.device == Device::CUDA && host.get_allocator().source() != &pinned_host_allocator())
    host = HostBuffer(HostVectorAllocator<float>(pinned_host_allocator()));
  host.resize(static_cast<size_t>(t.numel()));
  if (t.numel() > 0) copy(Tensor(host.data(), {t.numel()}, Device::CPU), t);
}

void take_snapshot(const LlamaModel& model, const ZeroAdamW& optimizer, const TrainingProgress& progress,
                   const CheckpointLayout& layout, CheckpointSnapshot& out) {
  out.parameters = model.parameters();
  out.segments = optimizer.segments();
  out.progress = progress;
  // Only the first data-parallel rank of each slice writes weights (write_part).
  if (writes_any_weight(layout)) {
    to_host(model.flat_parameters(), out.flat_parameters);
  } else {
    out.flat_parameters.clear();
  }
  to_host(optimizer.exp_avg(), out.exp_avg);
  to_host(optimizer.exp_avg_sq(), out.exp_avg_sq);
}

std::string save_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model, const ZeroAdamW& optimizer,
                            const TrainingProgress& progress, const std::string& config_yaml, int64_t keep,
                            const CheckpointLayout& layout) {
  CheckpointSnapshot snapshot;
  take_snapshot(model, optimizer, progress, layout, snapshot);
  return save_checkpoint(checkpoint_dir, snapshot, config_yaml, keep, layout);
}

std::string save_checkpoint(const std::string& checkpoint_dir, const CheckpointSnapshot& snapshot,
                            const std::string& config_yaml, int64_t keep, const CheckpointLayout& layout,
                            const CheckpointHooks& hooks) {
  const TrainingProgress& progress = snapshot.progress;
  const ParallelDegrees& d = layout.degrees;
  const GridCoords& c = layout.coords;
  const int world_size = d.world();
  auto within = [](int i, int n) { return i >= 0 && i < n; };
  if (d.tp < 1 || d.pp < 1 || d.hdp < 1 || !within(c.tp_rank, d.tp) || !within(c.pp_rank, d.pp) ||
      !within(c.hdp_rank, d.hdp) || !within(layout.world_rank, world_size) ||
      (layout.world && (layout.world->size() != world_size || layout.world->rank() != layout.world_rank))) {
    throw std::invalid_argument("save_checkpoint: inconsistent layout");
  }
  const std::string final_path = checkpoint_path(checkpoint_dir, progress.step);
  const std::string tmp_dir = final_path + ".tmp";

  // 1. Every rank writes its part.
  std::string error;
  try {
    std::error_code ec;
    fs::create_directories(tmp_dir, ec);
    if (!fs::is_directory(tmp_dir)) throw CheckpointError(tmp_dir + ": cannot create: " + ec.message());
    write_part((fs::path(tmp_dir) / part_name(layout.world_rank)).string(), snapshot, layout, hooks);
    if (hooks.after_part) hooks.after_part();
  } catch (const std::exception& e) {
    error = e.what();
    // Said now, before the collective below: the ranks it tells that this part failed
    // end the job at once, which may kill this rank before its own error is logged.
    if (layout.world) spdlog::error("checkpoint error: {}", error);
  }
  // 2. Wait for all parts (and learn whether any rank failed).
  if (layout.world) {
    int64_t failed = error.empty() ? 0 : 1;
    layout.world->all_reduce(std::span<int64_t>(&failed, 1), ReduceOp::Max);
    if (failed && error.empty()) error = tmp_dir + ": another rank failed to write its part";
  }
  if (!error.empty()) throw CheckpointError(error);
  if (layout.world_rank != 0 && layout.world == nullptr) return final_path;  // offline: rank 0 commits later

  // 3. Rank 0 commits: manifest, rename, prune.
  if (layout.world_rank == 0) {
    try {
      Manifest m;
      m.format_version = kFormatVersion;
      m.progress = progress;
      m.degrees = layout.degrees;
      m.config = config_yaml;
      std::string missing;
      for (int r = 0; r < world_size; ++r) {
        m.parts.push_back(part_name(r));
        std::error_code ec;
        if (!fs::is_regular_file(fs::path(tmp_dir) / m.parts.back(), ec)) missing += " " + m.parts.back();
      }
      if (!missing.empty()) throw CheckpointError(tmp_dir + ": parts missing, not committing:" + missing);
      // Leftovers of an earlier attempt at this step (other layouts, temp files).
      for (const auto& entry : fs::directory_iterator(tmp_dir)) {
        const std::string name = entry.path().filename().string();
        if (std::find(m.parts.begin(), m.parts.end(), name) == m.parts.end()) fs::remove_all(entry.path());
      }
      write_text_file((fs::path(tmp_dir) / kManifest).string(), manifest_text(m, tmp_dir));
      std::error_code ec;
      if (fs::exists(final_path, ec) && !fs::exists(fs::path(final_path) / kManifest, ec)) {
        // Not a checkpoint this trainer committed (those have a manifest): someone's
        // files, kept, not overwritten.
        const std::string aside = unused_name(final_path + ".incomplete");
        fs::rename(final_path, aside, ec);
        if (ec) throw CheckpointError(final_path + ": has no " + kManifest + " and cannot be moved aside: " + ec.message());
        spdlog::warn("{} had no {} (not a complete checkpoint): moved to {} to write the checkpoint of step {}",
                     final_path, kManifest, aside, progress.step);
      }
      fs::remove_all(final_path, ec);  // a rerun of this step replaces it
      if (ec) throw CheckpointError(final_path + ": cannot replace: " + ec.message());
      fs::rename(tmp_dir, final_path, ec);
      if (ec) throw CheckpointError(final_path + ": renaming " + tmp_dir + " failed: " + ec.message());
      prune(checkpoint_dir, keep, progress.step);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // 4. Nobody returns before the checkpoint is committed.
  if (layout.world) {
    int64_t failed = error.empty() ? 0 : 1;
    layout.world->all_reduce(std::span<int64_t>(&failed, 1), ReduceOp::Max);
    if (failed && error.empty()) error = final_path + ": rank 0 failed to commit the checkpoint";
  }
  if (!error.empty()) throw CheckpointError(error);
  return final_path;
}

std::string save_weights_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model,
                                    const TrainingProgress& progress, const std::string& config_yaml) {
  const ModelPartition& part = model.partition();
  if (part.tp_size != 1 || part.first_layer != 0 || model.num_layers() != model.config().num_layers ||
      !part.has_embedding || !part.has_head)
    throw std::invalid_argument("save_weights_checkpoint: the model must be whole (one rank)");
  // No optimizer segments: the part's optimizer group stays empty.
  CheckpointSnapshot snapshot;
  snapshot.parameters = model.parameters();
  snapshot.progress = progress;
  to_host(model.flat_parameters(), snapshot.flat_parameters);
  CheckpointLayout layout;  // one rank, offline: it writes the only part and commits
  // Nothing is pruned: the directory may hold checkpoints that are not ours to delete.
  return save_checkpoint(checkpoint_dir, snapshot, config_yaml, std::numeric_limits<int64_t>::max(), layout);
}

static std::optional<Listed> newest_complete_before(const std::string& checkpoint_dir, int64_t step) {
  auto all = list_checkpoints(checkpoint_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->complete && it->step < step) return std::move(*it);
  }
  return std::nullopt;
}

std::optional<std::string> latest_checkpoint_before(const std::string& checkpoint_dir, int64_t step) {
  const std::optional<Listed> found = newest_complete_before(checkpoint_dir, step);
  if (!found) return std::nullopt;
  return found->path.string();
}

std::vector<std::string> manifestless_checkpoints(const std::string& checkpoint_dir) {
  std::vector<std::string> found;
  for (const Listed& l : list_checkpoints(checkpoint_dir)) {
    if (!l.complete && !l.tmp) found.push_back(l.path.string());
  }
  return found;
}

std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir) {
  return latest_checkpoint_before(checkpoint_dir, std::numeric_limits<int64_t>::max());
}

std::optional<int64_t> latest_checkpoint_step(const std::string& checkpoint_dir) {
  const std::optional<Listed> found = newest_complete_before(checkpoint_dir, std::numeric_limits<int64_t>::max());
  if (!found) return std::nullopt;
  return found->step;
}

std::string checkpoint_or_latest(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifest, ec)) return path;
  if (auto latest = latest_checkpoint(path)) return *latest;
  throw CheckpointError(path + ": neither a checkpoint (no " + kManifest + ") nor a directory holding complete checkpoints");
}

int delete_checkpoints_after(const std::string& checkpoint_dir, int64_t step) {
  int deleted = 0;
  for (const Listed& l : list_checkpoints(checkpoint_dir)) {
    if (l.step <= step || (!l.complete && !l.tmp)) continue;  // a step-N without a manifest is not ours
    if (delete_listed(l)) ++deleted;
  }
  return deleted;
}

void record_rollbacks(const std::string& path, int64_t rollbacks, const std::vector<SamplerState>& skipped_batches) {
  Manifest m = read_manifest(path);
  m.progress.rollbacks = rollbacks;
  m.progress.skipped_batches = skipped_batches;
  write_text_file((fs::path(path) / kManifest).string(), manifest_text(m, path));
}

TrainingProgress load_checkpoint(const std::string& path, LlamaModel& model, ZeroAdamW* optimizer) {
  const auto& params = model.parameters();
  std::vector<std::vector<const ZeroAdamW::Segment*>> segments(params.size());
  if (optimizer) {
    for (const ZeroAdamW::Segment& s : optimizer->segments()) {
      if (s.parameter >= params.size()) throw std::invalid_argument("load_checkpoint: optimizer segment out of range");
      if (s.length > 0) segments[s.parameter].push_back(&s);
    }
  }
  Hdf5Lock lock;
  CheckpointReader reader(path);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParameterInfo& p = params[i];
    const std::string name = p.tied_copy ? std::string(kTiedEmbedding) : p.name;
    const TensorPieces* t = reader.find(name);
    if (t == nullptr || t->weights.empty()) throw CheckpointError(path + ": tensor '" + name + "' is missing");
    reader.check_shape(name, *t, p.global_shape);
    const Slice mine = slice_of(p);

    // Weights: this rank's slice is one box of the global tensor.
    const Box box = mine.box();
    auto w = reader.assemble(name, t->weights, box);
    reader.check_covered(w, box, 0, box.area(), "tensor '" + name + "'");
    copy(model.parameter_tensor(p), Tensor(w.data.data(), {p.numel}, Device::CPU));

    // Moments of this rank's segments of the parameter.
    if (segments[i].empty()) continue;
    Box need;
    for (const auto* s : segments[i]) need = need.hull(mine.range_box(s->flat_offset - p.offset, s->length));
    const Tensor state[2] = {optimizer->exp_avg(), optimizer->exp_avg_sq()};
    for (int k = 0; k < 2; ++k) {
      auto m = reader.assemble(name, t->moments[k], need);
      const std::string what = std::string(kMomentNames[k]) + " of tensor '" + name + "'";
      std::vector<float> host;
      for (const auto* s : segments[i]) {
        const int64_t start = s->flat_offset - p.offset;
        host.assign(static_cast<size_t>(s->length), 0.0f);
        mine.for_each_run(start, s->length, need, [&](int64_t local, int64_t at, int64_t n) {
          reader.check_covered(m, need, at, n, what);
          std::copy_n(m.data.begin() + at, n, host.begin() + (local - start));
        });
        copy(state[k].rows(s->state_offset, s->state_offset + s->length),
             Tensor(host.data(), {s->length}, Device::CPU));
      }
    }
  }
  return reader.manifest().progress;
}

std::string checkpoint_config(const std::string& path) { return read_manifest(path).config; }

namespace {

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
