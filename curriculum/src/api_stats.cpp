// The per-API Beta posteriors of the Coder's success.
#include "kz/curriculum/api_stats.h"

#include <cmath>
#include <set>

#include <fmt/format.h>

#include "json_read.h"

namespace kz::curriculum {

Status ApiStatsOptions::validate() const {
  if (!(std::isfinite(prior_alpha) && prior_alpha > 0))
    return invalid_argument(fmt::format("api stats: prior_alpha must be a finite number > 0, got {}", prior_alpha));
  if (!(std::isfinite(prior_beta) && prior_beta > 0))
    return invalid_argument(fmt::format("api stats: prior_beta must be a finite number > 0, got {}", prior_beta));
  return Status::ok();
}

Result<ApiStats> ApiStats::create(ApiStatsOptions options) {
  KZ_RETURN_IF_ERROR(options.validate());
  return ApiStats(options);
}

Status ApiStats::update(const std::vector<std::string>& apis, bool correct) {
  for (const auto& api : apis)
    if (api.empty()) return invalid_argument("api stats: update with an empty API name");
  for (const auto& api : std::set<std::string>(apis.begin(), apis.end())) {
    ApiRecord& r = records_[api];
    (correct ? r.successes : r.failures) += 1;
  }
  return Status::ok();
}

ApiRecord ApiStats::record(const std::string& api) const {
  auto it = records_.find(api);
  return it == records_.end() ? ApiRecord{} : it->second;
}

double ApiStats::alpha(const std::string& api) const { return options_.prior_alpha + double(record(api).successes); }
double ApiStats::beta(const std::string& api) const { return options_.prior_beta + double(record(api).failures); }

double ApiStats::mean(const std::string& api) const {
  double a = alpha(api);
  return a / (a + beta(api));
}

int64_t ApiStats::count(const std::string& api) const {
  ApiRecord r = record(api);
  return r.successes + r.failures;
}

nlohmann::json ApiStats::to_json() const {
  nlohmann::json apis = nlohmann::json::object();
  for (const auto& [name, r] : records_) apis[name] = {{"successes", r.successes}, {"failures", r.failures}};
  return {{"prior_alpha", options_.prior_alpha}, {"prior_beta", options_.prior_beta}, {"apis", std::move(apis)}};
}

Result<ApiStats> ApiStats::from_json(const nlohmann::json& json) {
  const std::string where = "api stats";
  ApiStatsOptions options;
  KZ_RETURN_IF_ERROR(detail::read_number(json, "prior_alpha", where, options.prior_alpha));
  KZ_RETURN_IF_ERROR(detail::read_number(json, "prior_beta", where, options.prior_beta));
  if (auto status = options.validate(); !status.is_ok()) return parse_error(status.message());
  auto apis = detail::member(json, "apis", where);
  if (!apis.ok()) return apis.status();
  KZ_RETURN_IF_ERROR(detail::expect_object(**apis, where + ".apis"));
  ApiStats stats(options);
  for (const auto& [name, value] : (*apis)->items()) {
    if (name.empty()) return parse_error(where + ".apis: an empty API name");
    std::string at = fmt::format("{}.apis[\"{}\"]", where, name);
    ApiRecord r;
    KZ_RETURN_IF_ERROR(detail::read_count(value, "successes", at, r.successes));
    KZ_RETURN_IF_ERROR(detail::read_count(value, "failures", at, r.failures));
    stats.records_[name] = r;
  }
  return stats;
}

}  // namespace kz::curriculum
