// The NCCL communicator's entry points in a build without CUDA or NCCL: none can
// be made (parallel.comm: nccl is refused before this is reached; see config/config.cpp).

#include <stdexcept>

#include "parallel/nccl_communicator.h"

namespace hdp {
namespace {
[[noreturn]] void absent() {
  throw std::runtime_error("parallel.comm=nccl: this build has no NCCL (it needs the CUDA backend and libnccl at configure time)");
}
}  // namespace

bool nccl_compiled() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<MpiCommunicator>) { absent(); }
std::unique_ptr<Communicator> split_nccl_communicator(const Communicator&, int, int, std::string) { absent(); }

}  // namespace hdp
