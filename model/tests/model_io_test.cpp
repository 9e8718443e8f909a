// config.json parsing and the safetensors reader/writer, without libtorch.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "kz/core/files.h"
#include "kz/model/config.h"
#include "kz/model/safetensors.h"
#include "scratch.h"

namespace kz::model {
namespace {

using namespace test;

const char* kQwen2 = R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 1000,
  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": [2, 3],
  "use_sliding_window": false, "hidden_act": "silu"})";

std::string with(std::string json, const std::string& from, const std::string& to) {
  auto at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return json.replace(at, from.size(), to);
}

TEST(Config, Qwen2) {
  auto c = parse_model_config(kQwen2, "q/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->family, Family::qwen2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->attention_out_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->dtype, WeightDType::bf16);
  EXPECT_EQ(c->rope_theta, 1000000.0);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c->bos_token_ids, (std::vector<int64_t>{1}));
  auto w = expected_weights(*c);
  EXPECT_EQ(w.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(w.back().name, "model.norm.weight");  // tied: no lm_head
  EXPECT_EQ(w.size(), 1 + 2 * 12 + 1u);           // per layer: q/k/v w+b, o, 3 mlp, 2 norms
}

TEST(Config, Qwen3HeadDimNormsAndRopeParameters) {
  std::string j = with(kQwen2, R"("model_type": "qwen2")", R"("model_type": "qwen3", "head_dim": 32)");
  j = with(j, R"("rope_theta": 1000000.0)", R"("rope_parameters": {"rope_type": "default", "rope_theta": 5000.0})");
  auto c = parse_model_config(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->rope_theta, 5000.0);
  auto w = expected_weights(*c);
  EXPECT_EQ(w[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(w[1].shape, (std::vector<int64_t>{128, 64}));
}

TEST(Config, LlamaBiasesAndLlama3Rope) {
  std::string j = with(kQwen2, R"("model_type": "qwen2")", R"("model_type": "llama", "attention_bias": true,
    "mlp_bias": true, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  auto c = parse_model_config(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->attention_bias && c->attention_out_bias && c->mlp_bias);
  EXPECT_EQ(c->rope_llama3.factor, 8.0);
  EXPECT_EQ(c->rope_llama3.original_max_position_embeddings, 8192);
}

TEST(Config, ErrorsNameFileAndField) {
  struct Case {
    std::string json, field;
  };
  std::vector<Case> cases = {
      {with(kQwen2, R"("hidden_size": 64,)", ""), "hidden_size"},
      {with(kQwen2, R"("vocab_size": 1000)", R"("vocab_size": "big")"), "vocab_size"},
      {with(kQwen2, R"("model_type": "qwen2")", R"("model_type": "mistral")"), "model_type"},
      {with(kQwen2, R"("use_sliding_window": false)", R"("use_sliding_window": true)"), "use_sliding_window"},
      {with(kQwen2, R"("rope_theta": 1000000.0)", R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})"), "rope_scaling"},
      {with(kQwen2, R"("torch_dtype": "bfloat16")", R"("torch_dtype": "int8")"), "torch_dtype"},
      {with(kQwen2, R"("hidden_act": "silu")", R"("hidden_act": "gelu")"), "hidden_act"},
  };
  for (const auto& c : cases) {
    auto r = parse_model_config(c.json, "/x/config.json");
    ASSERT_FALSE(r.ok()) << c.field;
    EXPECT_NE(r.status().message().find("/x/config.json"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status().message();
  }
  auto heads = parse_model_config(with(kQwen2, R"("num_key_value_heads": 2)", R"("num_key_value_heads": 3)"), "c.json");
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(heads.status().message().find("num_key_value_heads"), std::string::npos);
  EXPECT_EQ(parse_model_config("{not json", "c.json").status().code(), StatusCode::parse_error);
  EXPECT_EQ(load_model_config(scratch_dir("none")).status().code(), StatusCode::not_found);
}

TEST(Config, SavedJsonKeepsUnknownFieldsAndUpdatesDtype) {
  auto c = parse_model_config(kQwen2, "config.json");
  ASSERT_TRUE(c.ok());
  auto back = parse_model_config(model_config_json(*c, WeightDType::f32), "saved");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->dtype, WeightDType::f32);
  EXPECT_NE(back->raw_json.find("Qwen2ForCausalLM"), std::string::npos);
}

// ---- safetensors ----

std::vector<StTensorView> sample_tensors(const std::vector<float>& a, const std::vector<uint16_t>& b) {
  return {{"a", StDType::f32, {2, 3}, a.data(), a.size() * 4}, {"b.weight", StDType::bf16, {4}, b.data(), b.size() * 2}};
}

TEST(Safetensors, WriteReadRoundTrip) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {0x3f80, 0x4000, 0x4040, 0x4080};
  fs::path file = scratch_dir("rt") / "x.safetensors";
  ASSERT_TRUE(write_safetensors(file, sample_tensors(a, b)).is_ok());
  auto f = SafetensorsFile::open(file);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ(f->tensors().size(), 2u);
  const StTensorInfo* ia = f->find("a");
  ASSERT_TRUE(ia);
  EXPECT_EQ(ia->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(f->data(*ia), a.data(), 24), 0);
  const StTensorInfo* ib = f->find("b.weight");
  ASSERT_TRUE(ib);
  EXPECT_EQ(ib->dtype, StDType::bf16);
  EXPECT_EQ(std::memcmp(f->data(*ib), b.data(), 8), 0);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data(*ia)) % 8, 0u);  // header padded: data aligned
}

// Writes raw bytes: an 8-byte length then `header` then `data_bytes` zero bytes.
fs::path raw_file(const std::string& name, uint64_t header_len, const std::string& header, size_t data_bytes) {
  fs::path p = scratch_dir(name) / "bad.safetensors";
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out << header << std::string(data_bytes, '\0');
  return p;
}

TEST(Safetensors, CorruptFilesAreClearErrors) {
  std::string h = R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  struct Case {
    fs::path path;
    std::string expect;
  };
  std::vector<Case> cases = {
      {raw_file("short", 8, "", 0), "truncated"},                         // header length, no header
      {raw_file("trunc", h.size(), h, 8), "truncated"},                   // data cut short
      {raw_file("huge", uint64_t(1) << 40, h, 16), "does not fit"},        // absurd header length
      {raw_file("json", 5, "{nope", 0), "not a JSON object"},
      {raw_file("empty", 0, "", 0), "not a JSON object"},
  };
  std::string bad_dtype = R"({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}})";
  cases.push_back({raw_file("dt", bad_dtype.size(), bad_dtype, 16), "Q4"});
  std::string bad_size = R"({"w": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}})";
  cases.push_back({raw_file("sz", bad_size.size(), bad_size, 16), "shape needing 20"});
  fs::path tiny = scratch_dir("tiny") / "t.safetensors";
  std::ofstream(tiny) << "abc";
  cases.push_back({tiny, "shorter"});
  for (const auto& c : cases) {
    auto f = SafetensorsFile::open(c.path);
    ASSERT_FALSE(f.ok()) << c.path;
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos) << f.status().message();
    EXPECT_NE(f.status().message().find(c.path.string()), std::string::npos) << f.status().message();
  }
  EXPECT_EQ(SafetensorsFile::open(scratch_dir("missing") / "no.safetensors").status().code(), StatusCode::not_found);
}

TEST(Safetensors, ShardedCheckpointWriteAndOpen) {
  std::vector<float> a(6, 1.f);
  std::vector<uint16_t> b(4, 2);
  std::vector<float> c(100, 3.f);
  auto tensors = sample_tensors(a, b);
  tensors.push_back({"c", StDType::f32, {100}, c.data(), 400});
  fs::path dir = scratch_dir("sharded");
  ASSERT_TRUE(write_checkpoint(dir, tensors, 0).is_ok());  // one file first ...
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  ASSERT_TRUE(write_checkpoint(dir, tensors, 32).is_ok());  // ... then sharded: the old file goes
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir / "model-00001-of-00002.safetensors"));  // a + b (32 bytes), then c
  EXPECT_TRUE(fs::exists(dir / "model-00002-of-00002.safetensors"));
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->entries().size(), 3u);
  const auto* e = ck->find("c");
  ASSERT_TRUE(e);
  EXPECT_EQ(static_cast<const float*>(e->file->data(*e->info))[99], 3.f);
  EXPECT_EQ(ck->find("nope"), nullptr);

  // An index naming a tensor its shard lacks is an error naming both.
  auto index = *read_file(dir / "model.safetensors.index.json");
  index.replace(index.find("\"c\""), 3, "\"d\"");
  ASSERT_TRUE(write_file_atomic(dir / "model.safetensors.index.json", index).is_ok());
  auto broken = Checkpoint::open(dir);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("'d'"), std::string::npos) << broken.status().message();
  EXPECT_EQ(Checkpoint::open(scratch_dir("empty")).status().code(), StatusCode::not_found);
}

}  // namespace
}  // namespace kz::model
