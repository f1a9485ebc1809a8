#include "run/profiler.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include "kernels/copy_engine.h"
#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"
#include "parallel/runtime.h"
#include "model/model.h"

namespace hdp {
namespace {

// ---- least squares ----

// min |A x - b| for an m x n matrix (row-major, m >= n, full column rank) by
// Householder QR. n is at most 3 here.
std::vector<double> least_squares(std::vector<double> a, std::vector<double> b, size_t m, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    double norm = 0;
    for (size_t i = k; i < m; ++i) norm += a[i * n + k] * a[i * n + k];
    norm = std::sqrt(norm);
    if (norm == 0) throw std::invalid_argument("least squares: the columns are linearly dependent");
    const double alpha = a[k * n + k] > 0 ? -norm : norm;
    // v = column k below the diagonal with v_k = a_kk - alpha.
    std::vector<double> v(m, 0.0);
    for (size_t i = k; i < m; ++i) v[i] = a[i * n + k];
    v[k] -= alpha;
    double vv = 0;
    for (size_t i = k; i < m; ++i) vv += v[i] * v[i];
    if (vv == 0) continue;
    for (size_t j = k; j < n; ++j) {
      double dot = 0;
      for (size_t i = k; i < m; ++i) dot += v[i] * a[i * n + j];
      const double f = 2 * dot / vv;
      for (size_t i = k; i < m; ++i) a[i * n + j] -= f * v[i];
    }
    double dot = 0;
    for (size_t i = k; i < m; ++i) dot += v[i] * b[i];
    const double f = 2 * dot / vv;
    for (size_t i = k; i < m; ++i) b[i] -= f * v[i];
  }
  std::vector<double> x(n, 0.0);
  for (size_t k = n; k-- > 0;) {
    double r = b[k];
    for (size_t j = k + 1; j < n; ++j) r -= a[k * n + j] * x[j];
    if (a[k * n + k] == 0) throw std::invalid_argument("least squares: singular system");
    x[k] = r / a[k * n + k];
  }
  return x;
}

// Non-negative least squares in relative error of t ~ sum_j c_j x^p_j with
// x = s / max(s), p = powers (highest first). Every candidate support (the
// columns left free) is solved unconstrained; the feasible one with the least
// residual is the NNLS optimum (it has a support on which it is the
// unconstrained solution). Returns the coefficients of x^p_j.
std::vector<double> fit_powers(std::span<const double> s, std::span<const double> t, std::span<const int> powers,
                               const char* what, int64_t window = 0) {
  const size_t m = s.size(), n = powers.size();
  if (t.size() != m) throw std::invalid_argument(std::string(what) + ": lengths and timings differ in size");
  double scale = 0;
  for (size_t i = 0; i < m; ++i) {
    if (!(s[i] > 0) || !std::isfinite(s[i]) || !(t[i] > 0) || !std::isfinite(t[i])) {
      throw std::invalid_argument(std::string(what) + ": every length and value must be positive and finite");
    }
    scale = std::max(scale, s[i]);
  }
  std::vector<double> distinct(s.begin(), s.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (distinct.size() < n) {
    throw std::invalid_argument(std::string(what) + ": needs at least " + std::to_string(n) +
                                " distinct lengths, got " + std::to_string(distinct.size()));
  }
  // Under a window the square column is the attention term (the same s^2 up to W).
  auto column = [&](size_t i, size_t j) {
    if (window > 0 && powers[j] == 2) {
      CostModel m;
      m.window = window;
      return m.attention_term(std::llround(s[i])) / (scale * scale) / t[i];
    }
    return std::pow(s[i] / scale, powers[j]) / t[i];
  };
  std::vector<double> best(n, 0.0);
  double best_residual = std::numeric_limits<double>::infinity();
  // Full support first: if it is feasible it is the optimum.
  for (unsigned mask = (1u << n) - 1; mask > 0; --mask) {
    std::vector<size_t> free;
    for (size_t j = 0; j < n; ++j)
      if (mask & (1u << j)) free.push_back(j);
    std::vector<double> a(m * free.size()), b(m, 1.0);
    for (size_t i = 0; i < m; ++i)
      for (size_t k = 0; k < free.size(); ++k) a[i * free.size() + k] = column(i, free[k]);
    const std::vector<double> x = least_squares(a, b, m, free.size());
    if (std::any_of(x.begin(), x.end(), [](double v) { return v < 0; })) continue;
    std::vector<double> c(n, 0.0);
    for (size_t k = 0; k < free.size(); ++k) c[free[k]] = x[k];
    double residual = 0;
    for (size_t i = 0; i < m; ++i) {
      double r = -1;
      for (size_t j = 0; j < n; ++j) r += c[j] * column(i, j);
      residual += r * r;
    }
    if (residual < best_residual) {
      best_residual = residual;
      best = c;
    }
    if (mask == (1u << n) - 1) break;  // the unconstrained optimum is feasible
  }
  for (size_t j = 0; j < n; ++j) best[j] /= std::pow(scale, powers[j]);
  return best;
}

// ---- timing ----

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median seconds of one call of fn: one untimed calibration run plus `warmups`
// more, then `repeats` samples, each looping fn enough times to last at least
// min_sample_seconds.
template <class Fn>
double time_median(Fn&& fn, const ProfileOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  const double once = std::max(seconds_since(t0), 1e-9);
  for (int w = 0; w < o.warmups; ++w) fn();
  const int inner = static_cast<int>(std::clamp(std::ceil(o.min_sample_seconds / once), 1.0, 1e6));
  std::vector<double> samples;
  for (int r = 0; r < std::max(1, o.repeats); ++r) {
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) fn();
    samples.push_back(seconds_since(t0) / inner);
  }
  return median(samples);
}

std::vector<float> uniform_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// One document of n tokens: ids, next-token targets, positions, boundaries.
struct Document {
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
  Document(int64_t n, int64_t vocab) {
    for (int64_t i = 0; i < n; ++i) {
      tokens.push_back(static_cast<int32_t>((i * 7 + 3) % vocab));
      targets.push_back(static_cast<int32_t>((i * 7 + 10) % vocab));
      positions.push_back(static_cast<int32_t>(i));
    }
    cu_seqlens = {0, static_cast<int32_t>(n)};
  }
  MicroBatchView view() const { return {tokens, targets, positions, cu_seqlens, nullptr, 0.0}; }
};

void fill_from(Tensor dst, const std::vector<float>& host) {
  if (static_cast<size_t>(dst.numel()) > host.size()) throw std::logic_error("profiler: source buffer too small");
  copy(dst.view({dst.numel()}), Tensor(const_cast<float*>(host.data()), {dst.numel()}, Device::CPU));
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// CPU time of the whole machine (all CPUs, /proc/stat) and of this process, to
// tell how much of the machine other processes used while measuring.
struct CpuClock {
  double machine_busy = -1;  // seconds, summed over CPUs
  double own = 0;            // this process's user + system seconds
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();

  static CpuClock now() {
    CpuClock c;
    std::ifstream in("/proc/stat");
    std::string cpu;
    unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal && cpu == "cpu") {
      c.machine_busy = static_cast<double>(user + nice + system + irq + softirq + steal) /
                       static_cast<double>(sysconf(_SC_CLK_TCK));
    }
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    c.own = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
            1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
    c.wall = std::chrono::steady_clock::now();
    return c;
  }

  // Others' share of the machine's CPU time since `start`, or -1.
  double others_since(const CpuClock& start) const {
    const double wall_s = std::chrono::duration<double>(wall - start.wall).count();
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (machine_busy < 0 || start.machine_busy < 0 || wall_s <= 0 || cpus <= 0) return -1;
    const double others = (machine_busy - start.machine_busy) - (own - start.own);
    return std::clamp(others / (wall_s * static_cast<double>(cpus)), 0.0, 1.0);
  }
};

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

double CostFit::operator()(double s) const {
  if (window <= 0) return (a1 * s + b1) * s + g;
  CostModel m;
  m.a1 = a1;
  m.b1 = b1;
  m.g = g;
  m.window = window;
  return m.compute_seconds(std::llround(s));
}

CostFit fit_quadratic(std::span<const double> s, std::span<const double> t, int64_t window) {
  static constexpr std::array<int, 3> powers{2, 1, 0};
  const std::vector<double> c = fit_powers(s, t, powers, "fit_quadratic", window);
  return {c[0], c[1], c[2], window};
}

ActivationFit fit_linear(std::span<const double> s, std::span<const double> t) {
  static constexpr std::array<int, 2> powers{1, 0};
  const std::vector<double> c = fit_powers(s, t, powers, "fit_linear");
  return {c[0], c[1]};
}

RelativeError relative_error(const std::function<double(double)>& model, std::span<const double> s,
                             std::span<const double> t) {
  if (s.size() != t.size()) throw std::invalid_argument("relative_error: lengths and values differ in size");
  RelativeError e;
  double sum = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const double r = std::abs(model(s[i]) - t[i]) / t[i];
    e.max = std::max(e.max, r);
    sum += r;
  }
  e.points = static_cast<int64_t>(s.size());
  e.mean = s.empty() ? 0 : sum / static_cast<double>(s.size());
  return e;
}

RelativeError held_out_quadratic(std::span<const double> s, std::span<const double> t, int64_t window) {
  if (s.size() != t.size()) throw std::invalid_argument("held_out_quadratic: lengths and values differ in size");
  if (s.size() < 5) {
    throw std::invalid_argument("held_out_quadratic: needs at least 5 points (3 to fit, 2 held out), got " +
                                std::to_string(s.size()));
  }
  std::vector<double> fs, ft, hs, ht;
  for (size_t i = 0; i < s.size(); ++i) {
    (i % 2 == 0 ? fs : hs).push_back(s[i]);
    (i % 2 == 0 ? ft : ht).push_back(t[i]);
  }
  const CostFit fit = fit_quadratic(fs, ft, window);
  return relative_error(fit, hs, ht);
}

void validate_profile_lengths(std::span<const int64_t> lengths) {
  if (lengths.size() < 5) {
    throw std::invalid_argument("needs at least 5 lengths (every other one is held out to check the fit), got " +
                                std::to_string(lengths.size()));
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 2) throw std::invalid_argument("lengths must be at least 2 tokens, got " + std::to_string(lengths[i]));
    for (size_t j = 0; j < i; ++j)
      if (lengths[j] == lengths[i]) throw std::invalid_argument("length " + std::to_string(lengths[i]) + " given twice");
  }
}

std::vector<int64_t> default_profile_lengths(const Config& config) {
  // Documents are never longer than data.max_seq_len (longer ones are split).
  const int64_t top = std::max<int64_t>(16, std::min<int64_t>(8192, config.data.max_seq_len));
  int64_t p = 1;
  while (p * 2 <= top) p *= 2;  // largest power of two <= top
  int64_t low = std::min<int64_t>(128, p / 8);
  low = std::max<int64_t>(low, 2);
  std::vector<int64_t> lengths;
  for (int64_t q = low; q <= p; q *= 2) {
    lengths.push_back(q);
    if (q * 2 <= p) lengths.push_back(std::llround(static_cast<double>(q) * std::sqrt(2.0)));
  }
  return lengths;
}

ProfileOptions startup_profile_options(const Config& config) {
  Config short_config = config;
  short_config.data.max_seq_len = std::min<int64_t>(512, config.data.max_seq_len);
  ProfileOptions o;
  // The top three powers of two of the ordinary list and their midpoints: 5 lengths.
  std::vector<int64_t> all = default_profile_lengths(short_config);
  if (all.size() > 5) all.erase(all.begin(), all.end() - 5);
  o.lengths = all;
  o.repeats = 3;
  o.warmups = 0;
  o.head_tokens = 128;
  o.embedding_tokens = 1024;
  o.copy_bytes = int64_t{16} << 20;
  return o;
}

namespace {

void report(const ProfileLog& log, const std::string& line) {
  if (log) log(line);
}

// The layer shape profiled (tensor-parallel degree 1) and the machine, threads and
// settings it is profiled with.
CostProfileInfo profile_info(const Config& config, const ProfileOptions& options) {
  const ModelConfig& model_config = config.model;
  CostProfileInfo info;
  info.hidden_size = model_config.hidden_size;
  info.num_heads = model_config.num_heads;
  info.num_kv_heads = model_config.num_kv_heads;
  info.head_dim = model_config.head_dim();
  info.ffn_hidden_size = model_config.ffn_hidden_size;
  info.vocab_size = model_config.vocab_size;
  info.tp = 1;
  info.sliding_window = model_config.attention_window();
  info.threads = omp_get_max_threads();
  info.repeats = options.repeats;
  info.gemm = cpu::gemm_library_description(cpu::kGemmLibrary);
  info.host = host_name();
  info.date = utc_now();
  info.config = config.source;
  return info;
}

// One layer, no embedding, no head, at each length: its median forward and
// backward seconds and its activation bytes (file.fit), and the floats it saves per
// token (file.profiled). Its input and output gradient are filled with fixed values
// so every run does the same arithmetic (no growth, no denormals).
void measure_layer(const Config& config, const ProfileOptions& options, CostFile& file, const ProfileLog& log) {
  const ModelConfig& model_config = config.model;
  const int64_t H = model_config.hidden_size;
  const int64_t longest = options.lengths.back();
  CostFitReport& fit = file.fit;
  ModelPartition part;
  part.first_layer = 0;
  part.num_layers = 1;
  part.has_embedding = false;
  part.has_head = false;
  LlamaModel layer(model_config, longest, part);
  layer.init_weights(config.train.seed);
  file.profiled.saved_floats_per_token = layer.saved_floats_per_token();
  const std::vector<float> input = uniform_floats(static_cast<size_t>(longest * H), 1);
  const std::vector<float> dout = uniform_floats(static_cast<size_t>(longest * H), 2);
  report(log, fmt::format("one layer (hidden {}, {} heads, {} kv heads, ffn {}), {} threads, {}: lengths {}",
                          H, model_config.num_heads, model_config.num_kv_heads, model_config.ffn_hidden_size,
                          file.profiled.threads, file.profiled.gemm, fmt::join(options.lengths, ",")));
  for (int64_t s : options.lengths) {
    const Document doc(s, model_config.vocab_size);
    layer.set_batch(0, doc.view());
    // Lengths ascend, so the peak so far is this micro-batch's use.
    fit.activation_bytes.push_back(static_cast<double>(layer.activation_usage().device_peak_bytes));
    fill_from(layer.input_activation(0), input);
    const double seconds = time_median(
        [&] {
          layer.forward(0, 1.0f, true);
          fill_from(layer.output_gradient(0), dout);
          layer.backward(0);
        },
        options);
    fit.layer_seconds.push_back(seconds);
    report(log, fmt::format("  layer s={:>6}: {:9.3f} ms forward+backward, {:.2f} MiB saved activations", s,
                            seconds * 1e3, fit.activation_bytes.back() / (1024.0 * 1024.0)));
  }
}

// One end of the model alone, forward and backward over `tokens` tokens, in seconds
// per token: the final norm, LM head and loss (from a fixed input activation), or
// the embedding (from a fixed output gradient).
double time_model_end(const Config& config, const ProfileOptions& options, bool head, int64_t tokens) {
  const ModelConfig& model_config = config.model;
  ModelPartition part;
  part.num_layers = 0;
  part.has_embedding = !head;
  part.has_head = head;
  LlamaModel end(model_config, tokens, part);
  end.init_weights(config.train.seed);
  const Document doc(tokens, model_config.vocab_size);
  end.set_batch(0, doc.view());
  const std::vector<float> values =
      uniform_floats(static_cast<size_t>(tokens * model_config.hidden_size), head ? 3 : 4);
  fill_from(head ? end.input_activation(0) : end.output_gradient(0), values);
  const double seconds = time_median(
      [&] {
        end.forward(0, 1.0f, true);
        end.backward(0);
      },
      options);
  return seconds / static_cast<double>(tokens);
}

// Final norm, LM head and loss, forward and backward, in seconds per token.
double measure_head(const Config& config, const ProfileOptions& options, const ProfileLog& log) {
  const double per_token = time_model_end(config, options, /*head=*/true, options.head_tokens);
  report(log, fmt::format("  LM head + loss (vocab {}): {:.3f} us/token ({} tokens)", config.model.vocab_size,
                          per_token * 1e6, options.head_tokens));
  return per_token;
}

// Embedding forward and backward, in seconds per token.
double measure_embedding(const Config& config, const ProfileOptions& options, const ProfileLog& log) {
  const double per_token = time_model_end(config, options, /*head=*/false, options.embedding_tokens);
  report(log, fmt::format("  embedding: {:.4f} us/token ({} tokens)", per_token * 1e6, options.embedding_tokens));
  return per_token;
}

// Host <-> device copies through the copy engine (on the CPU backend a memcpy on
// the engine's worker thread, both "directions" between two host buffers), in
// bytes per second (cost.d2h_bytes_per_s, cost.h2d_bytes_per_s).
void measure_copies(const ProfileOptions& options, CostModel& cost, const ProfileLog& log) {
  const int64_t floats = std::max<int64_t>(1, options.copy_bytes / static_cast<int64_t>(sizeof(float)));
  std::vector<float> device_buffer(static_cast<size_t>(floats), 1.0f), host_buffer(static_cast<size_t>(floats), 0.0f);
  const Tensor device(device_buffer.data(), {floats}, Device::CPU), host(host_buffer.data(), {floats}, Device::CPU);
  CopyEngine engine(Device::CPU);
  const double bytes = static_cast<double>(floats) * sizeof(float);
  const double d2h = time_median([&] { engine.copy_async(host, device).wait(); }, options);
  const double h2d = time_median([&] { engine.copy_async(device, host).wait(); }, options);
  cost.d2h_bytes_per_s = bytes / d2h;
  cost.h2d_bytes_per_s = bytes / h2d;
  report(log, fmt::format("  copies of {:.0f} MiB: device->host {:.2f} GB/s, host->device {:.2f} GB/s",
                          bytes / (1024.0 * 1024.0), cost.d2h_bytes_per_s / 1e9, cost.h2d_bytes_per_s / 1e9));
}

// T(s) and Act(s) from the layer's measurements (file.fit) into file.cost: the
// held-out quality from the even-indexed lengths, the coefficients from all.
void fit_layer(CostFile& file) {
  CostFitReport& fit = file.fit;
  std::vector<double> s(fit.lengths.begin(), fit.lengths.end());
  const RelativeError held = held_out_quadratic(s, fit.layer_seconds, file.cost.window);
  fit.held_out_max_relative_error = held.max;
  fit.held_out_mean_relative_error = held.mean;
  for (size_t i = 1; i < fit.lengths.size(); i += 2) fit.held_out_lengths.push_back(fit.lengths[i]);
  const CostFit t = fit_quadratic(s, fit.layer_seconds, file.cost.window);
  fit.max_relative_error = relative_error(t, s, fit.layer_seconds).max;
  const ActivationFit act = fit_linear(s, fit.activation_bytes);
  fit.activation_max_relative_error = relative_error(act, s, fit.activation_bytes).max;
  file.cost.a1 = t.a1;
  file.cost.b1 = t.b1;
  file.cost.g = t.g;
  file.cost.a2 = act.a2;
  file.cost.b2 = act.b2;
}

}  // namespace

CostFile profile_cost_model(const Config& config, const ProfileOptions& options, const ProfileLog& log) {
  validate_profile_lengths(options.lengths);
  if (!std::is_sorted(options.lengths.begin(), options.lengths.end())) {
    throw std::invalid_argument("profile lengths must be ascending");
  }
  CostFile file;
  file.profiled = profile_info(config, options);
  file.cost.window = file.profiled.sliding_window;
  const CpuClock started = CpuClock::now();
  file.fit.lengths = options.lengths;
  file.fit.head_tokens = options.head_tokens;
  file.fit.embedding_tokens = options.embedding_tokens;
  file.fit.copy_bytes = options.copy_bytes;

  measure_layer(config, options, file, log);
  file.cost.head_seconds_per_token = measure_head(config, options, log);
  file.cost.embedding_seconds_per_token = measure_embedding(config, options, log);
  measure_copies(options, file.cost, log);

  file.profiled.other_cpu_fraction = CpuClock::now().others_since(started);
  if (file.profiled.other_cpu_fraction > kBusyOtherCpuFraction) {
    report(log, fmt::format("other processes used {:.0f}% of the machine's CPU time while measuring: the timings are "
                            "slowed down and scattered",
                            100 * file.profiled.other_cpu_fraction));
  }
  fit_layer(file);
  return file;
}

std::string describe_cost_file(const CostFile& file) {
  const CostModel& c = file.cost;
  const CostProfileInfo& p = file.profiled;
  const CostFitReport& f = file.fit;
  std::ostringstream out;
  out << fmt::format("cost model of one layer: hidden {}, {} heads ({} kv, dim {}), ffn {}, vocab {}; tp {}\n",
                     p.hidden_size, p.num_heads, p.num_kv_heads, p.head_dim, p.ffn_hidden_size, p.vocab_size, p.tp);
  out << fmt::format("measured on {} at {} with {} threads, {}, median of {}", p.host, p.date, p.threads,
                     p.gemm, p.repeats);
  if (p.other_cpu_fraction >= 0) {
    out << fmt::format("; other processes used {:.1f}% of the CPU time meanwhile", 100 * p.other_cpu_fraction);
  }
  out << "\n";
  out << fmt::format("  T(s)   = {:.4e} s^2 + {:.4e} s + {:.4e}  seconds (one layer, forward+backward)\n", c.a1, c.b1,
                     c.g);
  if (c.window > 0) {
    out << fmt::format("           (sliding window {}: s^2 stands for 2 P(s) - s past it, P(s) the visible pairs)\n",
                       c.window);
  }
  out << fmt::format("  Act(s) = {:.2f} s + {:.0f}  bytes (saved floats per token {} = {} bytes; fit max error {:.2e})\n",
                     c.a2, c.b2, p.saved_floats_per_token, 4 * p.saved_floats_per_token,
                     f.activation_max_relative_error);
  out << fmt::format("  embedding {:.4f} us/token, LM head + loss {:.3f} us/token\n", c.embedding_seconds_per_token * 1e6,
                     c.head_seconds_per_token * 1e6);
  out << fmt::format("  copies: device->host {:.2f} GB/s, host->device {:.2f} GB/s\n", c.d2h_bytes_per_s / 1e9,
                     c.h2d_bytes_per_s / 1e9);
  if (!f.lengths.empty() && f.layer_seconds.size() == f.lengths.size()) {
    // The held-out prediction of each odd-indexed length, from the even-indexed fit.
    std::vector<double> fs, ft;
    for (size_t i = 0; i < f.lengths.size(); i += 2) {
      fs.push_back(static_cast<double>(f.lengths[i]));
      ft.push_back(f.layer_seconds[i]);
    }
    CostFit even{};
    bool have_even = fs.size() >= 3;
    if (have_even) even = fit_quadratic(fs, ft, c.window);
    const CostFit all{c.a1, c.b1, c.g, c.window};
    out << "      length   measured ms   fit ms (all)   error   held-out fit ms   error\n";
    for (size_t i = 0; i < f.lengths.size(); ++i) {
      const double s = static_cast<double>(f.lengths[i]), t = f.layer_seconds[i];
      out << fmt::format("  {:>10} {:>13.3f} {:>14.3f} {:>6.1f}%", f.lengths[i], t * 1e3, all(s) * 1e3,
                         100 * std::abs(all(s) - t) / t);
      if (i % 2 == 1 && have_even) {
        out << fmt::format(" {:>17.3f} {:>6.1f}%", even(s) * 1e3, 100 * std::abs(even(s) - t) / t);
      } else {
        out << "        (fitted)";
      }
      out << "\n";
    }
  }
  out << fmt::format("  held-out relative error of T (fit on every other length): max {:.2f}%, mean {:.2f}%\n",
                     100 * f.held_out_max_relative_error, 100 * f.held_out_mean_relative_error);
  out << fmt::format("  final fit (all lengths): max relative error {:.2f}%\n", 100 * f.max_relative_error);
  if (f.held_out_max_relative_error > kUnreliableHeldOutError || p.other_cpu_fraction > kBusyOtherCpuFraction) {
    out << fmt::format("  UNRELIABLE: {}; profile again on an idle machine (or with more --repeats)\n",
                       p.other_cpu_fraction > kBusyOtherCpuFraction
                           ? fmt::format("other processes used {:.0f}% of the CPU time", 100 * p.other_cpu_fraction)
                           : fmt::format("held-out error above {:.0f}%", 100 * kUnreliableHeldOutError));
  }
  return out.str();
}

}  // namespace hdp
