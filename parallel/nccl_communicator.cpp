#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_runtime.h"
#include "parallel/device_ops.h"
#include "parallel/op_tracer.h"

namespace hdp {
namespace {

void check_nccl(ncclResult_t result, const std::string& group, const char* op, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  std::string detail = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') detail += std::string(": ") + last;
  throw std::runtime_error(group + " " + op + ": NCCL error: " + detail);
}

void check_cuda(cudaError_t error, const std::string& group, const char* op) {
  if (error != cudaSuccess) {
    throw std::runtime_error(group + " " + op + ": CUDA error: " + cudaGetErrorString(error));
  }
}

ncclDataType_t nccl_type(const Tensor& t, const std::string& group, const char* op) {
  switch (t.dtype) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    default: throw std::invalid_argument(group + " " + op + ": " + dtype_name(t.dtype) + " tensors are not communicated");
  }
}

// Completion events of operations in flight, recycled when their requests are waited for.
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "nccl", "event");
      return e;
    }
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  void give_back(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(e);
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// The compute stream waits for `done`, recorded on the communication stream after
// the operation; the event goes back to the pool (a later record does not change
// what the compute stream already waits for).
class NcclPending final : public CommRequest::Pending {
 public:
  NcclPending(std::shared_ptr<EventPool> events, cudaEvent_t done) : events_(std::move(events)), done_(done) {}
  ~NcclPending() override {
    if (done_ != nullptr) events_->give_back(done_);
  }
  void wait() override {
    const cudaError_t error =
        cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda::compute_stream_handle()), done_, 0);
    events_->give_back(done_);
    done_ = nullptr;
    check_cuda(error, "nccl", "wait");
  }

 private:
  std::shared_ptr<EventPool> events_;
  cudaEvent_t done_;
};

// A communicator's operations as the device ledger (parallel/device_ops.h) sees
// them: a pair of timing events on the communication stream around each, in
// slots reused once the ledger released them. Event times are read relative to an
// epoch event whose host time is known: it is re-recorded whenever nothing of the
// stream is in flight (every earlier operation seen finished), so the stream is
// idle and the event completes as it is recorded, and the float milliseconds of
// cudaEventElapsedTime stay small (fine-grained). The ledger may query from the
// watchdog thread, hence the lock.
class NcclTimeline final : public DeviceStream {
 public:
  NcclTimeline(ncclComm_t comm, std::string group) : comm_(comm), group_(std::move(group)) {
    check_cuda(cudaGetDevice(&device_), group_, "device");
    check_cuda(cudaEventCreate(&epoch_), group_, "event");
  }
  ~NcclTimeline() override {
    for (const Slot& s : slots_) {
      cudaEventDestroy(s.start);
      cudaEventDestroy(s.end);
    }
    cudaEventDestroy(epoch_);
  }
  NcclTimeline(const NcclTimeline&) = delete;
  NcclTimeline& operator=(const NcclTimeline&) = delete;

  // Before the stream's wait for the compute stream.
  void mark_epoch_if_idle(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_ > 0 && epoch_recorded_) return;
    check_cuda(cudaEventRecord(epoch_, stream), group_, "event");
    epoch_us_ = OpTracer::local_us();
    epoch_recorded_ = true;
  }
  // The start event of a new operation, once the stream may run it; its slot.
  uint64_t begin(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t slot = 0;
    if (free_.empty()) {
      Slot s;
      check_cuda(cudaEventCreate(&s.start), group_, "event");
      check_cuda(cudaEventCreate(&s.end), group_, "event");
      slot = slots_.size();
      slots_.push_back(s);
    } else {
      slot = free_.back();
      free_.pop_back();
    }
    ++in_flight_;
    check_cuda(cudaEventRecord(slots_[slot].start, stream), group_, "event");
    return slot;
  }
  void end(uint64_t slot, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_cuda(cudaEventRecord(slots_[slot].end, stream), group_, "event");
  }

  std::optional<DeviceTimes> finished(uint64_t slot) override {
    std::lock_guard<std::mutex> lock(mutex_);
    make_device_current();
    const Slot& s = slots_[slot];
    // A query that fails (cudaErrorNotReady while the operation runs) leaves its error
    // as the thread's last error, which the next kernel launch's check would report
    // as its own: clear it, as kernels/cuda/runtime.cu does after its queries.
    if (cudaEventQuery(s.end) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    float start_ms = 0, end_ms = 0;
    if (cudaEventElapsedTime(&start_ms, epoch_, s.start) != cudaSuccess ||
        cudaEventElapsedTime(&end_ms, epoch_, s.end) != cudaSuccess) {
      (void)cudaGetLastError();
      return DeviceTimes{epoch_us_, epoch_us_};  // finished, its times unreadable
    }
    return DeviceTimes{epoch_us_ + 1e3 * start_ms, epoch_us_ + 1e3 * end_ms};
  }
  void release(uint64_t slot) override {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(slot);
    --in_flight_;
  }
  std::string async_error() override {
    ncclResult_t result = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &result) != ncclSuccess) return {};
    if (result == ncclSuccess || result == ncclInProgress) return {};
    std::string detail = ncclGetErrorString(result);
    const char* last = ncclGetLastError(comm_);
    if (last != nullptr && *last != '\0') detail += std::string(": ") + last;
    return group_ + ": NCCL error: " + detail;
  }

 private:
  // The thread that polls (the training thread, or one tearing the communicator
  // down) must have this stream's device current.
  void make_device_current() const {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device_) cudaSetDevice(device_);
  }

  struct Slot {
    cudaEvent_t start = nullptr, end = nullptr;
  };
  ncclComm_t comm_;
  std::string group_;
  int device_ = 0;
  std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<uint64_t> free_;
  int64_t in_flight_ = 0;
  cudaEvent_t epoch_ = nullptr;
  double epoch_us_ = 0;
  bool epoch_recorded_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<MpiCommunicator> mpi, ncclComm_t comm)
      : mpi_(std::move(mpi)), comm_(comm), events_(std::make_shared<EventPool>()) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), name(), "stream");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), name(), "event");
    timeline_ = std::make_unique<NcclTimeline>(comm_, name());
    device_ops().attach(timeline_.get());
  }
  ~NcclCommunicator() override {
    if (std::uncaught_exceptions() > 0) {
      device_ops().detach(timeline_.get());  // no more queries of a communicator being aborted
      // The job is going down (this rank logs and aborts next): finalizing could wait
      // for peers that never come, aborting the communicator does not.
      ncclCommAbort(comm_);
    } else {
      cudaStreamSynchronize(stream_);
      device_ops().poll();  // the finished operations' trace records are kept
      device_ops().detach(timeline_.get());
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    }
    timeline_.reset();
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  const std::string& name() const override { return mpi_->name(); }
  // Point-to-point travels through the MPI twin, whose tags are the limit.
  int max_tag() const override { return mpi_->max_tag(); }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) const {
    // Both splits are collective over this communicator's ranks, in the same order on each.
    std::unique_ptr<MpiCommunicator> mpi = mpi_->split(color, key, std::move(name));
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, nullptr), this->name(),
               "split", comm_);
    if (color < 0) return nullptr;
    return std::make_unique<NcclCommunicator>(std::move(mpi), comm);
  }

  CommRequest all_reduce_async(Tensor data, ReduceOp op) override {
    if (!on_device(data)) return through_mpi([&] { return mpi_->all_reduce_async(data, op); });
    const ncclDataType_t type = nccl_type(data, name(), "all-reduce");
    count_collective(data, 2);
    if (size() == 1 || data.numel() == 0) return {};
    start();
    check_nccl(ncclAllReduce(data.raw(), data.raw(), static_cast<size_t>(data.numel()), type,
                             op == ReduceOp::Sum ? ncclSum : ncclMax, comm_, stream_),
               name(), "all-reduce", comm_);
    return finish(DeviceOp{name(), "all-reduce", static_cast<int64_t>(data.bytes())});
  }

  CommRequest reduce_scatter_async(const Tensor& send, Tensor recv) override {
    if (!on_device(send) || !on_device(recv)) {
      return through_mpi([&] { return mpi_->reduce_scatter_async(send, recv); });
    }
    const int64_t n = send.numel();
    const std::string error = reduce_scatter_part_error(name(), rank(), size(), n, recv.numel());
    if (!error.empty()) throw std::invalid_argument(error);
    if (send.dtype != recv.dtype) throw std::invalid_argument(name() + " reduce-scatter: send and receive dtypes differ");
    const ncclDataType_t type = nccl_type(send, name(), "reduce-scatter");
    count_collective(send, 1);
    if (n == 0) return {};
    start();
    const size_t element = send.element_size();
    const char* base = static_cast<const char*>(send.raw());
    if (n % size() == 0) {
      check_nccl(ncclReduceScatter(send.raw(), recv.raw(), static_cast<size_t>(n / size()), type, ncclSum, comm_, stream_),
                 name(), "reduce-scatter", comm_);
    } else {
      // Uneven parts (Communicator::part_begin): one reduce to each part's owner, as one group.
      check_nccl(ncclGroupStart(), name(), "reduce-scatter");
      for (int r = 0; r < size(); ++r) {
        const int64_t begin = part_begin(n, r, size()), count = part_begin(n, r + 1, size()) - begin;
        if (count == 0) continue;
        const void* part = base + static_cast<size_t>(begin) * element;
        // recvbuff is written on the root only; elsewhere the part itself stands in.
        void* out = r == rank() ? recv.raw() : const_cast<void*>(part);
        check_nccl(ncclReduce(part, out, static_cast<size_t>(count), type, ncclSum, r, comm_, stream_), name(),
                   "reduce-scatter", comm_);
      }
      check_nccl(ncclGroupEnd(), name(), "reduce-scatter", comm_);
    }
    return finish(DeviceOp{name(), "reduce-scatter", static_cast<int64_t>(send.bytes())});
  }

  CommRequest all_gather_async(Tensor buffer) override {
    if (!on_device(buffer)) return through_mpi([&] { return mpi_->all_gather_async(buffer); });
    const ncclDataType_t type = nccl_type(buffer, name(), "all-gather");
    count_collective(buffer, 1);
    const int64_t n = buffer.numel();
    if (size() == 1 || n == 0) return {};
    start();
    char* base = static_cast<char*>(buffer.raw());
    const size_t element = buffer.element_size();
    if (n % size() == 0) {
      // In place: this rank's part is the send buffer.
      const int64_t part = n / size();
      check_nccl(ncclAllGather(base + static_cast<size_t>(rank() * part) * element, base, static_cast<size_t>(part), type,
                               comm_, stream_),
                 name(), "all-gather", comm_);
    } else {
      // Uneven parts: each owner broadcasts its part in place, as one group.
      check_nccl(ncclGroupStart(), name(), "all-gather");
      for (int r = 0; r < size(); ++r) {
        const int64_t begin = part_begin(n, r, size()), count = part_begin(n, r + 1, size()) - begin;
        if (count == 0) continue;
        void* part = base + static_cast<size_t>(begin) * element;
        check_nccl(ncclBroadcast(part, part, static_cast<size_t>(count), type, r, comm_, stream_), name(), "all-gather",
                   comm_);
      }
      check_nccl(ncclGroupEnd(), name(), "all-gather", comm_);
    }
    return finish(DeviceOp{name(), "all-gather", static_cast<int64_t>(buffer.bytes())});
  }

  // One NCCL group of a send and a receive per peer (NCCL has no all-to-all-v
  // primitive; grouped point-to-point is its documented way to build one).
  CommRequest all_to_all_v_async(const Tensor& send, std::span<const int64_t> send_counts, Tensor recv,
                                 std::span<const int64_t> recv_counts) override {
    if (!on_device(send) || !on_device(recv)) {
      return through_mpi([&] { return mpi_->all_to_all_v_async(send, send_counts, recv, recv_counts); });
    }
    check_all_to_all_counts(name(), size(), send, send_counts, recv, recv_counts);
    if (send.dtype != recv.dtype) throw std::invalid_argument(name() + " all-to-all: send and receive dtypes differ");
    const ncclDataType_t type = nccl_type(send, name(), "all-to-all");
    ++stats_.collectives;
    const size_t element = send.element_size();
    const char* out = static_cast<const char*>(send.raw());
    char* in = static_cast<char*>(recv.raw());
    start();
    check_nccl(ncclGroupStart(), name(), "all-to-all");
    int64_t sent = 0, received = 0;
    for (int r = 0; r < size(); ++r) {
      const int64_t s = send_counts[static_cast<size_t>(r)], g = recv_counts[static_cast<size_t>(r)];
      if (r != rank()) stats_.collective_bytes += s * static_cast<int64_t>(element);
      if (g > 0) {
        check_nccl(ncclRecv(in + static_cast<size_t>(received) * element, static_cast<size_t>(g), type, r, comm_, stream_),
                   name(), "all-to-all", comm_);
      }
      if (s > 0) {
        check_nccl(ncclSend(out + static_cast<size_t>(sent) * element, static_cast<size_t>(s), type, r, comm_, stream_),
                   name(), "all-to-all", comm_);
      }
      sent += s;
      received += g;
    }
    check_nccl(ncclGroupEnd(), name(), "all-to-all", comm_);
    return finish(DeviceOp{name(), "all-to-all", static_cast<int64_t>(send.bytes() + recv.bytes())});
  }

  CommRequest send_async(const Tensor& data, int peer, int tag) override {
    return through_mpi([&] { return mpi_->send_async(data, peer, tag); });
  }
  CommRequest recv_async(Tensor data, int peer, int tag) override {
    return through_mpi([&] { return mpi_->recv_async(data, peer, tag); });
  }

  // One NCCL group of sends and receives (ByteScale's ring exchange). NCCL matches a
  // pair's messages in order, so both sides issue theirs sorted by (peer, tag): the
  // order of posting does not matter, the tags do, as with MPI. Empty messages move
  // nothing on either side.
  CommRequest exchange(std::span<const Transfer> sends, std::span<const Transfer> receives) override {
    const bool device = std::all_of(sends.begin(), sends.end(), [&](const Transfer& t) { return on_device(t.data); }) &&
                        std::all_of(receives.begin(), receives.end(), [&](const Transfer& t) { return on_device(t.data); });
    if (!device) return through_mpi([&] { return mpi_->exchange(sends, receives); });
    auto ordered = [&](std::span<const Transfer> transfers, const char* op) {
      std::vector<Transfer> out;
      for (const Transfer& t : transfers) {
        if (t.peer < 0 || t.peer >= size() || t.peer == rank()) {
          throw std::invalid_argument(name() + " " + op + " rank " + std::to_string(t.peer) + ": not another rank of " +
                                      std::to_string(size()));
        }
        nccl_type(t.data, name(), op);
        if (t.data.numel() > 0) out.push_back(t);
      }
      std::stable_sort(out.begin(), out.end(),
                       [](const Transfer& a, const Transfer& b) { return a.peer != b.peer ? a.peer < b.peer : a.tag < b.tag; });
      return out;
    };
    const std::vector<Transfer> to = ordered(sends, "send to"), from = ordered(receives, "recv from");
    for (const Transfer& s : sends) {  // every send counts, an empty one too, as with MPI
      stats_.p2p_bytes += static_cast<int64_t>(s.data.bytes());
      ++stats_.p2p_messages;
    }
    if (to.empty() && from.empty()) return {};
    start();
    check_nccl(ncclGroupStart(), name(), "exchange");
    for (const Transfer& r : from) {
      check_nccl(ncclRecv(r.data.raw(), static_cast<size_t>(r.data.numel()), nccl_type(r.data, name(), "recv from"),
                          r.peer, comm_, stream_),
                 name(), "recv from", comm_);
    }
    for (const Transfer& s : to) {
      check_nccl(ncclSend(s.data.raw(), static_cast<size_t>(s.data.numel()), nccl_type(s.data, name(), "send to"),
                          s.peer, comm_, stream_),
                 name(), "send to", comm_);
    }
    check_nccl(ncclGroupEnd(), name(), "exchange", comm_);
    DeviceOp op{name(), "exchange", 0, to.empty() ? -1 : to.front().peer, from.empty() ? -1 : from.front().peer};
    for (const Transfer& t : to) op.bytes += static_cast<int64_t>(t.data.bytes());
    for (const Transfer& t : from) op.bytes += static_cast<int64_t>(t.data.bytes());
    return finish(std::move(op));
  }

  void all_reduce(std::span<double> values, ReduceOp op) override { mpi_->all_reduce(values, op); }
  void all_reduce(std::span<int64_t> values, ReduceOp op) override { mpi_->all_reduce(values, op); }
  using Communicator::all_reduce;

 private:
  static bool on_device(const Tensor& t) { return t.device == Device::CUDA; }

  // What a ring sends per rank, with the elements' own size (bf16: 2 bytes).
  void count_collective(const Tensor& t, int passes) {
    stats_.collective_bytes += ring_collective_bytes(static_cast<int64_t>(t.bytes()), size(), passes);
    ++stats_.collectives;
  }

  // An operation of the MPI twin, its statistics added to this communicator's.
  template <class Call>
  CommRequest through_mpi(Call call) {
    mpi_->reset_stats();
    CommRequest request = call();
    const CommStats& s = mpi_->stats();
    stats_.p2p_bytes += s.p2p_bytes;
    stats_.p2p_messages += s.p2p_messages;
    stats_.collective_bytes += s.collective_bytes;
    stats_.collectives += s.collectives;
    return request;
  }

  // The communication stream waits for everything enqueued on the compute stream so
  // far; then the operation's start event (its device time excludes that wait).
  void start() {
    device_ops().poll();  // retires finished operations, so an idle stream is seen idle
    cudaStream_t compute = static_cast<cudaStream_t>(cuda::compute_stream_handle());
    check_cuda(cudaEventRecord(ready_, compute), name(), "event");
    timeline_->mark_epoch_if_idle(stream_);
    check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), name(), "event");
    op_ = timeline_->begin(stream_);
  }
  // The operation's end event and its entry in the device ledger; the request whose
  // wait() makes the compute stream wait for what was enqueued since start().
  CommRequest finish(DeviceOp op) {
    timeline_->end(op_, stream_);
    device_ops().enqueued(timeline_.get(), op_, std::move(op), OpTracer::local_us());
    cudaEvent_t done = events_->take();
    check_cuda(cudaEventRecord(done, stream_), name(), "event");
    return CommRequest(std::make_unique<NcclPending>(events_, done));
  }

  std::unique_ptr<MpiCommunicator> mpi_;
  ncclComm_t comm_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // reusable at once: the wait on it is enqueued when it is recorded
  std::shared_ptr<EventPool> events_;
  std::unique_ptr<NcclTimeline> timeline_;
  uint64_t op_ = 0;  // the slot of the operation between start() and finish()
};

}  // namespace

bool nccl_compiled() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator> group) {
  cuda::compute_stream_handle();  // the device is chosen before NCCL binds to it
  ncclUniqueId id{};
  if (group->rank() == 0) check_nccl(ncclGetUniqueId(&id), group->name(), "unique id");
  if (MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, group->handle()) != MPI_SUCCESS) {
    throw std::runtime_error(group->name() + ": broadcast of the NCCL unique id failed");
  }
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, group->size(), id, group->rank()), group->name(), "init");
  return std::make_unique<NcclCommunicator>(std::move(group), comm);
}

std::unique_ptr<Communicator> split_nccl_communicator(const Communicator& parent, int color, int key, std::string name) {
  const auto* nccl = dynamic_cast<const NcclCommunicator*>(&parent);
  if (nccl == nullptr) throw std::logic_error(parent.name() + ": not an NCCL communicator, cannot split it with NCCL");
  return nccl->split(color, key, std::move(name));
}

}  // namespace hdp
