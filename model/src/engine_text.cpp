// The torch-free half of the engine: stop strings over decoded text.
#include <algorithm>

#include "kz/model/engine.h"

namespace kz::model {

StopCut apply_stop_strings(const Tokenizer& tokenizer, const std::vector<int64_t>& ids,
                           const std::vector<std::string>& stop) {
  StopCut cut;
  TokenStreamDecoder decoder(tokenizer, /*skip_special=*/true);
  size_t longest = 0;
  for (const auto& s : stop) longest = std::max(longest, s.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    size_t before = cut.text.size();
    cut.text += decoder.push(static_cast<TokenId>(ids[i]));
    if (longest > 0 && cut.text.size() > before) {
      // A stop string ending in the new text starts at most longest-1 bytes before it.
      size_t from = before >= longest ? before - longest + 1 : 0;
      size_t first = std::string::npos;
      for (const auto& s : stop) {
        if (s.empty()) continue;
        size_t at = cut.text.find(s, from);
        if (at != std::string::npos) first = std::min(first, at);
      }
      if (first != std::string::npos) {
        cut.text.resize(first);
        cut.tokens = i + 1;
        cut.stopped = true;
        return cut;
      }
    }
  }
  cut.text += decoder.finish();
  cut.tokens = ids.size();
  return cut;
}

}  // namespace kz::model
