#pragma once
// Effective training time ratio (ETTR), as ByteRobust (ByteDance, 2025) defines it:
// the time spent on training progress that survives, divided by the wall time.
// A step counts once its progress survives: a step run and then lost (the job
// failed before a checkpoint held it, and the restarted job runs it again) is
// not effective; its rerun is. Restarts, back-off, start-up, checkpoint writes
// and data waits outside a step are not effective either.
//
// The steps come from the run's metrics.jsonl (run/metrics.h): each line's
// "step", "step_ms" (the step's duration) and "time" (Unix time in seconds when
// the step ended). A resumed run rewrites that file to the steps of the
// checkpoint it resumed from and appends its own, so the file holds every step
// once, with the time of the run whose progress is kept.

#include <cstdint>
#include <string>
#include <vector>

namespace hdp {

struct StepTiming {
  int64_t step = 0;
  double end_s = 0;       // Unix time the step ended
  double duration_s = 0;  // its step time
};

// The steps of RUN_DIR/metrics.jsonl that carry a time; lines of older runs
// without one and a last line cut short by a crash are skipped. A missing file
// is no steps (the run has not finished a step yet).
std::vector<StepTiming> read_step_timings(const std::string& metrics_path);

// Seconds of steps with step <= last_kept_step that fall inside [from_s, to_s]
// (a step partly inside counts with that part).
double effective_seconds(const std::vector<StepTiming>& steps, int64_t last_kept_step, double from_s, double to_s);

struct Ettr {
  double wall_s = 0;
  double effective_s = 0;
  double ratio = 0;  // effective_s / wall_s (0 before any wall time)
};

// ETTR over [from_s, to_s].
Ettr ettr_between(const std::vector<StepTiming>& steps, int64_t last_kept_step, double from_s, double to_s);

}  // namespace hdp
