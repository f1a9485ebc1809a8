#include "run/hang_watchdog.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "parallel/device_ops.h"
#include "parallel/op_tracer.h"
#include "parallel/progress.h"
#include "parallel/runtime.h"
#include "run/thread_stacks.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

constexpr int kBeatTag = 401;    // step, progress counter, waiting, phase
constexpr int kByeTag = 402;     // this rank stopped watching (it finished or failed on its own)
constexpr int kNoticeTag = 403;  // a hang was declared; write your stacks and report to the sender
constexpr int kReportTag = 404;  // step, progress age (ms), waiting, phase

// Text in int64 words: its length, then 8 bytes a word.
void append_text(std::vector<int64_t>& out, const std::string& text) {
  out.push_back(static_cast<int64_t>(text.size()));
  for (size_t i = 0; i < text.size(); i += 8) {
    int64_t word = 0;
    std::memcpy(&word, text.data() + i, std::min<size_t>(8, text.size() - i));
    out.push_back(word);
  }
}

std::string read_text(const std::vector<int64_t>& in, size_t at) {
  if (at >= in.size()) return "";
  const size_t n = static_cast<size_t>(std::max<int64_t>(0, in[at]));
  if (n > 8 * (in.size() - at - 1)) return "";
  std::string text(n, '\0');
  for (size_t i = 0; i < n; i += 8) std::memcpy(text.data() + i, &in[at + 1 + i / 8], std::min<size_t>(8, n - i));
  return text;
}

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), s < 10 ? "%.1f" : "%.0f", s);
  return text;
}

// "rank 3" or "ranks 0-2, 5": ranks in ascending order, runs collapsed.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i + 1) {
      out += '-';
      out += std::to_string(ranks[j]);
    } else if (j == i + 1) {
      out += ", ";
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

std::string where(int64_t step, const std::string& phase) {
  return (step > 0 ? "step " + std::to_string(step) + ", " : std::string()) + phase;
}

}  // namespace

double HangWatchdog::tick_s(double timeout_s) { return std::clamp(timeout_s / 20, 0.05, 1.0); }
double HangWatchdog::beat_period_s(double timeout_s) { return std::clamp(timeout_s / 5, 0.2, 10.0); }
double HangWatchdog::report_grace_s(double timeout_s) { return std::clamp(timeout_s, 2.0, 10.0); }

HangWatchdog::HangWatchdog(const HangWatchdogOptions& options, const MpiCommunicator* training_world)
    : options_(options) {
  if (!(options.timeout_s > 0)) throw std::invalid_argument("HangWatchdog: timeout_s must be > 0");
  prepare_thread_stacks();
  if (training_world != nullptr && training_world->size() > 1) channel_ = make_channel(*training_world);
  const int ranks = channel_ ? channel_->size() : 1;
  self_ = channel_ ? options.rank : 0;
  const auto now = Clock::now();
  peers_.assign(ranks, Peer{});
  for (Peer& p : peers_) p.last_heard = now;
  last_change_ = now;
  last_counter_ = progress::snapshot().counter;
  last_beat_ = now - std::chrono::hours(1);
  thread_ = std::thread([this] { run(); });
}

HangWatchdog::~HangWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!channel_) return;
  if (std::uncaught_exceptions() > 0) {
    // The job is going down (this rank logs and aborts next); a peer may be
    // stopped, and flushing sends to it could wait forever. Leave the channel.
    (void)channel_.release();
    return;
  }
  for (int r = 0; r < channel_->size(); ++r) {
    if (r != options_.rank) channel_->send(r, kByeTag, {});
  }
}

void HangWatchdog::run() {
  const auto tick = std::chrono::duration<double>(tick_s(options_.timeout_s));
  const double timeout = options_.timeout_s;
  if (channel_) send_beats(Clock::now());  // the peers know this rank from the start
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, tick, [this] { return stop_; })) return;
    }
    const auto now = Clock::now();
    const progress::Snapshot mine = progress::snapshot();
    if (mine.counter != last_counter_) {
      last_counter_ = mine.counter;
      last_change_ = now;
    }
    const std::string device_error = device_ops().async_error(OpTracer::local_us());
    if (!device_error.empty()) fail_on_device_error(device_error);
    if (channel_) {
      send_beats(now);
      if (drain(now) >= 0) await_abort(answered_);
    }
    const double stalled = seconds(now - last_change_);
    if (stalled >= timeout) {
      coordinate("rank " + std::to_string(options_.rank) + " made no progress for " + format_seconds(stalled) +
                 " s (train.hang_timeout_s = " + format_seconds(timeout) + ") in " + where(mine.step, mine.phase));
    }
    for (size_t r = 0; r < peers_.size(); ++r) {
      const Peer& p = peers_[r];
      if (static_cast<int>(r) == self_ || p.finished) continue;
      const double silent = seconds(now - p.last_heard);
      if (silent >= timeout) {
        coordinate("rank " + std::to_string(options_.rank) + " heard no heartbeat from rank " + std::to_string(r) +
                   " for " + format_seconds(silent) + " s (train.hang_timeout_s = " + format_seconds(timeout) + ")");
      }
    }
  }
}

void HangWatchdog::send_beats(Clock::time_point now) {
  if (seconds(now - last_beat_) < beat_period_s(options_.timeout_s)) return;
  last_beat_ = now;
  const progress::Snapshot mine = progress::snapshot();
  std::vector<int64_t> beat = {mine.step, static_cast<int64_t>(mine.counter), mine.waiting ? 1 : 0};
  append_text(beat, mine.phase);
  for (int r = 0; r < channel_->size(); ++r) {
    if (r != options_.rank) channel_->send(r, kBeatTag, beat);
  }
}

int HangWatchdog::drain(Clock::time_point now) {
  while (auto m = channel_->try_receive(-1, kBeatTag)) {
    if (m->payload.size() < 3) continue;
    Peer& p = peers_[m->source];
    p.last_heard = now;
    p.heard = true;
    p.step = m->payload[0];
    p.waiting = m->payload[2] != 0;
    p.phase = read_text(m->payload, 3);
  }
  while (auto m = channel_->try_receive(-1, kByeTag)) peers_[m->source].finished = true;
  while (auto m = channel_->try_receive(-1, kReportTag)) {
    if (m->payload.size() < 3) continue;
    Peer& p = peers_[m->source];
    p.last_heard = now;
    p.heard = true;
    p.reported = true;
    p.step = m->payload[0];
    p.progress_age_ms = m->payload[1];
    p.waiting = m->payload[2] != 0;
    p.phase = read_text(m->payload, 3);
  }
  while (auto m = channel_->try_receive(-1, kNoticeTag)) {
    answer_notice(m->source);
    if (answered_ < 0 || m->source < answered_) answered_ = m->source;
  }
  return answered_;
}

void HangWatchdog::answer_notice(int coordinator) {
  spdlog::error("rank {}: rank {} declared a hang; writing the stacks of this rank's threads", options_.rank,
                coordinator);
  const progress::Snapshot mine = progress::snapshot();
  write_stacks("hang declared by rank " + std::to_string(coordinator));
  std::vector<int64_t> report = {mine.step,
                                 static_cast<int64_t>(1000 * seconds(Clock::now() - last_change_)),
                                 mine.waiting ? 1 : 0};
  append_text(report, mine.phase);
  channel_->send(coordinator, kReportTag, report);
}

void HangWatchdog::await_abort(int coordinator) {
  // The coordinator ends the job once it has the reports; if it dies or stops
  // first, this rank ends it.
  const auto deadline = Clock::now() + std::chrono::duration<double>(report_grace_s(options_.timeout_s) + 15);
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::duration<double>(tick_s(options_.timeout_s)));
    drain(Clock::now());  // answers notices of other coordinators too
  }
  spdlog::critical("rank {}: rank {} declared a hang but did not end the job; ending it", options_.rank, coordinator);
  spdlog::default_logger()->flush();
  abort_job(1);
}

void HangWatchdog::fail_on_device_error(const std::string& error) {
  const std::string text = "rank " + std::to_string(options_.rank) + ": " + error + ". Ending the job (exit code 1).";
  spdlog::critical("{}", text);
  write_stacks(error);
  std::error_code ec;
  fs::create_directories(fs::path(options_.run_dir) / "hang", ec);
  std::ofstream(fs::path(options_.run_dir) / "hang" / "summary.txt") << text << "\n";
  spdlog::default_logger()->flush();
  abort_job(1);
}

void HangWatchdog::coordinate(const std::string& reason) {
  spdlog::error("hang: {}; collecting the phases and stacks of all ranks", reason);
  if (channel_) {
    for (int r = 0; r < channel_->size(); ++r) {
      if (r != options_.rank && !peers_[r].finished) channel_->send(r, kNoticeTag, {});
    }
  }
  write_stacks(reason);
  if (channel_) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(report_grace_s(options_.timeout_s));
    while (Clock::now() < deadline) {
      const auto now = Clock::now();
      const int lower = drain(now);
      if (lower >= 0 && lower < options_.rank) await_abort(lower);  // the lower rank's summary speaks for the job
      bool all = true, all_heard = true;
      for (size_t r = 0; r < peers_.size(); ++r) {
        const Peer& p = peers_[r];
        if (static_cast<int>(r) == self_ || p.finished || p.reported) continue;
        all = false;
        if (seconds(now - p.last_heard) < options_.timeout_s) all_heard = false;
      }
      // Everyone answered, or everyone still heartbeating answered and the silent
      // ones had a second to prove they are alive.
      if (all || (all_heard && seconds(now - start) > 1)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const std::string text = summary(reason);
  spdlog::critical("{}", text);
  std::error_code ec;
  fs::create_directories(fs::path(options_.run_dir) / "hang", ec);
  std::ofstream(fs::path(options_.run_dir) / "hang" / "summary.txt") << text << "\n";
  spdlog::default_logger()->flush();
  abort_job(1);
}

std::string HangWatchdog::summary(const std::string& reason) {
  const auto now = Clock::now();
  const progress::Snapshot mine = progress::snapshot();
  std::vector<std::string> parts;
  // Silent ranks first: they are the likely cause.
  for (size_t r = 0; r < peers_.size(); ++r) {
    const Peer& p = peers_[r];
    if (static_cast<int>(r) == self_ || p.finished || p.reported) continue;
    parts.push_back("rank " + std::to_string(r) + " sent no heartbeat for " +
                    format_seconds(seconds(now - p.last_heard)) + " s and did not answer (stopped, frozen or dead; " +
                    (p.heard ? "last heard in " + where(p.step, p.phase) : std::string("none received since the watchdog started")) +
                    ")");
  }
  // The others grouped by phase, the smallest groups (the odd ones out) first.
  std::map<std::string, std::vector<int>> groups;
  std::map<std::string, bool> waiting;
  auto add = [&](int rank, int64_t step, const std::string& phase, bool waits) {
    const std::string key = where(step, phase);
    groups[key].push_back(rank);
    waiting[key] = waits;
  };
  for (size_t r = 0; r < peers_.size(); ++r) {
    const Peer& p = peers_[r];
    if (static_cast<int>(r) == self_) {
      add(options_.rank, mine.step, mine.phase, mine.waiting);
    } else if (p.reported) {
      add(static_cast<int>(r), p.step, p.phase, p.waiting);
    }
  }
  std::vector<std::pair<std::string, std::vector<int>>> ordered(groups.begin(), groups.end());
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  for (auto& [phase, ranks] : ordered) {
    std::sort(ranks.begin(), ranks.end());
    const bool one = ranks.size() == 1;
    parts.push_back(rank_list(ranks) + (waiting[phase] ? (one ? " waits in " : " wait in ") : (one ? " is in " : " are in ")) +
                    phase);
  }
  std::vector<int> finished;
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (static_cast<int>(r) != self_ && peers_[r].finished) finished.push_back(static_cast<int>(r));
  }
  if (!finished.empty()) parts.push_back(rank_list(finished) + " had already stopped watching");
  std::string text = "hang detected: " + reason + ". ";
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? "; " : "") + parts[i];
  text += ". Stacks of every rank that could write them: " + (fs::path(options_.run_dir) / "hang").string() +
          "/rank-N.txt. Ending the job (exit code 1).";
  return text;
}

std::string HangWatchdog::write_stacks(const std::string& cause) {
  const progress::Snapshot mine = progress::snapshot();
  const fs::path dir = fs::path(options_.run_dir) / "hang";
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%d.txt", options_.rank);
  const std::string path = (dir / name).string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream out(path);
  out << "rank " << options_.rank << " on " << options_.hostname << ", pid " << ::getpid() << "\n";
  out << "cause: " << cause << "\n";
  out << "phase: " << where(mine.step, mine.phase) << (mine.waiting ? " (waiting on other ranks)" : "") << "\n";
  if (!mine.device_op.empty()) {
    out << "oldest unfinished device operation: " << mine.device_op << ", enqueued "
        << format_seconds(mine.device_op_age_s) << " s ago\n";
  }
  out << "no progress for " << format_seconds(seconds(Clock::now() - last_change_)) << " s\n\n";
  out << thread_stacks_text();
  out.flush();
  if (!out) {
    spdlog::error("rank {}: could not write {}", options_.rank, path);
  } else {
    spdlog::error("rank {}: stacks written to {}", options_.rank, path);
  }
  return path;
}

}  // namespace hdp
