// LoRA adapters (see lora.h): attaching, PEFT's on-disk format, merging.
//
// Adapters live inside Linear (transformer.h) as two bias-free Linears registered under
// "lora_A"/"lora_B", so named_parameters() already yields PEFT's names minus its
// "base_model.model." prefix; this file only walks the modules and converts formats.
#include "kz/model/lora.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "kz/model/safetensors.h"
#include "torch_status.h"

namespace kz::model {
namespace {

using nlohmann::json;

constexpr const char* kPrefix = "base_model.model.";  // PEFT's wrapper around the causal LM
constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

std::string leaf_name(const std::string& name) {
  auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// Every projection Linear of the model (never an adapter's own A/B) by full name.
std::vector<std::pair<std::string, std::shared_ptr<Linear>>> projections(const CausalLM& model) {
  std::vector<std::pair<std::string, std::shared_ptr<Linear>>> out;
  const auto& targets = lora_target_names();
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (std::find(targets.begin(), targets.end(), leaf_name(item.key())) == targets.end()) continue;
    if (auto lin = std::dynamic_pointer_cast<Linear>(item.value())) out.emplace_back(item.key(), lin);
  }
  return out;
}

void set_all_trainable(CausalLM& model, bool trainable) {
  for (auto& p : model.parameters()) p.set_requires_grad(trainable);
}

void detach_adapter(Linear& lin) {
  if (!lin.lora_A) return;
  lin.unregister_module("lora_A");
  lin.unregister_module("lora_B");
  lin.lora_A.reset();
  lin.lora_B.reset();
}

bool targeted(const LoraOptions& o, const std::string& leaf) {
  return std::find(o.target_modules.begin(), o.target_modules.end(), leaf) != o.target_modules.end();
}

// PEFT's init: A ~ kaiming_uniform(a = sqrt(5)) over fan_in = in, i.e. U(-1/sqrt(in), 1/sqrt(in)); B = 0.
void attach_fresh(Linear& lin, const LoraOptions& o, at::Generator& gen) {
  const int64_t out = lin.weight.size(0), in = lin.weight.size(1);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  at::Tensor a = at::empty({o.r, in}, at::kFloat).uniform_(-bound, bound, gen);
  auto opts = at::TensorOptions().dtype(at::kFloat).device(lin.weight.device());
  lin.lora_A = lin.register_module("lora_A", std::make_shared<Linear>(a.to(lin.weight.device()), std::nullopt));
  lin.lora_B = lin.register_module("lora_B", std::make_shared<Linear>(at::zeros({out, o.r}, opts), std::nullopt));
  lin.lora_scaling = o.scaling();
  lin.lora_dropout = o.dropout;
}

json config_json(const CausalLM& model, const std::string& base) {
  std::set<std::string> targets;
  const Linear* any = nullptr;
  for (const auto& [name, lin] : projections(model))
    if (lin->lora_A) {
      targets.insert(leaf_name(name));
      any = lin.get();
    }
  const int64_t r = any->lora_A->weight.size(0);
  const double alpha = any->lora_scaling * static_cast<double>(r);  // scaling = alpha / r (no rslora on save)
  json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base.empty() ? json(nullptr) : json(base);
  j["r"] = r;
  if (alpha == std::round(alpha)) j["lora_alpha"] = static_cast<int64_t>(std::llround(alpha));
  else j["lora_alpha"] = alpha;
  j["lora_dropout"] = any->lora_dropout;
  j["target_modules"] = std::vector<std::string>(targets.begin(), targets.end());
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = json::object();
  j["alpha_pattern"] = json::object();
  j["revision"] = nullptr;
  return j;
}

// Fields whose non-default values change what an adapter computes and that we do not implement.
Status check_supported(const json& j) {
  auto set = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  auto truthy = [&](const char* key) { return set(key) && j[key] != false && j[key] != json::object() && j[key] != json::array(); };
  for (const char* key : {"use_dora", "fan_in_fan_out", "lora_bias", "rank_pattern", "alpha_pattern",
                          "layers_to_transform", "modules_to_save", "layer_replication", "target_parameters",
                          "trainable_token_indices", "use_qalora", "use_bdlora", "exclude_modules",
                          "alora_invocation_tokens", "arrow_config"})
    if (truthy(key)) return invalid_argument(fmt::format("{} is set ({}), which is not supported", key, j[key].dump()));
  if (set("bias") && j["bias"] != "none") return invalid_argument(fmt::format("bias {} is not supported (only \"none\")", j["bias"].dump()));
  return Status::ok();
}

Result<std::vector<std::string>> parse_targets(const json& t) {
  if (t.is_string()) {
    std::string s = t.get<std::string>();
    if (s == "all-linear") return lora_target_names();  // PEFT: every linear but the output head
    if (targeted(LoraOptions{}, s)) return std::vector<std::string>{s};
    return invalid_argument(fmt::format("target_modules \"{}\" (a regular expression) is not supported: give a list", s));
  }
  if (!t.is_array()) return invalid_argument("target_modules must be a list of module names");
  return t.get<std::vector<std::string>>();
}

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Copies adapter tensors from the file into the attached adapters; one error lists every problem.
Status copy_weights(const CausalLM& model, const SafetensorsFile& file) {
  std::vector<std::string> missing, misshaped, unexpected, bad_dtype;
  std::set<std::string> expected;
  std::vector<std::pair<at::Tensor, const StTensorInfo*>> copies;
  for (const auto& [name, param] : lora_parameters(model)) {
    expected.insert(kPrefix + name);
    const StTensorInfo* info = file.find(kPrefix + name);
    if (!info) {
      missing.push_back(kPrefix + name);
    } else if (info->shape != param.sizes().vec()) {
      misshaped.push_back(fmt::format("{} (file {}, expected {})", info->name, shape_text(info->shape), shape_text(param.sizes().vec())));
    } else if (info->dtype != StDType::f32 && info->dtype != StDType::bf16 && info->dtype != StDType::f16) {
      bad_dtype.push_back(fmt::format("{} ({})", info->name, st_dtype_name(info->dtype)));
    } else {
      copies.emplace_back(param, info);
    }
  }
  for (const auto& t : file.tensors())
    if (!expected.count(t.name)) unexpected.push_back(t.name);
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back(fmt::format("{} missing: {}", missing.size(), fmt::join(missing, ", ")));
  if (!unexpected.empty()) parts.push_back(fmt::format("{} unexpected: {}", unexpected.size(), fmt::join(unexpected, ", ")));
  if (!misshaped.empty()) parts.push_back(fmt::format("{} mis-shaped: {}", misshaped.size(), fmt::join(misshaped, ", ")));
  if (!bad_dtype.empty()) parts.push_back(fmt::format("{} not a float type: {}", bad_dtype.size(), fmt::join(bad_dtype, ", ")));
  if (!parts.empty())
    return invalid_argument(fmt::format("{} does not match the model and adapter_config.json: {}", file.path().string(),
                                        fmt::join(parts, "; ")));
  c10::NoGradGuard no_grad;
  for (auto& [param, info] : copies) {
    at::ScalarType stored = info->dtype == StDType::f32 ? at::kFloat : info->dtype == StDType::bf16 ? at::kBFloat16 : at::kHalf;
    param.copy_(at::from_blob(const_cast<void*>(file.data(*info)), info->shape, at::dtype(stored)));
  }
  return Status::ok();
}

}  // namespace

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names;
}

Status LoraOptions::validate() const {
  if (r <= 0) return invalid_argument(fmt::format("LoRA rank r = {} must be > 0", r));
  if (!(alpha > 0)) return invalid_argument(fmt::format("LoRA alpha {} must be > 0", alpha));
  if (!(dropout >= 0 && dropout < 1)) return invalid_argument(fmt::format("LoRA dropout {} must be in [0, 1)", dropout));
  if (target_modules.empty()) return invalid_argument("LoRA target_modules is empty");
  for (const auto& t : target_modules)
    if (!targeted(LoraOptions{}, t))
      return invalid_argument(fmt::format("LoRA target module '{}' is not one of {}", t, fmt::join(lora_target_names(), ", ")));
  return Status::ok();
}

double LoraOptions::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

Status add_lora(CausalLM& model, const LoraOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate());
  if (has_lora(model)) return invalid_argument("add_lora: the model already has LoRA adapters (merge_lora or remove_lora first)");
  return guarded("add_lora", [&]() -> Status {
    c10::NoGradGuard no_grad;
    set_all_trainable(model, false);
    at::Generator gen = at::detail::createCPUGenerator(options.seed);
    for (auto& [name, lin] : projections(model))
      if (targeted(options, leaf_name(name))) attach_fresh(*lin, options, gen);
    model.eval();  // no dropout outside the Trainer's passes (generation stays deterministic)
    return Status::ok();
  });
}

bool has_lora(const CausalLM& model) {
  for (const auto& [name, lin] : projections(model))
    if (lin->lora_A) return true;
  return false;
}

std::vector<std::pair<std::string, at::Tensor>> lora_parameters(const CausalLM& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, lin] : projections(model)) {
    if (!lin->lora_A) continue;
    out.emplace_back(name + ".lora_A.weight", lin->lora_A->weight);
    out.emplace_back(name + ".lora_B.weight", lin->lora_B->weight);
  }
  return out;
}

Status save_lora(const CausalLM& model, const fs::path& dir, const std::string& base_model_name_or_path) {
  if (!has_lora(model)) return invalid_argument("save_lora: the model has no LoRA adapters");
  return guarded("saving adapter " + dir.string(), [&]() -> Status {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return io_error(fmt::format("creating {}: {}", dir.string(), ec.message()));
    std::vector<at::Tensor> host;  // keeps CPU copies alive while writing
    std::vector<StTensorView> views;
    for (const auto& [name, t] : lora_parameters(model)) {
      host.push_back(t.detach().to(at::kCPU, at::kFloat).contiguous());
      views.push_back({kPrefix + name, StDType::f32, host.back().sizes().vec(), host.back().data_ptr(), host.back().nbytes()});
    }
    KZ_RETURN_IF_ERROR(write_safetensors(dir / kWeightsFile, views));
    return write_file_atomic(dir / kConfigFile, config_json(model, base_model_name_or_path).dump(2) + "\n");
  });
}

Result<LoraOptions> read_lora_config(const fs::path& dir) {
  const fs::path path = dir / kConfigFile;
  if (!fs::exists(path)) return not_found(fmt::format("{} not found: not a PEFT adapter directory", path.string()));
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  try {
    json j = json::parse(*text);
    if (j.value("peft_type", std::string()) != "LORA")
      return invalid_argument(fmt::format("{}: peft_type {} is not \"LORA\"", path.string(), j.contains("peft_type") ? j["peft_type"].dump() : "missing"));
    KZ_RETURN_IF_ERROR(check_supported(j).with_context(path.string()));
    for (const char* key : {"r", "lora_alpha", "target_modules"})
      if (!j.contains(key)) return invalid_argument(fmt::format("{}: field {} is missing", path.string(), key));
    LoraOptions o;
    o.r = j["r"].get<int64_t>();
    o.alpha = j["lora_alpha"].get<double>();
    o.dropout = j.value("lora_dropout", 0.0);
    o.use_rslora = j.value("use_rslora", false);
    auto targets = parse_targets(j["target_modules"]);
    if (!targets.ok()) return targets.status().with_context(path.string());
    o.target_modules = *targets;
    KZ_RETURN_IF_ERROR(o.validate().with_context(path.string()));
    return o;
  } catch (const json::exception& e) {
    return parse_error(fmt::format("{}: {}", path.string(), e.what()));
  }
}

Status load_lora(CausalLM& model, const fs::path& dir) {
  auto options = read_lora_config(dir);
  if (!options.ok()) return options.status();
  auto file = SafetensorsFile::open(dir / kWeightsFile);
  if (!file.ok()) return file.status().with_context("loading adapter " + dir.string());
  KZ_RETURN_IF_ERROR(add_lora(model, *options).with_context("loading adapter " + dir.string()));
  Status copied = guarded("loading adapter " + dir.string(), [&]() -> Status { return copy_weights(model, *file); });
  if (!copied.is_ok()) remove_lora(model);
  return copied;
}

Status merge_lora(CausalLM& model) {
  if (!has_lora(model)) return invalid_argument("merge_lora: the model has no LoRA adapters");
  return guarded("merge_lora", [&]() -> Status {
    c10::NoGradGuard no_grad;
    for (auto& [name, lin] : projections(model)) {
      if (!lin->lora_A) continue;
      at::Tensor delta = at::matmul(lin->lora_B->weight.to(at::kFloat), lin->lora_A->weight.to(at::kFloat)) * lin->lora_scaling;
      lin->weight.copy_(lin->weight.to(at::kFloat) + delta.to(lin->weight.device()));
      detach_adapter(*lin);
    }
    set_all_trainable(model, true);
    return Status::ok();
  });
}

void remove_lora(CausalLM& model) {
  for (auto& [name, lin] : projections(model)) detach_adapter(*lin);
  set_all_trainable(model, true);
}

}  // namespace kz::model
