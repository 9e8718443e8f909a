// Unit tests of the tokenizer that need no Python: UTF-8 stepping, the Unicode tables, NFC, the
// split-pattern scanners, BPE merge order on hand-written vocabularies, added tokens, loading
// errors, decoding and streaming (with stop strings), ChatML, and the trainer.
#include "kz/model/tokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/model/chat_template.h"
#include "kz/model/stop_strings.h"
#include "kz/model/tokenizer_train.h"
#include "unicode.h"

namespace kz {
namespace {

using json = nlohmann::json;

const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string byte_level(std::string_view bytes) {
  std::string out;
  for (char c : bytes) unicode::append_utf8(out, unicode::byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

json byte_level_step(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", use_regex}};
}

json split_pre_tokenizer(const std::string& regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            byte_level_step(false)}}};
}

// A tokenizer.json with the 256 byte tokens (id = byte value), then one token per merge (merges
// are written as raw-byte pairs), then ChatML specials.
json make_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                         const std::string& regex = kQwen2Regex) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level(std::string(1, static_cast<char>(b)))] = b;
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    std::string merged = byte_level(a + b);
    if (!vocab.contains(merged)) vocab[merged] = vocab.size();
    merge_list.push_back({byte_level(a), byte_level(b)});
  }
  json added = json::array();
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
    added.push_back({{"id", vocab.size() + added.size()}, {"content", special}, {"special", true},
                     {"normalized", false}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", split_pre_tokenizer(regex)},
          {"decoder", byte_level_step(false)},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

Tokenizer make_tokenizer(const json& data) {
  auto tokenizer = Tokenizer::from_json(data.dump(), "test tokenizer.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return std::move(tokenizer).value();
}

std::vector<std::string> token_strings(const Tokenizer& tokenizer, const std::vector<TokenId>& ids) {
  std::vector<std::string> out;
  for (TokenId id : ids) out.emplace_back(tokenizer.token_bytes(id));
  return out;
}

std::vector<std::string> pieces(const std::string& regex, const std::string& text) {
  return make_tokenizer(make_tokenizer_json({}, regex)).pre_tokenize(text);
}

using Strings = std::vector<std::string>;

// ---- Unicode ----

TEST(UnicodeTest, Utf8StepsReplaceMaximalSubparts) {
  // As Rust's from_utf8_lossy and Python's decode("utf-8", "replace").
  EXPECT_EQ(unicode::to_valid_utf8_lossy("a\xF0\x90\x80" "b"), "a\xEF\xBF\xBD" "b");       // truncated 4-byte
  EXPECT_EQ(unicode::to_valid_utf8_lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");        // overlong
  EXPECT_EQ(unicode::to_valid_utf8_lossy("\xED\xA0\x80"), std::string(3 * 3, ' ').replace(0, 9, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));
  EXPECT_EQ(unicode::to_valid_utf8_lossy("\xE4\xB8"), "\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_utf8_lossy("\xF4\x90\x80\x80"), std::string("\xEF\xBF\xBD").append("\xEF\xBF\xBD").append("\xEF\xBF\xBD").append("\xEF\xBF\xBD"));
  EXPECT_EQ(unicode::to_valid_utf8_lossy("中文 ok"), "中文 ok");
  unicode::Utf8Step step = unicode::next_utf8("\xE4\xB8", 0);
  EXPECT_EQ(step.status, unicode::Utf8Status::truncated);
  EXPECT_EQ(step.length, 2u);
}

TEST(UnicodeTest, CategoriesAndClasses) {
  EXPECT_EQ(unicode::category('A'), unicode::Category::Lu);
  EXPECT_EQ(unicode::category(U'中'), unicode::Category::Lo);
  EXPECT_EQ(unicode::category(0x0301), unicode::Category::Mn);
  EXPECT_EQ(unicode::category(U'٣'), unicode::Category::Nd);
  EXPECT_EQ(unicode::category(U'Ⅻ'), unicode::Category::Nl);
  EXPECT_EQ(unicode::category(0x10FFFF), unicode::Category::Cn);
  EXPECT_EQ(unicode::category(0x1F600), unicode::Category::So);
  EXPECT_TRUE(unicode::char_class(U'é') & unicode::kLetter);
  EXPECT_TRUE(unicode::char_class(U'²') & unicode::kNumber);
  EXPECT_TRUE(unicode::char_class(0x3000) & unicode::kSpace);
  EXPECT_TRUE(unicode::char_class(0x85) & unicode::kSpace);
  EXPECT_FALSE(unicode::char_class(0x1C) & unicode::kSpace);   // Python's isspace says yes; \s says no
  EXPECT_FALSE(unicode::char_class(0x200B) & unicode::kSpace);  // zero width space is Cf
  EXPECT_TRUE(unicode::char_class('\r') & unicode::kNewline);
  EXPECT_EQ(unicode::char_class('_'), unicode::kWordPunct);
  EXPECT_EQ(unicode::char_class(unicode::kInvalid), 0);
  for (char32_t c = 0; c < 128; ++c) {  // the constant ASCII table agrees with the Unicode tables
    EXPECT_EQ(unicode::kAsciiClasses[c] & ~unicode::kNewline, unicode::char_class_slow(c)) << int(c);
    EXPECT_EQ((unicode::kAsciiClasses[c] & unicode::kNewline) != 0, c == '\r' || c == '\n') << int(c);
  }
  for (char32_t c = 0; c < 0x110000; c += (c < 0x3100 ? 1 : 97))  // White_Space and kSpace agree
    ASSERT_EQ(unicode::is_white_space(c), (unicode::char_class_slow(c) & unicode::kSpace) != 0) << int(c);
  EXPECT_STREQ(unicode::unicode_version(), "16.0.0");  // Oniguruma's, in tokenizers 0.2x
}

TEST(UnicodeTest, Nfc) {
  EXPECT_EQ(unicode::nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");                 // singleton: Angstrom sign
  EXPECT_EQ(unicode::nfc("\u1e9b\u0323"), "\u1e9b\u0323");     // UAX #15's example
  EXPECT_EQ(unicode::nfc("a\u0323\u0302"), "\u1ead");           // reordered marks compose
  EXPECT_EQ(unicode::nfc("a\u0302\u0323"), "\u1ead");
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11a8"), "\uac01");      // Hangul L V T
  EXPECT_EQ(unicode::nfc("\uac00\u11a8"), "\uac01");            // LV + T
  EXPECT_EQ(unicode::nfc("\u0958"), "\u0915\u093c");            // composition exclusion
  EXPECT_EQ(unicode::nfc("\u0301abc"), "\u0301abc");            // leading mark
  EXPECT_EQ(unicode::nfc("x\xFF" "e\u0301"), "x\xFF\u00e9");    // ill-formed bytes pass through
  EXPECT_TRUE(unicode::is_nfc_quick("plain ASCII, 中文, émigré"));
  EXPECT_FALSE(unicode::is_nfc_quick("e\u0301"));
}

TEST(UnicodeTest, ByteLevelAlphabet) {
  EXPECT_EQ(unicode::byte_to_char(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(unicode::byte_to_char('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(unicode::byte_to_char('a'), U'a');
  EXPECT_EQ(unicode::byte_to_char(0xAD), 0x143u);  // soft hyphen is not printable
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode::char_to_byte(unicode::byte_to_char(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(unicode::char_to_byte(0x20), -1);
  EXPECT_EQ(unicode::char_to_byte(0x4E2D), -1);
}

// ---- pre-tokenizer (expected pieces are what tokenizers 0.23 gives) ----

TEST(PreTokenizerTest, Qwen2Pattern) {
  EXPECT_EQ(pieces(kQwen2Regex, "a  \n\n  b\t\tc   "), (Strings{"a", "  \n\n", " ", " b", "\t", "\tc", "   "}));
  EXPECT_EQ(pieces(kQwen2Regex, "I'S 'ſ x"), (Strings{"I", "'S", " '", "ſ", " x"}));
  EXPECT_EQ(pieces(kQwen2Regex, "Hello world123"), (Strings{"Hello", " world", "1", "2", "3"}));
  EXPECT_EQ(pieces(kQwen2Regex, "don't WE'LL"), (Strings{"don", "'t", " WE", "'LL"}));
  EXPECT_EQ(pieces(kQwen2Regex, "x = (a+b);\r\n"), (Strings{"x", " =", " (", "a", "+b", ");\r\n"}));
  EXPECT_EQ(pieces(kQwen2Regex, "\u0301abc"), (Strings{"\u0301abc"}));
  EXPECT_EQ(pieces(kQwen2Regex, "x\n  y"), (Strings{"x", "\n", " ", " y"}));
}

TEST(PreTokenizerTest, Llama3AndGpt2Patterns) {
  EXPECT_EQ(pieces(kLlama3Regex, "Hello world12345"), (Strings{"Hello", " world", "123", "45"}));
  std::string gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(pieces(gpt2, "I'M it's  12345 x!!\n\ny"), (Strings{"I", "'", "M", " it", "'s", " ", " 12345", " x", "!!", "\n", "\n", "y"}));
}

// ---- BPE ----

TEST(BpeTest, MergesApplyByRankThenLeftmost) {
  Tokenizer ab_first = make_tokenizer(make_tokenizer_json({{"a", "b"}, {"b", "c"}}));
  EXPECT_EQ(token_strings(ab_first, ab_first.encode("abc")), (Strings{"ab", "c"}));
  Tokenizer bc_first = make_tokenizer(make_tokenizer_json({{"b", "c"}, {"a", "b"}}));
  EXPECT_EQ(token_strings(bc_first, bc_first.encode("abc")), (Strings{"a", "bc"}));
  Tokenizer aa = make_tokenizer(make_tokenizer_json({{"a", "a"}}));
  EXPECT_EQ(token_strings(aa, aa.encode("aaa")), (Strings{"aa", "a"}));  // leftmost of equal ranks
  Tokenizer hello = make_tokenizer(make_tokenizer_json({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}}));
  EXPECT_EQ(token_strings(hello, hello.encode("hello hello world")), (Strings{"hello", " ", "hello", " w", "o", "r", "l", "d"}));
}

TEST(BpeTest, LongWordsUseTheHeapAndAgreeWithShortOnes) {
  // 'ab' then 'abab' merges: a 1000-letter word goes through the heap path, a short one through
  // the scan; the segmentation pattern must be the same.
  Tokenizer t = make_tokenizer(make_tokenizer_json({{"a", "b"}, {"ab", "ab"}, {"abab", "abab"}}));
  std::vector<std::string> short_word = token_strings(t, t.encode("abababababab"));
  EXPECT_EQ(short_word, (Strings{"abababab", "abab"}));
  std::string long_text;
  for (int i = 0; i < 500; ++i) long_text += "ab";
  std::vector<std::string> long_word = token_strings(t, t.encode(long_text));
  ASSERT_EQ(long_word.size(), 1000u / 8 + (1000 % 8 ? 1 : 0));
  for (const auto& piece : long_word) EXPECT_EQ(piece, "abababab");
}

TEST(BpeTest, IgnoreMergesEmitsWholeWordTokens) {
  json data = make_tokenizer_json({{"a", "b"}});
  data["model"]["vocab"][byte_level("abc")] = 300;  // no merge reaches it
  Tokenizer merged = make_tokenizer(data);
  EXPECT_EQ(token_strings(merged, merged.encode("abc")), (Strings{"ab", "c"}));
  data["model"]["ignore_merges"] = true;
  Tokenizer whole = make_tokenizer(data);
  EXPECT_EQ(whole.encode("abc"), (std::vector<TokenId>{300}));
  EXPECT_EQ(token_strings(whole, whole.encode("abcd")), (Strings{"ab", "c", "d"}));
}

TEST(BpeTest, OldStringMergesLoadLikePairs) {
  json pairs = make_tokenizer_json({{"a", "b"}, {"ab", "c"}});
  json strings = pairs;
  for (json& m : strings["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  EXPECT_EQ(make_tokenizer(pairs).encode("abcab"), make_tokenizer(strings).encode("abcab"));
  EXPECT_EQ(make_tokenizer(strings).encode("abc").size(), 1u);
}

// ---- added tokens, decoding ----

TEST(TokenizerTest, SpecialTokensAreMatchedOnlyWhenAllowed) {
  Tokenizer t = make_tokenizer(make_tokenizer_json({}));
  TokenId start = *t.token_to_id("<|im_start|>"), end = *t.token_to_id("<|im_end|>");
  std::vector<TokenId> ids = t.encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(ids.front(), start);
  EXPECT_EQ(ids.back(), end);
  std::vector<TokenId> plain = t.encode("<|im_start|>user", /*allow_special=*/false);
  EXPECT_EQ(plain.size(), std::string("<|im_start|>user").size());  // bytes, no merges here
  EXPECT_TRUE(t.is_special(start));
  EXPECT_FALSE(t.is_special(0));
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "user\nhi");
  EXPECT_EQ(t.decode(ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(t.vocab_size(), 259u);
  EXPECT_EQ(t.id_to_token(' '), "Ġ");
  EXPECT_EQ(t.token_to_id("Ġ"), ' ');
  EXPECT_FALSE(t.token_to_id("nope").has_value());
  EXPECT_FALSE(t.id_to_token(100000).has_value());
}

TEST(TokenizerTest, DecodeHandlesPartialCharactersAndUnknownIds) {
  Tokenizer t = make_tokenizer(make_tokenizer_json({}));
  std::vector<TokenId> zhong = t.encode("中");  // three byte tokens
  ASSERT_EQ(zhong.size(), 3u);
  EXPECT_EQ(t.decode(zhong), "中");
  EXPECT_EQ(t.decode(std::vector<TokenId>{zhong[0], zhong[1]}), "\xEF\xBF\xBD");  // one U+FFFD
  EXPECT_EQ(t.decode(std::vector<TokenId>{'a', -1, 999999, 'b'}), "ab");           // unknown ids skipped
  // Invalid UTF-8 input is encoded byte for byte and comes back (lossily) in decode.
  std::string bad = "ok\xFF\xC3(";
  std::vector<TokenId> ids = t.encode(bad);
  std::string bytes;
  for (TokenId id : ids) bytes += t.token_bytes(id);
  EXPECT_EQ(bytes, bad);
  EXPECT_EQ(t.decode(ids), unicode::to_valid_utf8_lossy(bad));
}

TEST(TokenizerTest, StreamDecoderHoldsBackIncompleteCharacters) {
  Tokenizer t = make_tokenizer(make_tokenizer_json({}));
  std::string text = "a中😀b";
  std::vector<TokenId> ids = t.encode(text);  // one token per byte
  TokenStreamDecoder stream(t);
  std::vector<std::string> parts;
  for (TokenId id : ids) parts.push_back(stream.push(id));
  EXPECT_EQ(parts, (Strings{"a", "", "", "中", "", "", "", "😀", "b"}));
  EXPECT_EQ(stream.finish(), "");
  TokenStreamDecoder cut(t);
  EXPECT_EQ(cut.push(ids[1]), "");
  EXPECT_EQ(cut.push('x'), "\xEF\xBF\xBDx");  // the character can no longer complete
  EXPECT_EQ(cut.push(ids[4]), "");
  EXPECT_EQ(cut.finish(), "\xEF\xBF\xBD");
}

// Streaming with stop strings: what settled() lets out is never taken back, holds back an
// unfinished character and any tail that may still become a stop string, and the pieces add up
// to apply_stop_strings' text, whichever way the tokens are grouped.
TEST(StopStringTextTest, SettledTextIsFinalAndHeldBackWhereItMayChange) {
  using model::StopStringText;
  Tokenizer t = make_tokenizer(make_tokenizer_json({}));
  std::vector<TokenId> ids = t.encode("ab中cd<END>ef");  // one token per byte
  StopStringText text(t, {"<END>", "", "dx"});
  std::vector<std::string> settled;
  for (TokenId id : ids) {
    if (text.push(id)) break;
    settled.push_back(text.text().substr(0, text.settled()));
  }
  EXPECT_EQ(settled, (Strings{"a", "ab", "ab", "ab", "ab中", "ab中c", "ab中c", "ab中cd", "ab中cd", "ab中cd", "ab中cd"}));
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(text.text(), "ab中cd");
  EXPECT_EQ(text.settled(), text.text().size());
  EXPECT_EQ(text.tokens(), ids.size() - 2);  // up to the '>' that completed "<END>"
  // The stop string spans the pieces: once cut, the text is what apply_stop_strings gives.
  std::vector<int64_t> all(ids.begin(), ids.end());
  model::StopCut cut = model::apply_stop_strings(t, all, {"<END>", "dx"});
  EXPECT_EQ(cut.text, text.text());
  EXPECT_EQ(cut.tokens, text.tokens());
  EXPECT_TRUE(cut.stopped);
  // No stop string: an unfinished character stays out until finish() writes it as U+FFFD.
  StopStringText open(t, {});
  std::vector<TokenId> zhong = t.encode("中");
  open.push('x');
  open.push(zhong[0]);
  EXPECT_EQ(open.text().substr(0, open.settled()), "x");
  open.finish();
  EXPECT_EQ(open.text(), "x\xEF\xBF\xBD");
  EXPECT_FALSE(open.stopped());
}

TEST(TokenizerTest, EncodingIsThreadSafe) {
  Tokenizer t = make_tokenizer(make_tokenizer_json({{"a", "b"}, {"ab", "c"}, {" ", "x"}}));
  std::string text;
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) text += "abc x\n中"[rng() % 8];
  std::vector<TokenId> expected = t.encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k) threads.emplace_back([&, k] { ok[k] = t.encode(text) == expected; });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, (std::vector<int>{1, 1, 1, 1}));
}

// ---- loading errors ----

std::string load_error(const json& data) {
  auto tokenizer = Tokenizer::from_json(data.dump(), "bad/tokenizer.json");
  return tokenizer.ok() ? "(loaded)" : tokenizer.status().to_string();
}

TEST(TokenizerLoadTest, ErrorsNameTheFileAndTheField) {
  auto malformed = Tokenizer::from_json("{\"model\": {", "bad/tokenizer.json");
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), StatusCode::parse_error);
  EXPECT_NE(malformed.status().message().find("bad/tokenizer.json: malformed JSON"), std::string::npos);

  json base = make_tokenizer_json({{"a", "b"}});
  auto expect_error = [&](json data, const std::string& needle) {
    std::string error = load_error(data);
    EXPECT_NE(error.find("bad/tokenizer.json"), std::string::npos) << error;
    EXPECT_NE(error.find(needle), std::string::npos) << "expected '" << needle << "' in: " << error;
  };
  json d = base;
  d["model"].erase("merges");
  expect_error(d, "model.merges: missing");
  d = base;
  d["model"]["merges"][0] = {"a", "zz"};
  expect_error(d, "model.merges[0]: 'zz' is not in the vocabulary");
  d = base;
  d["model"]["merges"][0] = "a b c";
  expect_error(d, "model.merges[0]");
  d = base;
  d["model"]["type"] = "Unigram";
  expect_error(d, "model.type: 'Unigram' is not supported");
  d = base;
  d["model"]["byte_fallback"] = true;
  expect_error(d, "model.byte_fallback");
  d = base;
  d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+";
  expect_error(d, "pre_tokenizer.pretokenizers[0].pattern.Regex: unknown split regex");
  d = base;
  d["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(d, "pre_tokenizer.type: 'Whitespace' is not supported");
  d = base;
  d["pre_tokenizer"] = split_pre_tokenizer(kQwen2Regex)["pretokenizers"][0];
  expect_error(d, "has no ByteLevel step");
  d = base;
  d["normalizer"] = {{"type", "NFKC"}};
  expect_error(d, "normalizer.type: 'NFKC' is not supported");
  d = base;
  d["decoder"] = nullptr;
  expect_error(d, "decoder: missing");
  d = base;
  d["added_tokens"][0]["id"] = -3;
  expect_error(d, "added_tokens[0].id");
  d = base;
  d.erase("model");
  expect_error(d, "model: missing");
}

TEST(TokenizerLoadTest, FilesAndConfig) {
  auto missing = Tokenizer::load("/nonexistent/kz/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/kz/tokenizer.json"), std::string::npos);

  auto dir = make_unique_dir(fs::temp_directory_path(), "kz_tokenizer_test");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(write_file_atomic(*dir / "tokenizer.json", make_tokenizer_json({}).dump()).is_ok());
  json config = {{"bos_token", nullptr},
                 {"eos_token", {{"__type", "AddedToken"}, {"content", "<|im_end|>"}}},
                 {"pad_token", "<|endoftext|>"},
                 {"chat_template", "{{- '<|im_start|>system\\nYou are a test.<|im_end|>\\n' }}"}};
  ASSERT_TRUE(write_file_atomic(*dir / "tokenizer_config.json", config.dump()).is_ok());
  auto t = Tokenizer::load(*dir);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_FALSE(t->bos_id().has_value());
  EXPECT_EQ(t->eos_id(), t->token_to_id("<|im_end|>"));
  EXPECT_EQ(t->pad_id(), t->token_to_id("<|endoftext|>"));
  EXPECT_TRUE(t->chat_template().present);
  EXPECT_TRUE(t->chat_template().chatml);
  EXPECT_EQ(t->chat_template().default_system, "You are a test.");

  config["eos_token"] = "<|eot_id|>";
  ASSERT_TRUE(write_file_atomic(*dir / "tokenizer_config.json", config.dump()).is_ok());
  auto bad = Tokenizer::load(*dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer_config.json: eos_token: '<|eot_id|>' is not in the vocabulary"),
            std::string::npos)
      << bad.status().to_string();
  fs::remove_all(*dir);
}

// ---- chat template ----

TEST(ChatTemplateTest, RendersChatMl) {
  std::vector<ChatTurn> turns = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  EXPECT_EQ(render_chatml(turns, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  ChatTemplate qwen25;
  qwen25.default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  EXPECT_EQ(render_chatml({{"user", "Hi"}}, false, qwen25),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(render_chatml({{"system", "S"}, {"user", "Hi"}}, false, qwen25),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(render_chatml({}, true, qwen25), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, FindsTheDefaultSystemMessageOfQwenTemplates) {
  // Shapes of the Qwen2, Qwen2.5 and Qwen3 templates (as stored in tokenizer_config.json).
  std::string qwen2 =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  std::string qwen25 =
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
      "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
      "helpful assistant.<|im_end|>\\n' }}{%- endif %}";
  std::string qwen3 =
      "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
      "{%- endif %}";
  EXPECT_EQ(default_system_from_jinja(qwen2), "You are a helpful assistant.");
  EXPECT_EQ(default_system_from_jinja(qwen25), "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(default_system_from_jinja(qwen3), "");
  EXPECT_EQ(default_system_from_jinja(chatml_jinja("It's \"quoted\"\nand\\more")), "It's \"quoted\"\nand\\more");
  EXPECT_EQ(default_system_from_jinja(chatml_jinja("")), "");
}

// ---- training ----

TEST(TrainerTest, TrainsLoadsAndRoundTrips) {
  std::vector<std::string> corpus;
  for (int i = 0; i < 50; ++i)
    corpus.push_back("def forward(self, x):\n    return torch.relu(x) + " + std::to_string(i) +
                     "  # it's fine\n<|im_end|>中文 e\u0301\n");
  BpeTrainOptions options;
  options.vocab_size = 400;
  auto files = train_byte_level_bpe(corpus, options);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  auto t = Tokenizer::from_json(files->tokenizer_json, "trained");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE(t->apply_config(files->tokenizer_config_json, "trained config").is_ok());
  // Merging stops once every word of this small corpus is one token: fewer ids than asked for.
  auto n = static_cast<TokenId>(t->vocab_size());
  EXPECT_LT(n, 400);
  EXPECT_GT(n, 256 + 3 + 20);
  EXPECT_EQ(t->token_to_id("<|endoftext|>"), n - 3);  // specials come last, as in Qwen2
  EXPECT_EQ(t->eos_id(), n - 1);
  EXPECT_EQ(t->pad_id(), n - 3);
  EXPECT_EQ(t->encode("    return torch.relu(x)").size(), 6u);  // one token per piece
  // The same corpus gives the same files.
  EXPECT_EQ(train_byte_level_bpe(corpus, options)->tokenizer_json, files->tokenizer_json);
  options.vocab_size = 270;  // the cap holds when the corpus has more to give
  auto capped = train_byte_level_bpe(corpus, options);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(Tokenizer::from_json(capped->tokenizer_json)->vocab_size(), 270u);
  for (const std::string& text : {std::string("unseen text: 日本語 ẞ 🙂\r\n\t"), corpus[3]})
    EXPECT_EQ(t->decode(t->encode(text)), unicode::nfc(text));
  // No merge may cross a special token: "<|im_end|>" never joins its neighbours.
  for (const auto& m : json::parse(files->tokenizer_json)["model"]["merges"])
    EXPECT_EQ((m[0].get<std::string>() + m[1].get<std::string>()).find("im_end"), std::string::npos);
}

TEST(TrainerTest, OptionsAreValidated) {
  BpeTrainOptions options;
  options.vocab_size = 100;
  EXPECT_NE(options.validate().message().find("vocab_size"), std::string::npos);
  options = {};
  options.split_pattern = "bert";
  EXPECT_NE(options.validate().message().find("split_pattern 'bert'"), std::string::npos);
  options = {};
  options.eos_token = "<|eot_id|>";
  EXPECT_NE(options.validate().message().find("eos_token"), std::string::npos);
  options = {};
  options.special_tokens.push_back("<|im_end|>");
  EXPECT_NE(options.validate().message().find("twice"), std::string::npos);
  EXPECT_FALSE(train_byte_level_bpe({"x"}, options).ok());
}

}  // namespace
}  // namespace kz
