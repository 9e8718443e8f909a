// `kz sft` (sft.h): the model, the data, the plan, then the training loop with its metrics,
// evaluations and checkpoints. The only file of sft/ that includes libtorch.
#include "kz/sft/sft.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <optional>

#include "kz/core/hash.h"
#include "kz/core/jsonl.h"
#include "kz/core/terminal.h"
#include "kz/dist/data_parallel.h"
#include "kz/dist/process_group.h"
#include "kz/dist/world.h"
#include "kz/loop/run_dir.h"
#include "kz/model/init_model.h"
#include "kz/model/tokenizer.h"
#include "kz/model/train.h"
#include "kz/model/transformer.h"
#include "kz/sft/batches.h"
#include "kz/sft/corpus.h"
#include "kz/sft/examples.h"

namespace kz::sft {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// ---- the model -------------------------------------------------------------------------------

bool is_preset(const std::string& init) {
  const auto& names = model::model_preset_names();
  return std::find(names.begin(), names.end(), init) != names.end();
}

// The preset written fresh into OUT/init with the trained tokenizer, or the checkpoint dir as is.
Result<fs::path> initial_model_dir(const SftConfig& c, const fs::path& out_dir, std::ostream& log) {
  const ModelSection& m = c.model;
  const bool shaped = m.hidden_size || m.intermediate_size || m.num_hidden_layers || m.num_attention_heads ||
                      m.num_key_value_heads || m.vocab_size || m.max_position_embeddings || m.initializer_range;
  if (!is_preset(m.init)) {
    if (!fs::exists(fs::path(m.init) / "config.json"))
      return invalid_argument(fmt::format("[model] init \"{}\" is neither a preset ({}) nor a checkpoint dir with "
                                          "config.json", m.init, fmt::join(model::model_preset_names(), ", ")));
    if (shaped || !m.tokenizer.empty())
      return invalid_argument("[model]: a checkpoint init keeps its own shape and tokenizer: leave the shape keys "
                              "at 0 and tokenizer empty");
    return fs::path(m.init);
  }
  if (m.tokenizer.empty())
    return invalid_argument("[model] tokenizer: a preset init needs the trained tokenizer's dir (kz train-tokenizer)");
  auto tokenizer = Tokenizer::load(m.tokenizer);
  if (!tokenizer.ok()) return tokenizer.status().with_context("[model] tokenizer");
  model::InitModelOptions init;
  init.preset = m.init;
  init.out_dir = out_dir / "init";
  init.seed = m.seed;
  init.dtype = m.dtype == "fp16" ? "" : m.dtype;  // written in fp32 or bf16; loaded in the run's dtype
  init.tokenizer_dir = m.tokenizer;
  init.shape = {m.hidden_size, m.intermediate_size, m.num_hidden_layers, m.num_attention_heads,
                m.num_key_value_heads, m.vocab_size, m.max_position_embeddings, m.initializer_range};
  if (init.shape.vocab_size == 0) init.shape.vocab_size = (static_cast<int64_t>(tokenizer->vocab_size()) + 63) / 64 * 64;
  auto report = model::init_model(init);
  if (!report.ok()) return report.status().with_context("[model] init");
  const auto& cfg = report->config;
  log << fmt::format("model: preset {} written to {}: {} layers, hidden {}, {} heads / {} kv, vocab {}, {:.2f}M "
                     "parameters\n",
                     m.init, init.out_dir.string(), cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
                     cfg.num_key_value_heads, cfg.vocab_size, report->parameters / 1e6);
  return init.out_dir;
}

// Where rank 0's initial_model_dir puts the model, for the other ranks (which write nothing).
fs::path initial_model_dir_of(const SftConfig& c, const fs::path& out_dir) {
  return is_preset(c.model.init) ? out_dir / "init" : fs::path(c.model.init);
}

Result<at::Device> parse_device(const std::string& name) {
  try {
    return at::Device(name);
  } catch (const std::exception& e) {
    return invalid_argument(fmt::format("[model] device \"{}\": {}", name, e.what()));
  }
}


// The trained tokens (loss-mask sum) of a rank's share of a step: 0 for no share.
double trained_tokens(const std::vector<model::MicroBatch>& batches) {
  double tokens = 0;
  for (const auto& b : batches) tokens += model::target_mask(b).sum().item<double>();
  return tokens;
}

Result<std::shared_ptr<model::CausalLM>> load_model(const fs::path& dir, const ModelSection& m,
                                                    const at::Device& device) {
  auto dtype = model::parse_dtype(m.dtype);
  if (!dtype.ok()) return dtype.status();
  model::LoadOptions load;
  load.dtype = *dtype;
  load.device = device;
  return model::CausalLM::load(dir, load);
}

// A Hugging Face checkpoint of `model` in `dir`, with the tokenizer and generation config of `from`.
Status save_hf_checkpoint(const model::CausalLM& model, const fs::path& from, const fs::path& dir) {
  KZ_RETURN_IF_ERROR(model.save(dir));
  return copy_tokenizer_files(from, dir);
}

// ---- the data --------------------------------------------------------------------------------

struct Data {
  ExampleSet train, eval;
  std::vector<Step> plan;
  std::vector<MicroBatchRows> eval_plan;
  std::string digest;  // of every training and evaluation token: a resume must see the same data
};

std::string examples_digest(const ExampleSet& train, const ExampleSet& eval) {
  std::string bytes;
  for (const ExampleSet* set : {&train, &eval})
    for (const Example& e : set->examples) {
      bytes.append(reinterpret_cast<const char*>(e.prompt_ids.data()), e.prompt_ids.size() * sizeof(TokenId));
      bytes.append(reinterpret_cast<const char*>(e.completion_ids.data()), e.completion_ids.size() * sizeof(TokenId));
      bytes.push_back('\0');
    }
  return content_hash({bytes});
}

Result<Data> prepare_data(const SftConfig& c, const Tokenizer& tokenizer, const fs::path& default_prompts_dir) {
  std::vector<fs::path> paths(c.data.corpus.begin(), c.data.corpus.end());
  auto modules = load_corpora(paths);
  if (!modules.ok()) return modules.status();
  auto split = split_modules(std::move(*modules), c.data.eval_split, c.data.eval_fraction, c.train.seed);
  if (!split.ok()) return split.status().with_context("[data]");
  if (split->eval.size() > static_cast<size_t>(c.data.eval_max_examples))
    split->eval.resize(static_cast<size_t>(c.data.eval_max_examples));
  ExampleOptions options = c.example_options(default_prompts_dir);
  Data data;
  auto train = build_examples(split->train, options, tokenizer);
  if (!train.ok()) return train.status().with_context("training pairs");
  data.train = std::move(*train);
  auto eval = build_examples(split->eval, options, tokenizer);
  if (!eval.ok()) return eval.status().with_context("evaluation pairs");
  data.eval = std::move(*eval);
  if (data.eval.examples.size() > static_cast<size_t>(c.data.eval_max_examples))
    data.eval.examples.resize(static_cast<size_t>(c.data.eval_max_examples));
  if (data.train.examples.empty())
    return invalid_argument(fmt::format("no training pairs: {} modules, {} longer than max_seq_len {}, {} without a "
                                        "candidate of [data] formats with verdict \"ok\" (or null, with "
                                        "accept_unchecked = true)",
                                        data.train.modules, data.train.too_long, c.data.max_seq_len,
                                        data.train.without_candidate));
  auto plan = plan_training(data.train.examples, c.batch_options(), c.train.seed, c.train.epochs, c.train.steps);
  if (!plan.ok()) return plan.status().with_context("[train]");
  data.plan = std::move(*plan);
  data.eval_plan = plan_evaluation(data.eval.examples, c.batch_options());
  data.digest = examples_digest(data.train, data.eval);
  return data;
}

double unfused_share(const ExampleSet& set) {
  if (set.examples.empty()) return 0;
  size_t unfused = 0;
  for (const Example& e : set.examples) unfused += !e.fused;
  return static_cast<double>(unfused) / static_cast<double>(set.examples.size());
}

// Rows right-padded with `pad` into one micro-batch; the loss mask is the rows' completion targets.
model::MicroBatch to_micro_batch(const MicroBatchRows& rows, const std::vector<Example>& examples, int64_t pad) {
  std::vector<RowTokens> tokens;
  size_t width = 2;
  for (const Row& row : rows) {
    tokens.push_back(row_tokens(row, examples));
    width = std::max(width, tokens.back().ids.size());
  }
  const auto n = static_cast<int64_t>(rows.size()), t = static_cast<int64_t>(width);
  std::vector<int64_t> ids(rows.size() * width, pad), attention(rows.size() * width, 0);
  std::vector<float> loss(rows.size() * (width - 1), 0.0f);
  for (size_t b = 0; b < tokens.size(); ++b) {
    std::copy(tokens[b].ids.begin(), tokens[b].ids.end(), ids.begin() + static_cast<std::ptrdiff_t>(b * width));
    std::fill_n(attention.begin() + static_cast<std::ptrdiff_t>(b * width), tokens[b].ids.size(), 1);
    std::copy(tokens[b].loss_mask.begin(), tokens[b].loss_mask.end(),
              loss.begin() + static_cast<std::ptrdiff_t>(b * (width - 1)));
  }
  model::MicroBatch batch;
  batch.input_ids = at::tensor(ids).view({n, t});
  batch.attention_mask = at::tensor(attention).view({n, t});
  batch.loss_mask = at::tensor(loss).view({n, t - 1});
  return batch;
}

// ---- the run ---------------------------------------------------------------------------------

// Training statistics since the last metrics row (kept in checkpoints, so a resumed run logs the
// rows an uninterrupted one would).
struct Window {
  double loss_sum = 0;        // loss x trained tokens, summed over steps
  double trained_tokens = 0;  // completion tokens (the loss's)
  double tokens = 0;          // every real token (prompts too): what tokens/s counts
  double grad_norm = 0, seconds = 0;
  int64_t steps = 0;
  json to_json() const {
    return {{"loss_sum", loss_sum}, {"trained_tokens", trained_tokens}, {"tokens", tokens},
            {"grad_norm", grad_norm}, {"seconds", seconds}, {"steps", steps}};
  }
  static Window from_json(const json& j) {
    return {j.at("loss_sum").get<double>(), j.at("trained_tokens").get<double>(), j.at("tokens").get<double>(),
            j.at("grad_norm").get<double>(), j.at("seconds").get<double>(), j.at("steps").get<int64_t>()};
  }
};

// Data parallel (WORLD_SIZE > 1, docs/scale.md): every rank builds the same plan and trains on
// its share of each step (shard_step), the gradients averaged over the ranks (dist/); rank 0
// alone logs, evaluates and writes checkpoints, so a checkpoint is the whole run's state and
// resumes at any world size.
class SftRun {
 public:
  SftRun(SftConfig config, fs::path out_dir, std::ostream& log, std::shared_ptr<dist::ProcessGroup> group,
         at::Device device)
      : config_(std::move(config)),
        out_(std::move(out_dir)),
        log_(log),
        metrics_(out_ / "metrics.jsonl"),
        group_(std::move(group)),
        world_(group_->world()),
        device_(device) {}

  Status open(bool resume, const fs::path& default_prompts_dir);
  Result<SftReport> train(int64_t stop_at_step);

 private:
  Status restore(const fs::path& checkpoint);
  Status create_trainer();
  Status run_step(const Step& step);
  Result<model::StepStats> distributed_step(const std::vector<model::MicroBatch>& batches);
  Status log_window();
  Status evaluate();
  Status checkpoint();
  Status write_final(const fs::path& dir);
  Result<SftReport> report(bool finished) const;

  SftConfig config_;
  fs::path out_;
  std::ostream& log_;
  loop::AppendLog metrics_;
  fs::path model_files_;   // the weights this run started or resumed from
  fs::path tokenizer_dir_;  // the run's initial model dir: the tokenizer and generation config every save copies
  std::shared_ptr<model::CausalLM> model_;
  std::unique_ptr<model::Trainer> trainer_;
  Data data_;
  int64_t pad_id_ = 0;
  Window window_;
  double train_seconds_ = 0;      // over the whole run, resumes included
  double tokens_this_process_ = 0, seconds_this_process_ = 0;
  std::optional<ProgressBar> bar_;
  std::shared_ptr<dist::ProcessGroup> group_;
  dist::World world_;
  at::Device device_;
};

Status SftRun::open(bool resume, const fs::path& default_prompts_dir) {
  std::optional<fs::path> latest;
  if (resume) {
    auto found = loop::latest_checkpoint(out_);
    if (!found.ok()) return found.status();
    latest = *found;
  }
  if (latest) {
    model_files_ = *latest / "model";
  } else if (world_.is_main()) {
    KZ_RETURN_IF_ERROR(metrics_.truncate_to(0));  // rows of a run killed before its first checkpoint
    auto dir = initial_model_dir(config_, out_, log_);
    if (!dir.ok()) return dir.status();
    model_files_ = *dir;
    KZ_RETURN_IF_ERROR(group_->barrier());  // the others wait for OUT/init
  } else {
    KZ_RETURN_IF_ERROR(group_->barrier());
    model_files_ = initial_model_dir_of(config_, out_);
  }
  // The tokenizer's files come from the run's start, which stays: a resumed run's checkpoint is
  // pruned once newer ones are written, and with it the files model_files_ points to.
  tokenizer_dir_ = initial_model_dir_of(config_, out_);
  auto tokenizer = Tokenizer::load(model_files_);
  if (!tokenizer.ok()) return tokenizer.status();
  pad_id_ = tokenizer->pad_id().value_or(tokenizer->eos_id().value_or(0));
  auto data = prepare_data(config_, *tokenizer, default_prompts_dir);
  if (!data.ok()) return data.status();
  data_ = std::move(*data);
  auto model = load_model(model_files_, config_.model, device_);
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  if (config_.data.max_seq_len > model_->config().max_position_embeddings)
    return invalid_argument(fmt::format("[data] max_seq_len {} is above the model's max_position_embeddings {}",
                                        config_.data.max_seq_len, model_->config().max_position_embeddings));
  KZ_RETURN_IF_ERROR(create_trainer());
  if (latest) KZ_RETURN_IF_ERROR(restore(*latest));
  KZ_RETURN_IF_ERROR(dist::make_data_parallel(*trainer_, group_, dist::DataParallelOptions{}));
  if (world_.distributed())
    log_ << fmt::format("data parallel: {} ranks over {}, each step's rows dealt out among them\n", world_.size,
                        group_->backend_name());
  std::string coder_notes = config_.data.role != "coder"
                                ? ""
                                : fmt::format(", {} without a candidate, {:.0f}% unfused", data_.train.without_candidate,
                                              100 * unfused_share(data_.train));
  log_ << fmt::format("data: {} {} training pairs from {} modules ({} too long{}), {} evaluation pairs; {} steps of "
                      "about {} tokens{}\n",
                      data_.train.examples.size(), config_.data.role, data_.train.modules, data_.train.too_long,
                      coder_notes, data_.eval.examples.size(), data_.plan.size(), config_.train.batch_tokens,
                      config_.train.packing ? " (packed rows)" : "");
  return Status::ok();
}

Status SftRun::create_trainer() {
  const TrainSection& t = config_.train;
  model::TrainOptions options;
  options.lr = t.lr;
  options.beta1 = t.beta1;
  options.beta2 = t.beta2;
  options.weight_decay = t.weight_decay;
  options.max_grad_norm = t.max_grad_norm;
  options.activation_checkpointing = t.activation_checkpointing;
  options.fp32_master_weights = t.fp32_master_weights;
  options.schedule = model::LrSchedule::warmup_cosine;
  options.warmup_steps = t.warmup_steps;
  options.total_steps = static_cast<int64_t>(data_.plan.size());
  options.min_lr_ratio = t.min_lr_ratio;
  if (options.total_steps <= options.warmup_steps)
    return invalid_argument(fmt::format("[train]: the plan has {} steps, not more than warmup_steps {}",
                                        options.total_steps, options.warmup_steps));
  auto trainer = model::Trainer::create(model_, options);
  if (!trainer.ok()) return trainer.status();
  trainer_ = std::move(*trainer);
  return Status::ok();
}

Status SftRun::restore(const fs::path& checkpoint) {
  KZ_RETURN_IF_ERROR(trainer_->load_state(checkpoint / "trainer"));
  auto text = read_file(checkpoint / "state.json");
  if (!text.ok()) return text.status();
  json state = json::parse(*text, nullptr, false);
  if (state.is_discarded() || !state.contains("examples_digest"))
    return invalid_argument((checkpoint / "state.json").string() + ": not a kz sft state");
  if (state["examples_digest"] != data_.digest)
    return invalid_argument(fmt::format("{}: the training pairs differ from the ones this run started with (the "
                                        "corpus, the tokenizer or the prompts changed)",
                                        checkpoint.string()));
  window_ = Window::from_json(state.at("window"));
  train_seconds_ = state.at("train_seconds").get<double>();
  if (world_.is_main()) KZ_RETURN_IF_ERROR(metrics_.truncate_to(state.at("metrics_bytes").get<uint64_t>()));
  log_ << fmt::format("resuming from {} (step {} of {})\n", checkpoint.string(), trainer_->steps_done(),
                      data_.plan.size());
  return Status::ok();
}

Status SftRun::run_step(const Step& step) {
  auto started = Clock::now();
  std::vector<model::MicroBatch> batches;
  for (const auto& rows : shard_step(step, data_.train.examples, config_.batch_options().micro_batch_tokens,
                                     world_.rank, world_.size))
    batches.push_back(to_micro_batch(rows, data_.train.examples, pad_id_));
  auto stats = world_.distributed() ? distributed_step(batches) : trainer_->step(batches, model::LossOptions{});
  if (!stats.ok()) return stats.status().with_context(fmt::format("step {}", trainer_->steps_done() + 1));
  double seconds = seconds_since(started);
  window_.loss_sum += stats->loss * stats->tokens;
  window_.trained_tokens += stats->tokens;
  window_.tokens += static_cast<double>(step.tokens);
  window_.grad_norm += stats->grad_norm;
  window_.seconds += seconds;
  window_.steps += 1;
  train_seconds_ += seconds;
  tokens_this_process_ += static_cast<double>(step.tokens);
  seconds_this_process_ += seconds;
  if (bar_)
    bar_->advance(fmt::format("loss {:.4f} lr {:.2e} {:.0f} tok/s", stats->loss, stats->lr,
                              static_cast<double>(step.tokens) / std::max(seconds, 1e-9)));
  return Status::ok();
}

// The loss normalised by the whole step's trained tokens (every rank's), divided by the world
// size: the averaged gradients are then the whole step's, as one process would compute them.
Result<model::StepStats> SftRun::distributed_step(const std::vector<model::MicroBatch>& batches) {
  model::LossOptions loss;
  auto tokens = group_->all_reduce_sum({trained_tokens(batches)});
  if (!tokens.ok()) return tokens.status();
  const auto size = static_cast<double>(world_.size);
  auto stats = trainer_->step(batches, loss, std::max((*tokens)[0], 1.0) / size);
  if (!stats.ok()) return stats;
  auto sums = group_->all_reduce_sum({stats->loss, stats->tokens});  // the step's loss: the shares' mean
  if (!sums.ok()) return sums.status();
  stats->loss = (*sums)[0] / size;
  stats->tokens = (*sums)[1];
  return stats;
}

Status SftRun::log_window() {
  if (!world_.is_main()) window_ = Window{};
  if (window_.steps == 0) return Status::ok();
  const int64_t step = trainer_->steps_done();
  double loss = window_.trained_tokens > 0 ? window_.loss_sum / window_.trained_tokens : 0.0;
  json row = {{"kind", "train"},
              {"step", step},
              {"epoch", data_.plan[static_cast<size_t>(step - 1)].epoch},
              {"loss", loss},
              {"lr", model::learning_rate(trainer_->options(), step - 1)},
              {"grad_norm", window_.grad_norm / static_cast<double>(window_.steps)},
              {"tokens", window_.tokens},
              {"trained_tokens", window_.trained_tokens},
              {"tokens_per_s", window_.tokens / std::max(window_.seconds, 1e-9)},
              {"elapsed_s", train_seconds_}};
  if (!bar_)
    log_ << fmt::format("step {}/{}  loss {:.4f}  lr {:.2e}  grad {:.3f}  {:.0f} tok/s\n", step, data_.plan.size(),
                        loss, row["lr"].get<double>(), row["grad_norm"].get<double>(), row["tokens_per_s"].get<double>());
  window_ = Window{};
  return metrics_.append(row.dump());
}

Status SftRun::evaluate() {
  if (data_.eval.examples.empty() || !world_.is_main()) return Status::ok();
  c10::NoGradGuard no_grad;
  std::vector<model::MicroBatch> batches;
  for (const auto& rows : data_.eval_plan) batches.push_back(to_micro_batch(rows, data_.eval.examples, pad_id_));
  model::LossOptions loss;
  const double denominator = model::step_denominator(batches, loss);
  double total = 0;
  for (const auto& batch : batches) {
    auto value = model::micro_batch_loss(*model_, batch, loss, denominator);
    if (!value.ok()) return value.status().with_context("evaluation");
    total += value->item<double>();
  }
  const int64_t step = trainer_->steps_done();
  json row = {{"kind", "eval"}, {"step", step}, {"eval_loss", total}, {"eval_tokens", denominator},
              {"examples", data_.eval.examples.size()}};
  if (bar_)
    bar_->show(fmt::format("eval loss {:.4f}", total));
  else
    log_ << fmt::format("step {}/{}  eval loss {:.4f} over {:.0f} tokens\n", step, data_.plan.size(), total,
                        denominator);
  return metrics_.append(row.dump());
}

Status SftRun::checkpoint() {
  if (!world_.is_main()) return Status::ok();
  auto metrics_bytes = metrics_.size();
  if (!metrics_bytes.ok()) return metrics_bytes.status();
  json state = {{"step", trainer_->steps_done()},        {"total_steps", data_.plan.size()},
                {"examples_digest", data_.digest},       {"metrics_bytes", *metrics_bytes},
                {"window", window_.to_json()},           {"train_seconds", train_seconds_}};
  return loop::write_checkpoint(out_, trainer_->steps_done(), static_cast<int>(config_.train.checkpoint_keep),
                                [&](const fs::path& staging) -> Status {
                                  KZ_RETURN_IF_ERROR(save_hf_checkpoint(*model_, tokenizer_dir_, staging / "model"));
                                  KZ_RETURN_IF_ERROR(trainer_->save_state(staging / "trainer"));
                                  return write_file_atomic(staging / "state.json", state.dump(2) + "\n");
                                });
}

// Written beside, then renamed over an earlier one: a kill leaves no half-written final dir.
Status SftRun::write_final(const fs::path& dir) {
  if (!world_.is_main()) return Status::ok();
  fs::path staging = dir.string() + ".staging";
  std::error_code ec;
  fs::remove_all(staging, ec);
  KZ_RETURN_IF_ERROR(save_hf_checkpoint(*model_, tokenizer_dir_, staging));
  fs::remove_all(dir, ec);
  fs::rename(staging, dir, ec);
  if (ec) return io_error(fmt::format("renaming {} to {}: {}", staging.string(), dir.string(), ec.message()));
  return Status::ok();
}

Result<SftReport> SftRun::train(int64_t stop_at_step) {
  const TrainSection& t = config_.train;
  const auto total = static_cast<int64_t>(data_.plan.size());
  const int64_t end = stop_at_step > 0 ? std::min(stop_at_step, total) : total;
  if (world_.is_main() && is_terminal(log_) && trainer_->steps_done() < end)
    bar_.emplace("sft", static_cast<size_t>(end - trainer_->steps_done()), log_);
  if (trainer_->steps_done() == 0) KZ_RETURN_IF_ERROR(evaluate());
  while (trainer_->steps_done() < end) {
    KZ_RETURN_IF_ERROR(run_step(data_.plan[static_cast<size_t>(trainer_->steps_done())]));
    const int64_t step = trainer_->steps_done();
    const bool last = step == total;
    if (step % t.log_every == 0 || last) KZ_RETURN_IF_ERROR(log_window());
    if ((t.eval_every > 0 && step % t.eval_every == 0) || last) KZ_RETURN_IF_ERROR(evaluate());
    if ((t.checkpoint_every > 0 && step % t.checkpoint_every == 0) || last || step == end)
      KZ_RETURN_IF_ERROR(checkpoint());
  }
  if (bar_) bar_->finish();
  const bool finished = trainer_->steps_done() == total;
  if (finished) KZ_RETURN_IF_ERROR(write_final(out_ / "final"));
  return report(finished);
}

Result<SftReport> SftRun::report(bool finished) const {
  SftReport r;
  r.out_dir = out_;
  if (finished) r.final_dir = out_ / "final";
  r.steps_done = trainer_->steps_done();
  r.total_steps = static_cast<int64_t>(data_.plan.size());
  r.train_examples = static_cast<int64_t>(data_.train.examples.size());
  r.eval_examples = static_cast<int64_t>(data_.eval.examples.size());
  r.too_long = static_cast<int64_t>(data_.train.too_long);
  r.unfused_share = unfused_share(data_.train);
  r.tokens = tokens_this_process_;
  r.train_seconds = seconds_this_process_;
  r.tokens_per_s = seconds_this_process_ > 0 ? tokens_this_process_ / seconds_this_process_ : 0;
  r.rank = world_.rank;
  r.world_size = world_.size;
  if (!world_.is_main()) return r;  // rank 0 keeps the metrics
  auto rows = read_jsonl_log(metrics_.path());
  if (!rows.ok()) return rows.status();
  bool first_train = true, first_eval = true;
  for (const json& row : *rows) {
    if (row.value("kind", "") == "train") {
      if (first_train) r.first_loss = row["loss"].get<double>(), first_train = false;
      r.last_loss = row["loss"].get<double>();
    } else if (row.value("kind", "") == "eval") {
      if (first_eval) r.first_eval_loss = row["eval_loss"].get<double>(), first_eval = false;
      r.last_eval_loss = row["eval_loss"].get<double>();
    }
  }
  return r;
}

json report_json(const SftReport& r) {
  auto optional = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  return {{"out_dir", r.out_dir.string()},       {"final_dir", r.final_dir.string()},
          {"steps_done", r.steps_done},           {"total_steps", r.total_steps},
          {"train_examples", r.train_examples},   {"eval_examples", r.eval_examples},
          {"too_long", r.too_long},               {"unfused_share", r.unfused_share},
          {"first_loss", r.first_loss},           {"last_loss", r.last_loss},
          {"first_eval_loss", optional(r.first_eval_loss)}, {"last_eval_loss", optional(r.last_eval_loss)},
          {"tokens", r.tokens},                   {"train_seconds", r.train_seconds},
          {"tokens_per_s", r.tokens_per_s}};
}

// The run dir and its config: a resumed run reads its config.toml; a new one must not find one
// (the caller writes it once the run has opened).
Result<SftConfig> run_config(const SftOptions& options, fs::path& out_dir, const dist::World& world) {
  if (options.resume) {
    out_dir = options.out_dir;
    return load_sft_config(out_dir / "config.toml");
  }
  auto config = load_sft_config(options.config_path);
  if (!config.ok()) return config.status();
  out_dir = options.out_dir.empty() ? config->output_dir : options.out_dir;
  if (out_dir.empty()) return invalid_argument("no output dir: give [output] dir or --out");
  config->output_dir = out_dir;
  std::error_code ec;
  if (world.is_main() && fs::exists(out_dir / "config.toml", ec))
    return invalid_argument(fmt::format("{} already holds a kz sft run: --resume it or choose another dir",
                                        out_dir.string()));
  fs::create_directories(out_dir, ec);
  if (ec) return io_error(fmt::format("creating {}: {}", out_dir.string(), ec.message()));
  return config;
}

}  // namespace

Result<SftReport> run_sft(const SftOptions& options, std::ostream& log) {
  auto world = dist::current_world();
  if (!world.ok()) return world.status();
  fs::path out_dir;
  auto config = run_config(options, out_dir, *world);
  if (!config.ok()) return config.status();
  std::ostream silent(nullptr);  // ranks other than 0 log nothing; their errors still come back
  std::ostream& out = world->is_main() ? log : silent;
  try {
    auto device = parse_device(dist::rank_device(config->model.device, *world));
    if (!device.ok()) return device.status();
    auto group = dist::ProcessGroup::connect(*world, *device);
    if (!group.ok()) return group.status();
    SftRun run(*config, out_dir, out, *group, *device);
    KZ_RETURN_IF_ERROR(run.open(options.resume, options.default_prompts_dir));
    if (!options.resume && world->is_main())
      KZ_RETURN_IF_ERROR(write_file_atomic(out_dir / "config.toml", sft_config_to_toml(*config)));
    auto report = run.train(options.stop_at_step);
    if (!report.ok()) return report.status();
    if (world->is_main())
      KZ_RETURN_IF_ERROR(write_file_atomic(out_dir / "summary.json", report_json(*report).dump(2) + "\n"));
    return report;
  } catch (const std::exception& e) {
    return internal_error(fmt::format("kz sft {}: {}", out_dir.string(), e.what()));
  }
}

}  // namespace kz::sft
