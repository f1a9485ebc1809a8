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

  // The compute rate the cost model uses: peak_flops * achievable_fraction.
  double flops_per_second() const { return peak_flops * achievable_fraction; }
  // GPUs g and h (global GPU indices, gpus_per_node per node in order).
  bool same_node(long g, long h) const { return g / gpus_per_node == h / gpus_per_node; }
  double link_bytes_per_s(long g, long h) const { return same_node(g, h) ? nvlink_bytes_per_s : internode_bytes_per_s; }
  double link_latency_s(long g, long h) const { return same_node(g, h) ? intranode_latency_s : internode_latency_s; }
};

// Throws std::invalid_argument naming the first field out of range (all rates and
// sizes positive, achievable_fraction in (0, 1], latencies and reserved >= 0,
// reserved < hbm).
void validate_hardware(const HardwareProfile& hardware);

}  // namespace hdp
