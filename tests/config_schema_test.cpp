// The config schema as the one description of the keys: every key documented and
// its defaults within its own rules; `trainer plan`'s model files read as the
// config's model section; `trainer config` checking a config and printing the
// effective one, or the key tables of docs/configuration.md.

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <string>

#include "config/config.h"
#include "config/model_file.h"
#include "config/schema.h"
#include "test_util.h"

namespace hdp {
namespace {

using testing::run_trainer;
using testing::scratch_dir;

std::string source(const std::string& path) { return std::string(HDP_SOURCE_DIR) + "/" + path; }

TEST(ConfigSchema, EveryKeyIsDocumentedAndItsDefaultKeepsItsOwnRule) {
  Config defaults;
  int keys = 0, own_rules = 0;
  for (const Section& section : config_schema()) {
    ASSERT_FALSE(section.fields.empty()) << section.name;
    for (const Field& f : section.fields) {
      const std::string key = section.name + "." + f.key;
      ++keys;
      EXPECT_FALSE(f.doc.empty()) << key;
      EXPECT_EQ(f.doc.find('\n'), std::string::npos) << key << ": the doc is one line";
      EXPECT_EQ(&schema_field(key), &f) << key;
      if (!f.rule.holds) continue;
      ++own_rules;
      EXPECT_FALSE(f.rule.text.empty()) << key << ": a rule the docs do not state";
      EXPECT_FALSE(f.rule.problem.empty()) << key;
      EXPECT_FALSE(f.rule.valid.empty()) << key;
      // The one key without a usable default: data.path is required.
      EXPECT_EQ(f.rule.holds(f.ref(defaults)), key != "data.path") << key;
    }
  }
  EXPECT_EQ(keys, 90);
  EXPECT_GE(own_rules, 30);
  EXPECT_THROW(schema_field("model.hidden"), std::logic_error);
}

// A model file and a training config's model section are one reader: the same
// keys give the same ModelConfig.
TEST(ModelFile, IsTheConfigsModelSection) {
  const std::string dir = scratch_dir("model_file_section");
  const std::string config_path = source("configs/tiny-mixtral.yaml");
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "tiny";
  for (const auto& entry : YAML::LoadFile(config_path)["model"])
    out << YAML::Key << entry.first << YAML::Value << entry.second;
  out << YAML::EndMap;
  std::ofstream(dir + "/tiny.yaml") << out.c_str() << "\n";
  const ModelFile file = read_model_file(dir + "/tiny.yaml");
  EXPECT_EQ(file.name, "tiny");
  Config from_config = load_config(config_path, {}, /*check_files=*/false);
  ASSERT_TRUE(from_config.model.moe());
  Config from_file = from_config;
  from_file.model = file.model;
  EXPECT_EQ(emit_config_yaml(from_file), emit_config_yaml(from_config));
  // The shipped files name their architecture and keep the model rules.
  EXPECT_EQ(read_model_file(source("configs/models/mistral-7b.yaml")).model.arch, "mistral");
  EXPECT_EQ(read_model_file(source("configs/models/mistral-8x22b.yaml")).model.num_experts, 8);
  EXPECT_EQ(read_model_file(source("configs/models/llama-30b.yaml")).model.num_kv_heads, 4);
}

TEST(ConfigCommand, PrintsTheEffectiveConfigOrTheFirstProblem) {
  const std::string dir = scratch_dir("config_command");
  std::ofstream(dir + "/data.h5") << "";
  std::ofstream(dir + "/run.yaml") << "data:\n  path: " << dir << "/data.h5\nmodel:\n  num_heads: 8\n";
  const auto good = run_trainer("config " + dir + "/run.yaml --set train.steps=7");
  ASSERT_EQ(good.exit_code, 0) << good.output;
  EXPECT_EQ(good.output, load_config(dir + "/run.yaml", {"train.steps=7"}).yaml);
  const auto bad = run_trainer("config " + dir + "/run.yaml --set model.num_kv_heads=3");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--set model.num_kv_heads=3: model.num_kv_heads: 3 does not divide model.num_heads 8"),
            std::string::npos)
      << bad.output;
  EXPECT_EQ(run_trainer("config").exit_code, 2);
  EXPECT_EQ(run_trainer("config --keys-markdown " + dir + "/run.yaml").exit_code, 2);
}

// --get: one key's value as a launch script reads it (the checkpoint directory
// resolved under the run directory, names unquoted, numbers as written).
TEST(ConfigCommand, GetPrintsOneKeysEffectiveValue) {
  const std::string dir = scratch_dir("config_command_get");
  std::ofstream(dir + "/data.h5") << "";
  std::ofstream(dir + "/run.yaml") << "data:\n  path: " << dir << "/data.h5\ntrain:\n  run_dir: runs/x\n";
  const auto get = [&](const std::string& args) { return run_trainer("config " + dir + "/run.yaml " + args); };
  EXPECT_EQ(get("--get train.run_dir").output, "runs/x\n");
  EXPECT_EQ(get("--get train.checkpoint_dir").output, "runs/x/checkpoints\n");
  EXPECT_EQ(get("--set train.run_dir=/r --get train.checkpoint_dir").output, "/r/checkpoints\n");
  EXPECT_EQ(get("--set optim.lr=0.0005 --get optim.lr").output, "0.0005\n");
  EXPECT_EQ(get("--get optim.schedule").output, "cosine\n");
  const auto bad = get("--get train.no_such_key");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("--get train.no_such_key: no such key"), std::string::npos) << bad.output;
}

TEST(ConfigCommand, KeysMarkdownHasEveryKeyOfTheSchema) {
  const auto r = run_trainer("config --keys-markdown");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const Section& section : config_schema()) {
    const size_t begin = r.output.find("<!-- BEGIN keys " + section.name + " ");
    const size_t end = r.output.find("<!-- END keys " + section.name + " -->");
    ASSERT_NE(begin, std::string::npos) << section.name;
    ASSERT_NE(end, std::string::npos) << section.name;
    const std::string table = r.output.substr(begin, end - begin);
    for (const Field& f : section.fields) EXPECT_NE(table.find("\n| `" + f.key + "` |"), std::string::npos) << f.key;
  }
  EXPECT_NE(r.output.find("| `num_kv_heads` | integer | `4` | > 0; divides `num_heads` |"), std::string::npos);
  EXPECT_NE(r.output.find("| `lr` | number | `0.0003` | > 0 | peak learning rate |"), std::string::npos);
  EXPECT_NE(r.output.find("| `policy` | name | `naive` | naive ("), std::string::npos);
}

}  // namespace
}  // namespace hdp
