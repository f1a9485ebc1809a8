// An op trace in JSON Lines (whatif/trace.h: read_traces), then the straggler
// analysis of `trainer analyze` over it (whatif/straggler_analysis.h).
#include "whatif/straggler_analysis.h"
#include "whatif/trace.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hdp::fuzz::write_input("trace.jsonl", hdp::fuzz::as_text(data, size));
  return hdp::fuzz::accept_or_refuse([&] {
    const hdp::Trace trace = hdp::read_traces({path});
    hdp::straggler_report_json(hdp::analyze_stragglers(trace));
  });
}
