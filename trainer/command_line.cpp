#include "trainer/command_line.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <stdexcept>

#include "data/dataset.h"
#include "checkpoint/checkpoint_error.h"
#include "run/metrics.h"
#include "run/numerical_guard.h"

namespace hdp {

bool Arguments::flag(const std::string& name) {
  auto it = std::find(args_.begin(), args_.end(), name);
  if (it == args_.end()) return false;
  args_.erase(it);
  return true;
}

std::optional<std::string> Arguments::option(const std::string& name) {
  std::vector<std::string> values = repeated(name);
  if (values.size() > 1) throw UsageError(name + " given more than once");
  if (values.empty()) return std::nullopt;
  return values.front();
}

std::string Arguments::required(const std::string& name) {
  std::optional<std::string> value = option(name);
  if (!value) throw UsageError(name + " is required");
  return *value;
}

std::vector<std::string> Arguments::repeated(const std::string& name) {
  std::vector<std::string> values;
  for (size_t i = 0; i < args_.size();) {
    if (args_[i] == name) {
      if (i + 1 >= args_.size()) throw UsageError(name + " needs a value");
      values.push_back(args_[i + 1]);
      args_.erase(args_.begin() + static_cast<long>(i), args_.begin() + static_cast<long>(i) + 2);
    } else if (args_[i].rfind(name + "=", 0) == 0) {
      values.push_back(args_[i].substr(name.size() + 1));
      args_.erase(args_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  return values;
}

std::vector<std::string> Arguments::list(const std::string& name) {
  std::vector<std::string> values;
  auto it = std::find(args_.begin(), args_.end(), name);
  if (it == args_.end()) return values;
  auto end = it + 1;
  while (end != args_.end() && end->rfind("--", 0) != 0) values.push_back(*end++);
  args_.erase(it, end);
  return values;
}

int64_t Arguments::integer(const std::string& name, std::optional<int64_t> fallback, int64_t minimum) {
  const std::optional<std::string> value = option(name);
  if (!value) {
    if (!fallback) throw UsageError(name + " is required");
    return *fallback;
  }
  std::string text = *value;
  int64_t scale = 1;
  if (!text.empty() && (text.back() == 'K' || text.back() == 'k')) scale = 1024, text.pop_back();
  else if (!text.empty() && (text.back() == 'M' || text.back() == 'm')) scale = 1024 * 1024, text.pop_back();
  const std::string out_of_range = name + " does not fit a signed 64-bit integer, got '" + *value + "'";
  int64_t x = 0;
  try {
    size_t used = 0;
    x = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument("trailing characters");
  } catch (const std::out_of_range&) {
    throw UsageError(out_of_range);
  } catch (const std::exception&) {
    throw UsageError(name + " expects an integer, got '" + *value + "'");
  }
  if (__builtin_mul_overflow(x, scale, &x)) throw UsageError(out_of_range);
  if (x < minimum) throw UsageError(name + " must be at least " + std::to_string(minimum) + ", got " + *value);
  return x;
}

std::vector<std::string> Arguments::positional() {
  std::vector<std::string> values;
  for (size_t i = 0; i < args_.size();) {
    if (args_[i].rfind("--", 0) != 0) {
      values.push_back(args_[i]);
      args_.erase(args_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  return values;
}

void Arguments::expect_empty() const {
  if (!args_.empty()) throw UsageError("unknown argument '" + args_.front() + "'");
}

void setup_logging(int rank) {
  auto logger = spdlog::stderr_color_mt("trainer");
  logger->set_pattern(rank == 0 ? "[%H:%M:%S.%e] %^%l%$ %v"
                                : "[%H:%M:%S.%e] [rank " + std::to_string(rank) + "] %^%l%$ %v");
  spdlog::set_default_logger(logger);
}

namespace {

// The table: bad input exits with 2, naming what kind of input; a diverging run with 3;
// anything else with 1.
// The line is printed when `announce` (if given) says this process should.
int report(const std::string& command, const std::exception_ptr& error,
           const std::function<bool(const std::string&)>& announce) {
  int code = kExitBadInput;
  std::string kind;  // empty: a usage error, printed with the command's help hint
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const UsageError& e) {
    message = e.what();
  } catch (const ConfigError& e) {
    kind = "config error", message = e.what();
  } catch (const DatasetError& e) {
    kind = "dataset error", message = e.what();
  } catch (const CheckpointError& e) {
    kind = "checkpoint error", message = e.what();
  } catch (const MetricsError& e) {
    kind = "metrics error", message = e.what();
  } catch (const InputError& e) {
    kind = "input error", message = e.what();
  } catch (const DivergenceError& e) {
    code = kExitDiverged, message = e.what();
  } catch (const std::exception& e) {
    code = kExitFailure, message = e.what();
  }
  const std::string line = code != kExitBadInput ? message : kind.empty() ? "" : kind + ": " + message;
  if (announce && !announce(line.empty() ? message : line)) return code;
  if (code != kExitBadInput || !kind.empty()) {
    spdlog::error("{}", line);
  } else {
    std::fprintf(stderr, "trainer %s: %s (see trainer %s --help)\n", command.c_str(), message.c_str(),
                 command.c_str());
  }
  return code;
}

}  // namespace

int run_subcommand(const std::string& command, const std::function<int()>& body,
                   const std::function<bool(const std::string& message)>& announce) {
  if (!spdlog::get("trainer")) setup_logging(0);
  try {
    return body();
  } catch (...) {
    return report(command, std::current_exception(), announce);
  }
}

}  // namespace hdp
