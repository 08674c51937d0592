#include "common/space/split.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "common/util/status_macros.h"

namespace fusor::space {
namespace {

bool HasPrefix(absl::string_view text, absl::string_view prefix) {
  return text.size() > prefix.size() && text.substr(0, prefix.size()) == prefix;
}

// The chain text of `ops` of `chain`, reading `inputs` and writing `outputs`
// (tensor ids of `chain`).
std::string PartText(const ir::Chain& chain, const std::string& name, const std::vector<int>& ops,
                     const std::vector<int>& inputs, const std::vector<int>& outputs) {
  std::set<int> dims;
  auto use_tensor = [&](int t) {
    for (int d : chain.tensors[t].axis_dims) {
      if (d >= 0) dims.insert(d);
    }
  };
  for (int t : inputs) use_tensor(t);
  for (int o : ops) {
    const ir::Op& op = chain.ops[o];
    use_tensor(op.output);
    dims.insert(op.index.begin(), op.index.end());
    dims.insert(op.reduce.begin(), op.reduce.end());
    if (op.axis >= 0) dims.insert(op.axis);
    ir::ForEachAccess(op.body, [&](const ir::Access& a) {
      for (const ir::AffineExpr& e : a.index) {
        for (const auto& [d, c] : e.terms) dims.insert(d);
      }
    });
  }
  return ir::ChainToText(chain, name, std::vector<int>(dims.begin(), dims.end()), ops, inputs, outputs);
}

}  // namespace

std::string UnfusedVendor(absl::string_view text) {
  return HasPrefix(text, kUnfusedPrefix) ? std::string(text.substr(sizeof(kUnfusedPrefix) - 1)) : "";
}

bool IsSplitText(absl::string_view text) { return HasPrefix(text, kSplitPrefix); }

absl::StatusOr<ChainParts> SplitChain(const ir::Chain& chain, int boundary) {
  if (boundary < 0 || boundary >= static_cast<int>(chain.tensors.size()) || chain.tensors[boundary].producer < 0) {
    return absl::InvalidArgumentError("a chain splits only after a tensor one of its ops computes");
  }
  // The head: the boundary's producer and every op it depends on.
  std::vector<bool> in_head(chain.ops.size(), false);
  in_head[chain.tensors[boundary].producer] = true;
  for (int o = static_cast<int>(chain.ops.size()) - 1; o >= 0; --o) {
    if (!in_head[o]) continue;
    for (int t : ir::TensorsRead(chain.ops[o])) {
      if (chain.tensors[t].producer >= 0) in_head[chain.tensors[t].producer] = true;
    }
  }
  std::array<std::vector<int>, 2> ops;
  for (size_t o = 0; o < chain.ops.size(); ++o) ops[in_head[o] ? 0 : 1].push_back(static_cast<int>(o));
  if (ops[1].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nothing of chain '", chain.name, "' is left after '", chain.tensors[boundary].name, "'"));
  }
  // What each part reads from outside itself, and what it must write.
  std::array<std::set<int>, 2> reads;
  for (int p = 0; p < 2; ++p) {
    for (int o : ops[p]) {
      for (int t : ir::TensorsRead(chain.ops[o])) {
        const int producer = chain.tensors[t].producer;
        if (producer < 0 || in_head[producer] != (p == 0)) reads[p].insert(t);
      }
    }
  }
  ChainParts out;
  std::array<std::vector<int>, 2> outputs;
  for (int p = 0; p < 2; ++p) {
    for (int o : ops[p]) {
      const int t = chain.ops[o].output;
      const bool chain_output = chain.tensors[t].role == ir::TensorRole::kOutput;
      const bool handed_on = p == 0 && reads[1].count(t) > 0;
      if (chain_output || handed_on) outputs[p].push_back(t);
      if (handed_on && !chain_output) out.handed_on.push_back(chain.tensors[t].name);
    }
  }
  for (int p = 0; p < 2; ++p) {
    const std::vector<int> inputs(reads[p].begin(), reads[p].end());
    const std::string name = absl::StrCat(chain.name, p == 0 ? "_head" : "_tail");
    absl::StatusOr<ir::Chain> part = ir::ParseChainText(PartText(chain, name, ops[p], inputs, outputs[p]));
    if (!part.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("chain '", chain.name, "' does not split after '",
                                                     chain.tensors[boundary].name, "': ", part.status().message()));
    }
    out.parts[p] = std::move(*part);
  }
  return out;
}

std::vector<int> SplitPoints(const ir::Chain& chain) {
  std::vector<int> out;
  if (!chain.RangedDims().empty()) return out;  // a ranged chain's kernels run fused, at any size
  for (const ir::Op& op : chain.ops) {
    if (chain.tensors[op.output].role != ir::TensorRole::kIntermediate) continue;
    absl::StatusOr<ChainParts> parts = SplitChain(chain, op.output);
    if (!parts.ok()) continue;
    bool sums = true;
    for (const ir::Chain& part : parts->parts) {
      sums = sums && std::any_of(part.ops.begin(), part.ops.end(),
                                 [](const ir::Op& o) { return o.kind == ir::OpKind::kSum; });
    }
    if (sums) out.push_back(op.output);
  }
  return out;
}

absl::StatusOr<Schedule> ProjectSchedule(const Schedule& schedule, const ir::Chain& chain, const ir::Chain& part) {
  if (!schedule.regroup.empty()) return absl::InvalidArgumentError("a regrouped schedule does not split");
  Schedule out = UntiledSchedule(part);
  std::vector<int> dim(chain.dims.size());
  for (size_t d = 0; d < chain.dims.size(); ++d) {
    dim[d] = part.FindDim(chain.dims[d].name);
    if (dim[d] >= 0) out.tile[dim[d]] = schedule.tile[d];
  }
  for (int d : schedule.block) {
    if (dim[d] >= 0) out.block.push_back(dim[d]);
  }
  for (int d : schedule.stream) {
    if (dim[d] >= 0) out.stream.push_back(dim[d]);
  }
  out.split = out.stream.empty() ? 1 : schedule.split;
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    const int t = part.FindTensor(chain.tensors[chain.ops[o].output].name);
    const int op = t >= 0 ? part.tensors[t].producer : -1;
    if (op < 0) continue;
    for (int d : schedule.own[o]) {
      if (dim[d] >= 0) out.own[op].push_back(dim[d]);
    }
    mapping::Mapping m = schedule.maps[o];
    bool whole = true;
    for (auto& loops : m.axes) {
      for (int& d : loops) {
        whole = whole && dim[d] >= 0;
        d = dim[d];
      }
      std::sort(loops.begin(), loops.end());
    }
    if (whole) out.maps[op] = m;
  }
  // A stream loop encloses two ops or more: a part of one op runs the
  // loop's dims as its own innermost loops, or over blocks.
  if (part.ops.size() == 1 && !out.stream.empty()) {
    const ir::Op& op = part.ops[0];
    for (int d : out.stream) {
      if (std::find(op.reduce.begin(), op.reduce.end(), d) != op.reduce.end()) {
        out.own[0].push_back(d);
      } else {
        out.block.push_back(d);
      }
    }
    std::sort(out.block.begin(), out.block.end());
    out.stream.clear();
    out.split = 1;
  }
  out.warps = schedule.warps;
  out.stages = schedule.stages;
  out.registers = schedule.registers;
  return Canonical(out, part);
}

absl::StatusOr<SplitWords> ReadSplitWords(absl::string_view text) {
  if (!IsSplitText(text)) return absl::InvalidArgumentError(absl::StrCat("not a split: '", text, "'"));
  absl::string_view rest = text.substr(sizeof(kSplitPrefix) - 1);
  const size_t colon = rest.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("split '", text, "': expected 'split after TENSOR: HEAD | TAIL'"));
  }
  const std::vector<absl::string_view> texts = absl::StrSplit(rest.substr(colon + 1), '|');
  if (texts.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("split '", text, "': expected two parts separated by '|'"));
  }
  SplitWords words;
  words.tensor = std::string(absl::StripAsciiWhitespace(rest.substr(0, colon)));
  for (int p = 0; p < 2; ++p) words.texts[p] = std::string(absl::StripAsciiWhitespace(texts[p]));
  return words;
}

absl::StatusOr<SplitSchedule> ParseSplit(absl::string_view text, const ir::Chain& chain) {
  ASSIGN_OR_RETURN(SplitWords words, ReadSplitWords(text));
  SplitSchedule s;
  s.boundary = chain.FindTensor(words.tensor);
  if (s.boundary < 0) return absl::InvalidArgumentError(absl::StrCat("split: chain has no tensor '", words.tensor, "'"));
  absl::StatusOr<ChainParts> parts = SplitChain(chain, s.boundary);
  if (!parts.ok()) return parts.status();
  s.chains = std::move(*parts);
  s.texts = std::move(words.texts);
  for (int p = 0; p < 2; ++p) {
    if (!UnfusedVendor(s.texts[p]).empty()) continue;
    absl::StatusOr<Schedule> schedule = ParseSchedule(s.texts[p], s.chains.parts[p]);
    if (!schedule.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("split '", text, "', ", p == 0 ? "head" : "tail", ": ",
                                                     schedule.status().message()));
    }
  }
  return s;
}

std::string SplitToText(const ir::Chain& chain, int boundary, const std::array<std::string, 2>& texts) {
  return absl::StrCat(kSplitPrefix, chain.tensors[boundary].name, ": ", texts[0], " | ", texts[1]);
}

std::string SplitMappings(const SplitSchedule& split, const hw::TargetDesc& target) {
  std::array<std::string, 2> out;
  for (int p = 0; p < 2; ++p) {
    out[p] = split.texts[p];
    if (!UnfusedVendor(split.texts[p]).empty()) continue;
    absl::StatusOr<Schedule> schedule = ParseSchedule(split.texts[p], split.chains.parts[p]);
    if (!schedule.ok()) continue;
    absl::StatusOr<LoopNest> nest = BuildLoopNest(split.chains.parts[p], *schedule, target);
    if (nest.ok()) out[p] = DescribeMappings(split.chains.parts[p], *nest);
  }
  return absl::StrCat(out[0], " | ", out[1]);
}

}  // namespace fusor::space
