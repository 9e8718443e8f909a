// Loading a Hugging Face tokenizer.json (and tokenizer_config.json) into Tokenizer::Impl.
//
// Every unsupported or inconsistent setting is an invalid_argument naming the file and the JSON
// field ("tokenizer.json: model.merges[12]: ..."), so a user knows what to change or report.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "tokenizer_internal.h"
#include "unicode.h"

namespace kz {
namespace {

using json = nlohmann::json;
using tok::PreTokenizerStage;

// Builds errors that name the file.
struct Origin {
  std::string name;
  Status error(std::string_view field, std::string_view message) const {
    return invalid_argument(fmt::format("{}: {}: {}", name, field, message));
  }
};

std::string type_of(const json& node) { return node.is_object() ? node.value("type", std::string()) : std::string(); }

// The raw bytes a vocabulary string stands for under the byte-level alphabet, or nullopt when a
// character is outside it (then the string's own UTF-8 is used, as tokenizers' decoder does).
std::optional<std::string> byte_level_bytes(std::string_view token) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    unicode::Utf8Step step = unicode::next_utf8(token, i);
    int byte = step.status == unicode::Utf8Status::ok ? unicode::char_to_byte(step.code_point) : -1;
    if (byte < 0) return std::nullopt;
    bytes += static_cast<char>(byte);
    i += step.length;
  }
  return bytes;
}

// Makes room for `id` in the per-id tables and records its string.
void set_token(Tokenizer::Impl& impl, TokenId id, const std::string& token) {
  if (static_cast<size_t>(id) >= impl.id_known.size()) {
    size_t size = static_cast<size_t>(id) + 1;
    impl.id_to_token.resize(size);
    impl.id_to_bytes.resize(size);
    impl.id_known.resize(size, 0);
    impl.id_special.resize(size, 0);
  }
  impl.id_known[id] = 1;
  impl.id_to_token[id] = token;
  std::optional<std::string> bytes = byte_level_bytes(token);
  impl.id_to_bytes[id] = bytes ? *bytes : token;
}

Status check_bpe_options(const json& model, const Origin& origin) {
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = model.contains(field) ? &model[field] : nullptr;
    if (v && !v->is_null() && !(v->is_string() && v->get<std::string>().empty()))
      return origin.error(fmt::format("model.{}", field), "is not supported by byte-level BPE (must be null)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    return origin.error("model.dropout", "BPE dropout is not supported (must be null)");
  if (model.value("byte_fallback", false))
    return origin.error("model.byte_fallback", "byte_fallback is not supported (SentencePiece-style BPE); only byte-level BPE");
  return Status::ok();
}

Status load_vocab(const json& model, const Origin& origin, Tokenizer::Impl& impl) {
  if (!model.contains("vocab")) return origin.error("model.vocab", "missing");
  const json& vocab = model["vocab"];
  if (!vocab.is_object()) return origin.error("model.vocab", "must be an object of token -> id");
  impl.token_to_id.reserve(vocab.size() + 1024);
  impl.bpe.byte_tokens.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      return origin.error(fmt::format("model.vocab[\"{}\"]", token), "the id must be a non-negative integer");
    auto token_id = static_cast<TokenId>(id.get<int64_t>());
    set_token(impl, token_id, token);
    impl.token_to_id[token] = token_id;
    std::optional<std::string> bytes = byte_level_bytes(token);
    if (!bytes) continue;
    if (bytes->size() == 1) impl.bpe.byte_ids[static_cast<uint8_t>((*bytes)[0])] = token_id;
    impl.bpe.byte_tokens[*bytes] = token_id;
  }
  return Status::ok();
}

// One merge entry: "a b" (tokenizers before 0.20) or ["a", "b"].
Result<std::pair<std::string, std::string>> merge_parts(const json& entry, const Origin& origin, const std::string& field) {
  if (entry.is_string()) {
    const std::string& s = entry.get_ref<const std::string&>();
    size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
      return origin.error(field, fmt::format("'{}' is not two tokens separated by one space", s));
    return std::pair{s.substr(0, space), s.substr(space + 1)};
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string())
    return std::pair{entry[0].get<std::string>(), entry[1].get<std::string>()};
  return origin.error(field, "must be a string \"a b\" or a pair [\"a\", \"b\"]");
}

Status load_merges(const json& model, const Origin& origin, Tokenizer::Impl& impl) {
  if (!model.contains("merges")) return origin.error("model.merges", "missing (a BPE model needs its merge list)");
  const json& merges = model["merges"];
  if (!merges.is_array()) return origin.error("model.merges", "must be an array");
  impl.bpe.merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    std::string field = fmt::format("model.merges[{}]", rank);
    auto parts = merge_parts(merges[rank], origin, field);
    if (!parts.ok()) return parts.status();
    const auto& [left, right] = *parts;
    auto find = [&](const std::string& token) -> std::optional<TokenId> {
      auto it = impl.token_to_id.find(token);
      return it == impl.token_to_id.end() ? std::nullopt : std::optional(it->second);
    };
    auto left_id = find(left), right_id = find(right), merged_id = find(left + right);
    if (!left_id) return origin.error(field, fmt::format("'{}' is not in the vocabulary", left));
    if (!right_id) return origin.error(field, fmt::format("'{}' is not in the vocabulary", right));
    if (!merged_id) return origin.error(field, fmt::format("the merged token '{}{}' is not in the vocabulary", left, right));
    // A later duplicate replaces the earlier rank, as in tokenizers.
    impl.bpe.merges.insert(*left_id, *right_id, {static_cast<uint32_t>(rank), *merged_id});
  }
  return Status::ok();
}

Status load_model(const json& root, const Origin& origin, Tokenizer::Impl& impl) {
  if (!root.contains("model") || !root["model"].is_object()) return origin.error("model", "missing");
  const json& model = root["model"];
  std::string type = model.value("type", "BPE");
  if (type != "BPE") return origin.error("model.type", fmt::format("'{}' is not supported (only BPE)", type));
  KZ_RETURN_IF_ERROR(check_bpe_options(model, origin));
  KZ_RETURN_IF_ERROR(load_vocab(model, origin, impl));
  KZ_RETURN_IF_ERROR(load_merges(model, origin, impl));
  impl.bpe.ignore_merges = model.value("ignore_merges", false);
  impl.bpe.fuse_unk = model.value("fuse_unk", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = impl.token_to_id.find(model["unk_token"].get<std::string>());
    if (it == impl.token_to_id.end()) return origin.error("model.unk_token", "is not in the vocabulary");
    impl.bpe.unk = it->second;
  }
  if (!impl.bpe.ignore_merges) impl.bpe.byte_tokens.clear();  // only needed for ignore_merges
  return Status::ok();
}

Result<AddedToken> parse_added_token(const json& entry, const Origin& origin, const std::string& field) {
  if (!entry.is_object() || !entry.contains("id") || !entry.contains("content"))
    return origin.error(field, "must be an object with 'id' and 'content'");
  const json& id = entry["id"];
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
    return origin.error(field + ".id", "must be a non-negative integer");
  if (!entry["content"].is_string() || entry["content"].get<std::string>().empty())
    return origin.error(field + ".content", "must be a non-empty string");
  AddedToken token;
  token.id = static_cast<TokenId>(id.get<int64_t>());
  token.content = entry["content"].get<std::string>();
  token.special = entry.value("special", false);
  token.single_word = entry.value("single_word", false);
  token.lstrip = entry.value("lstrip", false);
  token.rstrip = entry.value("rstrip", false);
  token.normalized = entry.value("normalized", !token.special);
  return token;
}

Status load_added_tokens(const json& root, const Origin& origin, Tokenizer::Impl& impl) {
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return Status::ok();
  const json& added = root["added_tokens"];
  if (!added.is_array()) return origin.error("added_tokens", "must be an array");
  for (size_t i = 0; i < added.size(); ++i) {
    auto token = parse_added_token(added[i], origin, fmt::format("added_tokens[{}]", i));
    if (!token.ok()) return token.status();
    set_token(impl, token->id, token->content);
    impl.token_to_id[token->content] = token->id;
    if (token->special) impl.id_special[token->id] = 1;
    AddedToken pattern = *token;  // normalized tokens are looked for in normalised text
    if (pattern.normalized && impl.nfc) pattern.content = unicode::nfc(pattern.content);
    (token->normalized ? impl.normalized_matcher : impl.raw_matcher).add(pattern);
    impl.added.push_back(*token);
  }
  impl.raw_matcher.finish();
  impl.normalized_matcher.finish();
  return Status::ok();
}

Status load_normalizer(const json& node, const std::string& field, const Origin& origin, Tokenizer::Impl& impl) {
  if (node.is_null()) return Status::ok();
  std::string type = type_of(node);
  if (type == "NFC") {
    impl.nfc = true;
    return Status::ok();
  }
  if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    for (size_t i = 0; i < node["normalizers"].size(); ++i)
      KZ_RETURN_IF_ERROR(load_normalizer(node["normalizers"][i], fmt::format("{}.normalizers[{}]", field, i), origin, impl));
    return Status::ok();
  }
  return origin.error(field + ".type", fmt::format("'{}' is not supported (supported: none, NFC)", type));
}

Status load_split(const json& node, const std::string& field, const Origin& origin, std::vector<PreTokenizerStage>& stages) {
  const json* pattern = node.contains("pattern") ? &node["pattern"] : nullptr;
  if (!pattern || !pattern->is_object() || !pattern->contains("Regex") || !(*pattern)["Regex"].is_string())
    return origin.error(field + ".pattern", "only {\"Regex\": ...} split patterns are supported");
  std::string regex = (*pattern)["Regex"].get<std::string>();
  std::optional<tok::SplitPattern> known = tok::find_split_pattern(regex);
  if (!known)
    return origin.error(field + ".pattern.Regex",
                        fmt::format("unknown split regex '{}' (known: {})", regex, tok::known_split_patterns()));
  std::string behavior = node.value("behavior", std::string("Isolated"));
  if (behavior != "Isolated") return origin.error(field + ".behavior", fmt::format("'{}' is not supported (only Isolated)", behavior));
  if (node.value("invert", false)) return origin.error(field + ".invert", "inverted splits are not supported");
  stages.push_back({known, false});
  return Status::ok();
}

// Adds the stages of one pre-tokenizer node; `byte_level` is set when a ByteLevel step is seen.
Status load_pre_tokenizer(const json& node, const std::string& field, const Origin& origin,
                          std::vector<PreTokenizerStage>& stages, bool& byte_level) {
  std::string type = type_of(node);
  if (type == "ByteLevel") {
    byte_level = true;
    std::optional<tok::SplitPattern> split;
    if (node.value("use_regex", true)) split = tok::SplitPattern::gpt2;
    stages.push_back({split, node.value("add_prefix_space", true)});
    return Status::ok();
  }
  if (type == "Split") return load_split(node, field, origin, stages);
  if (type == "Sequence" && node.contains("pretokenizers") && node["pretokenizers"].is_array()) {
    for (size_t i = 0; i < node["pretokenizers"].size(); ++i)
      KZ_RETURN_IF_ERROR(load_pre_tokenizer(node["pretokenizers"][i], fmt::format("{}.pretokenizers[{}]", field, i),
                                            origin, stages, byte_level));
    return Status::ok();
  }
  return origin.error(field + ".type", fmt::format("'{}' is not supported (supported: ByteLevel, Split, Sequence)", type));
}

Status load_pre_tokenizers(const json& root, const Origin& origin, Tokenizer::Impl& impl) {
  if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
    return origin.error("pre_tokenizer", "missing (a byte-level BPE needs a ByteLevel pre-tokenizer)");
  bool byte_level = false;
  KZ_RETURN_IF_ERROR(load_pre_tokenizer(root["pre_tokenizer"], "pre_tokenizer", origin, impl.pre_tokenizer.stages, byte_level));
  if (!byte_level) return origin.error("pre_tokenizer", "has no ByteLevel step (only byte-level BPE is supported)");
  return Status::ok();
}

Status load_decoder(const json& root, const Origin& origin) {
  const json* node = root.contains("decoder") ? &root["decoder"] : nullptr;
  if (!node || node->is_null()) return origin.error("decoder", "missing (expected ByteLevel)");
  std::string type = type_of(*node);
  if (type == "ByteLevel") return Status::ok();
  if (type == "Sequence" && node->contains("decoders") && (*node)["decoders"].is_array()) {
    for (size_t i = 0; i < (*node)["decoders"].size(); ++i)
      if (type_of((*node)["decoders"][i]) != "ByteLevel")
        return origin.error(fmt::format("decoder.decoders[{}].type", i),
                            fmt::format("'{}' is not supported (expected ByteLevel)", type_of((*node)["decoders"][i])));
    return Status::ok();
  }
  return origin.error("decoder.type", fmt::format("'{}' is not supported (expected ByteLevel)", type));
}

Result<json> parse_json(std::string_view text, const std::string& origin) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return parse_error(fmt::format("{}: malformed JSON: {}", origin, e.what()));
  }
}

// A token named in tokenizer_config.json: a string, an AddedToken object {"content": ...}, or null.
Result<std::optional<TokenId>> config_token(const json& config, const char* field, const Origin& origin,
                                            const Tokenizer& tokenizer) {
  if (!config.contains(field) || config[field].is_null()) return std::optional<TokenId>();
  const json& node = config[field];
  std::string content;
  if (node.is_string()) content = node.get<std::string>();
  else if (node.is_object() && node.contains("content") && node["content"].is_string()) content = node["content"].get<std::string>();
  else return origin.error(field, "must be a string, an object with 'content', or null");
  std::optional<TokenId> id = tokenizer.token_to_id(content);
  if (!id) return origin.error(field, fmt::format("'{}' is not in the vocabulary", content));
  return id;
}

// chat_template is a string, or a list of {"name", "template"} of which "default" is used.
Result<ChatTemplate> config_chat_template(const json& config, const Origin& origin) {
  ChatTemplate chat;
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return chat;
  const json& node = config["chat_template"];
  if (node.is_string()) {
    chat.source = node.get<std::string>();
  } else if (node.is_array()) {
    for (const json& entry : node)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") && entry["template"].is_string())
        chat.source = entry["template"].get<std::string>();
    if (chat.source.empty()) return origin.error("chat_template", "a list of templates without one named 'default'");
  } else {
    return origin.error("chat_template", "must be a string or a list of {name, template}");
  }
  chat.present = true;
  chat.chatml = chat.source.find("<|im_start|>") != std::string::npos;
  chat.default_system = default_system_from_jinja(chat.source);
  return chat;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view origin_name) {
  Origin origin{std::string(origin_name)};
  auto root = parse_json(tokenizer_json, origin.name);
  if (!root.ok()) return root.status();
  if (!root->is_object()) return parse_error(origin.name + ": the top level must be a JSON object");
  auto impl = std::make_shared<Impl>();
  impl->origin = origin.name;
  try {
    KZ_RETURN_IF_ERROR(load_model(*root, origin, *impl));
    if (root->contains("normalizer")) KZ_RETURN_IF_ERROR(load_normalizer((*root)["normalizer"], "normalizer", origin, *impl));
    KZ_RETURN_IF_ERROR(load_added_tokens(*root, origin, *impl));  // after the normaliser: it applies to some
    KZ_RETURN_IF_ERROR(load_pre_tokenizers(*root, origin, *impl));
    KZ_RETURN_IF_ERROR(load_decoder(*root, origin));
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    return parse_error(fmt::format("{}: {}", origin.name, e.what()));
  }
  return Tokenizer(std::move(impl));
}

Status Tokenizer::apply_config(std::string_view tokenizer_config_json, std::string_view origin_name) {
  Origin origin{std::string(origin_name)};
  auto root = parse_json(tokenizer_config_json, origin.name);
  if (!root.ok()) return root.status();
  if (!root->is_object()) return parse_error(origin.name + ": the top level must be a JSON object");
  SpecialTokens special;
  for (auto [field, slot] : {std::pair{"bos_token", &special.bos}, {"eos_token", &special.eos}, {"pad_token", &special.pad}}) {
    auto id = config_token(*root, field, origin, *this);
    if (!id.ok()) return id.status();
    *slot = *id;
  }
  auto chat = config_chat_template(*root, origin);
  if (!chat.ok()) return chat.status();
  special_ = special;
  chat_template_ = std::move(*chat);
  return Status::ok();
}

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  std::filesystem::path file = std::filesystem::is_directory(path) ? path / "tokenizer.json" : path;
  auto text = read_file(file);
  if (!text.ok()) return text.status();
  auto tokenizer = from_json(*text, file.string());
  if (!tokenizer.ok()) return tokenizer.status();
  std::filesystem::path config = file.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    auto config_text = read_file(config);
    if (!config_text.ok()) return config_text.status();
    KZ_RETURN_IF_ERROR(tokenizer->apply_config(*config_text, config.string()));
  }
  return tokenizer;
}

Status copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  static const char* const kFiles[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                       "vocab.json",     "merges.txt",            "special_tokens_map.json",
                                       "added_tokens.json"};
  // A model dir without its tokenizer could not be loaded again: that is an error, never a skip.
  if (std::error_code ec; !fs::exists(from / "tokenizer.json", ec))
    return not_found(fmt::format("copying the tokenizer: {} has no tokenizer.json", from.string()));
  for (const char* name : kFiles) {
    std::error_code ec;
    if (!fs::exists(from / name, ec)) continue;
    fs::copy_file(from / name, to / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return io_error(fmt::format("copying {} to {}: {}", (from / name).string(), to.string(), ec.message()));
  }
  return Status::ok();
}

}  // namespace kz
