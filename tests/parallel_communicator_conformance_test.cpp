// The communicator conformance suite (communicator_conformance.h) on the
// implementations that need no MPI: the thread communicator of the unit tests
// (groups of 1 to 4 threads) and the local communicator (a group of one).

#include "communicator_conformance.h"
#include "parallel/local_communicator.h"
#include "thread_communicator.h"

namespace hdp::testing {
namespace {

struct ThreadBackend {
  static std::string unavailable() { return {}; }
  static int max_ranks() { return 4; }
  static Device device() { return Device::CPU; }
  static constexpr bool kDetectsMismatchedCollectives = true;
  static void run(int ranks, const std::function<void(Communicator&)>& body) {
    run_ranks(ranks, [&](ThreadCommunicator& comm) { body(comm); });
  }
};

struct LocalBackend {
  static std::string unavailable() { return {}; }
  static int max_ranks() { return 1; }
  static Device device() { return Device::CPU; }
  static constexpr bool kDetectsMismatchedCollectives = false;
  static void run(int ranks, const std::function<void(Communicator&)>& body) {
    LocalCommunicator comm("local", 0, ranks);
    body(comm);
  }
};

}  // namespace

INSTANTIATE_TYPED_TEST_SUITE_P(Thread, CommunicatorConformance, ThreadBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(Local, CommunicatorConformance, LocalBackend);

}  // namespace hdp::testing
