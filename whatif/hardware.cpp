#include "whatif/hardware.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace hdp {

namespace {

void positive(double v, const char* field) {
  if (!(v > 0) || !std::isfinite(v))
    throw std::invalid_argument(std::string(field) + " must be a positive number, got " + std::to_string(v));
}

void non_negative(double v, const char* field) {
  if (!(v >= 0) || !std::isfinite(v))
    throw std::invalid_argument(std::string(field) + " must not be negative, got " + std::to_string(v));
}

}  // namespace

void validate_hardware(const HardwareProfile& h) {
  if (h.gpus_per_node < 1)
    throw std::invalid_argument("gpus_per_node must be at least 1, got " + std::to_string(h.gpus_per_node));
  positive(h.peak_flops, "peak_bf16_flops");
  if (!(h.achievable_fraction > 0 && h.achievable_fraction <= 1))
    throw std::invalid_argument("achievable_fraction must be in (0, 1], got " + std::to_string(h.achievable_fraction));
  positive(h.hbm_bytes, "hbm_bytes");
  positive(h.hbm_bytes_per_s, "hbm_bytes_per_s");
  non_negative(h.reserved_bytes, "reserved_bytes");
  if (h.reserved_bytes >= h.hbm_bytes)
    throw std::invalid_argument("reserved_bytes (" + std::to_string(h.reserved_bytes) + ") must be below hbm_bytes (" +
                                std::to_string(h.hbm_bytes) + ")");
  positive(h.nvlink_bytes_per_s, "nvlink_bytes_per_s");
  positive(h.internode_bytes_per_s, "internode_bytes_per_s");
  non_negative(h.intranode_latency_s, "intranode_latency_s");
  non_negative(h.internode_latency_s, "internode_latency_s");
  positive(h.pcie_bytes_per_s, "pcie_bytes_per_s");
  non_negative(h.host_bytes_per_node, "host_bytes_per_node");
  if (!(h.link_efficiency > 0 && h.link_efficiency <= 1))
    throw std::invalid_argument("link_efficiency must be in (0, 1], got " + std::to_string(h.link_efficiency));
  non_negative(h.gemm_half_rows, "gemm_half_rows");
  non_negative(h.attention_half_rows, "attention_half_rows");
}

}  // namespace hdp
