// A Prometheus histogram of durations in seconds by one label.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace fusor::server {

// Durations in seconds by one label, in fixed buckets: a Prometheus
// histogram, whose counts never decrease. Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {}
  void Observe(const std::string& label, double seconds);
  // The family's series: NAME_bucket{LABEL="..",le=".."}, NAME_sum, NAME_count.
  void Render(std::string& out, const std::string& name, const std::string& label) const;

 private:
  struct Series {
    std::vector<int64_t> counts;  // per bound, not cumulative; the last: beyond every bound
    double sum = 0;
  };
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<std::string, Series> series_;
};

}  // namespace fusor::server
