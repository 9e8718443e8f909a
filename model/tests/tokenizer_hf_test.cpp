// kz::Tokenizer against Hugging Face `tokenizers` and `transformers` (the venv interpreter,
// KZ_PYTHON; override with the KZ_PYTHON environment variable).
//
// tests/tokenizer_reference.py trains Qwen2-, Llama 3- and GPT-2-style tokenizers (no downloads)
// and records what tokenizers makes of a test corpus: code, Unicode of many scripts, white-space
// runs, CRLF, digits, contractions, special tokens inside text, random character soups. Here the
// same files are loaded and every result compared: ids (specials on and off), decodes, random-id
// decodes, streaming, pre-tokenizer pieces, NFC, and a sweep of every code point through the split
// regex (which checks the generated Unicode tables against Oniguruma's). The last test goes the
// other way: a tokenizer written by train_byte_level_bpe is loaded by tokenizers and transformers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/sandbox/process.h"
#include "kz/model/tokenizer.h"
#include "kz/model/tokenizer_train.h"
#include "unicode.h"

namespace kz {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

const char* const kStyles[] = {"qwen2", "llama3", "gpt2", "gpt2_prefix"};

fs::path source_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return dir ? fs::path(dir) : fs::path(".");
}

std::string python() {
  const char* env = std::getenv("KZ_PYTHON");
  return env && *env ? env : KZ_PYTHON;
}

// Runs tokenizer_reference.py with `args`; fails the test with its stderr on error.
::testing::AssertionResult run_reference(const std::vector<std::string>& args, const fs::path& scratch) {
  ProcessSpec spec;
  spec.argv = {python(), (source_dir() / "model/tests/tokenizer_reference.py").string()};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = current_environment();
  // Nothing may be downloaded; caches go to the scratch directory.
  spec.env["HF_HUB_OFFLINE"] = "1";
  spec.env["TRANSFORMERS_OFFLINE"] = "1";
  spec.env["HF_HOME"] = (scratch / "hf_home").string();
  spec.env["TOKENIZERS_PARALLELISM"] = "false";
  spec.env["PYTHONDONTWRITEBYTECODE"] = "1";
  auto result = run_process(spec, 540s);
  if (!result.ok()) return ::testing::AssertionFailure() << result.status().to_string();
  if (result->timed_out) return ::testing::AssertionFailure() << "tokenizer_reference.py timed out";
  if (!result->exit.exited || result->exit.exit_code != 0)
    return ::testing::AssertionFailure() << "tokenizer_reference.py " << args[0] << ": " << result->exit.describe()
                                         << "\n" << result->stderr_text;
  return ::testing::AssertionSuccess();
}

json read_json(const fs::path& path) {
  auto text = read_file(path);
  if (!text.ok()) return json();
  return json::parse(*text);
}

// Printable form of a test string for failure messages.
std::string shown(std::string_view text, size_t limit = 120) {
  std::string out;
  for (char c : text.substr(0, limit)) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return text.size() > limit ? out + "..." : out;
}

std::string byte_level_string(std::string_view bytes) {
  std::string out;
  for (char c : bytes) unicode::append_utf8(out, unicode::byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

uint64_t fnv1a(const std::vector<uint64_t>& values) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t v : values) {
    h ^= v;
    h *= 0x100000001b3ull;
  }
  return h;
}

class HfReferenceTest : public ::testing::Test {
 protected:
  // KZ_TOKENIZER_REFERENCE_DIR names a directory already made by `tokenizer_reference.py
  // prepare` (kept afterwards): for iterating on a failure without retraining.
  static void SetUpTestSuite() {
    const char* reuse = std::getenv("KZ_TOKENIZER_REFERENCE_DIR");
    if (reuse && *reuse) {
      dir_ = new fs::path(reuse);
      keep_dir_ = true;
    } else {
      auto dir = make_unique_dir(fs::temp_directory_path(), "kz_tokenizer_hf_test");
      ASSERT_TRUE(dir.ok()) << dir.status().to_string();
      dir_ = new fs::path(*dir);
      ASSERT_TRUE(run_reference({"prepare", dir_->string(), "--source-dir", source_dir().string()}, *dir_));
    }
    reference_ = new json(read_json(*dir_ / "reference.json"));
    ASSERT_TRUE(reference_->is_object()) << "no reference.json in " << *dir_;
  }
  static void TearDownTestSuite() {
    if (dir_ && !keep_dir_) fs::remove_all(*dir_);
    delete dir_;
    delete reference_;
    dir_ = nullptr;
    reference_ = nullptr;
  }
  void SetUp() override {
    if (!reference_ || !reference_->is_object()) GTEST_SKIP() << "no reference (see the suite's setup failure)";
  }

  static Tokenizer load(const std::string& style) {
    auto tokenizer = Tokenizer::load(*dir_ / style / "tokenizer.json");
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
    return std::move(tokenizer).value();
  }
  static const json& ref(const std::string& style) { return (*reference_)["tokenizers"][style]; }
  static const json& cases() { return (*reference_)["cases"]; }

  static fs::path* dir_;
  static bool keep_dir_;
  static json* reference_;
};

fs::path* HfReferenceTest::dir_ = nullptr;
bool HfReferenceTest::keep_dir_ = false;
json* HfReferenceTest::reference_ = nullptr;

TEST_F(HfReferenceTest, EncodeMatchesWithAndWithoutSpecialTokens) {
  for (const char* style : kStyles) {
    Tokenizer tokenizer = load(style);
    int mismatches = 0;
    for (size_t i = 0; i < cases().size(); ++i) {
      std::string text = cases()[i].get<std::string>();
      for (auto [key, allow] : {std::pair{"special", true}, {"plain", false}}) {
        auto expected = ref(style)["encode"][key][i].get<std::vector<TokenId>>();
        std::vector<TokenId> got = tokenizer.encode(text, allow);
        if (got != expected && ++mismatches <= 5)
          ADD_FAILURE() << style << " (" << key << ") case " << i << " '" << shown(text) << "'\n  ours: "
                        << fmt::format("{}", fmt::join(got, " ")) << "\n  hf:   " << fmt::format("{}", fmt::join(expected, " "));
      }
    }
    EXPECT_EQ(mismatches, 0) << style << ": " << mismatches << " encodings differ of " << 2 * cases().size();
  }
}

TEST_F(HfReferenceTest, DecodeMatches) {
  for (const char* style : kStyles) {
    Tokenizer tokenizer = load(style);
    for (const char* source : {"encode", "random"}) {
      bool random = std::string(source) == "random";
      const json& id_lists = random ? ref(style)["random_ids"] : ref(style)["encode"]["special"];
      const json& decoded = random ? ref(style)["random_decode"] : ref(style)["decode"];
      int mismatches = 0;
      for (size_t i = 0; i < id_lists.size(); ++i) {
        auto ids = id_lists[i].get<std::vector<TokenId>>();
        for (auto [key, skip] : {std::pair{"full", false}, {"skip", true}}) {
          std::string expected = decoded[key][i].get<std::string>();
          std::string got = tokenizer.decode(ids, skip);
          if (got != expected && ++mismatches <= 5)
            ADD_FAILURE() << style << " " << source << " decode (" << key << ") " << i << ":\n  ours: '" << shown(got)
                          << "'\n  hf:   '" << shown(expected) << "'";
        }
      }
      EXPECT_EQ(mismatches, 0) << style << " " << source;
    }
  }
}

TEST_F(HfReferenceTest, EncodeDecodeRoundTripsAndStreamingEqualsDecode) {
  for (const char* style : {"qwen2", "llama3", "gpt2"}) {
    Tokenizer tokenizer = load(style);
    for (size_t i = 0; i < cases().size(); ++i) {
      std::string text = cases()[i].get<std::string>();
      std::vector<TokenId> ids = tokenizer.encode(text);
      std::string expected = ref(style)["decode"]["full"][i].get<std::string>();  // NFC for qwen2
      ASSERT_EQ(tokenizer.decode(ids), expected) << style << " case " << i;
      if (std::string(style) == "llama3") {  // no normaliser, no lstrip/rstrip: the text comes back
        EXPECT_EQ(tokenizer.decode(ids), text) << style << " case " << i;
      }
      TokenStreamDecoder stream(tokenizer);
      std::string streamed;
      for (TokenId id : ids) streamed += stream.push(id);
      streamed += stream.finish();
      ASSERT_EQ(streamed, expected) << style << " case " << i;
    }
    for (const json& ids : ref(style)["random_ids"]) {  // arbitrary ids split characters anywhere
      TokenStreamDecoder stream(tokenizer, /*skip_special=*/true);
      std::string streamed;
      for (TokenId id : ids.get<std::vector<TokenId>>()) {
        std::string part = stream.push(id);
        EXPECT_EQ(unicode::to_valid_utf8_lossy(part), part) << "a pushed piece is not valid UTF-8";
        streamed += part;
      }
      streamed += stream.finish();
      EXPECT_EQ(streamed, tokenizer.decode(ids.get<std::vector<TokenId>>(), true));
    }
  }
}

TEST_F(HfReferenceTest, PreTokenizerPiecesMatch) {
  for (const char* style : kStyles) {
    Tokenizer tokenizer = load(style);
    int mismatches = 0;
    for (size_t i = 0; i < cases().size(); ++i) {
      std::vector<std::string> got;
      for (const std::string& piece : tokenizer.pre_tokenize(cases()[i].get<std::string>()))
        got.push_back(byte_level_string(piece));
      auto expected = ref(style)["pieces"][i].get<std::vector<std::string>>();
      if (got != expected && ++mismatches <= 5)
        ADD_FAILURE() << style << " pieces of case " << i << " '" << shown(cases()[i].get<std::string>()) << "'\n  ours: "
                      << shown(fmt::format("{}", fmt::join(got, " | ")), 400) << "\n  hf:   "
                      << shown(fmt::format("{}", fmt::join(expected, " | ")), 400);
    }
    EXPECT_EQ(mismatches, 0) << style;
  }
}

// The probe text must be the one sweep_probe() builds in tokenizer_reference.py.
std::string sweep_block_text(char32_t first, char32_t block) {
  std::string text;
  for (char32_t cp = first; cp < first + block; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string c;
    unicode::append_utf8(c, cp);
    text += c + "a" + c + "1" + c + c + "!" + c + " ";
  }
  return text;
}

TEST_F(HfReferenceTest, EveryCodePointIsClassedAsOniguruma) {
  const json& sweep = (*reference_)["sweep"];
  auto block = sweep["block"].get<char32_t>();
  for (const char* style : {"llama3", "gpt2"}) {
    Tokenizer tokenizer = load(style);
    int mismatches = 0;
    for (size_t b = 0; b < sweep[style].size(); ++b) {
      std::vector<uint64_t> lengths;
      for (const std::string& piece : tokenizer.pre_tokenize(sweep_block_text(static_cast<char32_t>(b) * block, block)))
        lengths.push_back(byte_level_string(piece).size());
      if (fnv1a(lengths) != sweep[style][b].get<uint64_t>() && ++mismatches <= 10)
        ADD_FAILURE() << style << ": pieces differ in code point block U+" << fmt::format("{:04X}", b * block);
    }
    EXPECT_EQ(mismatches, 0) << style;
  }
}

TEST_F(HfReferenceTest, NfcMatches) {
  const json& nfc = (*reference_)["nfc"];
  int mismatches = 0;
  for (size_t i = 0; i < nfc["inputs"].size(); ++i) {
    std::string input = nfc["inputs"][i].get<std::string>();
    std::string expected = nfc["outputs"][i].get<std::string>();
    std::string got = unicode::nfc(input);
    if (got != expected && ++mismatches <= 5) {
      size_t at = 0;
      while (at < got.size() && at < expected.size() && got[at] == expected[at]) ++at;
      size_t from = at > 20 ? at - 20 : 0;
      ADD_FAILURE() << "NFC input " << i << " differs at byte " << at << ": ours '" << got.substr(from, 40) << "' hf '"
                    << expected.substr(from, 40) << "'";
    }
    EXPECT_TRUE(unicode::nfc(expected) == expected) << "NFC is not idempotent on input " << i;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(HfReferenceTest, VocabularyAndLookupsMatch) {
  for (const char* style : kStyles) {
    Tokenizer tokenizer = load(style);
    EXPECT_EQ(tokenizer.vocab_size(), ref(style)["vocab_size"].get<size_t>()) << style;
    auto data = read_json(*dir_ / style / "tokenizer.json");
    for (const auto& [token, id] : data["model"]["vocab"].items()) {
      ASSERT_EQ(tokenizer.token_to_id(token), id.get<TokenId>()) << style << " " << token;
      ASSERT_EQ(tokenizer.id_to_token(id.get<TokenId>()), token) << style;
    }
    for (const json& added : data["added_tokens"]) {
      EXPECT_EQ(tokenizer.token_to_id(added["content"].get<std::string>()), added["id"].get<TokenId>());
      EXPECT_EQ(tokenizer.is_special(added["id"].get<TokenId>()), added["special"].get<bool>());
    }
  }
}

// ---- the other direction: what train_byte_level_bpe writes loads in Hugging Face ----

std::vector<std::string> training_corpus() {
  std::vector<std::string> corpus;
  for (const char* dir : {"core/src", "eval/src", "worker"}) {
    std::error_code ec;
    for (const auto& entry : fs::recursive_directory_iterator(source_dir() / dir, ec)) {
      if (!entry.is_regular_file()) continue;
      auto text = read_file(entry.path());
      if (text.ok()) corpus.push_back(*text);
    }
  }
  corpus.push_back("深度学习模型 Crème brûlée e\u0301 😀👍🏽 مرحبا 1234567 it's DON'T\r\n\t\tx  ");
  return corpus;
}

TEST(HfWrittenTest, TrainedTokenizerLoadsInTokenizersAndTransformers) {
  auto dir = make_unique_dir(fs::temp_directory_path(), "kz_tokenizer_written");
  ASSERT_TRUE(dir.ok()) << dir.status().to_string();
  BpeTrainOptions options;
  options.vocab_size = 1200;
  options.default_system = "You are a helpful assistant.";
  auto files = train_byte_level_bpe(training_corpus(), options);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  ASSERT_TRUE(files->write(*dir).is_ok());

  std::vector<std::string> cases = {
      "def forward(self, x):\n    return torch.relu(x)  # it's fine\n",
      "__global__ void k(float* y) { y[threadIdx.x] = 0.0f; }\r\n",
      "<|im_start|>user\nWrite a kernel<|im_end|>\n<|im_start|>assistant\n",
      "深度学习 Crème e\u0301 😀 مرحبا 2026-11-29   \t\n\n  x", "", "     ", "<|endoftext|><|endoftext|>"};
  json chats = json::array();
  std::vector<std::vector<ChatTurn>> conversations = {
      {{"user", "Hello"}},
      {{"system", "Be brief."}, {"user", "Write a GELU kernel"}, {"assistant", "```python\npass\n```"}},
      {{"user", "a"}, {"assistant", "b"}, {"user", "c"}}};
  for (const auto& turns : conversations)
    for (bool prompt : {false, true}) {
      json messages = json::array();
      for (const auto& t : turns) messages.push_back({{"role", t.role}, {"content", t.content}});
      chats.push_back({{"messages", messages}, {"add_generation_prompt", prompt}});
    }
  ASSERT_TRUE(write_file_atomic(*dir / "cases.json", json(cases).dump()).is_ok());
  ASSERT_TRUE(write_file_atomic(*dir / "chats.json", chats.dump()).is_ok());
  ASSERT_TRUE(run_reference({"check-written", dir->string()}, *dir));
  json hf = read_json(*dir / "hf_result.json");

  auto tokenizer = Tokenizer::load(*dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ(tokenizer->vocab_size(), hf["vocab_size"].get<size_t>());
  EXPECT_EQ(tokenizer->vocab_size(), options.vocab_size);
  EXPECT_EQ(tokenizer->eos_id(), hf["eos_token_id"].get<TokenId>());
  EXPECT_EQ(tokenizer->pad_id(), hf["pad_token_id"].get<TokenId>());
  EXPECT_TRUE(hf["bos_token_id"].is_null());
  EXPECT_FALSE(tokenizer->bos_id().has_value());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<TokenId> ours = tokenizer->encode(cases[i]);
    EXPECT_EQ(ours, hf["tokenizers"][i].get<std::vector<TokenId>>()) << "case " << i;
    EXPECT_EQ(ours, hf["transformers"][i].get<std::vector<TokenId>>()) << "case " << i;
    EXPECT_EQ(tokenizer->decode(ours), hf["decode"][i].get<std::string>()) << "case " << i;
  }
  EXPECT_EQ(tokenizer->chat_template().default_system, options.default_system);
  for (size_t i = 0; i < chats.size(); ++i) {
    std::vector<ChatTurn> turns;
    for (const json& m : chats[i]["messages"]) turns.push_back({m["role"], m["content"]});
    EXPECT_EQ(render_chatml(turns, chats[i]["add_generation_prompt"].get<bool>(), tokenizer->chat_template()),
              hf["chats"][i].get<std::string>())
        << "chat " << i;
  }
  fs::remove_all(*dir);
}

}  // namespace
}  // namespace kz
