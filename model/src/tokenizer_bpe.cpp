// BPE over the bytes of one pre-tokenized piece: the merge table, the word cache, and the merge
// loop. The result is the one tokenizers gives: repeatedly merge the adjacent pair of lowest
// rank, the leftmost of equal ranks.
#include <algorithm>
#include <atomic>
#include <queue>

#include "tokenizer_internal.h"

namespace kz::tok {
namespace {

struct Symbol {
  TokenId id;
  int32_t prev, next;  // neighbours in the word; -1 at the ends
  bool alive;          // false once merged into its left neighbour
};

// Short words (most of them) are merged by rescanning all pairs for the lowest rank: no heap, no
// allocation. Long ones (white-space runs, minified code) use a heap, as tokenizers does.
constexpr size_t kScanMergeMaxSymbols = 48;

void merge_by_scan(const PairMap& merges, std::vector<Symbol>& symbols) {
  for (;;) {
    const Merge* best = nullptr;
    int32_t best_pos = -1;
    for (int32_t i = 0; i != -1 && symbols[i].next != -1; i = symbols[i].next) {
      const Merge* m = merges.find(symbols[i].id, symbols[symbols[i].next].id);
      if (m && (!best || m->rank < best->rank)) {
        best = m;
        best_pos = i;
      }
    }
    if (!best) return;
    Symbol& left = symbols[best_pos];
    Symbol& right = symbols[left.next];
    left.id = best->merged;
    right.alive = false;
    left.next = right.next;
    if (right.next != -1) symbols[right.next].prev = best_pos;
  }
}

struct Candidate {
  uint32_t rank;
  int32_t pos;
  TokenId merged;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

void merge_by_heap(const PairMap& merges, std::vector<Symbol>& symbols) {
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int32_t pos) {
    if (pos == -1 || symbols[pos].next == -1) return;
    if (const Merge* m = merges.find(symbols[pos].id, symbols[symbols[pos].next].id))
      queue.push({m->rank, pos, m->merged});
  };
  for (int32_t i = 0; i != -1; i = symbols[i].next) push_pair(i);
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next == -1) continue;
    // An entry is stale when the pair at pos changed since it was pushed; a pair spanning the
    // same bytes is the same pair, so comparing the result is enough (as tokenizers does).
    const Merge* m = merges.find(left.id, symbols[left.next].id);
    if (!m || m->merged != top.merged) continue;
    Symbol& right = symbols[left.next];
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next != -1) symbols[right.next].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
}

}  // namespace

void PairMap::reserve(size_t count) {
  while ((size_t{1} << (64 - shift_)) < count * 2 || shift_ == 64) {
    --shift_;
  }
  keys_.assign(size_t{1} << (64 - shift_), kEmpty);
  values_.assign(keys_.size(), Merge{});
  size_ = 0;
}

void PairMap::grow() {
  std::vector<uint64_t> old_keys = std::move(keys_);
  std::vector<Merge> old_values = std::move(values_);
  reserve(old_keys.size());
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_keys[i] == kEmpty) continue;
    insert(static_cast<TokenId>(old_keys[i] >> 32), static_cast<TokenId>(old_keys[i] & 0xFFFFFFFF), old_values[i]);
  }
}

void PairMap::insert(TokenId left, TokenId right, Merge merge) {
  if (keys_.empty() || (size_ + 1) * 2 > keys_.size()) grow();
  uint64_t k = key(left, right);
  size_t mask = keys_.size() - 1;
  for (size_t i = slot(k);; i = (i + 1) & mask) {
    if (keys_[i] == k) {
      values_[i] = merge;
      return;
    }
    if (keys_[i] == kEmpty) {
      keys_[i] = k;
      values_[i] = merge;
      ++size_;
      return;
    }
  }
}

const Merge* PairMap::find(TokenId left, TokenId right) const {
  if (keys_.empty()) return nullptr;
  uint64_t k = key(left, right);
  size_t mask = keys_.size() - 1;
  for (size_t i = slot(k);; i = (i + 1) & mask) {
    if (keys_[i] == k) return &values_[i];
    if (keys_[i] == kEmpty) return nullptr;
  }
}

bool WordCache::lookup(std::string_view word, std::vector<TokenId>& out) const {
  if (slots_.empty()) return false;
  uint64_t hash = hash_of(word);
  for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& slot = slots_[i];
    if (slot.hash == 0) return false;
    if (slot.hash == hash && std::string_view(keys_).substr(slot.key_offset, slot.key_length) == word) {
      out.insert(out.end(), ids_.begin() + slot.ids_offset, ids_.begin() + slot.ids_offset + slot.ids_length);
      return true;
    }
  }
}

void WordCache::insert(std::string_view word, std::span<const TokenId> ids) {
  if (word.size() > kMaxWordBytes || ids.size() > UINT16_MAX || entries_ >= kMaxEntries) return;
  if (slots_.empty()) slots_.resize(kSlots);
  uint64_t hash = hash_of(word);
  size_t i = hash & (kSlots - 1);
  while (slots_[i].hash != 0) i = (i + 1) & (kSlots - 1);
  slots_[i] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
               static_cast<uint16_t>(word.size()), static_cast<uint16_t>(ids.size())};
  keys_.append(word);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++entries_;
}

void WordCache::clear() {
  slots_.clear();
  keys_.clear();
  ids_.clear();
  entries_ = 0;
}

BpeModel::BpeModel() {
  static std::atomic<uint64_t> next_serial{1};
  serial_ = next_serial++;
  byte_ids.fill(-1);
}

WordCache& BpeModel::cache() const {
  thread_local WordCache cache;
  thread_local uint64_t owner = 0;
  if (owner != serial_) {
    cache.clear();
    owner = serial_;
  }
  return cache;
}

void BpeModel::encode(std::string_view word, std::vector<TokenId>& out) const {
  if (word.size() == 1 && byte_ids[static_cast<uint8_t>(word[0])] >= 0) {
    out.push_back(byte_ids[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (ignore_merges) {
    auto it = byte_tokens.find(word);
    if (it != byte_tokens.end()) {
      out.push_back(it->second);
      return;
    }
  }
  WordCache& word_cache = cache();
  if (word_cache.lookup(word, out)) return;
  size_t first = out.size();
  merge_word(word, out);
  word_cache.insert(word, std::span<const TokenId>(out).subspan(first));
}

void BpeModel::merge_word(std::string_view word, std::vector<TokenId>& out) const {
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  bool last_was_unk = false;
  for (char c : word) {
    TokenId id = byte_ids[static_cast<uint8_t>(c)];
    if (id < 0) {  // a byte without a token: unk if there is one, else dropped (as tokenizers)
      if (!unk || (fuse_unk && last_was_unk)) continue;
      id = *unk;
      last_was_unk = true;
    } else {
      last_was_unk = false;
    }
    auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  if (symbols.size() <= kScanMergeMaxSymbols) merge_by_scan(merges, symbols);
  else merge_by_heap(merges, symbols);
  for (int32_t i = 0; i != -1; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace kz::tok
