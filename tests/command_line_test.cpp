// The command-line contract (trainer/command_line.h): the arguments of one
// command, and the one table from what a command throws to its exit code.

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/json.h"
#include "data/length_distributions.h"
#include "data/prepare.h"
#include "checkpoint/checkpoint_error.h"
#include "trainer/command_line.h"
#include "run/metrics.h"
#include "run/numerical_guard.h"
#include "trainer/plan_command.h"

namespace hdp {
namespace {

TEST(Arguments, OptionsFlagsListsAndPositionals) {
  Arguments args({"run.yaml", "--set", "a=1", "--output=out.h5", "--no-check", "--set=b=2", "--input", "x.txt",
                  "y.jsonl", "--gpus", "2K", "--seed", "-3"});
  EXPECT_TRUE(args.flag("--no-check"));
  EXPECT_FALSE(args.flag("--no-check"));  // consumed
  EXPECT_EQ(args.repeated("--set"), (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(args.option("--output"), "out.h5");
  EXPECT_EQ(args.option("--trace"), std::nullopt);
  EXPECT_EQ(args.list("--input"), (std::vector<std::string>{"x.txt", "y.jsonl"}));
  EXPECT_EQ(args.integer("--gpus", std::nullopt, 1), 2048);
  EXPECT_EQ(args.integer("--seed", 1), -3);
  EXPECT_EQ(args.integer("--tp", 1, 1), 1);
  EXPECT_EQ(args.positional(), (std::vector<std::string>{"run.yaml"}));
  EXPECT_NO_THROW(args.expect_empty());
}

std::string usage_error(const std::function<void(Arguments&)>& read, std::vector<std::string> raw) {
  Arguments args(std::move(raw));
  try {
    read(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

TEST(Arguments, MistakesAreUsageErrors) {
  EXPECT_EQ(usage_error([](Arguments& a) { a.required("--cluster"); }, {}), "--cluster is required");
  EXPECT_EQ(usage_error([](Arguments& a) { a.option("--output"); }, {"--output", "a", "--output=b"}),
            "--output given more than once");
  EXPECT_EQ(usage_error([](Arguments& a) { a.option("--output"); }, {"--output"}), "--output needs a value");
  EXPECT_EQ(usage_error([](Arguments& a) { a.integer("--gpus", std::nullopt, 1); }, {"--gpus", "many"}),
            "--gpus expects an integer, got 'many'");
  EXPECT_EQ(usage_error([](Arguments& a) { a.integer("--gpus", std::nullopt, 1); }, {"--gpus", "0"}),
            "--gpus must be at least 1, got 0");
  EXPECT_EQ(usage_error([](Arguments& a) { a.integer("--gpus", std::nullopt, 1); }, {}), "--gpus is required");
  // K and M scale within int64: 2^63 - 2^20 and -2^63 fit, one more M does not.
  EXPECT_EQ(Arguments({"--n", "8796093022207M"}).integer("--n", std::nullopt),
            std::numeric_limits<int64_t>::max() - (1 << 20) + 1);
  EXPECT_EQ(Arguments({"--n", "-8796093022208M"}).integer("--n", std::nullopt), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(usage_error([](Arguments& a) { a.integer("--tokens", std::nullopt); }, {"--tokens", "8796093022208M"}),
            "--tokens does not fit a signed 64-bit integer, got '8796093022208M'");
  EXPECT_EQ(usage_error([](Arguments& a) { a.integer("--tokens", std::nullopt); }, {"--tokens", "-9007199254740993k"}),
            "--tokens does not fit a signed 64-bit integer, got '-9007199254740993k'");
  EXPECT_EQ(usage_error([](Arguments& a) { a.integer("--tokens", std::nullopt); }, {"--tokens", "99999999999999999999"}),
            "--tokens does not fit a signed 64-bit integer, got '99999999999999999999'");
  EXPECT_EQ(usage_error([](Arguments& a) { a.expect_empty(); }, {"--bogus"}), "unknown argument '--bogus'");
}

int exit_code_of(const std::function<void()>& fail) {
  return run_subcommand("test", [&] {
    fail();
    return kExitSuccess;
  });
}

TEST(ExitCodes, EveryInputErrorIsTwoADivergingRunThreeAnythingElseOne) {
  EXPECT_EQ(run_subcommand("test", [] { return kExitSuccess; }), 0);
  EXPECT_EQ(run_subcommand("test", [] { return 7; }), 7);  // the body's own code
  EXPECT_EQ(exit_code_of([] { throw UsageError("--x is required"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw ConfigError("run.yaml:3: model.x: unknown key"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw DatasetError("corpus.h5: not HDF5"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw DataInputError("notes.jsonl:2: invalid JSON"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw CheckpointError("step-1: fails its checksum"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw MetricsError("runs/x/metrics.jsonl: No space left on device"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw PlanInputError("52 heads over tp 8"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw LengthsInputError("unknown length distribution 'pile'"); }), 2);
  EXPECT_EQ(exit_code_of([] { throw JsonError("expected a value", 3); }), 2);
  EXPECT_EQ(exit_code_of([] { throw DivergenceError("the run diverges: step 4: 3 bad step(s) in a row"); }), 3);
  EXPECT_EQ(exit_code_of([] { throw std::invalid_argument("an internal check"); }), 1);
  EXPECT_EQ(exit_code_of([] { throw std::runtime_error("disk full"); }), 1);
}

}  // namespace
}  // namespace hdp
