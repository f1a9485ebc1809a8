#pragma once
// Communicators over NCCL, for device tensors (parallel.comm: nccl). Built only
// with the CUDA backend and NCCL (nccl_communicator.cpp); a build without them has
// the twin no_nccl.cpp, whose nccl_compiled() is false and whose factories throw, so
// callers need no #ifdef.
//
// What goes where: collectives on CUDA tensors (all-reduce, reduce-scatter,
// all-gather, all-to-all with a size per peer, fp32 and bf16 natively) and grouped
// exchanges (ring attention) run on NCCL, on a communication stream of the communicator's own: the stream first
// waits for the work already enqueued on the compute stream (an event), and a
// request's wait() makes the compute stream wait for the operation's completion
// event, so neither the host nor the compute stream blocks while it runs. The
// rest travels through the communicator's MPI twin (same ranks, same order): host
// values, tensors that are not on a CUDA device, and single send/recv calls.
// Those keep MPI's semantics (messages matched by tag, in any posting order, sizes
// checked), which NCCL lacks: it matches a pair's messages in issue order only and
// runs a rank's operations in order, so a receive posted before its send (the
// pipeline posts receives ahead) would block the stream. A grouped exchange on NCCL
// is therefore matched by its sorted (peer, tag) order and its sizes are not checked:
// both sides must agree on every transfer's size exactly (ring attention computes
// them from one shared layout), where MPI would name a mismatch. CommStats count
// both, with bf16 at 2 bytes an element on NCCL's wire.

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"

namespace hdp {

// True when this build has the NCCL communicator.
bool nccl_compiled();

// The NCCL communicator of the ranks of `group` (collective over them): rank 0 makes
// the ncclUniqueId and MPI broadcasts it. `group` becomes its MPI twin. Each rank
// must have chosen its GPU (cuda::initialize) and no two ranks may share one (NCCL
// refuses that; see ProcessGroups' gpus_shared_by_ranks).
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator> group);

// Splits a communicator made by make_nccl_communicator as MpiCommunicator::split
// does (ncclCommSplit, and the MPI twin alike): collective over its ranks; color < 0
// means this rank joins none and gets nullptr.
std::unique_ptr<Communicator> split_nccl_communicator(const Communicator& parent, int color, int key, std::string name);

}  // namespace hdp
