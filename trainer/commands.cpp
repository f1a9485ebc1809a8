#include "trainer/commands.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "data/corpus.h"
#include "data/prepare.h"
#include "parallel/runtime.h"
#include "planning/cost_file.h"
#include "checkpoint/directory.h"
#include "checkpoint/export.h"
#include "trainer/command_line.h"
#include "config/config.h"
#include "trainer/evaluate.h"
#include "trainer/generate.h"
#include "checkpoint/hf_checkpoint.h"
#include "run/job.h"
#include "run/profiler.h"
#include "trainer/selftest.h"
#include "trainer/supervisor.h"
#include "run/training.h"

namespace hdp {
namespace {

// Outputs may name a directory that does not exist yet, as in data-cache/corpus.h5.
void create_parent_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
}

const char* const kTrainHelp = R"(usage: trainer train CONFIG.yaml [--set key.path=value ...]

Trains the model the config describes (see docs/configuration.md).
  --set key.path=value   override one config key (repeatable, applied in order)

Run under mpirun or srun for several ranks; without them it is a single rank.
Restarted by `trainer supervise` (HDP_SUPERVISE_RESTART above 0 in the environment),
it takes train.resume=auto and continues from the newest complete checkpoint.
)";

const char* const kPrepareHelp = R"(usage: trainer prepare-data --input FILE... --output DATA.h5 [--tokenizer PATH]

Tokenizes text into the project's HDF5 token dataset (docs/dataset-format.md).
EOS ends every document; the dataset records the tokenizer, its vocabulary and a copy of
its files, which training copies into every checkpoint (docs/dataset-format.md).
  --tokenizer PATH  a SentencePiece model (tokenizer.model) or a Hugging Face byte-level
                    BPE tokenizer.json (BOS/EOS from tokenizer_config.json beside it);
                    its ids, BOS first;
                    default byte-level (ids 0-255 bytes, 256 BOS, 257 EOS, no BOS added)
  --threads N       workers tokenizing .jsonl documents (default: every core)
  --output-format hdf5|megatron
                    megatron writes Megatron-LM's OUTPUT.bin and OUTPUT.idx (MMIDIDX v1;
                    train them with data.format: megatron, data.path: OUTPUT) and the
                    tokenizer's copy in OUTPUT.tokenizer/
  --input FILE...   .jsonl files give one document per line from {"text": ...};
                    any other file is one document
  --output PATH     the dataset to write; never one of the inputs (nor, with megatron,
                    OUTPUT.bin or OUTPUT.idx)
  --overwrite       replace a dataset already at --output (refused without it)
)";

const char* const kCorpusHelp = R"(usage: trainer make-corpus --output DATA.h5 [options]

Writes the built-in demo corpus: synthetic English-like documents a small model can
learn, with a long-tailed length distribution (lognormal, truncated).
  --output PATH        the dataset to write
  --documents N        number of documents (default 5000)
  --seed S             generator seed (default 1234)
  --max-length L       longest document in bytes (default 8192)
  --min-length L       shortest document in bytes (default 16)
  --median-length L    median document length in bytes (default 300)
)";

const char* const kExportHelp = R"(usage: trainer export CHECKPOINT --output FILE.h5

Writes every weight of a checkpoint (a step-NNNNNNNN directory, saved under any
tp/pp/hdp layout) as a whole float32 tensor under its Hugging Face name
([out, in]) into one HDF5 file, with the config as an attribute.
  --output PATH   the file to write
)";


const char* const kImportHfHelp = R"(usage: trainer import-hf HF_DIR --output CHECKPOINT_DIR [--set key.path=value ...]

Converts a Hugging Face LLaMA model directory (config.json and model.safetensors,
or shards listed in model.safetensors.index.json; F32, F16 or BF16 tensors) into
a step-0 checkpoint of this trainer, CHECKPOINT_DIR/step-00000000, holding the
weights in float32 and the directory's tokenizer (tokenizer.model, else
tokenizer.json with tokenizer_config.json), which generate and eval then use. Train from it under any layout with
  --set train.init_from=CHECKPOINT_DIR/step-00000000
config.json settings this build does not implement (rope_scaling, attention or
MLP biases, another activation or architecture, a sliding window) are refused.
  --output DIR           a new (or empty) directory
  --set key.path=value   a config key stored with the checkpoint (not the model's shape)
)";

const char* const kExportHfHelp = R"(usage: trainer export-hf CHECKPOINT --output HF_DIR [options]

Writes a checkpoint (a step-NNNNNNNN directory saved under any layout, or a
checkpoint directory, whose newest complete checkpoint is taken) as a Hugging
Face LLaMA model directory: config.json, generation_config.json,
model.safetensors (sharded, with model.safetensors.index.json, above the
shard size) and the checkpoint's tokenizer (tokenizer.model or tokenizer.json,
with tokenizer_config.json; the byte-level tokenizer has no such file), which
transformers' from_pretrained loads as LlamaForCausalLM.
  --output DIR            the directory to write (must not hold a model)
  --dtype bf16|fp32       the weights' type (default bf16)
  --max-shard-size BYTES  largest shard (default 5000000000; K and M suffixes)
  --bos-id N --eos-id N   the BOS and EOS ids, only for a checkpoint that records no
                          tokenizer (written before checkpoints kept one; default 256
                          and 257 for the byte-level vocabulary of 258); otherwise
                          they come from its tokenizer and given ones must agree
)";


const char* const kEvalHelp = R"(usage: trainer eval CHECKPOINT --data DATA [options]

Loss and perplexity of a checkpoint (a step directory saved under any layout, or
a checkpoint directory, whose newest complete checkpoint is taken) on held-out
data, in one process: every document cut into sequences of at most max_seq_len
tokens, each token predicting the next of its sequence; the loss is the mean
cross-entropy over the predicted tokens (nats), the perplexity its exp.
  --data PATH               the dataset (an HDF5 file, or a Megatron PREFIX)
  --data-format hdf5|megatron
  --max-seq-len N           default: the checkpoint config's data.max_seq_len
  --max-documents N         only the first N documents
  --threads N               default: every core
)";


const char* const kGenerateHelp = R"(usage: trainer generate CHECKPOINT --prompt TEXT [options]

Continues TEXT with a checkpoint (a step directory saved under any layout, or a
checkpoint directory, whose newest complete checkpoint is taken) and prints the
prompt and its continuation. Stops after --max-new-tokens or at the tokenizer's
EOS. The prompt runs once into a key/value cache; each new token then costs one
position. Past data.max_seq_len the cache restarts from the last half context.
  --tokenizer PATH       tokenizer.model or tokenizer.json (default: the checkpoint's own,
                         the copy of its data's tokenizer; a checkpoint that records one
                         takes only that same tokenizer here)
  --max-new-tokens N     default 128
  --temperature T        0 (default): greedy; otherwise sample softmax(logits / T)
  --top-p P              sample only from the most likely tokens holding P of the mass (default 1)
  --seed S               the sampling stream (default 1)
  --threads N            default: every core
)";

const char* const kSelftestHelp = R"(usage: trainer selftest [--seed N]

Checks the CUDA backend on this machine against the CPU backend: every op on
random shapes (packed documents of uneven lengths, grouped-query attention,
ring-attention blocks, tile-unaligned sizes; forward and backward), then five
training steps of a small model on both devices from the same weights. Prints
a table (op, shape, max abs error, max relative error, tolerance, result) and
exits 1 if any check fails. Without a CUDA device it says so and exits 0.

options:
  --seed N   random inputs (default 1)
)";

const char* const kProfileHelp = R"(usage: trainer profile CONFIG.yaml [options]

Measures the cost model the HDP planner uses (docs/cost-model.md) on this machine
for the config's model shape and writes it as a cost file for scheduler.cost_file:
one transformer layer's forward+backward time T(s) = a1 s^2 + b1 s + g over
documents of several lengths (median of repeats after a warm-up), its saved
activations Act(s) = a2 s + b2 bytes, the embedding and the LM head + loss per
token, and the host<->device copy bandwidth. Every other length is held out to
check the fit; the final coefficients are fitted on all lengths.
  --set key.path=value   override one config key (repeatable); train.threads sets
                         the threads measured with (0 = all cores)
  --output FILE.yaml     the cost file (default TRAIN.RUN_DIR/cost-model.yaml)
  --lengths L1,L2,...    document lengths, at least 5 (default: powers of two from
                         128 to min(data.max_seq_len, 8192) with the geometric
                         midpoints between them, which are the held-out ones)
  --repeats N            timed runs per measurement, the median counts (default 5)

The layer is measured whole (tensor-parallel degree 1); a run with parallel.tp > 1
divides its times by tp. The data file is not needed.
)";

// "256,512,1024" -> lengths, ascending.
std::vector<int64_t> parse_lengths(const std::string& text) {
  std::vector<int64_t> lengths;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument("trailing characters");
      lengths.push_back(v);
    } catch (const std::exception&) {
      throw UsageError("--lengths expects comma-separated integers, got '" + item + "' in '" + text + "'");
    }
  }
  std::sort(lengths.begin(), lengths.end());
  try {
    validate_profile_lengths(lengths);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--lengths ") + e.what());
  }
  return lengths;
}

// How long a failed rank waits for the others to fail too before it takes the
// job down by itself (parallel/runtime.h, agree_on_failure): ranks reading the
// same bad input fail within milliseconds of each other.
constexpr double kFailureAgreementSeconds = 3;

}  // namespace

int command_train(int argc, char** argv, const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kTrainHelp, stdout);
    return kExitSuccess;
  }
  MpiRuntime runtime(&argc, &argv);
  const ProcessInfo& process = runtime.info();
  setup_logging(process.rank);
  FailureAgreement failure;
  const int code = run_subcommand("train", [&] {
    std::vector<std::string> overrides = args.repeated("--set");
    const std::vector<std::string> files = args.positional();
    args.expect_empty();
    if (files.size() != 1) throw UsageError("expects exactly one CONFIG.yaml");
    // A restart by `trainer supervise` continues the run it restarts, whatever the
    // config and the command line say (trainer/supervisor.h).
    const char* restart = std::getenv(kSuperviseRestartVariable);
    if (restart != nullptr && std::atoi(restart) > 0) {
      overrides.push_back("train.resume=auto");
      if (process.rank == 0) spdlog::info("restart {} under trainer supervise: train.resume=auto", restart);
    }
    Config config = load_config(files[0], overrides, /*check_files=*/true, process.world_size);
    keep_resumed_precision(config, process.rank);
    if (process.rank == 0) spdlog::info("config {} ({} ranks)", files[0], process.world_size);
    run_training(config, process);
    return kExitSuccess;
  }, [&](const std::string& message) {
    failure = runtime.agree_on_failure(message, kFailureAgreementSeconds);
    return failure.print;
  });
  if (code == kExitSuccess || process.world_size == 1) return code;
  // Every rank failed (the same bad input): each ends by itself. Otherwise one
  // rank failing takes the whole job down at once rather than leaving the others
  // waiting in a collective.
  if (failure.every_rank_failed) runtime.end_failed(code);
  runtime.abort(code);
}

int command_prepare_data(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kPrepareHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("prepare-data", [&] {
    const std::vector<std::string> inputs = args.list("--input");
    const std::optional<std::string> output = args.option("--output");
    const std::string tokenizer_path = args.option("--tokenizer").value_or("");
    const std::string output_format = args.option("--output-format").value_or("hdf5");
    const int64_t threads = args.integer("--threads", 0, 0);
    const bool overwrite = args.flag("--overwrite");
    args.expect_empty();
    if (inputs.empty()) throw UsageError("--input needs at least one file");
    if (!output) throw UsageError("--output is required");
    const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(tokenizer_path);
    spdlog::info("prepare-data: tokenizer {} (vocabulary {}, BOS {}, EOS {})", tokenizer->name(),
                 tokenizer->vocab_size(), tokenizer->adds_bos() ? std::to_string(tokenizer->bos_id()) : "not added",
                 tokenizer->eos_id());
    create_parent_directory(*output);
    PrepareOptions options;
    options.tokenizer = tokenizer.get();
    options.tokenizer_copy = tokenizer_files(tokenizer_path, *tokenizer);
    options.threads = static_cast<int>(threads);
    options.overwrite = overwrite;
    if (output_format == "megatron") options.format = DatasetFormat::Megatron;
    else if (output_format != "hdf5") throw UsageError("--output-format '" + output_format + "' is not one of hdf5, megatron");
    prepare_dataset(inputs, *output, options);
    return kExitSuccess;
  });
}

int command_make_corpus(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kCorpusHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("make-corpus", [&] {
    CorpusOptions options;
    const std::optional<std::string> output = args.option("--output");
    options.documents = args.integer("--documents", options.documents);
    options.seed = static_cast<uint64_t>(args.integer("--seed", static_cast<int64_t>(options.seed)));
    options.max_length = args.integer("--max-length", options.max_length);
    options.min_length = args.integer("--min-length", options.min_length);
    options.median_length = args.integer("--median-length", options.median_length);
    args.expect_empty();
    if (!output) throw UsageError("--output is required");
    try {
      validate_corpus_options(options);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    create_parent_directory(*output);
    make_demo_corpus(options, *output);
    return kExitSuccess;
  });
}

int command_export(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kExportHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("export", [&] {
    const std::optional<std::string> output = args.option("--output");
    const std::vector<std::string> checkpoints = args.positional();
    args.expect_empty();
    if (checkpoints.size() != 1) throw UsageError("expects exactly one CHECKPOINT directory");
    if (!output) throw UsageError("--output is required");
    create_parent_directory(*output);
    export_checkpoint(checkpoints[0], *output);
    spdlog::info("exported {} to {}", checkpoints[0], *output);
    return kExitSuccess;
  });
}

int command_import_hf(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kImportHfHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("import-hf", [&] {
    const std::vector<std::string> overrides = args.repeated("--set");
    const std::optional<std::string> output = args.option("--output");
    const std::vector<std::string> dirs = args.positional();
    args.expect_empty();
    if (dirs.size() != 1) throw UsageError("expects exactly one HF_DIR (a Hugging Face model directory)");
    if (!output) throw UsageError("--output is required");
    const std::string path = import_hf(dirs[0], *output, overrides);
    std::printf("wrote %s; train from it with --set train.init_from=%s\n", path.c_str(), path.c_str());
    return kExitSuccess;
  });
}

int command_export_hf(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kExportHfHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("export-hf", [&] {
    HfExportOptions options;
    const std::optional<std::string> output = args.option("--output");
    const std::string dtype = args.option("--dtype").value_or("bf16");
    options.max_shard_bytes = static_cast<uint64_t>(
        args.integer("--max-shard-size", static_cast<int64_t>(options.max_shard_bytes), 1));
    // -1: not given (the byte-level vocabulary's ids, or an error for other vocabularies).
    if (const int64_t bos = args.integer("--bos-id", -1, 0); bos >= 0) options.bos_token_id = bos;
    if (const int64_t eos = args.integer("--eos-id", -1, 0); eos >= 0) options.eos_token_id = eos;
    const std::vector<std::string> checkpoints = args.positional();
    args.expect_empty();
    if (checkpoints.size() != 1) throw UsageError("expects exactly one CHECKPOINT directory");
    if (!output) throw UsageError("--output is required");
    if (dtype == "bf16") options.dtype = SafetensorsDtype::BF16;
    else if (dtype == "fp32") options.dtype = SafetensorsDtype::F32;
    else throw UsageError("--dtype '" + dtype + "' is not one of bf16, fp32");
    const std::string path = export_hf(checkpoints[0], *output, options);
    std::printf("wrote %s from %s; load it with transformers' AutoModelForCausalLM.from_pretrained(\"%s\")\n",
                output->c_str(), path.c_str(), output->c_str());
    return kExitSuccess;
  });
}

int command_eval(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kEvalHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("eval", [&] {
    EvalOptions options;
    const std::optional<std::string> data = args.option("--data");
    const std::string format = args.option("--data-format").value_or("hdf5");
    options.max_seq_len = args.integer("--max-seq-len", 0, 2);
    options.max_documents = args.integer("--max-documents", 0, 1);
    options.threads = args.integer("--threads", 0, 0);
    const std::vector<std::string> checkpoints = args.positional();
    args.expect_empty();
    if (checkpoints.size() != 1) throw UsageError("expects exactly one CHECKPOINT directory");
    if (!data) throw UsageError("--data is required");
    if (format == "megatron") options.format = DatasetFormat::Megatron;
    else if (format != "hdf5") throw UsageError("--data-format '" + format + "' is not one of hdf5, megatron");
    const EvalResult r = evaluate_checkpoint(checkpoints[0], *data, options);
    std::printf("eval %s (step %lld) on %s: %lld documents, %lld sequences, %lld predicted tokens: loss %.6f, "
                "perplexity %.4f (%.1f s)\n",
                r.checkpoint.c_str(), static_cast<long long>(r.step), data->c_str(),
                static_cast<long long>(r.documents), static_cast<long long>(r.sequences),
                static_cast<long long>(r.predicted_tokens), r.loss, r.perplexity, r.seconds);
    return kExitSuccess;
  });
}

int command_generate(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kGenerateHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("generate", [&] {
    GenerateOptions options;
    const std::optional<std::string> prompt = args.option("--prompt");
    options.tokenizer = args.option("--tokenizer").value_or("");
    options.max_new_tokens = args.integer("--max-new-tokens", options.max_new_tokens, 1);
    options.seed = static_cast<uint64_t>(args.integer("--seed", 1, 0));
    options.threads = args.integer("--threads", 0, 0);
    auto real = [&](const char* name, double fallback) {
      const std::optional<std::string> text = args.option(name);
      if (!text) return fallback;
      try {
        size_t used = 0;
        const double v = std::stod(*text, &used);
        if (used != text->size()) throw std::invalid_argument("trailing characters");
        return v;
      } catch (const std::exception&) {
        throw UsageError(std::string(name) + " expects a number, got '" + *text + "'");
      }
    };
    options.temperature = real("--temperature", options.temperature);
    options.top_p = real("--top-p", options.top_p);
    const std::vector<std::string> checkpoints = args.positional();
    args.expect_empty();
    if (checkpoints.size() != 1) throw UsageError("expects exactly one CHECKPOINT directory");
    if (!prompt) throw UsageError("--prompt is required");
    const GenerateResult r = generate_text(checkpoint_or_latest(checkpoints[0]), *prompt, options);
    spdlog::info("generate: {} (tokenizer {}, prompt {} tokens, {} new{}, {:.2f} s)", r.checkpoint, r.tokenizer,
                 r.prompt_ids.size(), r.new_ids.size(), r.stopped_at_eos ? ", stopped at EOS" : "", r.seconds);
    std::printf("%s%s\n", prompt->c_str(), r.text.c_str());
    return kExitSuccess;
  });
}

int command_profile(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kProfileHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("profile", [&] {
    const std::vector<std::string> overrides = args.repeated("--set");
    const std::optional<std::string> output = args.option("--output");
    const std::optional<std::string> lengths = args.option("--lengths");
    const int repeats = static_cast<int>(args.integer("--repeats", 5, 1));
    const std::vector<std::string> files = args.positional();
    args.expect_empty();
    if (files.size() != 1) throw UsageError("expects exactly one CONFIG.yaml");
    if (output && output->empty()) throw UsageError("--output needs a file name");
    ProfileOptions options;
    options.repeats = repeats;
    if (lengths) options.lengths = parse_lengths(*lengths);
    // Profiling needs no data file.
    const Config config = load_config(files[0], overrides, /*check_files=*/false);
    if (!lengths) options.lengths = default_profile_lengths(config);
    const std::string path = output ? *output : (std::filesystem::path(config.train.run_dir) / "cost-model.yaml").string();

    const int threads = configure_threads(config.train.threads, ProcessInfo{});
    spdlog::info("profiling {} with {} threads (median of {} runs after a warm-up)", files[0], threads, repeats);
    if (config.parallel.tp > 1) {
      spdlog::info("parallel.tp = {}: measuring the whole layer (tp 1); training divides the times by tp",
                   config.parallel.tp);
    }
    const CostFile file = profile_cost_model(config, options, [](const std::string& line) { spdlog::info("{}", line); });
    write_cost_file(path, file);
    std::fputs(describe_cost_file(file).c_str(), stdout);
    std::printf("wrote %s; train with it: --set scheduler.cost_file=%s\n", path.c_str(), path.c_str());
    if (file.fit.held_out_max_relative_error > kUnreliableHeldOutError) {
      spdlog::warn("held-out error {:.1f}% is above {:.0f}%: the timings are noisy; profile again on an idle machine",
                   100 * file.fit.held_out_max_relative_error, 100 * kUnreliableHeldOutError);
    }
    if (file.profiled.other_cpu_fraction > kBusyOtherCpuFraction) {
      spdlog::warn("other processes used {:.0f}% of the CPU time while measuring: the numbers are pessimistic and "
                   "noisy; profile again on an idle machine",
                   100 * file.profiled.other_cpu_fraction);
    }
    return kExitSuccess;
  });
}

int command_selftest(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kSelftestHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("selftest", [&] {
    SelftestOptions options;
    options.seed = static_cast<uint64_t>(args.integer("--seed", 1));
    args.expect_empty();
    return run_selftest(options);
  });
}

}  // namespace hdp
