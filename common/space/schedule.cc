#include "common/space/schedule.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/util/status_macros.h"

namespace fusor::space {
namespace {

absl::Status Error(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("schedule: ", message));
}

std::string Entries(const std::vector<int>& dims, const Schedule& s, const ir::Chain& chain) {
  std::vector<std::string> parts;
  for (int d : dims) parts.push_back(absl::StrCat(chain.dims[d].name, "=", s.tile[d]));
  return absl::StrJoin(parts, " ");
}

// Reads "name=tile" entries into `dims`, recording each dim's tile; with
// `split`, "name=tilexN" too (N into *split).
absl::Status ParseEntries(absl::string_view text, const ir::Chain& chain, Schedule& s,
                          std::vector<bool>& tile_set, std::vector<int>& dims, int* split = nullptr) {
  for (absl::string_view entry : absl::StrSplit(text, ' ', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    int d = chain.FindDim(kv.first);
    if (d < 0) return Error(absl::StrCat("unknown dim '", kv.first, "'"));
    if (const size_t x = kv.second.find('x'); x != absl::string_view::npos) {
      int parts = 0;
      if (split == nullptr || !absl::SimpleAtoi(kv.second.substr(x + 1), &parts) || parts < 1 || parts > 64) {
        return Error(absl::StrCat("'", entry, "': only the stream loop splits, as dim=TILExN with N in [1, 64]"));
      }
      *split = parts;
      kv.second = kv.second.substr(0, x);
    }
    int64_t tile = 0;
    if (!absl::SimpleAtoi(kv.second, &tile) || tile < 1 || tile > chain.dims[d].extent) {
      return Error(absl::StrCat("tile of '", kv.first, "' must be an integer in [1, ", chain.dims[d].extent,
                                "], got '", kv.second, "'"));
    }
    if (tile_set[d] && s.tile[d] != tile) {
      return Error(absl::StrCat("dim '", kv.first, "' has two tile sizes (", s.tile[d], " and ", tile, ")"));
    }
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      return Error(absl::StrCat("dim '", kv.first, "' appears twice in one loop list"));
    }
    s.tile[d] = tile;
    tile_set[d] = true;
    dims.push_back(d);
  }
  return absl::OkStatus();
}

// " warps=W stages=S registers" (each optional) into `s`.
absl::StatusOr<Schedule> ParseLaunch(absl::string_view text, Schedule s) {
  for (absl::string_view entry : absl::StrSplit(text, ' ', absl::SkipWhitespace())) {
    if (entry == "registers") {
      s.registers = true;
      continue;
    }
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    int value = 0;
    if (kv.first == "warps") {
      if (!absl::SimpleAtoi(kv.second, &value) || (value != 1 && value != 2 && value != 4 && value != 8 && value != 16)) {
        return Error(absl::StrCat("warps must be 1, 2, 4, 8 or 16, got '", kv.second, "'"));
      }
      s.warps = value;
    } else if (kv.first == "stages") {
      if (!absl::SimpleAtoi(kv.second, &value) || value < 1 || value > 3) {
        return Error(absl::StrCat("stages must be 1, 2 or 3, got '", kv.second, "'"));
      }
      s.stages = value;
    } else {
      return Error(absl::StrCat("unknown launch setting '", entry, "' (warps=W, stages=S, registers)"));
    }
  }
  return s;
}

}  // namespace

Schedule UntiledSchedule(const ir::Chain& chain) {
  Schedule s;
  for (const ir::Dim& d : chain.dims) s.tile.push_back(d.extent);
  s.own.resize(chain.ops.size());
  s.maps.resize(chain.ops.size());
  return s;
}

Schedule Canonical(const Schedule& schedule, const ir::Chain& chain) {
  Schedule s = schedule;
  auto one_trip = [&](int d) { return s.tile[d] >= chain.dims[d].extent; };
  std::erase_if(s.block, one_trip);
  std::sort(s.block.begin(), s.block.end());
  std::erase_if(s.stream, one_trip);
  if (s.stream.empty()) s.split = 1;
  s.own.resize(chain.ops.size());
  s.maps.resize(chain.ops.size());
  for (auto& loops : s.own) std::erase_if(loops, one_trip);
  if (s.warps == kDefaultWarps) s.warps = 0;
  if (s.stages == kDefaultStages) s.stages = 0;
  // A tile nobody loops over is the full extent.
  std::vector<bool> used(chain.dims.size(), false);
  for (int d : s.block) used[d] = true;
  for (int d : s.stream) used[d] = true;
  for (const auto& loops : s.own) {
    for (int d : loops) used[d] = true;
  }
  for (size_t d = 0; d < chain.dims.size(); ++d) {
    if (!used[d]) s.tile[d] = chain.dims[d].extent;
  }
  return s;
}

absl::StatusOr<ir::Chain> ScheduledChain(const ir::Chain& chain, const Schedule& schedule) {
  if (schedule.regroup.empty()) return chain;
  return ir::ApplyRegroup(chain, schedule.regroup);
}

std::string ScheduleToText(const Schedule& schedule, const ir::Chain& chain) {
  if (!schedule.regroup.empty()) {
    absl::StatusOr<ir::Chain> regrouped = ir::ApplyRegroup(chain, schedule.regroup);
    Schedule rest = schedule;
    rest.regroup = {};
    return absl::StrCat("{", ir::RegroupToText(chain, schedule.regroup), "} ",
                        regrouped.ok() ? ScheduleToText(rest, *regrouped) : "?");
  }
  Schedule s = Canonical(schedule, chain);
  std::string block = s.block.empty() ? "-" : Entries(s.block, s, chain);
  std::string stream = s.stream.empty() ? "-" : Entries(s.stream, s, chain);
  if (s.split > 1) absl::StrAppend(&stream, "x", s.split);
  std::vector<std::string> own;
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    if (s.own[o].empty()) continue;
    own.push_back(absl::StrCat(chain.tensors[chain.ops[o].output].name, "(", Entries(s.own[o], s, chain), ")"));
  }
  std::string out = absl::StrCat(block, " / ", stream, " / ", own.empty() ? "-" : absl::StrJoin(own, " "));
  std::vector<std::string> maps;
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    if (s.maps[o].intrinsic == nullptr) continue;
    maps.push_back(absl::StrCat(chain.tensors[chain.ops[o].output].name, "=", mapping::MappingToText(s.maps[o], chain)));
  }
  if (!maps.empty()) absl::StrAppend(&out, " / ", absl::StrJoin(maps, " "));
  if (s.warps > 0 || s.stages > 0 || s.registers) {
    absl::StrAppend(&out, " / cuda", s.warps > 0 ? absl::StrCat(" warps=", s.warps) : "",
                    s.stages > 0 ? absl::StrCat(" stages=", s.stages) : "", s.registers ? " registers" : "");
  }
  return out;
}

std::string TilingExpression(const Schedule& schedule, const ir::Chain& chain) {
  Schedule s = Canonical(schedule, chain);
  bool short_names = std::all_of(chain.dims.begin(), chain.dims.end(), [](const ir::Dim& d) { return d.name.size() == 1; });
  const char* sep = short_names ? "" : " ";
  auto names = [&](const std::vector<int>& dims) {
    std::vector<std::string> n;
    for (int d : dims) n.push_back(chain.dims[d].name);
    return absl::StrJoin(n, sep);
  };
  std::vector<int> deep = s.block;
  deep.insert(deep.end(), s.stream.begin(), s.stream.end());
  std::vector<std::string> groups;
  for (const auto& loops : s.own) {
    if (!loops.empty()) groups.push_back(names(loops));
  }
  std::string out = names(deep);
  if (groups.size() == 1) absl::StrAppend(&out, sep, groups[0]);
  if (groups.size() > 1) absl::StrAppend(&out, "(", absl::StrJoin(groups, ","), ")");
  return out.empty() ? "-" : out;
}

absl::StatusOr<Schedule> ParseSchedule(absl::string_view text, const ir::Chain& chain) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::StartsWith(text, "{")) {
    const size_t close = text.find('}');
    if (close == absl::string_view::npos) return Error("a regrouping '{OUT=X*(Y*Z)}' lacks its '}'");
    ASSIGN_OR_RETURN(ir::Regroup regroup, ir::ParseRegroup(text.substr(1, close - 1), chain));
    ASSIGN_OR_RETURN(ir::Chain regrouped, ir::ApplyRegroup(chain, regroup));
    ASSIGN_OR_RETURN(Schedule s, ParseSchedule(text.substr(close + 1), regrouped));
    s.regroup = regroup;
    return s;
  }
  Schedule s = UntiledSchedule(chain);
  std::vector<absl::string_view> parts = absl::StrSplit(text, '/');
  if (const absl::string_view last = absl::StripAsciiWhitespace(parts.back());
      parts.size() > 3 && (last == "cuda" || absl::StartsWith(last, "cuda "))) {
    ASSIGN_OR_RETURN(s, ParseLaunch(last.substr(4), std::move(s)));
    parts.pop_back();
  }
  if (parts.size() != 3 && parts.size() != 4) {
    return Error("expected 'BLOCK / STREAM / OWN [/ MAPPINGS] [/ cuda warps=W stages=S registers]' (use - for an empty level)");
  }
  std::vector<bool> tile_set(chain.dims.size(), false);
  auto level = [](absl::string_view p) {
    p = absl::StripAsciiWhitespace(p);
    return p == "-" ? absl::string_view() : p;
  };
  absl::Status st = ParseEntries(level(parts[0]), chain, s, tile_set, s.block);
  if (!st.ok()) return st;
  st = ParseEntries(level(parts[1]), chain, s, tile_set, s.stream, &s.split);
  if (!st.ok()) return st;
  absl::string_view own = level(parts[2]);
  while (!own.empty()) {
    size_t open = own.find('(');
    size_t close = own.find(')');
    if (open == absl::string_view::npos || close == absl::string_view::npos || close < open) {
      return Error(absl::StrCat("expected OP(dim=tile ...) in '", own, "'"));
    }
    absl::string_view name = absl::StripAsciiWhitespace(own.substr(0, open));
    int t = chain.FindTensor(name);
    if (t < 0 || chain.tensors[t].producer < 0) return Error(absl::StrCat("'", name, "' is not the result of an op"));
    int op = chain.tensors[t].producer;
    if (!s.own[op].empty()) return Error(absl::StrCat("loops of '", name, "' given twice"));
    st = ParseEntries(own.substr(open + 1, close - open - 1), chain, s, tile_set, s.own[op]);
    if (!st.ok()) return st;
    own = absl::StripAsciiWhitespace(own.substr(close + 1));
  }
  if (parts.size() == 4) {
    // OP=INTRINSIC[i=... j=... k=...], separated by spaces.
    absl::string_view rest = absl::StripAsciiWhitespace(parts[3]);
    while (!rest.empty()) {
      const size_t eq = rest.find('='), close = rest.find(']');
      if (eq == absl::string_view::npos || close == absl::string_view::npos || close < eq) {
        return Error(absl::StrCat("expected OP=INTRINSIC[...] in '", rest, "'"));
      }
      absl::string_view name = absl::StripAsciiWhitespace(rest.substr(0, eq));
      int t = chain.FindTensor(name);
      if (t < 0 || chain.tensors[t].producer < 0) return Error(absl::StrCat("'", name, "' is not the result of an op"));
      auto m = mapping::ParseMapping(rest.substr(eq + 1, close - eq), chain);
      if (!m.ok()) return m.status();
      s.maps[chain.tensors[t].producer] = *m;
      rest = absl::StripAsciiWhitespace(rest.substr(close + 1));
    }
  }
  for (int d : s.block) {
    if (std::find(s.stream.begin(), s.stream.end(), d) != s.stream.end()) {
      return Error(absl::StrCat("dim '", chain.dims[d].name, "' is both a block and a stream loop"));
    }
  }
  return s;
}

Schedule RemapSchedule(const Schedule& schedule, const std::vector<int>& dim_map, const std::vector<int>& op_map,
                       const ir::Chain& to, const std::vector<int>& tensor_map) {
  Schedule out = UntiledSchedule(to);
  if (!schedule.regroup.empty()) {
    out.regroup.consumer = op_map[schedule.regroup.consumer];
    for (int t : schedule.regroup.first) out.regroup.first.push_back(tensor_map.empty() ? t : tensor_map[t]);
  }
  for (size_t d = 0; d < dim_map.size() && d < schedule.tile.size(); ++d) {
    if (dim_map[d] >= 0) out.tile[dim_map[d]] = schedule.tile[d];
  }
  for (int d : schedule.block) out.block.push_back(dim_map[d]);
  std::sort(out.block.begin(), out.block.end());
  for (int d : schedule.stream) out.stream.push_back(dim_map[d]);
  for (size_t o = 0; o < schedule.own.size() && o < op_map.size(); ++o) {
    for (int d : schedule.own[o]) out.own[op_map[o]].push_back(dim_map[d]);
  }
  for (size_t o = 0; o < schedule.maps.size() && o < op_map.size(); ++o) {
    mapping::Mapping m = schedule.maps[o];
    for (auto& loops : m.axes) {
      for (int& d : loops) d = dim_map[d];
      std::sort(loops.begin(), loops.end());
    }
    out.maps[op_map[o]] = m;
  }
  out.split = schedule.split;
  out.warps = schedule.warps;
  out.stages = schedule.stages;
  out.registers = schedule.registers;
  return out;
}

}  // namespace fusor::space
