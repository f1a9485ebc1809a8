#include "run/planner_cost.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <sstream>

#include "kernels/dtype.h"
#include "parallel/communicator.h"
#include "run/profiler.h"

namespace hdp {
namespace {

std::string shape_string(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t ffn, int64_t vocab) {
  return "hidden_size " + std::to_string(hidden) + ", num_heads " + std::to_string(heads) + ", num_kv_heads " +
         std::to_string(kv_heads) + ", head_dim " + std::to_string(head_dim) + ", ffn_hidden_size " +
         std::to_string(ffn) + ", vocab_size " + std::to_string(vocab);
}

void log_lines(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) spdlog::info("{}", line);
}
}  // namespace

void check_cost_file_shape(const CostFile& file, const Config& config, const std::string& where) {
  const CostProfileInfo& p = file.profiled;
  const ModelConfig& m = config.model;
  std::string differences;
  auto compare = [&](const char* key, int64_t profiled, int64_t configured) {
    if (profiled == configured) return;
    differences += std::string(differences.empty() ? "" : ", ") + key + " " + std::to_string(profiled) + " vs " +
                   std::to_string(configured);
  };
  compare("hidden_size", p.hidden_size, m.hidden_size);
  compare("num_heads", p.num_heads, m.num_heads);
  compare("num_kv_heads", p.num_kv_heads, m.num_kv_heads);
  compare("head_dim", p.head_dim, m.head_dim());
  compare("ffn_hidden_size", p.ffn_hidden_size, m.ffn_hidden_size);
  compare("vocab_size", p.vocab_size, m.vocab_size);
  compare("sliding_window", p.sliding_window, m.attention_window());
  if (differences.empty()) return;
  const std::string config_name = config.source.empty() ? std::string("the config") : "the config " + config.source;
  throw ConfigError(where + ": model: the cost file was profiled for another model shape (" +
                    shape_string(p.hidden_size, p.num_heads, p.num_kv_heads, p.head_dim, p.ffn_hidden_size,
                                 p.vocab_size) +
                    ") than " + config_name + " describes (" +
                    shape_string(m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim(), m.ffn_hidden_size,
                                 m.vocab_size) +
                    "); differing: " + differences + " (file vs config); profile this model with 'trainer profile " +
                    (config.source.empty() ? std::string("CONFIG.yaml") : config.source) +
                    " --output FILE' or point scheduler.cost_file at a file for this shape");
}

CostModel cost_model_from_file(const CostFile& file, const Config& config, int64_t saved_floats_per_token) {
  CostModel c = file.cost;
  // The fit's s^2 term is the attention term of this run's window (planning/cost_model.h).
  c.window = config.model.attention_window();
  // A tp rank runs 1/tp of the projections, the MLP, the attention heads and the
  // LM head's vocabulary; the all-reduces and the replicated norms and residual
  // additions are not in this scaling (an approximation, docs/cost-model.md).
  const double time_scale = static_cast<double>(file.profiled.tp) / static_cast<double>(config.parallel.tp);
  c.a1 *= time_scale;
  c.b1 *= time_scale;
  c.g *= time_scale;
  c.head_seconds_per_token *= time_scale;
  // Activations: what this rank's layer slice saves relative to the measured layer.
  if (saved_floats_per_token > 0 && file.profiled.saved_floats_per_token > 0) {
    const double act_scale =
        static_cast<double>(saved_floats_per_token) / static_cast<double>(file.profiled.saved_floats_per_token);
    c.a2 *= act_scale;
    c.b2 *= act_scale;
  }
  return c;
}

CostModel derived_cost_model(const Config& config, double flops_per_second, int64_t saved_floats_per_token) {
  const ModelShape shape = config.model.shape();
  const int tp = config.parallel.tp;
  // The saved floats are fp32 (4 bytes): the trainer computes in fp32.
  CostModel cost = analytic_cost_model(shape, tp, 4.0 * static_cast<double>(saved_floats_per_token), flops_per_second,
                                       config.offload.bandwidth_gbs * 1e9);
  cost.head_seconds_per_token = head_flops_per_token(shape, tp) / flops_per_second;
  return cost;
}

double expert_all_to_all_seconds_per_token(const Config& config, const CostModel& cost) {
  const int ep = config.parallel.ep;
  if (ep <= 1) return 0;
  const double bandwidth = std::min(cost.d2h_bytes_per_s, cost.h2d_bytes_per_s);
  if (!(bandwidth > 0)) return 0;
  const double row_bytes = static_cast<double>(config.model.hidden_size) *
                           static_cast<double>(dtype_size(config.train.precision)) *
                           static_cast<double>(config.model.experts_per_token);
  return 4 * row_bytes * (ep - 1) / ep / bandwidth;
}

CostModel planner_cost_model(const Config& config, double flops_per_second, int64_t saved_floats_per_token,
                             Communicator* world) {
  const std::string& source = config.scheduler.cost_file;
  if (source.empty()) return derived_cost_model(config, flops_per_second, saved_floats_per_token);

  const bool announce = world == nullptr || world->rank() == 0;
  CostFile file;
  if (source == "profile") {
    const ProfileOptions options = startup_profile_options(config);
    file = profile_cost_model(config, options);
    if (world != nullptr && world->size() > 1) {
      // The other ranks measured at the same time: their CPU use says nothing about noise.
      file.profiled.other_cpu_fraction = -1;
      // Every rank measured (sharing the node as in training); all plan with the average.
      const double n = world->size();
      CostModel& c = file.cost;
      const std::array<double*, 9> fields = {&c.a1, &c.b1, &c.g, &c.a2, &c.b2, &c.d2h_bytes_per_s,
                                             &c.h2d_bytes_per_s, &c.embedding_seconds_per_token,
                                             &c.head_seconds_per_token};
      std::array<double, 9> values{};
      for (size_t i = 0; i < fields.size(); ++i) values[i] = *fields[i];
      world->all_reduce(std::span<double>(values), ReduceOp::Sum);
      for (size_t i = 0; i < fields.size(); ++i) *fields[i] = values[i] / n;
    }
    if (announce) {
      spdlog::info("scheduler.cost_file: profile: measured at start-up{}",
                   world != nullptr && world->size() > 1 ? " (average over " + std::to_string(world->size()) + " ranks)"
                                                         : std::string());
      log_lines(describe_cost_file(file));
      spdlog::info("a short start-up profile extrapolates beyond length {}; 'trainer profile' measures longer ones",
                   options.lengths.back());
      if (file.fit.held_out_max_relative_error > kUnreliableHeldOutError ||
          file.profiled.other_cpu_fraction > kBusyOtherCpuFraction) {
        spdlog::warn("the start-up profile is noisy (held-out error {:.0f}%, other processes {:.0f}% of the CPU time); "
                     "the plans may be unbalanced: profile once on an idle machine with 'trainer profile' and set "
                     "scheduler.cost_file to the file",
                     100 * file.fit.held_out_max_relative_error, 100 * std::max(0.0, file.profiled.other_cpu_fraction));
      }
    }
  } else {
    file = read_cost_file(source);
    check_cost_file_shape(file, config, source);
    const int threads = omp_get_max_threads();
    if (announce) {
      spdlog::info("cost model from {} (profiled {} on {} with {} threads; held-out error max {:.1f}%)", source,
                   file.profiled.date, file.profiled.host, file.profiled.threads,
                   100 * file.fit.held_out_max_relative_error);
      if (file.fit.held_out_max_relative_error > kUnreliableHeldOutError) {
        spdlog::warn("{}: held-out error {:.0f}%: the profile is noisy; consider profiling again on an idle machine",
                     source, 100 * file.fit.held_out_max_relative_error);
      }
      if (file.profiled.threads > 0 && file.profiled.threads != threads) {
        spdlog::warn("{} was profiled with {} threads, this rank runs {}: its times are off by about that ratio; "
                     "profile with --set train.threads={}",
                     source, file.profiled.threads, threads, threads);
      }
      if (config.parallel.tp != file.profiled.tp) {
        spdlog::info("cost model: layer and head times divided by tp {} (profiled at tp {}); the tp all-reduces are "
                     "not modelled",
                     config.parallel.tp, file.profiled.tp);
      }
    }
  }
  return cost_model_from_file(file, config, saved_floats_per_token);
}
}  // namespace hdp
