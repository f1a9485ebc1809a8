// trainer: the one executable. Subcommands are in trainer/commands.cpp.
//
// Exit codes: the table in trainer/command_line.h (0 success, 2 bad input, 1 other).

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "data/hdf5_lock.h"
#include "trainer/command_line.h"
#include "trainer/commands.h"

namespace {

const char* const kUsage = R"(trainer - LLaMA training with hybrid data parallelism

usage: trainer <command> [options]

commands:
  train CONFIG.yaml [--set key.path=value ...]   train a model
  prepare-data --input FILE... --output DATA.h5  tokenize text or JSONL into a dataset
  make-corpus --output DATA.h5 [...]             write the built-in demo corpus
  export CHECKPOINT --output FILE.h5             whole weights under Hugging Face names
  import-hf HF_DIR --output CHECKPOINT_DIR       a Hugging Face LLaMA (safetensors) as a step-0 checkpoint
  export-hf CHECKPOINT --output HF_DIR           a checkpoint as a Hugging Face model directory
  eval CHECKPOINT --data DATA                    loss and perplexity on held-out data
  generate CHECKPOINT --prompt TEXT              continue a text (greedy or sampled)
  config CONFIG.yaml | --keys-markdown           check a config and print it effective, or the key tables
  profile CONFIG.yaml [--output FILE.yaml]       measure the planner's cost model on this machine
  plan --cluster HW.yaml --model M.yaml ...      plan and simulate one step on a described cluster
  analyze TRACE... [--output R.json ...]         what-if straggler analysis of op traces
  trace merge TRACE_DIR --output TRACE.json      a run's per-rank traces as one Perfetto trace
  plot RUN_DIR... [--output DIR]                 SVG charts of metrics.jsonl (several runs compared)
  selftest [--seed N]                            check the CUDA backend op by op against the CPU
  supervise [--max-restarts N] -- COMMAND...      run a training command, restarting it after failures

  trainer <command> --help   options of one command
  trainer --version          version
)";

}  // namespace

int main(int argc, char** argv) {
  // A file grown past the size limit (ulimit -f) then fails its write with EFBIG,
  // which every command reports naming the file, as a full disk (ENOSPC), instead
  // of SIGXFSZ killing the process with a core dump.
  std::signal(SIGXFSZ, SIG_IGN);
  hdp::hdf5_skip_exit_cleanup();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return hdp::kExitBadInput;
  }
  const std::string command = args[0];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return hdp::kExitSuccess;
  }
  if (command == "--version") {
    std::printf("trainer %s\n", HDP_VERSION);
    return hdp::kExitSuccess;
  }
  args.erase(args.begin());
  if (command == "train") return hdp::command_train(argc, argv, args);
  if (command == "prepare-data") return hdp::command_prepare_data(args);
  if (command == "make-corpus") return hdp::command_make_corpus(args);
  if (command == "export") return hdp::command_export(args);
  if (command == "import-hf") return hdp::command_import_hf(args);
  if (command == "export-hf") return hdp::command_export_hf(args);
  if (command == "eval") return hdp::command_eval(args);
  if (command == "generate") return hdp::command_generate(args);
  if (command == "profile") return hdp::command_profile(args);
  if (command == "config") return hdp::command_config(args);
  if (command == "plan") return hdp::command_plan(args);
  if (command == "analyze") return hdp::command_analyze(args);
  if (command == "trace") return hdp::command_trace(args);
  if (command == "plot") return hdp::command_plot(args);
  if (command == "supervise") return hdp::command_supervise(args);
  if (command == "selftest") return hdp::command_selftest(args);
  std::fprintf(stderr, "trainer: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return hdp::kExitBadInput;
}
