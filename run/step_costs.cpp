#include "run/step_costs.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/pipeline_layers.h"
#include "kernels/dtype.h"

namespace hdp {

StepCosts run_step_costs(const Config& config, const CostModel& layer, const CostModel& recomputed) {
  const double link = std::min(layer.d2h_bytes_per_s, layer.h2d_bytes_per_s);
  if (!(link > 0)) {
    throw ConfigError("the step simulator needs a positive host copy bandwidth (offload.bandwidth_gbs, or the "
                      "d2h and h2d rates of scheduler.cost_file), got " + std::to_string(link) + " bytes/s");
  }
  HardwareProfile ranks;
  ranks.name = "training ranks";
  ranks.gpus_per_node = config.parallel.world();  // one link rate: where a rank sits does not matter
  ranks.nvlink_bytes_per_s = ranks.internode_bytes_per_s = ranks.pcie_bytes_per_s = ranks.hbm_bytes_per_s = link;
  // Read by nothing below: the compute rate's costs are replaced by the run's, and the
  // device memory is the planners' capacity (data.micro_batch_tokens).
  ranks.peak_flops = 1;
  ranks.achievable_fraction = 1;
  ranks.hbm_bytes = 1;
  const std::vector<int64_t> chunks = virtual_stage_layers(config);
  StepCosts k;
  try {
    k = make_step_costs(config.model.shape(), ranks, config.parallel, chunks, config.parallel.ep,
                        config.train.recompute, config.parallel.sequence_parallel);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("the step simulator's costs of this run: ") + e.what());
  }
  k.cost = layer;
  k.recomputed = recomputed;
  k.embedding_seconds_per_token = layer.embedding_seconds_per_token;
  k.head_seconds_per_token = layer.head_seconds_per_token;
  // make_step_costs counts bf16 activations and weights (kActivationBytes); the run
  // sends them in its precision. Gradients are fp32 in both.
  const double element = static_cast<double>(dtype_size(config.train.precision)) / kActivationBytes;
  k.kv_bytes_per_token *= element;
  k.boundary_bytes_per_token *= element;
  k.all_to_all_bytes_per_token *= element;
  for (double& b : k.parameter_bytes) b *= element;
  for (double& b : k.expert_parameter_bytes) b *= element;
  return k;
}

}  // namespace hdp
