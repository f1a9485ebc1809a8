#include "data/remote_loader.h"

#include <spdlog/spdlog.h>

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>

#include "base/fault_injection.h"
#include "data/materialize.h"

namespace hdp {
namespace {

constexpr int64_t kStop = -1;
constexpr double kForever = 1e12;

class Writer {
 public:
  void put(int64_t v) { out.push_back(v); }
  void put(double v) { out.push_back(std::bit_cast<int64_t>(v)); }
  void put(const SamplerState& s) {
    put(static_cast<int64_t>(s.epoch));
    put(s.cursor);
    put(s.document_offset);
  }
  std::vector<int64_t> out;
};

class Reader {
 public:
  explicit Reader(std::span<const int64_t> in) : in_(in) {}
  int64_t get() {
    if (at_ >= in_.size()) throw std::runtime_error("remote loader: truncated message");
    return in_[at_++];
  }
  double get_double() { return std::bit_cast<double>(get()); }
  SamplerState get_state() {
    SamplerState s;
    s.epoch = static_cast<uint64_t>(get());
    s.cursor = get();
    s.document_offset = get();
    return s;
  }
  size_t count() {
    const int64_t n = get();
    if (n < 0 || static_cast<size_t>(n) > in_.size()) throw std::runtime_error("remote loader: corrupt message");
    return static_cast<size_t>(n);
  }

 private:
  std::span<const int64_t> in_;
  size_t at_ = 0;
};

}  // namespace

std::vector<int64_t> encode_work(const RankWork& work) {
  Writer w;
  w.put(work.step);
  w.put(work.batch.tokens);
  w.put(work.batch.start);
  w.put(work.batch.next);
  w.put(work.batch.planned_busy_s);
  w.put(work.batch.planned_max_busy_s);
  w.put(work.batch.planned_bound_s);
  w.put(work.batch.planned_step_s);
  w.put(static_cast<int64_t>(work.batch.sequences.size()));
  for (const SequenceSpan& s : work.batch.sequences) {
    w.put(s.document);
    w.put(s.offset);
    w.put(s.length);
  }
  w.put(static_cast<int64_t>(work.micro_batches.size()));
  for (const RankMicroBatch& m : work.micro_batches) {
    const PlannedMicroBatch& mb = m.planned;
    w.put(static_cast<int64_t>(mb.ring));
    w.put(mb.offload_ratio);
    w.put(mb.recompute_layers);
    w.put(static_cast<int64_t>(mb.pieces.size()));
    for (const PlannedPiece& p : mb.pieces) {
      w.put(p.sequence);
      w.put(p.offset);
      w.put(p.length);
      w.put(static_cast<int64_t>(p.ring));
    }
    const RingLayout& ring = m.ring_layout;
    w.put(static_cast<int64_t>(ring.peers.size()));
    for (int peer : ring.peers) w.put(static_cast<int64_t>(peer));
    w.put(static_cast<int64_t>(ring.self));
    for (const std::vector<RingChunk>& chunks : ring.chunks) {
      w.put(static_cast<int64_t>(chunks.size()));
      for (const RingChunk& c : chunks) {
        w.put(c.rows);
        w.put(c.position);
        w.put(c.sequence);
      }
    }
  }
  return std::move(w.out);
}

RankWork decode_work(std::span<const int64_t> payload) {
  Reader r(payload);
  RankWork work;
  work.step = r.get();
  work.batch.tokens = r.get();
  work.batch.start = r.get_state();
  work.batch.next = r.get_state();
  work.batch.planned_busy_s = r.get_double();
  work.batch.planned_max_busy_s = r.get_double();
  work.batch.planned_bound_s = r.get_double();
  work.batch.planned_step_s = r.get_double();
  work.batch.sequences.resize(r.count());
  for (SequenceSpan& s : work.batch.sequences) {
    s.document = r.get();
    s.offset = r.get();
    s.length = r.get();
  }
  const size_t micro_batches = r.count();
  for (size_t m = 0; m < micro_batches; ++m) {
    RankMicroBatch& rank_mb = work.micro_batches.emplace_back();
    PlannedMicroBatch& mb = rank_mb.planned;
    mb.ring = static_cast<int>(r.get());
    mb.offload_ratio = r.get_double();
    mb.recompute_layers = r.get();
    mb.pieces.resize(r.count());
    for (PlannedPiece& p : mb.pieces) {
      p.sequence = r.get();
      p.offset = r.get();
      p.length = r.get();
      p.ring = static_cast<int>(r.get());
      if (p.sequence < 0 || p.sequence >= static_cast<int64_t>(work.batch.sequences.size())) {
        throw std::runtime_error("remote loader: a piece names an unknown sequence");
      }
    }
    RingLayout& ring = rank_mb.ring_layout;
    ring.peers.resize(r.count());
    for (int& peer : ring.peers) peer = static_cast<int>(r.get());
    ring.self = static_cast<int>(r.get());
    ring.chunks.resize(ring.peers.size());
    for (std::vector<RingChunk>& chunks : ring.chunks) {
      chunks.resize(r.count());
      for (RingChunk& c : chunks) {
        c.rows = r.get();
        c.position = r.get();
        c.sequence = r.get();
      }
    }
  }
  return work;
}

std::vector<int64_t> encode_hello(const LoaderHello& hello) {
  Writer w;
  w.put(hello.start_step);
  w.put(hello.sampler);
  const CostModel& c = hello.cost;
  for (double v : {c.a1, c.b1, c.g, c.a2, c.b2, c.d2h_bytes_per_s, c.h2d_bytes_per_s, c.embedding_seconds_per_token,
                   c.head_seconds_per_token}) {
    w.put(v);
  }
  w.put(c.window);
  return std::move(w.out);
}

LoaderHello decode_hello(std::span<const int64_t> payload) {
  Reader r(payload);
  LoaderHello hello;
  hello.start_step = r.get();
  hello.sampler = r.get_state();
  CostModel& c = hello.cost;
  for (double* v : {&c.a1, &c.b1, &c.g, &c.a2, &c.b2, &c.d2h_bytes_per_s, &c.h2d_bytes_per_s,
                    &c.embedding_seconds_per_token, &c.head_seconds_per_token}) {
    *v = r.get_double();
  }
  c.window = r.get();
  return hello;
}

int server_rank_of(int64_t document, int first_server, int servers) {
  return first_server + static_cast<int>(document % servers);
}

void serve_tokens(const TokenDataset& dataset, MessageChannel& channel, int first_server, int servers,
                  int training_ranks) {
  const FaultInjection fault = fault_injection_from_env();
  std::vector<int32_t> tokens;
  int stopped = 0;
  while (stopped < training_ranks) {
    const Message request = channel.receive(-1, kLoaderRequestTag, kForever, "a training rank");
    Reader r(request.payload);
    const int64_t step = r.get();
    if (step == kStop) {
      ++stopped;
      continue;
    }
    if (fault.rank == channel.rank() && fault.step == step && fault.exits()) {
      spdlog::critical("fault injection: loader rank {} {} at step {}", channel.rank(),
                       fault.hang ? "stops answering" : "exits abruptly", step);
      if (!fault.hang) std::_Exit(kInjectedExitCode);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    Writer reply;
    reply.put(step);
    const size_t n = r.count();
    for (size_t i = 0; i < n; ++i) {
      const int64_t document = r.get(), offset = r.get(), length = r.get();
      if (server_rank_of(document, first_server, servers) != channel.rank()) {
        throw std::runtime_error("loader rank " + std::to_string(channel.rank()) + " was asked for document " +
                                 std::to_string(document) + ", which another server holds");
      }
      tokens.resize(static_cast<size_t>(length));
      dataset.read(document, offset, length, tokens.data());
      for (int32_t t : tokens) reply.put(static_cast<int64_t>(t));
    }
    channel.send(request.source, kLoaderDataTag, std::move(reply.out));
  }
  channel.flush();
}

RemoteBatchClient::RemoteBatchClient(MessageChannel& channel, int scheduler_rank, int first_server, int servers,
                                     double timeout_s)
    : channel_(channel),
      scheduler_rank_(scheduler_rank),
      first_server_(first_server),
      servers_(servers),
      timeout_s_(timeout_s) {}

GlobalBatch RemoteBatchClient::next() {
  const Message message = channel_.receive(scheduler_rank_, kLoaderWorkTag, timeout_s_,
                                           "the loader scheduler (world rank " + std::to_string(scheduler_rank_) + ")");
  RankWork work = decode_work(message.payload);

  // One request per server: every piece's tokens plus, when the sequence goes on,
  // the token after it (the piece's last target).
  struct Fetch {
    int64_t document, offset, length;
    size_t at = 0;  // where its tokens start in the server's reply
  };
  std::vector<std::vector<Fetch>> fetches(servers_);
  for (const RankMicroBatch& mb : work.micro_batches) {
    for (const PlannedPiece& p : mb.planned.pieces) {
      const SequenceSpan& s = work.batch.sequences[p.sequence];
      const int64_t length = p.length + (p.offset + p.length < s.length ? 1 : 0);
      fetches[server_rank_of(s.document, first_server_, servers_) - first_server_].push_back(
          {s.document, s.offset + p.offset, length});
    }
  }
  for (int server = 0; server < servers_; ++server) {
    if (fetches[server].empty()) continue;
    Writer request;
    request.put(work.step);
    request.put(static_cast<int64_t>(fetches[server].size()));
    for (const Fetch& f : fetches[server]) {
      request.put(f.document);
      request.put(f.offset);
      request.put(f.length);
    }
    channel_.send(first_server_ + server, kLoaderRequestTag, std::move(request.out));
  }
  std::vector<std::vector<int64_t>> replies(servers_);
  std::unordered_map<int64_t, std::vector<std::pair<int, size_t>>> by_document;  // document -> (server, fetch index)
  for (int server = 0; server < servers_; ++server) {
    if (fetches[server].empty()) continue;
    const int rank = first_server_ + server;
    Message reply = channel_.receive(rank, kLoaderDataTag, timeout_s_,
                                     "loader server " + std::to_string(server) + " (world rank " +
                                         std::to_string(rank) + ")");
    size_t at = 1;  // after the step
    for (size_t i = 0; i < fetches[server].size(); ++i) {
      fetches[server][i].at = at;
      at += static_cast<size_t>(fetches[server][i].length);
      by_document[fetches[server][i].document].push_back({server, i});
    }
    if (at != reply.payload.size()) {
      throw std::runtime_error("loader server " + std::to_string(server) + " sent " +
                               std::to_string(reply.payload.size()) + " values, expected " + std::to_string(at));
    }
    replies[server] = std::move(reply.payload);
  }
  auto read = [&](int64_t document, int64_t offset, int64_t length, int32_t* out) {
    for (auto [server, i] : by_document[document]) {
      const Fetch& f = fetches[server][i];
      if (f.offset <= offset && offset + length <= f.offset + f.length) {
        const int64_t* src = replies[server].data() + f.at + (offset - f.offset);
        for (int64_t k = 0; k < length; ++k) out[k] = static_cast<int32_t>(src[k]);
        return;
      }
    }
    throw std::runtime_error("remote loader: tokens of document " + std::to_string(document) + " were not fetched");
  };
  GlobalBatch batch = std::move(work.batch);
  batch.local_micro_batches = materialize_rank_work(read, batch.sequences, work.micro_batches);
  return batch;
}

void RemoteBatchClient::stop_servers() {
  for (int server = 0; server < servers_; ++server) channel_.send(first_server_ + server, kLoaderRequestTag, {kStop});
  channel_.flush();
}

}  // namespace hdp
