// Stop strings over generated tokens (stop_strings.h).
#include "kz/model/stop_strings.h"

#include <algorithm>

namespace kz::model {

StopStringText::StopStringText(const Tokenizer& tokenizer, std::vector<std::string> stop)
    : decoder_(tokenizer, /*skip_special=*/true) {
  for (auto& s : stop) {
    if (s.empty()) continue;
    longest_ = std::max(longest_, s.size());
    stop_.push_back(std::move(s));
  }
}

bool StopStringText::push(TokenId id) {
  if (stopped_) return true;
  ++tokens_;
  size_t before = text_.size();
  text_ += decoder_.push(id);
  if (stop_.empty() || text_.size() == before) return false;
  // A stop string ending in the new text starts at most longest-1 bytes before it.
  size_t from = before >= longest_ ? before - longest_ + 1 : 0;
  size_t first = std::string::npos;
  for (const auto& s : stop_) first = std::min(first, text_.find(s, from));
  if (first == std::string::npos) return false;
  text_.resize(first);
  stopped_ = true;
  return true;
}

void StopStringText::finish() {
  if (!stopped_) text_ += decoder_.finish();
  finished_ = true;
}

size_t StopStringText::settled() const {
  if (stopped_ || finished_) return text_.size();
  size_t held = 0;
  for (const auto& s : stop_)
    for (size_t k = std::min(s.size() - 1, text_.size()); k > held; --k)
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        held = k;
        break;
      }
  return text_.size() - held;
}

StopCut apply_stop_strings(const Tokenizer& tokenizer, const std::vector<int64_t>& ids,
                           const std::vector<std::string>& stop) {
  StopStringText text(tokenizer, stop);
  for (int64_t id : ids)
    if (text.push(static_cast<TokenId>(id))) break;
  text.finish();
  return {text.tokens(), text.text(), text.stopped()};
}

}  // namespace kz::model
