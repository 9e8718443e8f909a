// Random-init checkpoints (see init_model.h): presets, the tokenizer, and streaming shard writes.
#include "kz/model/init_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "kz/core/hash.h"
#include "kz/core/parallel.h"
#include "kz/model/safetensors.h"
#include "kz/model/tokenizer.h"
#include "kz/model/tokenizer_train.h"

namespace kz::model {
namespace {

using json = nlohmann::json;

constexpr size_t kBlockElements = size_t(1) << 20;  // one random stream per block (thread-count independent)

struct Preset {
  const char* name;
  json config;           // config.json without the special-token ids and dtype
  const char* dtype;     // default "bf16" / "fp32"
  size_t tokenizer_vocab;  // BpeTrainOptions::vocab_size (an upper bound: merging may stop earlier)
};

double init_std(const json& config) { return config["initializer_range"].get<double>(); }

json qwen2_config(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t vocab, int64_t max_positions, bool tied, double std = 0.02) {
  return json{{"architectures", {"Qwen2ForCausalLM"}},
              {"attention_dropout", 0.0},
              {"hidden_act", "silu"},
              {"hidden_size", hidden},
              {"initializer_range", std},
              {"intermediate_size", intermediate},
              {"max_position_embeddings", max_positions},
              {"max_window_layers", layers},
              {"model_type", "qwen2"},
              {"num_attention_heads", heads},
              {"num_hidden_layers", layers},
              {"num_key_value_heads", kv_heads},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0},
              {"sliding_window", max_positions},
              {"tie_word_embeddings", tied},
              {"use_cache", true},
              {"use_sliding_window", false},
              {"vocab_size", vocab}};
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      // For tests: 2 layers, GQA 4/2, tied like Qwen2.5-0.5B; ~100k parameters; a context of 16k
      // tokens, which the Coder's and the Proposer's prompts need (its byte-level vocabulary makes
      // them several thousand tokens; rotary positions cost no weights). Weights drawn
      // wider than 0.02 so the random model's next-token distribution is far from uniform and a
      // greedy continuation is varied (and its argmax margins large against rounding).
      {"tiny", qwen2_config(64, 128, 2, 4, 2, 512, 16384, true, 0.5), "fp32", 512},
      // Qwen/Qwen2.5-0.5B's config.json shapes (494M parameters).
      {"qwen2.5-0.5b", qwen2_config(896, 4864, 24, 14, 2, 151936, 32768, true), "bf16", 2048},
      // Qwen/Qwen2.5-7B's config.json shapes (7.62B parameters, 15.2 GB in bf16).
      {"qwen2.5-7b", qwen2_config(3584, 18944, 28, 28, 4, 152064, 131072, false), "bf16", 2048},
  };
  return all;
}

Result<const Preset*> find_preset(const std::string& name) {
  for (const auto& p : presets())
    if (name == p.name) return &p;
  return invalid_argument(fmt::format("unknown preset \"{}\" (one of: {})", name, fmt::join(model_preset_names(), ", ")));
}

// ---- the random weights ----------------------------------------------------------------------

// A uniform in (0, 1] from the top 53 bits.
double uniform01(uint64_t& state) { return (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53; }

uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even (finite values only here)
  return static_cast<uint16_t>(bits >> 16);
}

enum class Fill { normal, ones, zeros };

Fill fill_of(const std::string& name) {
  if (name.ends_with("norm.weight")) return Fill::ones;
  if (name.ends_with(".bias")) return Fill::zeros;
  return Fill::normal;
}

// Fills elements [begin, end) of a tensor in `dtype` (f32 or bf16).
void fill_block(void* data, StDType dtype, Fill fill, double std, uint64_t stream, size_t begin, size_t end) {
  uint64_t state = stream;
  for (size_t i = begin; i < end; i += 2) {
    float v[2] = {0.0f, 0.0f};
    if (fill == Fill::ones) {
      v[0] = v[1] = 1.0f;
    } else if (fill == Fill::normal) {
      double r = std::sqrt(-2.0 * std::log(uniform01(state))), a = 2.0 * M_PI * uniform01(state);
      v[0] = static_cast<float>(std * r * std::cos(a));
      v[1] = static_cast<float>(std * r * std::sin(a));
    }
    for (size_t k = 0; k < 2 && i + k < end; ++k) {
      if (dtype == StDType::f32) static_cast<float*>(data)[i + k] = v[k];
      else static_cast<uint16_t*>(data)[i + k] = to_bf16(v[k]);
    }
  }
}

struct PlannedTensor {
  WeightSpec spec;
  size_t nbytes = 0;
};

// Consecutive tensors grouped into shards of at most max_bytes (a larger tensor alone), as
// write_checkpoint does.
std::vector<std::vector<PlannedTensor>> plan_shards(const ModelConfig& config, StDType dtype, size_t max_bytes) {
  std::vector<std::vector<PlannedTensor>> shards(1);
  size_t current = 0;
  for (auto& spec : expected_weights(config)) {
    size_t numel = 1;
    for (int64_t d : spec.shape) numel *= static_cast<size_t>(d);
    size_t bytes = numel * st_dtype_size(dtype);
    if (max_bytes > 0 && current > 0 && current + bytes > max_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back({std::move(spec), bytes});
    current += bytes;
  }
  return shards;
}

Status write_shard(const fs::path& path, const std::vector<PlannedTensor>& tensors, StDType dtype, double std,
                   uint64_t seed, int jobs) {
  std::vector<std::vector<uint8_t>> buffers;
  struct Block {
    size_t tensor, index;
  };
  std::vector<Block> blocks;
  for (size_t t = 0; t < tensors.size(); ++t) {
    buffers.emplace_back(tensors[t].nbytes);
    size_t numel = tensors[t].nbytes / st_dtype_size(dtype);
    for (size_t b = 0; b * kBlockElements < numel; ++b) blocks.push_back({t, b});
  }
  KZ_RETURN_IF_ERROR(parallel_for(blocks.size(), jobs, [&](size_t i) -> Status {
    const PlannedTensor& t = tensors[blocks[i].tensor];
    size_t numel = t.nbytes / st_dtype_size(dtype);
    size_t begin = blocks[i].index * kBlockElements, end = std::min(numel, begin + kBlockElements);
    uint64_t stream = hash64(fmt::format("{}/{}/{}", seed, t.spec.name, blocks[i].index));
    fill_block(buffers[blocks[i].tensor].data(), dtype, fill_of(t.spec.name), std, stream, begin, end);
    return Status::ok();
  }));
  std::vector<StTensorView> views;
  for (size_t t = 0; t < tensors.size(); ++t)
    views.push_back({tensors[t].spec.name, dtype, tensors[t].spec.shape, buffers[t].data(), buffers[t].size()});
  return write_safetensors(path, views);
}

// Removes model.safetensors, shards and the index of an earlier checkpoint in `dir`.
void remove_old_weights(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        (name.starts_with("model-") && name.ends_with(".safetensors")))
      fs::remove(entry.path(), ec);
  }
}

Result<std::vector<std::string>> write_weights(const fs::path& dir, const ModelConfig& config, StDType dtype,
                                               double std, const InitModelOptions& options) {
  auto shards = plan_shards(config, dtype, options.max_shard_bytes);
  int jobs = options.jobs > 0 ? options.jobs : cpu_cores();
  std::vector<std::string> files;
  if (shards.size() == 1) {
    KZ_RETURN_IF_ERROR(write_shard(dir / "model.safetensors", shards[0], dtype, std, options.seed, jobs));
    return std::vector<std::string>{"model.safetensors"};
  }
  json weight_map = json::object();
  size_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    KZ_RETURN_IF_ERROR(write_shard(dir / name, shards[s], dtype, std, options.seed, jobs));
    for (const auto& t : shards[s]) {
      weight_map[t.spec.name] = name;
      total += t.nbytes;
    }
    files.push_back(name);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  KZ_RETURN_IF_ERROR(write_file_atomic(dir / "model.safetensors.index.json", index.dump(2) + "\n"));
  files.push_back("model.safetensors.index.json");
  return files;
}

// The preset's config.json with `shape`'s non-zero fields in place of its own.
Result<json> shaped_config(json config, const ShapeOverrides& shape) {
  const std::pair<const char*, int64_t> fields[] = {
      {"hidden_size", shape.hidden_size},
      {"intermediate_size", shape.intermediate_size},
      {"num_hidden_layers", shape.num_hidden_layers},
      {"max_window_layers", shape.num_hidden_layers},
      {"num_attention_heads", shape.num_attention_heads},
      {"num_key_value_heads", shape.num_key_value_heads},
      {"vocab_size", shape.vocab_size},
      {"max_position_embeddings", shape.max_position_embeddings},
      {"sliding_window", shape.max_position_embeddings}};
  for (const auto& [name, value] : fields) {
    if (value < 0) return invalid_argument(fmt::format("init-model: {} must be >= 0, got {}", name, value));
    if (value > 0) config[name] = value;
  }
  if (shape.initializer_range < 0) return invalid_argument("init-model: initializer_range must be >= 0");
  if (shape.initializer_range > 0) config["initializer_range"] = shape.initializer_range;
  int64_t hidden = config["hidden_size"].get<int64_t>(), heads = config["num_attention_heads"].get<int64_t>();
  if (hidden % heads != 0)
    return invalid_argument(fmt::format("init-model: hidden_size {} is not a multiple of num_attention_heads {}",
                                        hidden, heads));
  return config;
}

// The preset's tokenizer trained on the built-in corpus, or the files of options.tokenizer_dir.
Result<TokenizerFiles> tokenizer_files(const InitModelOptions& options, const Preset& preset) {
  if (options.tokenizer_dir.empty()) {
    auto files = train_byte_level_bpe(init_tokenizer_corpus(), chatml_bpe_options(preset.tokenizer_vocab));
    if (!files.ok()) return files.status().with_context("init-model: training the tokenizer");
    return files;
  }
  TokenizerFiles files;
  for (auto [name, text] : {std::pair{"tokenizer.json", &files.tokenizer_json},
                            std::pair{"tokenizer_config.json", &files.tokenizer_config_json}}) {
    auto read = read_file(options.tokenizer_dir / name);
    if (!read.ok()) return read.status().with_context("init-model: the tokenizer");
    *text = std::move(*read);
  }
  return files;
}

}  // namespace

BpeTrainOptions chatml_bpe_options(size_t vocab_size) {
  BpeTrainOptions bpe;
  bpe.vocab_size = vocab_size;
  bpe.default_system = "You are a helpful assistant.";
  return bpe;
}

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& p : presets()) n.push_back(p.name);
    return n;
  }();
  return names;
}

Status InitModelOptions::validate() const {
  if (auto p = find_preset(preset); !p.ok()) return p.status();
  if (out_dir.empty()) return invalid_argument("init-model: an output directory is required");
  if (!dtype.empty() && dtype != "bf16" && dtype != "fp32")
    return invalid_argument(fmt::format("init-model: dtype \"{}\" is not bf16 or fp32", dtype));
  if (jobs < 0) return invalid_argument("init-model: jobs must be >= 0");
  return Status::ok();
}

Result<std::string> preset_config_json(const std::string& preset) {
  auto p = find_preset(preset);
  if (!p.ok()) return p.status();
  json config = (*p)->config;
  config["bos_token_id"] = 151643;  // Qwen2.5's <|endoftext|> and <|im_end|>
  config["eos_token_id"] = 151645;
  config["torch_dtype"] = std::string((*p)->dtype) == "fp32" ? "float32" : "bfloat16";
  return config.dump(2) + "\n";
}

Result<InitModelReport> init_model(const InitModelOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate());
  const Preset& preset = **find_preset(options.preset);
  const fs::path& dir = options.out_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(fmt::format("init-model: cannot create {}: {}", dir.string(), ec.message()));

  // The tokenizer first: the config names its special ids.
  auto files = tokenizer_files(options, preset);
  if (!files.ok()) return files.status();
  auto tokenizer = Tokenizer::from_json(files->tokenizer_json, "init-model tokenizer");
  if (!tokenizer.ok()) return tokenizer.status();
  KZ_RETURN_IF_ERROR(tokenizer->apply_config(files->tokenizer_config_json));
  InitModelReport report;
  report.tokenizer_vocab_size = tokenizer->vocab_size();
  auto id_of = [&](const char* token) { return static_cast<int64_t>(*tokenizer->token_to_id(token)); };
  report.bos_token_id = id_of("<|endoftext|>");
  report.eos_token_id = id_of("<|im_end|>");
  report.pad_token_id = id_of("<|endoftext|>");
  auto shaped = shaped_config(preset.config, options.shape);
  if (!shaped.ok()) return shaped.status();
  json config = std::move(*shaped);
  int64_t vocab = config["vocab_size"].get<int64_t>();
  if (static_cast<int64_t>(report.tokenizer_vocab_size) > vocab)
    return invalid_argument(fmt::format("init-model: the tokenizer has {} ids, more than vocab_size {}",
                                        report.tokenizer_vocab_size, vocab));

  std::string dtype = options.dtype.empty() ? preset.dtype : options.dtype;
  config["bos_token_id"] = report.bos_token_id;
  config["eos_token_id"] = report.eos_token_id;
  config["torch_dtype"] = dtype == "fp32" ? "float32" : "bfloat16";
  config["dtype"] = config["torch_dtype"];
  auto parsed = parse_model_config(config.dump(), "preset " + options.preset);
  if (!parsed.ok()) return parsed.status();
  report.config = *parsed;
  StDType st = dtype == "fp32" ? StDType::f32 : StDType::bf16;
  for (const auto& spec : expected_weights(report.config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    report.parameters += n;
  }
  report.weight_bytes = static_cast<size_t>(report.parameters) * st_dtype_size(st);

  json generation = {{"bos_token_id", report.bos_token_id},
                     {"eos_token_id", {report.eos_token_id, report.pad_token_id}},
                     {"pad_token_id", report.pad_token_id},
                     {"do_sample", false}};
  remove_old_weights(dir);
  KZ_RETURN_IF_ERROR(write_file_atomic(dir / "config.json", config.dump(2) + "\n"));
  KZ_RETURN_IF_ERROR(write_file_atomic(dir / "generation_config.json", generation.dump(2) + "\n"));
  KZ_RETURN_IF_ERROR(files->write(dir));
  report.files = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"};
  if (options.weights) {
    auto written = write_weights(dir, report.config, st, init_std(config), options);
    if (!written.ok()) return written.status().with_context("init-model: writing weights to " + dir.string());
    report.files.insert(report.files.end(), written->begin(), written->end());
  }
  return report;
}

}  // namespace kz::model
