// `trainer plan` as a program of its own library (hdp_plan_command: the planners,
// the simulator, model files and length sources) and nothing else:
// planner_links_alone (tests/planner_links_alone_test.sh) reads its link command
// to show that `trainer plan` needs no kernels, runtime, CUDA or BLAS, and the
// ctest trainer_plan_alone compares its output with the trainer's.
//   trainer_plan_alone ARGS...   (the arguments of `trainer plan`)

#include <string>
#include <vector>

#include "trainer/commands.h"

int main(int argc, char** argv) { return hdp::command_plan(std::vector<std::string>(argv + 1, argv + argc)); }
