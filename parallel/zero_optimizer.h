#pragma once
// ZeRO-1 AdamW over a flat parameter buffer, sharded across the hybrid-data-
// parallel group.
//
// The flat buffer is cut into buckets at parameter boundaries (in reverse, the
// order backward finalises gradients). Every bucket is split into hdp parts,
// part r of every bucket belongs to hdp rank r ([n*r/hdp, n*(r+1)/hdp)), and the
// concatenation of a rank's parts is its shard: only the shard has AdamW moments
// on that rank. A step:
//   1. during the last micro-batch's backward, each bucket's gradients are
//      reduce-scattered as soon as they are final (gradients_ready), overlapping
//      the rest of backward;
//   2. finish_gradients() starts what is left, waits, and adds the shard's sum of
//      squares into a sum on the device, which the caller reads back with the step's
//      other sums (one host read) and turns into the global gradient norm with
//      gradient_norm() (shards of all hdp ranks and all tp/pp ranks);
//   3. step() updates the shard (fp32: the shard of the parameter buffer is the
//      master copy) and all-gathers the updated parameters bucket by bucket.
// With hdp = 1 the same path runs without sharding.
//
// Expert parallelism (Mixtral): an expert's weights live only on the hdp ranks
// that hold the expert, its expert-data-parallel group (parallel_degrees.h). Their
// buckets (never mixed with others: buckets are also cut where the group changes)
// are split over, reduce-scattered in and all-gathered over that group instead;
// everything else is as above. Every rank of the hdp group has the same buckets in
// the same order, so the collectives of both groups are posted in one order.

#include <cstdint>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/communicator.h"
#include "spec/optim_config.h"

namespace hdp {

struct FlatParameter {
  int64_t offset = 0;           // in floats from the start of the flat buffer
  int64_t numel = 0;
  bool weight_decay = false;
  bool counts_in_norm = true;   // false for copies counted elsewhere (tp-replicated, tied copies)
  bool synced_later = false;    // gradient completed by another collective first (tied embeddings)
  bool expert = false;          // sharded over the expert-data-parallel group, not hdp
};

// The AdamW kernel's arguments for one update (decay as the hyper-parameters say; the
// caller zeroes it for parameters that do not decay): the one place where the
// hyper-parameters become them.
AdamWStep adamw_step(const AdamWHyperparameters& adamw, double lr, int64_t step, float grad_scale);

class ZeroAdamW {
 public:
  // norm_group: every rank whose shards make up the whole gradient (the world).
  // expert_dp: the group that shards the `expert` parameters (nullptr: hdp).
  ZeroAdamW(std::vector<FlatParameter> parameters, int64_t flat_numel, const AdamWHyperparameters& adamw,
            Communicator& hdp, Communicator& norm_group, int64_t bucket_floats, Device device = Device::CPU,
            Communicator* expert_dp = nullptr);

  // A piece of this rank's shard: flat elements [flat_offset, flat_offset + length)
  // of parameter `parameter`, whose moments sit at [state_offset, state_offset + length).
  struct Segment {
    size_t parameter = 0;
    int64_t flat_offset = 0;
    int64_t length = 0;
    int64_t state_offset = 0;
  };
  const std::vector<Segment>& segments() const { return segments_; }
  int64_t shard_numel() const { return shard_numel_; }
  Tensor exp_avg() const { return m_; }
  Tensor exp_avg_sq() const { return v_; }
  // Optimizer memory: the moments, plus the reduced gradient shard when sharded.
  size_t state_bytes() const { return arena_.capacity(); }
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

  // Call before the last micro-batch's backward; from then on gradients_ready()
  // starts the reduce-scatter of every bucket whose gradients are all final.
  void begin_reduction(const Tensor& grads);
  void gradients_ready(int64_t offset);
  // Starts the buckets not started yet, waits for all, and adds this rank's part of
  // the squared L2 norm (its shard, the parameters that count in the norm, in shard
  // order) into squared_norm[0] on the device.
  void finish_gradients(DoubleTensor squared_norm);
  // The global L2 norm from this rank's part, read back: the sum over the norm group.
  double gradient_norm(double local_sum_squares);
  // AdamW on this rank's shard with the reduced gradients, then all-gather. Given
  // compute_params (mixed precision's bf16 copy, params' layout), also leaves every
  // element of it equal to the updated params rounded: the shard by the update's own
  // pass, the gathered parts by a rounding copy.
  void step(Tensor params, double lr, float grad_scale, int64_t step, Tensor compute_params = Tensor());

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;     // flat range
    int64_t part_begin = 0;         // this rank's part: [part_begin, part_end)
    int64_t part_end = 0;
    int64_t shard_offset = 0;       // where the part sits in the shard buffers
    Communicator* group = nullptr;  // hdp, or the expert-data-parallel group
    bool synced_later = false;
    bool started = false;
    CommRequest request;
  };
  void start(Bucket& bucket);

  std::vector<FlatParameter> parameters_;
  AdamWHyperparameters adamw_;
  Communicator& norm_group_;
  bool sharded_ = true;             // some bucket's group has more than one rank
  std::vector<Bucket> buckets_;     // in flat order
  std::vector<Segment> segments_;
  int64_t shard_numel_ = 0;
  Arena arena_;
  Tensor grad_shard_, m_, v_;       // grad_shard_ aliases the gradients when not sharded
  Tensor grads_;                    // the full gradient buffer of the current reduction
  size_t next_to_start_ = 0;        // buckets start from the end of the buffer backwards
};

}  // namespace hdp
