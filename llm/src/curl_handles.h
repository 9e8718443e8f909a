// Owners for libcurl's handles (easy, multi, header lists), so every exit path frees them.
//
// Private to kz_llm: nothing outside src/ should see libcurl.
#pragma once

#include <curl/curl.h>

#include <memory>

namespace kz::curl {

struct EasyDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
struct MultiDeleter {
  void operator()(CURLM* handle) const { curl_multi_cleanup(handle); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

using EasyHandle = std::unique_ptr<CURL, EasyDeleter>;
using MultiHandle = std::unique_ptr<CURLM, MultiDeleter>;
using HeaderList = std::unique_ptr<curl_slist, SlistDeleter>;

// Appends one header line; false when libcurl could not allocate (the list is left unchanged).
inline bool append_header(HeaderList& list, const char* line) {
  curl_slist* grown = curl_slist_append(list.get(), line);
  if (grown == nullptr) return false;
  (void)list.release();  // curl_slist_append returns the same head (or a new one for an empty list)
  list.reset(grown);
  return true;
}

// libcurl's process-wide setup; call before the first handle is made (thread-safe, idempotent).
void global_init();

}  // namespace kz::curl
