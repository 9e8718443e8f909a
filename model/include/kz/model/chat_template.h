// ChatML, the chat format of the Qwen families:
//
//   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n
//   <|im_start|>user\nHello<|im_end|>\n
//   <|im_start|>assistant\n            <- add_generation_prompt
//
// Rendered in C++ instead of running the model's Jinja template. What differs between Qwen
// releases is only whether a default system turn is inserted when the conversation has none
// (Qwen2: "You are a helpful assistant.", Qwen2.5: "You are Qwen, created by Alibaba Cloud. You
// are a helpful assistant.", Qwen3: none); ChatTemplate::default_system carries that, read from
// the template text of tokenizer_config.json. Tool calls and Qwen3's <think> handling are not
// rendered.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kz {

// One turn of a conversation (the same shape as llm's ChatMessage, which model cannot include).
struct ChatTurn {
  std::string role;     // "system", "user", "assistant" (any role is rendered as given)
  std::string content;
};

struct ChatTemplate {
  bool present = false;        // tokenizer_config.json had a chat_template
  bool chatml = false;         // ... and it writes ChatML (<|im_start|>): render_chatml() applies;
                               // false for other formats (Llama 3's headers), not rendered here
  std::string source;          // the Jinja text as found (for reference; never executed)
  std::string default_system;  // system turn inserted when the first turn is not "system"; "" = none
};

// The default system message a Qwen-style Jinja template inserts, or "" when it inserts none:
// the literal text of a '<|im_start|>system\n...<|im_end|>' string constant in the template.
std::string default_system_from_jinja(std::string_view jinja);

// The ChatML text of `turns`; add_generation_prompt appends "<|im_start|>assistant\n".
std::string render_chatml(const std::vector<ChatTurn>& turns, bool add_generation_prompt,
                          const ChatTemplate& chat_template = {});

// A Jinja template that transformers' apply_chat_template renders exactly as render_chatml does
// (written into the tokenizer_config.json of tokenizers that KernelZero creates).
std::string chatml_jinja(std::string_view default_system);

}  // namespace kz
