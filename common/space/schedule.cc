#include "common/space/schedule.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fusor::space {

Schedule UntiledSchedule(const ir::Chain& chain) {
  Schedule s;
  for (const ir::Dim& d : chain.dims) s.tile.push_back(d.extent);
  return s;
}

std::string ScheduleToText(const Schedule& schedule, const ir::Chain& chain) {
  std::vector<std::string> block;
  for (int d : schedule.block_dims) {
    block.push_back(absl::StrCat(chain.dims[d].name, "=", schedule.tile[d]));
  }
  std::string out = absl::StrCat("block[", absl::StrJoin(block, ","), "]");
  for (size_t d = 0; d < chain.dims.size(); ++d) {
    bool is_block = std::find(schedule.block_dims.begin(), schedule.block_dims.end(),
                              static_cast<int>(d)) != schedule.block_dims.end();
    if (!is_block && schedule.tile[d] != chain.dims[d].extent) {
      absl::StrAppend(&out, " ", chain.dims[d].name, "=", schedule.tile[d]);
    }
  }
  return out;
}

namespace {

// Parses "name=tile" into `s`; `seen` guards against a dim named twice.
absl::StatusOr<int> ParseEntry(absl::string_view entry, const ir::Chain& chain, Schedule& s,
                               std::vector<bool>& seen) {
  std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
  absl::string_view name = absl::StripAsciiWhitespace(kv.first);
  int dim = chain.FindDim(name);
  if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("schedule: unknown dim '", name, "'"));
  if (seen[dim]) return absl::InvalidArgumentError(absl::StrCat("schedule: dim '", name, "' appears twice"));
  seen[dim] = true;
  int64_t tile = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(kv.second), &tile) || tile < 1 ||
      tile > chain.dims[dim].extent) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: tile of '", name, "' must be an integer in [1, ",
                     chain.dims[dim].extent, "], got '", kv.second, "'"));
  }
  s.tile[dim] = tile;
  return dim;
}

}  // namespace

absl::StatusOr<Schedule> ParseSchedule(absl::string_view text, const ir::Chain& chain) {
  Schedule s = UntiledSchedule(chain);
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  if (!absl::ConsumePrefix(&rest, "block[")) {
    return absl::InvalidArgumentError("schedule: expected 'block[' at the start");
  }
  size_t close = rest.find(']');
  if (close == absl::string_view::npos) return absl::InvalidArgumentError("schedule: missing ']'");
  absl::string_view block = rest.substr(0, close);
  rest = rest.substr(close + 1);
  std::vector<bool> seen(chain.dims.size(), false);
  for (absl::string_view entry : absl::StrSplit(block, ',', absl::SkipWhitespace())) {
    auto dim = ParseEntry(entry, chain, s, seen);
    if (!dim.ok()) return dim.status();
    s.block_dims.push_back(*dim);
  }
  for (absl::string_view entry : absl::StrSplit(rest, ' ', absl::SkipWhitespace())) {
    auto dim = ParseEntry(entry, chain, s, seen);
    if (!dim.ok()) return dim.status();
  }
  return s;
}

Schedule RemapSchedule(const Schedule& schedule, const std::vector<int>& dim_map,
                       const ir::Chain& to) {
  Schedule out = UntiledSchedule(to);
  for (size_t d = 0; d < dim_map.size() && d < schedule.tile.size(); ++d) {
    if (dim_map[d] >= 0) out.tile[dim_map[d]] = schedule.tile[d];
  }
  for (int d : schedule.block_dims) out.block_dims.push_back(dim_map[d]);
  return out;
}

}  // namespace fusor::space
