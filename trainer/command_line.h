#pragma once
// The trainer's command-line contract, shared by every subcommand: the arguments
// of one command, consumed option by option, and the one table from what a
// command throws to its exit code and message:
//   nothing            0  done
//   any other error    1  its message: a failure a restart may fix
//   UsageError         2  "trainer CMD: <message> (see trainer CMD --help)"
//   any InputError     2  its message, which names the file, line, key or argument:
//                         bad input, which a restart would meet again
//   DivergenceError    3  its message: the run diverges (run/numerical_guard.h), which
//                         a restart would replay
// `trainer supervise` restarts 1 and other failures (a signal), never 0, 2 or 3.

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/errors.h"

namespace hdp {

constexpr int kExitSuccess = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitDiverged = 3;

// The arguments after the command name. Each accessor removes what it reads;
// expect_empty() refuses whatever is left.
class Arguments {
 public:
  explicit Arguments(std::vector<std::string> args) : args_(std::move(args)) {}

  // Whether `name` ("--no-check") is present.
  bool flag(const std::string& name);
  // The value of "--name VALUE" or "--name=VALUE", given at most once.
  std::optional<std::string> option(const std::string& name);
  std::string required(const std::string& name);
  // Every value of an option that may repeat: "--set a=1 --set b=2".
  std::vector<std::string> repeated(const std::string& name);
  // All values following an option up to the next option: "--input a.txt b.jsonl".
  std::vector<std::string> list(const std::string& name);
  // An integer option, with K and M suffixes for powers of two ("2M" = 2097152);
  // `fallback` when absent (required without one), at least `minimum`; a value
  // that does not fit int64_t, suffix applied, is a UsageError.
  int64_t integer(const std::string& name, std::optional<int64_t> fallback,
                  int64_t minimum = std::numeric_limits<int64_t>::min());
  // The arguments that are not options ("CONFIG.yaml").
  std::vector<std::string> positional();
  void expect_empty() const;
  // Whether --help or -h is present.
  bool wants_help() { return flag("--help") || flag("-h"); }

 private:
  std::vector<std::string> args_;
};

// The "trainer" logger on stderr; ranks other than 0 name themselves in each line.
void setup_logging(int rank);

// Runs one command's body (after its arguments are known) and maps what it
// throws to the exit code and message of the table above. Returns the body's
// own exit code when it throws nothing. announce: asked with the message whether
// this process prints it (the ranks of a job agree who says an error they share,
// parallel/runtime.h); absent: it prints.
int run_subcommand(const std::string& command, const std::function<int()>& body,
                   const std::function<bool(const std::string& message)>& announce = {});

}  // namespace hdp
