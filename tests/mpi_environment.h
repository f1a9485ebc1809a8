#pragma once
// Included by the tests that ctest runs under mpirun (tests/mpi_*_test.cpp):
// initialises MPI before the first test and finalises it after the last.

#include <gtest/gtest.h>
#include <mpi.h>

namespace hdp::testing {

class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  void TearDown() override { MPI_Finalize(); }
};

inline ::testing::Environment* const mpi_environment = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace hdp::testing
