// The in-process Generator: the libtorch model engine (kz/model/engine.h) behind llm's interface.
//
// Chat requests are rendered with ChatML (render_chatml, with the tokenizer's default system
// turn) and a generation prompt; raw prompts are encoded as they are (special tokens written in
// them are recognised, as vLLM does). Each of a request's n completions is its own row with seed
// `seed + i` (the HTTP backend asks servers for the same), or a fresh random seed when the request
// has none. All completions of one generate() call run in as few engine batches as max_batch
// allows; a request's on_piece gets each completion's text while its batch decodes (engine.h's
// on_text). Built only with libtorch (target kz_llm_engine); llm itself never needs torch.
#pragma once

#include <memory>

#include "kz/core/status.h"
#include "kz/llm/generator.h"
#include "kz/model/engine.h"

namespace kz {

struct EngineGeneratorOptions {
  int max_batch = 64;  // completions per engine batch (rows prefilled and decoded together)
  Status validate() const;
};

// Over an engine already loaded (shared: kz serve-model also reads its tokenizer).
Result<std::unique_ptr<Generator>> make_engine_generator(std::shared_ptr<model::Engine> engine,
                                                         EngineGeneratorOptions options = {});
// Loads the checkpoint first.
Result<std::unique_ptr<Generator>> open_engine_generator(const model::EngineOptions& engine,
                                                         EngineGeneratorOptions options = {});

}  // namespace kz
