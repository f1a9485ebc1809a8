#include "parallel/device_ops.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

namespace hdp {
namespace {

std::string format_bytes(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  }
  return text;
}

// "device-" + the enclosing op's name, as a string that lives as long as the
// process (OpRecord::op is a pointer to a name). Few distinct names exist.
const char* device_trace_name(const char* enclosing) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(std::string(trace_ops::kDevicePrefix) + enclosing).first->c_str();
}

}  // namespace

std::string describe(const DeviceOp& op) {
  std::string text = op.group + " " + op.op + " of " + format_bytes(op.bytes);
  if (op.send_peer >= 0 || op.recv_peer >= 0) {
    text += " (";
    if (op.send_peer >= 0) text += "send to rank " + std::to_string(op.send_peer);
    if (op.send_peer >= 0 && op.recv_peer >= 0) text += ", ";
    if (op.recv_peer >= 0) text += "recv from rank " + std::to_string(op.recv_peer);
    text += ")";
  }
  return text;
}

void DeviceOpLedger::attach(DeviceStream* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  streams_.push_back(stream);
  busy_.reserve(streams_.size());  // a poll allocates nothing
}

void DeviceOpLedger::detach(DeviceStream* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase(streams_, stream);
  std::erase_if(entries_, [&](const Entry& e) {
    if (e.stream != stream) return false;
    stream->release(e.handle);
    return true;
  });
}

void DeviceOpLedger::enqueued(DeviceStream* stream, uint64_t handle, DeviceOp op, double now_us) {
  Entry e;
  e.stream = stream;
  e.handle = handle;
  e.op = std::move(op);
  e.enqueued_us = now_us;
  if (OpTracer* tracer = OpTracer::active()) {
    e.traced = true;
    e.step = tracer->step();
    e.microbatch = tracer->open_microbatch();
    e.trace_op = device_trace_name(tracer->open_op() != nullptr ? tracer->open_op() : e.op.op);
    e.clock_offset_us = tracer->offset_us();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(std::move(e));
}

void DeviceOpLedger::poll() {
  std::lock_guard<std::mutex> lock(mutex_);
  busy_.clear();
  std::erase_if(entries_, [&](const Entry& e) {
    if (std::find(busy_.begin(), busy_.end(), e.stream) != busy_.end()) return false;
    const std::optional<DeviceTimes> times = e.stream->finished(e.handle);
    if (!times) {
      busy_.push_back(e.stream);  // its later operations have not finished either
      return false;
    }
    if (e.traced) {
      records_.push_back(DeviceTraceRecord{
          e.step, OpRecord{e.trace_op, e.microbatch, times->start_us + e.clock_offset_us,
                           times->end_us + e.clock_offset_us, {}}});
    }
    e.stream->release(e.handle);
    return true;
  });
}

std::optional<UnfinishedDeviceOp> DeviceOpLedger::oldest_locked(const DeviceStream* stream, double now_us) const {
  for (const Entry& e : entries_) {
    if (stream == nullptr || e.stream == stream) {
      return UnfinishedDeviceOp{e.op, std::max(0.0, (now_us - e.enqueued_us) * 1e-6)};
    }
  }
  return std::nullopt;
}

std::optional<UnfinishedDeviceOp> DeviceOpLedger::oldest_unfinished(double now_us) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return oldest_locked(nullptr, now_us);
}

std::string DeviceOpLedger::async_error(double now_us) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (DeviceStream* stream : streams_) {
    std::string error = stream->async_error();
    if (error.empty()) continue;
    if (const auto oldest = oldest_locked(stream, now_us)) {
      char age[32];
      std::snprintf(age, sizeof age, "%.1f", oldest->age_s);
      error += "; " + describe(oldest->op) + " enqueued " + age + " s ago had not finished";
    } else {
      error += "; no operation of that group was unfinished";
    }
    return error;
  }
  return {};
}

std::vector<DeviceTraceRecord> DeviceOpLedger::take_trace_records() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(records_, {});
}

size_t DeviceOpLedger::unfinished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

DeviceOpLedger& device_ops() {
  static DeviceOpLedger ledger;
  return ledger;
}

}  // namespace hdp
