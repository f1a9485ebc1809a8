#include "parallel/message_channel.h"

#include <mpi.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "parallel/mpi_communicator.h"

namespace hdp {
namespace {

class MpiChannel final : public MessageChannel {
 public:
  explicit MpiChannel(MPI_Comm base) {
    MPI_Comm_dup(base, &comm_);
    // A communicator it is split from may return errors (MpiCommunicator); this one's calls do not check them.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiChannel() override {
    flush();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send(int peer, int tag, std::vector<int64_t> payload) override {
    std::lock_guard<std::mutex> lock(mutex_);
    reap();
    pending_.push_back({std::move(payload), MPI_REQUEST_NULL});
    Pending& p = pending_.back();
    MPI_Isend(p.payload.data(), static_cast<int>(p.payload.size()), MPI_INT64_T, peer, tag, comm_, &p.request);
  }

  Message receive(int source, int tag, double timeout_s, const std::string& what) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    MPI_Status status;
    for (;;) {
      int arrived = 0;
      MPI_Iprobe(source < 0 ? MPI_ANY_SOURCE : source, tag, comm_, &arrived, &status);
      if (arrived) break;
      if (std::chrono::steady_clock::now() > deadline) {
        throw MessageTimeout(what + " did not answer within " + std::to_string(timeout_s) + " s");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return take(status);
  }

  std::optional<Message> try_receive(int source, int tag) override {
    MPI_Status status;
    int arrived = 0;
    MPI_Iprobe(source < 0 ? MPI_ANY_SOURCE : source, tag, comm_, &arrived, &status);
    if (!arrived) return std::nullopt;
    return take(status);
  }

  void flush() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Pending& p : pending_) MPI_Wait(&p.request, MPI_STATUS_IGNORE);
    pending_.clear();
  }

 private:
  struct Pending {
    std::vector<int64_t> payload;
    MPI_Request request;
  };
  // Receives the message `status` announced (MPI_Iprobe).
  Message take(const MPI_Status& status) {
    int count = 0;
    MPI_Get_count(&status, MPI_INT64_T, &count);
    Message m;
    m.source = status.MPI_SOURCE;
    m.tag = status.MPI_TAG;
    m.payload.resize(count);
    MPI_Recv(m.payload.data(), count, MPI_INT64_T, m.source, m.tag, comm_, MPI_STATUS_IGNORE);
    return m;
  }

  // Drops the sends that have completed (their buffers are free).
  void reap() {
    while (!pending_.empty()) {
      int done = 0;
      MPI_Test(&pending_.front().request, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      pending_.pop_front();
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;
  std::deque<Pending> pending_;
};

}  // namespace

std::unique_ptr<MessageChannel> make_world_channel() { return std::make_unique<MpiChannel>(MPI_COMM_WORLD); }

std::unique_ptr<MessageChannel> make_channel(const MpiCommunicator& comm) {
  return std::make_unique<MpiChannel>(comm.handle());
}

}  // namespace hdp
