#pragma once
// The op trace format (docs/tracing.md): JSON Lines, one operation per line,
//   {"step": int, "microbatch": int, "pp_rank": int, "dp_rank": int, "op": string,
//    "start_us": number, "end_us": number, "group": string or null}
// plus an optional "tp_rank" (int, default 0); every other field is ignored, so
// traces from other trainers can be analysed and our own files (the trainer's
// tracer, run/step_tracer.h) carry more. It is the record of the what-if method of
// Lin et al., "Understanding Stragglers in Large Model Training Using What-if
// Analysis" (OSDI 2025): op type, step, micro-batch, PP rank, DP rank, start, end,
// and the peers of each communication (ops sharing a non-null group, within one
// step, are one collective or one send with its receive).
//
// Reading keeps the records compact (op names and groups interned to numbers) so
// that a trace of 10,000 workers x 100 steps fits in memory.

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/errors.h"

namespace hdp {

// A trace file (or a directory of them) that cannot be read: the message names
// the file and line. Exit code 2 like every input error.
class TraceError : public InputError {
 public:
  using InputError::InputError;
};

// The op names the trainer's tracer records (parallel/op_tracer.h) and the analysis
// knows (docs/tracing.md). Each is a null-terminated literal; any other name is its own op type.
namespace trace_ops {
inline constexpr std::string_view kForwardCompute = "forward-compute";
inline constexpr std::string_view kBackwardCompute = "backward-compute";
inline constexpr std::string_view kForwardSend = "forward-send";
inline constexpr std::string_view kForwardRecv = "forward-recv";
inline constexpr std::string_view kBackwardSend = "backward-send";
inline constexpr std::string_view kBackwardRecv = "backward-recv";
inline constexpr std::string_view kParamsSync = "params-sync";
inline constexpr std::string_view kGradsSync = "grads-sync";
inline constexpr std::string_view kOptimizer = "optimizer";
inline constexpr std::string_view kDataWait = "data-wait";
inline constexpr std::string_view kCheckpoint = "checkpoint";
// Collectives outside the pipeline and ZeRO (a dp-stream op each in the analysis).
inline constexpr std::string_view kTokenCount = "token-count-allreduce";
inline constexpr std::string_view kGradNorm = "grad-norm-allreduce";
inline constexpr std::string_view kLoss = "loss-allreduce";
inline constexpr std::string_view kTiedEmbedding = "tied-embedding-allreduce";
inline constexpr std::string_view kUpdateAgreement = "update-agreement-allreduce";
// Communication that runs inside a compute op in this trainer (the tp
// all-reduces of a layer, ring-attention block exchanges, Mixtral's expert-parallel
// all-to-alls): names with these prefixes are reported but not replayed, their time
// is their compute op's.
inline constexpr std::string_view kTensorParallelPrefix = "tp-";
inline constexpr std::string_view kRingPrefix = "ring-";
inline constexpr std::string_view kExpertParallelPrefix = "ep-";
inline constexpr std::string_view kTensorParallelAllReduce = "tp-allreduce";
inline constexpr std::string_view kSequenceParallelAllGather = "tp-allgather";
inline constexpr std::string_view kSequenceParallelReduceScatter = "tp-reducescatter";
inline constexpr std::string_view kExpertAllToAll = "ep-alltoall";
inline constexpr std::string_view kRingExchange = "ring-exchange";
// The device time of a collective enqueued on a device stream (NCCL), measured by
// events around it (parallel/device_ops.h): "device-" + the op whose span enqueued
// it ("device-grads-sync"). Reported, not replayed: the host ops hold its time.
inline constexpr std::string_view kDevicePrefix = "device-";
}  // namespace trace_ops

struct TraceOp {
  int64_t step = 0;
  int32_t microbatch = -1;  // -1: not per micro-batch
  int32_t pp_rank = 0, dp_rank = 0, tp_rank = 0;
  uint32_t op = 0;      // index into Trace::op_names
  int64_t group = -1;   // -1: null (a local op); equal ids within a step = one communication
  double start_us = 0, end_us = 0;
};

struct Trace {
  std::vector<std::string> op_names;
  std::vector<TraceOp> ops;

  // The index of an op name, added when new.
  uint32_t op_type(std::string_view name);
  // The id of a group name (shared by every file read into this trace).
  int64_t group_id(const std::string& name);
  // A fresh group id without a name (traces built in memory).
  int64_t new_group() { return next_group_++; }

 private:
  std::unordered_map<std::string, uint32_t> op_index_;
  std::unordered_map<std::string, int64_t> group_index_;
  int64_t next_group_ = 0;
};

// Every path is a trace file or a directory whose *.jsonl files (in name order)
// are read, blank lines skipped. Throws TraceError "<file>:<line>: <problem>" on a
// line that is not a JSON object, a missing or mistyped field, a negative rank or
// step, a rank or micro-batch above 2^31 - 1, or end_us < start_us; when the
// largest ranks span a grid (pp x dp x tp workers) of more workers than the trace
// has operations, naming the line of the largest; and when a path does not exist
// or a directory holds no .jsonl file.
Trace read_traces(const std::vector<std::string>& paths);

// One record as a JSONL line (no newline, base/json_writer.h): the import
// format's fields (times to the nanosecond), tp_rank, and the world rank that
// recorded it when given (our own files). `group` empty writes null.
void write_trace_line(std::ostream& out, int64_t step, int microbatch, int pp_rank, int dp_rank, int tp_rank,
                      std::string_view op, double start_us, double end_us, std::string_view group,
                      std::optional<int> rank = std::nullopt);

}  // namespace hdp
