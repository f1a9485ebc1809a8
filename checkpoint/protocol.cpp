#include "checkpoint/protocol.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>

#include "checkpoint/directory.h"
#include "checkpoint/tokenizer_copy.h"
#include "data/hdf5_lock.h"
#include "kernels/ops.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

// The last pipeline stage's copy of tied embeddings loads the first stage's.
constexpr const char* kTiedEmbedding = "model.embed_tokens.weight";

void to_host(const Tensor& t, HostBuffer& host) {
  if (t.device == Device::CUDA && host.get_allocator().source() != &pinned_host_allocator())
    host = HostBuffer(HostVectorAllocator<float>(pinned_host_allocator()));
  host.resize(static_cast<size_t>(t.numel()));
  if (t.numel() > 0) copy(Tensor(host.data(), {t.numel()}, Device::CPU), t);
}

}  // namespace

void take_snapshot(const LlamaModel& model, const ZeroAdamW& optimizer, const TrainingProgress& progress,
                   const CheckpointLayout& layout, CheckpointSnapshot& out) {
  out.parameters = model.parameters();
  out.segments = optimizer.segments();
  out.progress = progress;
  // Only the first data-parallel rank of each slice writes weights (write_part).
  if (part_holds_weights(layout)) {
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
                            const CheckpointHooks& hooks, const TokenizerFiles* tokenizer) {
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
    write_part((fs::path(tmp_dir) / part_name(layout.world_rank)).string(), snapshot, layout, hooks.before_part);
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
      m.format_version = kCheckpointFormatVersion;
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
      if (tokenizer) {
        write_checkpoint_tokenizer(tmp_dir, *tokenizer);
        m.tokenizer = tokenizer->identity;
      }
      write_manifest(tmp_dir, m);
      rename_into_place(tmp_dir, final_path, progress.step);
      prune_checkpoints(checkpoint_dir, keep, progress.step);
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
                                    const TrainingProgress& progress, const std::string& config_yaml,
                                    const TokenizerFiles* tokenizer) {
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
  return save_checkpoint(checkpoint_dir, snapshot, config_yaml, std::numeric_limits<int64_t>::max(), layout, {},
                         tokenizer);
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

}  // namespace hdp
