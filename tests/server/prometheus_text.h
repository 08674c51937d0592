// A strict reading of Prometheus' text exposition format (0.0.4), as a
// scraper parses it: what a metrics page breaks, one message per problem.
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fusor::testing {

// Problems in `text` (empty: it parses): malformed lines, names and label
// values; a TYPE missing, repeated or after its samples; a family's lines
// not together; a series twice; histograms whose buckets are not
// cumulative in increasing `le`, lack +Inf, _sum or _count, or whose +Inf
// bucket is not the count; counters that do not end in _total.
inline std::vector<std::string> PrometheusTextProblems(const std::string& text) {
  std::vector<std::string> problems;
  const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
  const std::regex sample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( -?\d+)?)");
  const std::regex label(R"(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)\"(,|$))");
  std::map<std::string, std::string> types;  // family -> type
  std::set<std::string> finished;            // families whose lines have ended
  std::set<std::string> series;
  std::string current;                       // the family of the lines being read
  struct Histogram {
    std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // labels but le -> (le, count)
    std::map<std::string, double> counts;
    std::set<std::string> sums;
  };
  std::map<std::string, Histogram> histograms;
  // The family a sample name belongs to: a histogram's _bucket, _sum and _count are its own.
  auto family_of = [&](const std::string& name) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        const std::string base = name.substr(0, name.size() - s.size());
        if (types.count(base) && types[base] == "histogram") return base;
      }
    }
    return name;
  };
  auto enter = [&](const std::string& family, int line_no) {
    if (family == current) return;
    if (finished.count(family)) {
      problems.push_back("line " + std::to_string(line_no) + ": " + family + " again after other families");
    }
    if (!current.empty()) finished.insert(current);
    current = family;
  };
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::smatch m;
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (std::regex_match(line, m, type)) {
        if (types.count(m[1])) problems.push_back("line " + std::to_string(n) + ": a second TYPE for " + m[1].str());
        if (series.count(m[1].str() + "|seen")) {
          problems.push_back("line " + std::to_string(n) + ": TYPE of " + m[1].str() + " after its samples");
        }
        types[m[1]] = m[2];
        const std::string name = m[1];
        if (m[2] == "counter" && (name.size() < 6 || name.compare(name.size() - 6, 6, "_total") != 0)) {
          problems.push_back("line " + std::to_string(n) + ": counter " + m[1].str() + " does not end in _total");
        }
        enter(m[1], n);
      } else if (std::regex_match(line, m, help)) {
        enter(m[1], n);
      } else if (line.rfind("# HELP", 0) == 0 || line.rfind("# TYPE", 0) == 0) {
        problems.push_back("line " + std::to_string(n) + ": malformed: " + line);
      }
      continue;
    }
    if (!std::regex_match(line, m, sample)) {
      problems.push_back("line " + std::to_string(n) + ": not a sample: " + line);
      continue;
    }
    const std::string name = m[1], value_text = m[4];
    std::string labels = m[3];
    double le = NAN;
    std::string other_labels;
    for (std::smatch l; !labels.empty();) {
      if (!std::regex_search(labels, l, label) || l.position(0) != 0) {
        problems.push_back("line " + std::to_string(n) + ": malformed labels: " + line);
        break;
      }
      if (l[1] == "le") {
        le = l[2] == "+Inf" ? INFINITY : std::strtod(l[2].str().c_str(), nullptr);
      } else {
        other_labels += l[1].str() + "=" + l[2].str() + ",";
      }
      labels = l.suffix();
    }
    char* end = nullptr;
    const double value = std::strtod(value_text.c_str(), &end);
    if (end == value_text.c_str() || *end != '\0') {
      problems.push_back("line " + std::to_string(n) + ": value '" + value_text + "' is not a number");
    }
    const std::string family = family_of(name);
    if (!types.count(family)) problems.push_back("line " + std::to_string(n) + ": no TYPE for " + family);
    series.insert(family + "|seen");
    if (!series.insert(name + "{" + std::string(m[3]) + "}").second) {
      problems.push_back("line " + std::to_string(n) + ": the series twice: " + line);
    }
    enter(family, n);
    if (types[family] != "histogram") continue;
    Histogram& h = histograms[family];
    if (name == family + "_bucket") {
      if (std::isnan(le)) problems.push_back("line " + std::to_string(n) + ": a bucket without le");
      h.buckets[other_labels].push_back({le, value});
    } else if (name == family + "_count") {
      h.counts[other_labels] = value;
    } else if (name == family + "_sum") {
      h.sums.insert(other_labels);
    } else {
      problems.push_back("line " + std::to_string(n) + ": " + name + " in histogram " + family);
    }
  }
  for (const auto& [family, h] : histograms) {
    for (const auto& [labels, buckets] : h.buckets) {
      const std::string which = family + "{" + labels + "}";
      for (size_t i = 1; i < buckets.size(); ++i) {
        if (!(buckets[i].first > buckets[i - 1].first)) problems.push_back(which + ": le not increasing");
        if (buckets[i].second < buckets[i - 1].second) problems.push_back(which + ": buckets not cumulative");
      }
      if (buckets.empty() || !std::isinf(buckets.back().first)) problems.push_back(which + ": no +Inf bucket");
      if (!h.counts.count(labels)) {
        problems.push_back(which + ": no _count");
      } else if (!buckets.empty() && buckets.back().second != h.counts.at(labels)) {
        problems.push_back(which + ": the +Inf bucket is not _count");
      }
      if (!h.sums.count(labels)) problems.push_back(which + ": no _sum");
    }
  }
  return problems;
}

}  // namespace fusor::testing
