// A role's model (policy.h): the engine or endpoint that generates, and for a trainable role the
// trainer and CA-GRPO update that change the engine's own weights in place, with checkpoints.
//
// Checkpoint layout (save/restore):
//   DIR/policy.json   {"role", "describe", "steps", "lora", "trainable"}: written last, so its
//                     presence marks a complete checkpoint
//   DIR/model/        full fine-tuning: a Hugging Face checkpoint with the tokenizer files,
//                     loadable by Engine::load on its own
//   DIR/adapter/      LoRA: the PEFT adapter dir (save_lora)
//   DIR/trainer/      Trainer::save_state (optimiser moments, step count)
#include "kz/loop/policy.h"

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "kz/dist/data_parallel.h"
#include "kz/llm/engine_generator.h"
#include "kz/llm/http_generator.h"
#include "kz/model/engine.h"
#include "kz/model/generate.h"
#include "kz/model/safetensors.h"
#include "kz/model/transformer.h"

namespace kz::loop {
namespace {

using json = nlohmann::json;

constexpr const char* kPolicyJson = "policy.json";
constexpr const char* kModelDir = "model";
constexpr const char* kAdapterDir = "adapter";
constexpr const char* kTrainerDir = "trainer";
constexpr const char* kAdapterWeights = "adapter_model.safetensors";
constexpr const char* kPeftPrefix = "base_model.model.";  // PEFT's names wrap ours (lora.h)

std::string role_label(const PolicyOptions& options) {
  return options.name.empty() ? std::string("policy") : "policy " + options.name;
}

Status check_engine_options(const PolicyOptions& o) {
  if (o.max_batch < 1) return invalid_argument(fmt::format("max_batch must be >= 1, got {}", o.max_batch));
  if (!o.trainable) return Status::ok();
  KZ_RETURN_IF_ERROR(o.train.validate());
  KZ_RETURN_IF_ERROR(o.update.validate());
  if (o.lora) KZ_RETURN_IF_ERROR(o.lora_options.validate());
  return Status::ok();
}

// ---- opening ----------------------------------------------------------------------------------

// The starting weights again, frozen: the KL penalty's reference.
Result<std::shared_ptr<model::CausalLM>> load_reference(const fs::path& model_dir, const model::CausalLM& live) {
  model::LoadOptions load;
  load.dtype = live.dtype();
  load.device = live.device();
  auto reference = model::CausalLM::load(model_dir, load);
  if (!reference.ok()) return reference.status().with_context("loading the KL reference");
  for (auto& p : (*reference)->parameters()) p.set_requires_grad(false);
  (*reference)->eval();
  return reference;
}

}  // namespace

struct Policy::Impl {
  std::shared_ptr<model::Engine> engine;        // null for an endpoint
  std::unique_ptr<Generator> generator;
  std::shared_ptr<model::CausalLM> model;       // the engine's, trained in place
  std::unique_ptr<model::Trainer> trainer;      // trainable only
  std::unique_ptr<rl::PolicyUpdate> update;     // over *trainer
  std::shared_ptr<model::CausalLM> reference;   // kl_coef > 0 only
};

namespace {

Status attach_trainer(const PolicyOptions& options, Policy::Impl& impl) {
  if (options.lora) KZ_RETURN_IF_ERROR(model::add_lora(*impl.model, options.lora_options).with_context("adding LoRA"));
  auto trainer = model::Trainer::create(impl.model, options.train);
  if (!trainer.ok()) return trainer.status().with_context("creating the trainer");
  impl.trainer = std::move(*trainer);
  rl::PolicyUpdateOptions update = options.update;
  update.pad_token_id = impl.engine->pad_token_id();
  impl.update = std::make_unique<rl::PolicyUpdate>(*impl.trainer, update);
  if (options.update.loss.kl_coef > 0) {
    auto reference = load_reference(options.model_dir, *impl.model);
    if (!reference.ok()) return reference.status();
    impl.reference = std::move(*reference);
  }
  return Status::ok();
}

Result<std::unique_ptr<Policy::Impl>> open_engine(const PolicyOptions& options) {
  auto impl = std::make_unique<Policy::Impl>();
  auto engine = model::Engine::load({options.model_dir, options.device, options.dtype});
  if (!engine.ok()) return engine.status().with_context("loading " + options.model_dir.string());
  impl->engine = std::move(*engine);
  impl->model = impl->engine->model();
  auto generator = make_engine_generator(impl->engine, {options.max_batch});
  if (!generator.ok()) return generator.status();
  impl->generator = std::move(*generator);
  if (options.trainable) KZ_RETURN_IF_ERROR(attach_trainer(options, *impl));
  return impl;
}

Result<std::unique_ptr<Policy::Impl>> open_endpoint(const PolicyOptions& options) {
  HttpGeneratorOptions http;
  http.base_url = options.endpoint;
  http.model = options.endpoint_model;
  auto generator = make_http_generator(http);
  if (!generator.ok()) return generator.status().with_context("endpoint " + options.endpoint);
  auto impl = std::make_unique<Policy::Impl>();
  impl->generator = std::move(*generator);
  return impl;
}

// ---- teacher-forced scores: the KL reference's, and old log-probs at a temperature ------------

// Scores one micro-batch of rollouts under `model` at the update's temperature: `field` of each
// (ref_logprobs or old_logprobs) gets its completion tokens' log-probs.
Status score_rollouts(model::CausalLM& model, const std::vector<rl::Rollout*>& rows,
                      const rl::PolicyUpdateOptions& update, std::vector<float> rl::Rollout::*field) {
  model::MicroBatch mb =
      rl::make_micro_batch(std::vector<const rl::Rollout*>(rows.begin(), rows.end()), update.pad_token_id);
  auto lp = model::token_logprobs(model, mb.input_ids.to(model.device()), mb.attention_mask.to(model.device()),
                                  /*keep_graph=*/false, update.loss.temperature);
  if (!lp.ok()) return lp.status();
  at::Tensor host = lp->to(at::kCPU, at::kFloat).contiguous();
  const int64_t width = host.size(1);
  const float* data = host.data_ptr<float>();
  for (size_t b = 0; b < rows.size(); ++b) {
    // Completion token i is the target at index prompt_size - 1 + i (make_micro_batch's layout).
    const float* first = data + static_cast<int64_t>(b) * width + static_cast<int64_t>(rows[b]->prompt_ids.size()) - 1;
    (rows[b]->*field).assign(first, first + rows[b]->completion_ids.size());
  }
  return Status::ok();
}

// Fills `field` of every well-formed rollout, a micro-batch at a time; malformed ones are left for
// PolicyUpdate to report by index.
Status fill_logprobs(model::CausalLM& model, std::vector<rl::Rollout>& rollouts, const rl::PolicyUpdateOptions& update,
                     std::vector<float> rl::Rollout::*field) {
  std::vector<rl::Rollout*> rows;
  for (auto& r : rollouts)
    if (!r.prompt_ids.empty() && !r.completion_ids.empty()) rows.push_back(&r);
  const size_t chunk = static_cast<size_t>(update.micro_batch_size);
  for (size_t begin = 0; begin < rows.size(); begin += chunk) {
    std::vector<rl::Rollout*> part(rows.begin() + begin, rows.begin() + std::min(rows.size(), begin + chunk));
    KZ_RETURN_IF_ERROR(score_rollouts(model, part, update, field));
  }
  return Status::ok();
}

// ---- checkpoint files -------------------------------------------------------------------------

Result<at::ScalarType> float_type(model::StDType dtype) {
  switch (dtype) {
    case model::StDType::f32: return at::kFloat;
    case model::StDType::bf16: return at::kBFloat16;
    case model::StDType::f16: return at::kHalf;
    default: return invalid_argument(fmt::format("{} is not F32, BF16 or F16", model::st_dtype_name(dtype)));
  }
}

// Stored tensors checked against live parameters, copied only once every one of them fits.
struct StagedWeights {
  model::Checkpoint checkpoint;  // keeps the mapped files (and so the entries) alive
  struct Copy {
    at::Tensor target;
    model::Checkpoint::Entry entry;
    at::ScalarType stored;
  };
  std::vector<Copy> copies;

  Status apply() const {
    try {
      c10::NoGradGuard no_grad;
      for (const Copy& c : copies) {
        const void* data = c.entry.file->data(*c.entry.info);
        c.target.copy_(at::from_blob(const_cast<void*>(data), c.entry.info->shape, at::dtype(c.stored)));
      }
    } catch (const std::exception& e) {
      return internal_error(std::string("copying the checked weights in: ") + e.what());
    }
    return Status::ok();
  }
};

// Every parameter by Hugging Face name: what a full fine-tuning checkpoint holds.
std::vector<std::pair<std::string, at::Tensor>> all_parameters(const model::CausalLM& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

// Opens `path` (a checkpoint dir or one .safetensors file) and pairs each target with the
// tensor named `prefix + name`; every missing, mis-shaped or non-float tensor in one error.
Result<StagedWeights> stage_weights(const fs::path& path, const std::vector<std::pair<std::string, at::Tensor>>& targets,
                                    const std::string& prefix) {
  auto checkpoint = model::Checkpoint::open(path);
  if (!checkpoint.ok()) return checkpoint.status();
  StagedWeights staged{std::move(*checkpoint), {}};
  std::vector<std::string> problems;
  for (const auto& [name, target] : targets) {
    const model::Checkpoint::Entry* e = staged.checkpoint.find(prefix + name);
    if (!e) {
      problems.push_back(prefix + name + " missing");
      continue;
    }
    auto stored = float_type(e->info->dtype);
    if (!stored.ok()) problems.push_back(prefix + name + ": " + stored.status().message());
    else if (e->info->shape != target.sizes().vec())
      problems.push_back(fmt::format("{}{} is [{}], expected [{}]", prefix, name, fmt::join(e->info->shape, ", "),
                                     fmt::join(target.sizes(), ", ")));
    else staged.copies.push_back({target, *e, *stored});
  }
  if (!problems.empty())
    return invalid_argument(fmt::format("{} does not fit this policy's model: {}", path.string(), fmt::join(problems, "; ")));
  return staged;
}

// The saved adapter must have been made with this policy's LoRA settings (the shapes check r;
// the scaling is not in the tensors).
Status check_adapter_config(const fs::path& dir, const model::LoraOptions& options) {
  auto saved = model::read_lora_config(dir);
  if (!saved.ok()) return saved.status();
  if (saved->r != options.r || saved->scaling() != options.scaling())
    return invalid_argument(fmt::format("{}: r={} scaling={} differ from this policy's r={} scaling={}",
                                        (dir / "adapter_config.json").string(), saved->r, saved->scaling(),
                                        options.r, options.scaling()));
  return Status::ok();
}

// policy.json of a checkpoint must describe a policy of the same kind as the live one.
Status check_policy_json(const fs::path& path, const PolicyOptions& options) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  json j = json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.value("trainable", json()).is_boolean() || !j.value("lora", json()).is_boolean())
    return parse_error(path.string() + ": expected an object with booleans \"trainable\" and \"lora\"");
  if (j["trainable"].get<bool>() != options.trainable || j["lora"].get<bool>() != options.lora)
    return invalid_argument(fmt::format("{}: saved trainable={} lora={}, this policy is trainable={} lora={}",
                                        path.string(), j["trainable"].get<bool>(), j["lora"].get<bool>(),
                                        options.trainable, options.lora));
  return Status::ok();
}

}  // namespace

// ---- PolicyOptions ----------------------------------------------------------------------------

Status PolicyOptions::validate() const {
  if (name.empty()) return invalid_argument("a policy needs a role name");
  if (model_dir.empty() == endpoint.empty())
    return invalid_argument(fmt::format("give exactly one of a model dir and an endpoint (model dir \"{}\", endpoint \"{}\")",
                                        model_dir.string(), endpoint));
  if (!endpoint.empty() && trainable)
    return invalid_argument(fmt::format("endpoint {} cannot be trainable: only the in-process engine trains", endpoint));
  if (lora && !trainable) return invalid_argument("lora is set but the policy is not trainable");
  return check_engine_options(*this);
}

// ---- Policy -----------------------------------------------------------------------------------

Result<std::unique_ptr<Policy>> Policy::open(const PolicyOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate().with_context(role_label(options)));
  auto impl = options.endpoint.empty() ? open_engine(options) : open_endpoint(options);
  if (!impl.ok()) return impl.status().with_context(role_label(options));
  return std::unique_ptr<Policy>(new Policy(options, std::move(*impl)));
}

Policy::Policy(PolicyOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}
Policy::~Policy() = default;

Generator& Policy::generator() { return *impl_->generator; }

bool Policy::trainable() const { return impl_->trainer != nullptr; }

std::optional<TokenSample> Policy::token_sample(const Completion& completion) {
  if (completion.token_ids.empty() || completion.prompt_token_ids.empty() ||
      completion.logprobs.size() != completion.token_ids.size())
    return std::nullopt;
  TokenSample sample{completion.prompt_token_ids, completion.token_ids, {}};
  sample.logprobs.reserve(completion.logprobs.size());
  for (const TokenLogprob& lp : completion.logprobs) sample.logprobs.push_back(static_cast<float>(lp.logprob));
  return sample;
}

bool Policy::learns_from(const std::vector<rl::Rollout>& rollouts) const {
  if (!impl_->update || rollouts.empty()) return false;
  if (impl_->update->options().loss.kl_coef > 0) return true;
  return std::any_of(rollouts.begin(), rollouts.end(), [](const rl::Rollout& r) { return r.advantage != 0; });
}

Result<rl::PolicyUpdateStats> Policy::update(std::vector<rl::Rollout> rollouts) {
  const std::string label = role_label(options_) + " update";
  if (!impl_->update) return invalid_argument(label + ": the policy is frozen (not trainable)");
  const rl::PolicyUpdateOptions& options = impl_->update->options();
  // The sampler's log-probs are of the unmodified distribution; at another temperature the
  // sampling policy's are recomputed from the same weights (nothing has trained since the samples).
  if (options.loss.temperature != 1.0)
    KZ_RETURN_IF_ERROR(fill_logprobs(*impl_->model, rollouts, options, &rl::Rollout::old_logprobs)
                           .with_context(label + ": the sampling policy's log-probs at its temperature"));
  if (impl_->reference)
    KZ_RETURN_IF_ERROR(fill_logprobs(*impl_->reference, rollouts, options, &rl::Rollout::ref_logprobs)
                           .with_context(label + ": scoring with the KL reference"));
  auto stats = impl_->update->run(rollouts);
  if (!stats.ok()) return stats.status().with_context(label);
  return stats;
}

int64_t Policy::steps() const { return impl_->trainer ? impl_->trainer->steps_done() : 0; }

std::string Policy::describe() const {
  std::string out = impl_->generator->describe();
  if (options_.lora) out += fmt::format(", lora r={}", options_.lora_options.r);
  if (trainable()) out += ", trainable";
  return out;
}

Status Policy::save(const fs::path& dir) const {
  const std::string label = fmt::format("saving {} to {}", role_label(options_), dir.string());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(fmt::format("{}: {}", label, ec.message()));
  if (impl_->trainer) {
    if (options_.lora) {
      KZ_RETURN_IF_ERROR(model::save_lora(*impl_->model, dir / kAdapterDir, options_.model_dir.string()).with_context(label));
    } else {
      KZ_RETURN_IF_ERROR(impl_->model->save(dir / kModelDir).with_context(label));
      KZ_RETURN_IF_ERROR(copy_tokenizer_files(options_.model_dir, dir / kModelDir).with_context(label));
    }
    KZ_RETURN_IF_ERROR(impl_->trainer->save_state(dir / kTrainerDir).with_context(label));
  }
  json j = {{"role", options_.name}, {"describe", describe()}, {"steps", steps()},
            {"lora", options_.lora}, {"trainable", options_.trainable}};
  return write_file_atomic(dir / kPolicyJson, j.dump(2) + "\n").with_context(label);
}

Status Policy::make_data_parallel(std::shared_ptr<dist::ProcessGroup> group) {
  if (!impl_->trainer) return Status::ok();
  KZ_RETURN_IF_ERROR(dist::make_data_parallel(*impl_->trainer, group, dist::DataParallelOptions{})
                         .with_context(role_label(options_) + ": data parallel"));
  impl_->update->set_process_group(std::move(group));
  return Status::ok();
}

// Every file is opened and checked before anything changes: the weights are staged, the trainer
// state loads all-or-nothing, and only then are the staged weights copied in.
Status Policy::restore(const fs::path& dir) {
  const std::string label = fmt::format("restoring {} from {}", role_label(options_), dir.string());
  KZ_RETURN_IF_ERROR(check_policy_json(dir / kPolicyJson, options_).with_context(label));
  if (!impl_->trainer) return Status::ok();
  Result<StagedWeights> staged = invalid_argument("unset");
  if (options_.lora) {
    KZ_RETURN_IF_ERROR(check_adapter_config(dir / kAdapterDir, options_.lora_options).with_context(label));
    staged = stage_weights(dir / kAdapterDir / kAdapterWeights, model::lora_parameters(*impl_->model), kPeftPrefix);
  } else {
    staged = stage_weights(dir / kModelDir, all_parameters(*impl_->model), "");
  }
  if (!staged.ok()) return staged.status().with_context(label);
  KZ_RETURN_IF_ERROR(impl_->trainer->load_state(dir / kTrainerDir).with_context(label));
  return staged->apply().with_context(label);
}

}  // namespace kz::loop
