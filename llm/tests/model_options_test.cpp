// ModelOptions: the TOML of the model commands (configs/model.toml), every key both ways.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include <fmt/format.h>

#include "kz/llm/model_options.h"

namespace kz {
namespace {

// Every key set to a value other than its default.
ModelOptions every_key_changed() {
  ModelOptions o;
  o.engine.device = "cuda:1";
  o.engine.dtype = "bf16";
  o.engine.cuda_graph = false;
  o.engine.max_batch_rows = 8;
  o.sampling.max_new_tokens = 3;
  o.sampling.temperature = 0.7;
  o.sampling.top_p = 0.9;
  o.sampling.top_k = 40;
  o.sampling.seed = 1234567890123;
  o.sampling.stop = {"\n\n", "```"};
  o.ignore_eos = true;
  o.serve.host = "0.0.0.0";
  o.serve.port = 8000;
  o.serve.model_name = "tiny";
  o.serve.max_batch = 4;
  o.serve.batch_wait_ms = 2.5;
  o.serve.concurrent_batches = 2;
  o.serve.http_threads = 8;
  o.serve.max_n = 16;
  o.serve.default_max_tokens = 32;
  o.serve.chat_default_max_tokens = 512;
  return o;
}

// The "key = value" lines of a printed configuration.
std::vector<std::string> key_lines(const std::string& toml) {
  std::vector<std::string> lines;
  std::istringstream in(toml);
  for (std::string line; std::getline(in, line);)
    if (line.find(" = ") != std::string::npos) lines.push_back(line);
  return lines;
}

TEST(ModelOptions, EveryKeyRoundTrips) {
  ModelOptions changed = every_key_changed();
  std::string text = to_toml(changed);
  // The test covers every key: each printed line differs from the default's.
  auto changed_lines = key_lines(text), default_lines = key_lines(to_toml(ModelOptions{}));
  ASSERT_EQ(changed_lines.size(), default_lines.size());
  for (size_t i = 0; i < changed_lines.size(); ++i) EXPECT_NE(changed_lines[i], default_lines[i]);

  ModelOptions back;
  auto status = apply_toml_text(text, "printed", back);
  ASSERT_TRUE(status.is_ok()) << status.to_string() << "\n" << text;
  EXPECT_EQ(to_toml(back), text);
  EXPECT_EQ(back.sampling.stop, changed.sampling.stop);
  EXPECT_EQ(back.sampling.seed, changed.sampling.seed);
  EXPECT_EQ(back.serve.model_name, "tiny");
  EXPECT_TRUE(back.ignore_eos);
}

TEST(ModelOptions, KeysLeftOutKeepTheirValues) {
  ModelOptions o;
  auto status = apply_toml_text("[sampling]\ntemperature = 0\nmax_new_tokens = 3\n", "t.toml", o);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(o.sampling.temperature, 0.0);
  EXPECT_EQ(o.sampling.max_new_tokens, 3);
  EXPECT_EQ(o.sampling.top_p, 1.0);
  EXPECT_EQ(o.serve.max_batch, 32);
}

// Each bad text's error names the file and the key.
TEST(ModelOptions, UnknownKeysWrongTypesAndOutOfRangeValuesAreNamed) {
  struct Case {
    const char* text;
    const char* key;
  };
  for (Case c : {Case{"[sampling]\ntemprature = 0.5\n", "sampling.temprature"},
                 Case{"[engine]\nmodel_dir = \"/tmp/m\"\n", "engine.model_dir"},  // --model is a flag only
                 Case{"[sampling]\nmax_new_tokens = \"3\"\n", "sampling.max_new_tokens"},
                 Case{"[serve]\nport = 8000.0\n", "serve.port"},
                 Case{"[sampling]\nignore_eos = \"yes\"\n", "sampling.ignore_eos"},
                 Case{"[sampling]\nstop = \"\\n\"\n", "sampling.stop"},
                 Case{"[sampling]\ntop_p = 0\n", "sampling.top_p"},
                 Case{"[sampling]\ntemperature = -1\n", "sampling.temperature"},
                 Case{"[sampling]\nmax_new_tokens = 0\n", "sampling.max_new_tokens"},
                 Case{"[sampling]\nseed = -1\n", "sampling.seed"},
                 Case{"[serve]\nport = 70000\n", "serve.port"},
                 Case{"[serve]\nmax_batch = 0\n", "serve.max_batch"},
                 Case{"[engine]\ndtype = \"fp8\"\n", "engine.dtype"},
                 Case{"[engine]\ndevice = \"tpu\"\n", "engine.device"}}) {
    ModelOptions o;
    Status status = apply_toml_text(c.text, "bad.toml", o);
    ASSERT_FALSE(status.is_ok()) << c.text;
    EXPECT_NE(status.message().find("bad.toml"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(fmt::format("'{}'", c.key)), std::string::npos) << status.message();
  }
}

TEST(ModelOptions, ShippedConfigFileMatchesTheDefaults) {
  const char* source_dir = std::getenv("KZ_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr);
  ModelOptions from_file = every_key_changed();  // so that a key missing from the file shows
  auto status = apply_toml_file(std::filesystem::path(source_dir) / "configs" / "model.toml", from_file);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(to_toml(from_file), to_toml(ModelOptions{}));
}

}  // namespace
}  // namespace kz
