#pragma once
// Tagged byte messages between ranks, with timeouts: the transport of the remote
// data loader (its requests come from any rank and a silent peer must end the
// job instead of hanging it). It runs on a communicator of its own, so loader
// traffic never mixes with training collectives, and may be used from a thread
// other than the one running the collectives (MPI is then initialised with
// MPI_THREAD_MULTIPLE).

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace hdp {

class MessageTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Message {
  int source = -1;
  int tag = -1;
  std::vector<int64_t> payload;
};

class MessageChannel {
 public:
  virtual ~MessageChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends without waiting for the receiver (the payload is copied).
  virtual void send(int peer, int tag, std::vector<int64_t> payload) = 0;
  // The next message with `tag` from `source` (or any source when source < 0).
  // Throws MessageTimeout naming `what` after timeout_s seconds without one.
  virtual Message receive(int source, int tag, double timeout_s, const std::string& what) = 0;
  // The next message with `tag` from `source` (any source when source < 0) if one
  // has arrived; never waits.
  virtual std::optional<Message> try_receive(int source, int tag) = 0;
  // Waits until every message sent so far has left this rank.
  virtual void flush() = 0;
};

// A channel over a duplicate of MPI_COMM_WORLD (world ranks).
std::unique_ptr<MessageChannel> make_world_channel();

class MpiCommunicator;
// A channel over a duplicate of `comm` (its ranks). Collective over comm.
std::unique_ptr<MessageChannel> make_channel(const MpiCommunicator& comm);

}  // namespace hdp
