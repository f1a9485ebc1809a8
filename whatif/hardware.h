#pragma once
// A GPU cluster as the offline planner and simulator see it (trainer plan,
// docs/planning.md): per-GPU compute rate and memory, and the bandwidths of the
// links a training step uses. Loaded from configs/cluster/*.yaml by
// trainer/plan_command.cpp; this layer only holds and checks the figures.
//
// Bandwidths are bytes per second per GPU and direction.

#include <string>

namespace hdp {

struct HardwareProfile {
  std::string name;
  int gpus_per_node = 8;
  double peak_flops = 0;           // dense BF16 tensor-core FLOP/s per GPU (datasheet peak)
  double achievable_fraction = 0;  // fraction of the peak that layer compute reaches (MFU-like)
  double hbm_bytes = 0;            // device memory per GPU
  double hbm_bytes_per_s = 0;      // device memory bandwidth
  double reserved_bytes = 0;       // device memory not available to the model (runtime, NCCL, workspace)
  double nvlink_bytes_per_s = 0;   // GPU to GPU within a node
  double internode_bytes_per_s = 0;  // GPU to a GPU of another node (its share of the node's NICs)
  double intranode_latency_s = 0;  // per message / ring hop within a node
  double internode_latency_s = 0;  // per message / ring hop across nodes
  double pcie_bytes_per_s = 0;     // host <-> device copies (activation offload)
  double host_bytes_per_node = 0;  // host memory per node (offloaded activations); 0 = unknown
  // Links as alpha-beta channels: a transfer of b bytes takes latency + b / (peak x
  // link_efficiency), the efficiency being what large collectives reach of the
  // datasheet peak (1: the peak).
  double link_efficiency = 1;
  // Small kernels do not run at the large-kernel rate. With Hockney's half-performance
  // length n_1/2 (Hockney and Jesshope, "Parallel Computers 2", 1988), a kernel over n
  // rows runs at n / (n + n_1/2) of it: a GEMM over a micro-batch's n tokens, an
  // attention block over n query rows (a whole sequence, or a ring member's share of
  // one). 0: every kernel at the large-kernel rate.
  double gemm_half_rows = 0;
  double attention_half_rows = 0;

  // The compute rate the cost model uses: peak_flops * achievable_fraction.
  double flops_per_second() const { return peak_flops * achievable_fraction; }
  // GPUs g and h (global GPU indices, gpus_per_node per node in order).
  bool same_node(long g, long h) const { return g / gpus_per_node == h / gpus_per_node; }
  // What a transfer between them reaches: the link's peak times link_efficiency.
  double link_bytes_per_s(long g, long h) const {
    return (same_node(g, h) ? nvlink_bytes_per_s : internode_bytes_per_s) * link_efficiency;
  }
  double link_latency_s(long g, long h) const { return same_node(g, h) ? intranode_latency_s : internode_latency_s; }
  // The seconds of a kernel over `rows` rows that takes `seconds` at the large-kernel
  // rate: seconds x (1 + half_rows / rows).
  static double small_kernel_seconds(double seconds, double rows, double half_rows) {
    return rows > 0 ? seconds * (1 + half_rows / rows) : seconds;
  }
  double gemm_seconds(double seconds, double rows) const { return small_kernel_seconds(seconds, rows, gemm_half_rows); }
  double attention_seconds(double seconds, double rows) const {
    return small_kernel_seconds(seconds, rows, attention_half_rows);
  }
};

// Throws std::invalid_argument naming the first field out of range (all rates and
// sizes positive, achievable_fraction and link_efficiency in (0, 1], latencies,
// half-performance rows and reserved >= 0, reserved < hbm).
void validate_hardware(const HardwareProfile& hardware);

}  // namespace hdp
