#include "parallel/mpi_communicator.h"

#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "parallel/progress.h"

namespace hdp {

// ---- staging pool ------------------------------------------------------------------

class StagingPool {
 public:
  struct Block {
    float* data = nullptr;
    int size_class = 0;  // the block holds 2^size_class bytes
    bool pinned = false;
  };

  StagingPool() = default;
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool() {
    for (auto& [key, blocks] : free_) {
      for (const Block& b : blocks) release_memory(b);
    }
  }

  // A block of at least `bytes`: a free one of its size class, else a new one.
  Block acquire(size_t bytes, bool pinned) {
    int size_class = kMinClass;
    while ((size_t{1} << size_class) < bytes) ++size_class;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<Block>& list = free_[key(size_class, pinned)];
      if (!list.empty()) {
        const Block b = list.back();
        list.pop_back();
        return b;
      }
    }
    Block b;
    b.size_class = size_class;
    b.pinned = pinned;
    const size_t n = size_t{1} << size_class;
    b.data = static_cast<float*>(pinned ? cuda::pinned_malloc(n) : std::aligned_alloc(4096, n));
    if (b.data == nullptr) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_ += n;
    ++allocations_;
    return b;
  }

  void release(const Block& b) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[key(b.size_class, b.pinned)].push_back(b);
  }

  size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }
  int64_t allocations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return allocations_;
  }

 private:
  static constexpr int kMinClass = 12;  // 4 KiB
  static int key(int size_class, bool pinned) { return 2 * size_class + (pinned ? 1 : 0); }
  static void release_memory(const Block& b) {
    if (b.pinned) {
      cuda::pinned_free(b.data);
    } else {
      std::free(b.data);
    }
  }

  mutable std::mutex mutex_;
  std::map<int, std::vector<Block>> free_;
  size_t bytes_ = 0;
  int64_t allocations_ = 0;
};

namespace {

// Bytes a tensor takes on the wire in a collective: every element travels as an
// MPI_FLOAT (bf16 tensors are widened into a staging block first, see
// MpiCommunicator::staged), so that reductions sum in fp32.
size_t wire_bytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * sizeof(float); }

// A point-to-point message reduces nothing: its elements travel in their own dtype,
// bf16 as its 16 bits (MPI_UINT16_T: the bytes as they are, half of fp32's).
MPI_Datatype message_type(const Tensor& t) { return t.dtype == DType::BF16 ? MPI_UINT16_T : MPI_FLOAT; }

// Tensor t as one flat run of elements [begin, end).
Tensor flat(const Tensor& t, int64_t begin, int64_t end) { return t.view({t.numel()}).rows(begin, end); }
Tensor flat(const Tensor& t) { return flat(t, 0, t.numel()); }

std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// The communicators this class owns return errors instead of aborting the job (see
// the constructor), so every call is checked and a failure names the group, the
// operation and the peer (a world rank).
void check(int rc, const std::string& group, const char* op, int peer = -1) {
  if (rc != MPI_SUCCESS) {
    throw std::runtime_error(group + " " + op + (peer >= 0 ? " rank " + std::to_string(peer) : std::string()) + ": " +
                             mpi_error(rc));
  }
}

class MpiPending final : public CommRequest::Pending {
 public:
  MPI_Request request = MPI_REQUEST_NULL;
  // A receive: the elements it expects, checked against what arrived (-1 otherwise).
  int64_t expected = -1;
  MPI_Datatype expected_type = MPI_FLOAT;  // the elements' MPI type, for counting them
  // What wait() is waiting for, for the hang watchdog (parallel/progress.h).
  const char* op = "";
  const char* group = "";
  int peer = -1;  // world rank, -1 for a collective
  // Count and displacement arrays of a v-collective must outlive the call.
  std::vector<int> counts, displacements;
  std::vector<int> recv_counts, recv_displacements;  // all-to-all: the receiving side's
  // Staged buffers: the blocks in use, and the outputs to copy back after MPI_Wait.
  std::shared_ptr<StagingPool> pool;
  std::vector<StagingPool::Block> blocks;
  struct CopyBack {
    Tensor destination;  // flat
    Tensor staged;       // the block, in the dtype the elements travelled in
  };
  std::vector<CopyBack> copy_back;

  ~MpiPending() override { release_blocks(); }

  void wait() override {
    {
      progress::Waiting waiting(op, group, peer);
      MPI_Status status;
      const int rc = MPI_Wait(&request, &status);
      if (rc != MPI_SUCCESS || expected >= 0) check_arrived(rc, status);
    }
    {
      const StagedCopies staged_copy;  // the communicator's wait, not the computation's (kernels/ops.h)
      for (const CopyBack& c : copy_back) copy(c.destination, c.staged);
    }
    copy_back.clear();
    release_blocks();
  }

  // The host address MPI uses for `t` (flat, all of it): a staging block when
  // `staged`, else t's own memory. The block holds the elements as `wire` (fp32 for
  // collectives, which widen bf16 exactly; t's own dtype for messages, copied as
  // bytes). Elements [in_begin, in_end) of t are copied into the block now (the part
  // MPI reads); with `output`, the whole block is copied back into t by wait(),
  // rounding once when bf16 travelled as fp32.
  void* host_buffer(const Tensor& t, bool staged, int64_t in_begin, int64_t in_end, bool output,
                    DType wire = DType::F32) {
    if (!staged) return t.raw();
    // Page-locked for CUDA buffers; plain host memory for the others (Device::Guarded, the test mode).
    const StagingPool::Block b =
        pool->acquire(static_cast<size_t>(t.numel()) * dtype_size(wire), t.device == Device::CUDA);
    blocks.push_back(b);
    Tensor block(b.data, {t.numel()}, Device::CPU);
    block.dtype = wire;
    if (in_end > in_begin) {
      const StagedCopies staged_copy;  // the communicator's read, not the computation's (kernels/ops.h)
      copy(block.rows(in_begin, in_end), flat(t, in_begin, in_end));
    }
    if (output) copy_back.push_back({flat(t), block});
    return b.data;
  }
  float* input(const Tensor& t, bool staged) { return static_cast<float*>(host_buffer(t, staged, 0, t.numel(), false)); }
  float* output(const Tensor& t, bool staged) { return static_cast<float*>(host_buffer(t, staged, 0, 0, true)); }
  float* in_out(const Tensor& t, bool staged) { return static_cast<float*>(host_buffer(t, staged, 0, t.numel(), true)); }
  // A point-to-point message's buffer: its own dtype on the wire.
  const void* message_input(const Tensor& t, bool staged) {
    return host_buffer(t, staged, 0, t.numel(), false, t.dtype);
  }
  void* message_output(const Tensor& t, bool staged) { return host_buffer(t, staged, 0, 0, true, t.dtype); }

 private:
  // A receive whose message is longer (MPI_ERR_TRUNCATE) or shorter than its buffer.
  void check_arrived(int rc, const MPI_Status& status) {
    const std::string where = std::string(group) + " " + op + (peer >= 0 ? " rank " + std::to_string(peer) : std::string());
    if (rc != MPI_SUCCESS) {
      release_blocks();
      throw std::runtime_error(where + ": " + mpi_error(rc) +
                               (expected >= 0 ? " (the message is longer than the " + std::to_string(expected) +
                                                    " elements of the receive)"
                                              : std::string()));
    }
    int count = 0;
    MPI_Get_count(&status, expected_type, &count);
    if (count != expected) {
      release_blocks();
      throw std::runtime_error(where + ": " + std::to_string(count) + " elements arrived, the receive holds " +
                               std::to_string(expected));
    }
  }
  void release_blocks() {
    for (const StagingPool::Block& b : blocks) pool->release(b);
    blocks.clear();
  }
};

// Part sizes and offsets of an even split of n elements (Communicator::part_begin).
void split_counts(int64_t n, int parts, MpiPending& p) {
  p.counts.resize(parts);
  p.displacements.resize(parts);
  for (int r = 0; r < parts; ++r) {
    p.displacements[r] = static_cast<int>(part_begin(n, r, parts));
    p.counts[r] = static_cast<int>(part_begin(n, r + 1, parts) - part_begin(n, r, parts));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

int count_of(const Tensor& t, const std::string& what) {
  if (t.numel() > INT_MAX) throw std::invalid_argument("MPI " + what + ": more than 2^31 elements in one call");
  return static_cast<int>(t.numel());
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : comm_(comm), name_(std::move(name)), staging_(std::make_shared<StagingPool>()) {
  // Errors on a communicator this object owns come back as codes, which every call
  // checks (a receive of the wrong size names the group and peer instead of aborting
  // with MPI's message); MPI_COMM_WORLD keeps its handler, which other code relies on.
  if (comm_ != MPI_COMM_WORLD) MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // MPI_TAG_UB is an attribute of every communicator (a pointer to the int).
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found);
  max_tag_ = found && tag_ub != nullptr ? *tag_ub : kGuaranteedMaxTag;
  // The world rank of every member, so that a wait names its peer as the job knows it.
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm_, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> members(size_);
  for (int r = 0; r < size_; ++r) members[r] = r;
  world_ranks_.resize(size_);
  MPI_Group_translate_ranks(group, size_, members.data(), world, world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key, std::string name) const {
  MPI_Comm out = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out), name_, "split");
  if (out == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(out, std::move(name));
}

size_t MpiCommunicator::staging_bytes() const { return staging_->bytes(); }
int64_t MpiCommunicator::staging_allocations() const { return staging_->allocations(); }

namespace {
std::unique_ptr<MpiPending> pending_with(const std::shared_ptr<StagingPool>& pool, const char* op, const std::string& group,
                                         int peer = -1) {
  auto p = std::make_unique<MpiPending>();
  p->pool = pool;
  p->op = op;
  p->group = group.c_str();
  p->peer = peer;
  return p;
}
}  // namespace

CommRequest MpiCommunicator::all_reduce_async(Tensor data, ReduceOp op) {
  const int n = count_of(data, name_ + " all-reduce");
  stats_.collective_bytes += ring_collective_bytes(static_cast<int64_t>(wire_bytes(data)), size_, 2);
  ++stats_.collectives;
  if (size_ == 1) return {};
  auto p = pending_with(staging_, "all-reduce", name_);
  float* buffer = p->in_out(data, staged(data));
  check(MPI_Iallreduce(MPI_IN_PLACE, buffer, n, MPI_FLOAT, mpi_op(op), comm_, &p->request), name_, "all-reduce");
  return CommRequest(std::move(p));
}

CommRequest MpiCommunicator::reduce_scatter_async(const Tensor& send, Tensor recv) {
  const int n = count_of(send, name_ + " reduce-scatter");
  count_of(recv, name_ + " reduce-scatter");
  const std::string error = reduce_scatter_part_error(name_, rank_, size_, n, recv.numel());
  if (!error.empty()) throw std::invalid_argument(error);
  stats_.collective_bytes += ring_collective_bytes(static_cast<int64_t>(wire_bytes(send)), size_, 1);
  ++stats_.collectives;
  if (size_ == 1 && (staged(send) || staged(recv))) {  // nothing to reduce: recv = send, on the device
    copy(flat(recv), flat(send));
    return {};
  }
  auto p = pending_with(staging_, "reduce-scatter", name_);
  split_counts(n, size_, *p);
  const float* send_buffer = p->input(send, staged(send));
  float* recv_buffer = p->output(recv, staged(recv));
  check(MPI_Ireduce_scatter(send_buffer, recv_buffer, p->counts.data(), MPI_FLOAT, MPI_SUM, comm_, &p->request), name_,
        "reduce-scatter");
  return CommRequest(std::move(p));
}

CommRequest MpiCommunicator::all_gather_async(Tensor buffer) {
  const int n = count_of(buffer, name_ + " all-gather");
  stats_.collective_bytes += ring_collective_bytes(static_cast<int64_t>(wire_bytes(buffer)), size_, 1);
  ++stats_.collectives;
  if (size_ == 1) return {};
  auto p = pending_with(staging_, "all-gather", name_);
  split_counts(n, size_, *p);
  // In place, MPI reads only this rank's part.
  void* host = p->host_buffer(buffer, staged(buffer), part_begin(n, rank_, size_), part_begin(n, rank_ + 1, size_),
                               true);
  check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host, p->counts.data(), p->displacements.data(), MPI_FLOAT,
                       comm_, &p->request),
        name_, "all-gather");
  return CommRequest(std::move(p));
}

CommRequest MpiCommunicator::all_to_all_v_async(const Tensor& send, std::span<const int64_t> send_counts, Tensor recv,
                                                std::span<const int64_t> recv_counts) {
  check_all_to_all_counts(name_, size_, send, send_counts, recv, recv_counts);
  count_of(send, name_ + " all-to-all");
  count_of(recv, name_ + " all-to-all");
  auto p = pending_with(staging_, "all-to-all", name_);
  auto layout = [this](std::span<const int64_t> counts, std::vector<int>& c, std::vector<int>& d) {
    c.resize(size_);
    d.resize(size_);
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      c[r] = static_cast<int>(counts[r]);
      d[r] = static_cast<int>(offset);
      offset += counts[r];
    }
  };
  layout(send_counts, p->counts, p->displacements);
  layout(recv_counts, p->recv_counts, p->recv_displacements);
  // What leaves this rank: everything but its part for itself.
  stats_.collective_bytes += (send.numel() - send_counts[rank_]) * static_cast<int64_t>(sizeof(float));
  ++stats_.collectives;
  const float* send_buffer = p->input(send, staged(send));
  float* recv_buffer = p->output(recv, staged(recv));
  check(MPI_Ialltoallv(send_buffer, p->counts.data(), p->displacements.data(), MPI_FLOAT, recv_buffer,
                       p->recv_counts.data(), p->recv_displacements.data(), MPI_FLOAT, comm_, &p->request),
        name_, "all-to-all");
  return CommRequest(std::move(p));
}

CommRequest MpiCommunicator::send_async(const Tensor& data, int peer, int tag) {
  const int n = count_of(data, name_ + " send");
  check_message_dtype(data, "send to");
  check_tag(tag, "send to", world_rank(peer));
  stats_.p2p_bytes += static_cast<int64_t>(data.bytes());
  ++stats_.p2p_messages;
  auto p = pending_with(staging_, "send to", name_, world_rank(peer));
  const void* buffer = p->message_input(data, staged_message(data));
  check(MPI_Isend(buffer, n, message_type(data), peer, tag, comm_, &p->request), name_, "send to", world_rank(peer));
  return CommRequest(std::move(p));
}

CommRequest MpiCommunicator::recv_async(Tensor data, int peer, int tag) {
  const int n = count_of(data, name_ + " recv");
  check_message_dtype(data, "recv from");
  check_tag(tag, "recv from", world_rank(peer));
  auto p = pending_with(staging_, "recv from", name_, world_rank(peer));
  void* buffer = p->message_output(data, staged_message(data));
  p->expected = n;
  p->expected_type = message_type(data);
  check(MPI_Irecv(buffer, n, message_type(data), peer, tag, comm_, &p->request), name_, "recv from", world_rank(peer));
  return CommRequest(std::move(p));
}

void MpiCommunicator::check_message_dtype(const Tensor& t, const char* op) const {
  if (t.dtype != DType::F32 && t.dtype != DType::BF16) {
    throw std::invalid_argument(name_ + " " + op + ": " + dtype_name(t.dtype) + " tensors are not communicated");
  }
}

void MpiCommunicator::all_reduce(std::span<double> values, ReduceOp op) {
  if (size_ == 1) return;
  progress::Waiting waiting("all-reduce", name_.c_str());
  check(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, mpi_op(op), comm_), name_,
        "all-reduce");
}

void MpiCommunicator::all_reduce(std::span<int64_t> values, ReduceOp op) {
  if (size_ == 1) return;
  progress::Waiting waiting("all-reduce", name_.c_str());
  check(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_INT64_T, mpi_op(op), comm_),
        name_, "all-reduce");
}

}  // namespace hdp
