// Stop strings over generated tokens, matched in one place for the engine's three uses: ending a
// row while it decodes, cutting its final text, and streaming that text as it grows. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kz/model/tokenizer.h"

namespace kz::model {

// A row's text as its tokens arrive (special tokens skipped), cut before the first stop string.
class StopStringText {
 public:
  StopStringText(const Tokenizer& tokenizer, std::vector<std::string> stop);

  // Appends a token's text; true once a stop string is complete. The text is then cut before the
  // first one, and later tokens are ignored.
  bool push(TokenId id);
  // The row has ended: flushes a character left unfinished (as U+FFFD) unless a stop string ended it.
  void finish();

  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }
  size_t tokens() const { return tokens_; }  // tokens taken, up to the one that completed a stop string
  // The length of text() that no later token can change, i.e. what may be streamed: all of it
  // once stopped or finished, else all but its longest tail that begins a stop string (a later
  // token may complete it, and the text is then cut there). Bytes of an unfinished UTF-8
  // character are never in text() before finish().
  size_t settled() const;

 private:
  TokenStreamDecoder decoder_;
  std::vector<std::string> stop_;  // the non-empty ones
  size_t longest_ = 0;
  std::string text_;
  size_t tokens_ = 0;
  bool stopped_ = false, finished_ = false;
};

// The text of `ids` after stop strings are applied: the length of the token prefix to keep, and
// the text it decodes to, cut before the first stop string. stopped is true when a stop string
// was found.
struct StopCut {
  size_t tokens = 0;
  std::string text;
  bool stopped = false;
};
StopCut apply_stop_strings(const Tokenizer& tokenizer, const std::vector<int64_t>& ids,
                           const std::vector<std::string>& stop);

}  // namespace kz::model
