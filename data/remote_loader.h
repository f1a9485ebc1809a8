#pragma once
// The remote data loader (loader.mode: remote). Loader ranks run beside the
// training ranks in the same MPI job:
//   - servers each hold the documents d with d % servers == their index; they read
//     (and would tokenize or decode) them and answer token requests;
//   - one scheduler (on the first loader rank) knows the document lengths, runs
//     the sampler and the planner for the next steps while training runs, and
//     sends each training rank its part of the step's plan;
//   - clients (the training ranks) fetch exactly the tokens of their pieces from
//     the servers that hold them.
// Everything travels as tagged messages on a channel of its own
// (parallel/message_channel.h); a silent peer ends the job with a message naming
// it after loader.timeout_s.

#include <cstdint>
#include <span>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "parallel/message_channel.h"
#include "planning/cost_model.h"
#include "planning/plan.h"

namespace hdp {

constexpr int kLoaderWorkTag = 301;     // scheduler -> training rank: its work for one step
constexpr int kLoaderRequestTag = 302;  // training rank -> server: token requests, or stop
constexpr int kLoaderDataTag = 303;     // server -> training rank: the requested tokens
constexpr int kLoaderHelloTag = 304;    // training rank 0 -> scheduler: where training starts

// One training rank's work for one step, as the scheduler sends it.
struct RankWork {
  int64_t step = 0;
  GlobalBatch batch;                          // sequences, totals and sampler states; no micro-batches
  std::vector<RankMicroBatch> micro_batches;  // this rank's part of the plan (planning/plan.h: rank_work)
};

std::vector<int64_t> encode_work(const RankWork& work);
RankWork decode_work(std::span<const int64_t> payload);

// Where training starts (sent once by training rank 0 to the scheduler).
struct LoaderHello {
  int64_t start_step = 0;
  SamplerState sampler;
  CostModel cost;  // the model the training ranks would plan with
};
std::vector<int64_t> encode_hello(const LoaderHello& hello);
LoaderHello decode_hello(std::span<const int64_t> payload);

// World rank of the loader that holds `document`, servers being world ranks
// [first_server, first_server + servers).
int server_rank_of(int64_t document, int first_server, int servers);

// Answers token requests for this server's documents until every training rank
// has said stop. HDP_FAULT_INJECT=RANK:STEP[:hang] makes this rank exit abruptly
// (or stop answering) when asked for the tokens of that step.
void serve_tokens(const TokenDataset& dataset, MessageChannel& channel, int first_server, int servers,
                  int training_ranks);

// A training rank's side of the loader.
class RemoteBatchClient {
 public:
  RemoteBatchClient(MessageChannel& channel, int scheduler_rank, int first_server, int servers, double timeout_s);
  // The next step's batch with this rank's micro-batches (tokens fetched from the
  // servers, data/materialize.h).
  GlobalBatch next();
  // Tells every server that this rank needs no more data.
  void stop_servers();

 private:
  MessageChannel& channel_;
  int scheduler_rank_, first_server_, servers_;
  double timeout_s_;
};

}  // namespace hdp
