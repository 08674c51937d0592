#include "common/mapping/mapping.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fusor::mapping {
namespace {

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

bool Uses(const ir::Access& a, int loop) {
  for (const ir::AffineExpr& e : a.index) {
    if (e.DependsOn(loop)) return true;
  }
  return false;
}

std::vector<int> LoopsOf(const ir::Access& a) {
  std::set<int> loops;
  for (const ir::AffineExpr& e : a.index) {
    for (const auto& [d, c] : e.terms) loops.insert(d);
  }
  return {loops.begin(), loops.end()};
}

bool Subset(const std::vector<int>& a, const std::vector<int>& b) {
  return std::all_of(a.begin(), a.end(), [&](int x) { return Contains(b, x); });
}

bool Factors(const ir::Expr& e, double& scale, std::vector<ir::Access>& out) {
  switch (e.kind) {
    case ir::Expr::Kind::kMul: return Factors(e.args[0], scale, out) && Factors(e.args[1], scale, out);
    case ir::Expr::Kind::kConst: scale *= e.value; return true;
    case ir::Expr::Kind::kNeg: scale = -scale; return Factors(e.args[0], scale, out);
    case ir::Expr::Kind::kAccess: out.push_back(e.access); return true;
    default: return false;
  }
}

// The axis each mapped loop sits on, or -1.
int AxisOf(const Mapping& m, int loop) {
  for (int a = 0; a < 3; ++a) {
    if (Contains(m.axes[a], loop)) return a;
  }
  return -1;
}

// Checks one software tensor access against the intrinsic operand it feeds.
std::string CheckOperand(const ir::Chain& chain, const ir::Access& t, const hw::IntrinsicOperand& u,
                         const Mapping& m, const std::string& role, bool degenerate) {
  const std::string& name = chain.tensors[t.tensor].name;
  auto axis_name = [&](int a) { return m.intrinsic->axes[a].name; };
  // Rule 1: each dim of T moves with at most one intrinsic axis.
  for (size_t d = 0; d < t.index.size(); ++d) {
    std::set<int> moving;
    for (const auto& [l, c] : t.index[d].terms) {
      int a = AxisOf(m, l);
      if (a >= 0) moving.insert(a);
    }
    if (moving.size() > 1) {
      std::vector<std::string> axes;
      for (int a : moving) axes.push_back(axis_name(a));
      return absl::StrCat("dim ", d, " of ", name, " (", ir::AffineToString(t.index[d], chain),
                          ") moves with axes ", absl::StrJoin(axes, " and "), " at once");
    }
  }
  // Rules 2 and 3.
  for (int a = 0; a < 3; ++a) {
    const bool u_has = Contains(u.dims, a);
    for (int l : m.axes[a]) {
      const bool uses = Uses(t, l);
      if (u_has && !uses) {
        return absl::StrCat(name, " (", role, ") does not use loop ", chain.dims[l].name, " fused onto axis ",
                            axis_name(a));
      }
      if (!u_has && uses) {
        return absl::StrCat(name, " (", role, ") varies along loop ", chain.dims[l].name, " on axis ", axis_name(a),
                            ", which ", u.name, " does not have");
      }
    }
    const bool may_be_empty = degenerate && m.intrinsic->axes[a].kind == hw::AxisKind::kSpatial;
    if (u_has && m.axes[a].empty() && !may_be_empty) {
      return absl::StrCat("axis ", axis_name(a), " of ", u.name, " has no loop");
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<SoftwareOp> ViewOp(const ir::Chain& chain, int op_id) {
  const ir::Op& op = chain.ops[op_id];
  const std::string name = chain.tensors[op.output].name;
  if (op.kind != ir::OpKind::kSum) return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a sum"));
  SoftwareOp sw;
  sw.op = op_id;
  std::vector<ir::Access> factors;
  if (!Factors(op.body, sw.scale, factors) || factors.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a product of two or more tensors"));
  }
  sw.a_side = {factors[0]};
  sw.b_side = {factors[1]};
  const std::vector<int> a_loops = LoopsOf(factors[0]), b_loops = LoopsOf(factors[1]);
  for (size_t f = 2; f < factors.size(); ++f) {
    std::vector<int> loops = LoopsOf(factors[f]);
    if (Subset(loops, a_loops)) {
      sw.a_side.push_back(factors[f]);
    } else if (Subset(loops, b_loops)) {
      sw.b_side.push_back(factors[f]);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "': factor ", chain.tensors[factors[f].tensor].name,
                                                     " fits neither input of the intrinsic"));
    }
  }
  for (size_t d = 0; d < chain.dims.size(); ++d) {
    if (Contains(op.index, static_cast<int>(d))) sw.spatial.push_back(static_cast<int>(d));
    if (Contains(op.reduce, static_cast<int>(d))) sw.reduced.push_back(static_cast<int>(d));
  }
  return sw;
}

Verdict Validate(const ir::Chain& chain, const SoftwareOp& sw, const Mapping& m, bool degenerate) {
  Verdict v;
  const hw::Intrinsic& x = *m.intrinsic;
  const ir::Op& op = chain.ops[sw.op];
  std::set<int> seen;
  for (int a = 0; a < 3; ++a) {
    for (int l : m.axes[a]) {
      const bool spatial = Contains(sw.spatial, l);
      const bool reduced = Contains(sw.reduced, l);
      if (!spatial && !reduced) {
        v.reason = absl::StrCat("loop ", chain.dims[l].name, " is not a loop of the op");
        return v;
      }
      if ((x.axes[a].kind == hw::AxisKind::kSpatial) != spatial) {
        v.reason = absl::StrCat("loop ", chain.dims[l].name, " is ", spatial ? "spatial" : "reduced", " but axis ",
                                x.axes[a].name, " is not");
        return v;
      }
      if (!seen.insert(l).second) {
        v.reason = absl::StrCat("loop ", chain.dims[l].name, " is on two axes");
        return v;
      }
      v.fused[a] *= chain.dims[l].extent;
    }
  }
  const ir::Access out = ir::ResultAccess(op);
  std::string why;
  for (const ir::Access& f : m.swapped ? sw.b_side : sw.a_side) {
    if (why.empty()) why = CheckOperand(chain, f, x.inputs[0], m, "A", degenerate);
  }
  for (const ir::Access& f : m.swapped ? sw.a_side : sw.b_side) {
    if (why.empty()) why = CheckOperand(chain, f, x.inputs[1], m, "B", degenerate);
  }
  if (why.empty()) why = CheckOperand(chain, out, x.output, m, "C", degenerate);
  if (!why.empty()) {
    v.reason = why;
    return v;
  }
  v.valid = true;
  v.strict = true;
  for (int a = 0; a < 3; ++a) {
    const int64_t e = x.axes[a].extent;
    v.strict = v.strict && v.fused[a] >= e;
    v.padding *= static_cast<double>((v.fused[a] + e - 1) / e * e) / static_cast<double>(v.fused[a]);
  }
  return v;
}

std::vector<Mapping> KindCompatibleMatchings(const SoftwareOp& sw, const hw::Intrinsic& x) {
  std::vector<Mapping> out;
  auto pool = [&](int a) { return x.axes[a].kind == hw::AxisKind::kSpatial ? sw.spatial : sw.reduced; };
  for (int i : pool(0)) {
    for (int j : pool(1)) {
      if (j == i) continue;
      for (int k : pool(2)) {
        if (k == i || k == j) continue;
        Mapping m;
        m.intrinsic = &x;
        m.axes = {std::vector<int>{i}, std::vector<int>{j}, std::vector<int>{k}};
        out.push_back(m);
      }
    }
  }
  return out;
}

MappingSet GenerateMappings(const ir::Chain& chain, const SoftwareOp& sw, const hw::Intrinsic& x) {
  MappingSet set;
  std::vector<Mapping> kinds = KindCompatibleMatchings(sw, x);
  set.kind_compatible = static_cast<int>(kinds.size());
  for (const Mapping& m : kinds) {
    if (Validate(chain, sw, m).valid) set.basic.push_back(m);
  }
  // A union is determined by its loop set per axis; it is a union of basic
  // matchings when every loop on an axis takes part in a basic matching
  // whose other loops lie in the union too.
  std::array<std::vector<int>, 3> used;
  for (const Mapping& m : set.basic) {
    for (int a = 0; a < 3; ++a) {
      if (!Contains(used[a], m.axes[a][0])) used[a].push_back(m.axes[a][0]);
    }
  }
  for (auto& u : used) std::sort(u.begin(), u.end());
  auto subsets = [](const std::vector<int>& v) {
    std::vector<std::vector<int>> out;
    for (uint32_t mask = 1; mask < (1u << v.size()); ++mask) {
      std::vector<int> s;
      for (size_t b = 0; b < v.size(); ++b) {
        if (mask & (1u << b)) s.push_back(v[b]);
      }
      out.push_back(s);
    }
    return out;
  };
  for (const auto& si : subsets(used[0])) {
    for (const auto& sj : subsets(used[1])) {
      for (const auto& sk : subsets(used[2])) {
        const std::array<std::vector<int>, 3> sets = {si, sj, sk};
        bool covered = true;
        for (int a = 0; a < 3 && covered; ++a) {
          for (int l : sets[a]) {
            bool found = false;
            for (const Mapping& b : set.basic) {
              found = found || (b.axes[a][0] == l && Contains(sets[0], b.axes[0][0]) &&
                                Contains(sets[1], b.axes[1][0]) && Contains(sets[2], b.axes[2][0]));
            }
            covered = covered && found;
          }
        }
        if (!covered) continue;
        Mapping m;
        m.intrinsic = &x;
        m.axes = sets;
        set.mappings.push_back(m);
      }
    }
  }
  return set;
}

MappingCounts CountMappings(const ir::Chain& chain, const SoftwareOp& sw, const hw::Intrinsic& intrinsic) {
  MappingSet set = GenerateMappings(chain, sw, intrinsic);
  MappingCounts c;
  c.kind_compatible = set.kind_compatible;
  c.basic = static_cast<int>(set.basic.size());
  c.mappings = static_cast<int>(set.mappings.size());
  for (const Mapping& m : set.mappings) {
    Verdict v = Validate(chain, sw, m);
    c.valid += v.valid;
    c.strict += v.strict;
  }
  return c;
}

namespace {

// The classic GEMM view of `sw` with `a` feeding A and `b` feeding B.
Mapping Classic(const ir::Chain& chain, const SoftwareOp& sw, const hw::Intrinsic& x, bool swapped) {
  const std::vector<ir::Access>& a = swapped ? sw.b_side : sw.a_side;
  const std::vector<ir::Access>& b = swapped ? sw.a_side : sw.b_side;
  auto uses = [](const std::vector<ir::Access>& side, int l) {
    return std::any_of(side.begin(), side.end(), [&](const ir::Access& t) { return Uses(t, l); });
  };
  Mapping m;
  m.intrinsic = &x;
  m.swapped = swapped;
  for (int l : sw.spatial) {
    const bool in_a = uses(a, l), in_b = uses(b, l);
    if (in_a && !in_b) m.axes[0].push_back(l);
    if (in_b && !in_a) m.axes[1].push_back(l);
  }
  for (int l : sw.reduced) {
    if (uses(a, l) && uses(b, l)) m.axes[2].push_back(l);
  }
  // Reduced loops sharing a dim with a mapped spatial loop would break rule 1.
  std::vector<ir::Access> all = a;
  all.insert(all.end(), b.begin(), b.end());
  for (const ir::Access& t : all) {
    for (const ir::AffineExpr& e : t.index) {
      bool spatial_mapped = false;
      for (const auto& [l, c] : e.terms) spatial_mapped = spatial_mapped || Contains(m.axes[0], l) || Contains(m.axes[1], l);
      if (!spatial_mapped) continue;
      for (const auto& [l, c] : e.terms) std::erase(m.axes[2], l);
    }
  }
  return m;
}

}  // namespace

std::optional<Mapping> DefaultMapping(const ir::Chain& chain, const SoftwareOp& sw, const hw::Intrinsic& x) {
  // The orientation that puts the result's last (adjacent) dim on the
  // columns, whatever the order of the factors: the result is stored a
  // row of columns at a time, and a chain written with its factors the
  // other way round (as the canonical form may be) gets the same mapping.
  // Trailing dims of extent 1 (a batch of one written last) are not the
  // adjacent one.
  const std::vector<int>& index = chain.ops[sw.op].index;
  int last = index.empty() ? -1 : index.back();
  for (auto d = index.rbegin(); d != index.rend(); ++d) {
    if (chain.dims[*d].extent > 1) {
      last = *d;
      break;
    }
  }
  std::optional<Mapping> valid;
  for (bool swapped : {false, true}) {
    Mapping m = Classic(chain, sw, x, swapped);
    if (!Validate(chain, sw, m).valid) continue;
    if (Contains(m.axes[1], last)) return m;
    if (!valid) valid = m;
  }
  if (valid) return valid;
  // Degenerate: keep whichever orientation pads less.
  std::optional<Mapping> best;
  double best_padding = 0;
  for (bool swapped : {false, true}) {
    Mapping d = Classic(chain, sw, x, swapped);
    Verdict v = Validate(chain, sw, d, /*degenerate=*/true);
    if (v.valid && (!best || v.padding < best_padding)) {
      best = d;
      best_padding = v.padding;
    }
  }
  return best;
}

std::string MappingToText(const Mapping& m, const ir::Chain& chain) {
  std::vector<std::string> parts;
  for (int a = 0; a < 3; ++a) {
    std::vector<std::string> names;
    for (int l : m.axes[a]) names.push_back(chain.dims[l].name);
    parts.push_back(absl::StrCat(m.intrinsic->axes[a].name, "=", names.empty() ? "-" : absl::StrJoin(names, ".")));
  }
  if (m.swapped) parts.push_back("swap");
  return absl::StrCat(m.intrinsic->name, "[", absl::StrJoin(parts, " "), "]");
}

absl::StatusOr<Mapping> ParseMapping(absl::string_view text, const ir::Chain& chain) {
  text = absl::StripAsciiWhitespace(text);
  size_t open = text.find('[');
  if (open == absl::string_view::npos || text.back() != ']') {
    return absl::InvalidArgumentError(absl::StrCat("mapping '", text, "': expected INTRINSIC[i=... j=... k=...]"));
  }
  Mapping m;
  m.intrinsic = hw::FindIntrinsic(text.substr(0, open));
  if (m.intrinsic == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("mapping: unknown intrinsic '", text.substr(0, open), "'"));
  }
  for (absl::string_view part : absl::StrSplit(text.substr(open + 1, text.size() - open - 2), ' ', absl::SkipEmpty())) {
    if (part == "swap") {
      m.swapped = true;
      continue;
    }
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    int a = -1;
    for (int x = 0; x < 3; ++x) {
      if (m.intrinsic->axes[x].name == kv.first) a = x;
    }
    if (a < 0) return absl::InvalidArgumentError(absl::StrCat("mapping: unknown axis '", kv.first, "'"));
    if (kv.second == "-") continue;
    for (absl::string_view name : absl::StrSplit(kv.second, '.')) {
      int d = chain.FindDim(name);
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("mapping: unknown dim '", name, "'"));
      m.axes[a].push_back(d);
    }
    std::sort(m.axes[a].begin(), m.axes[a].end());
  }
  return m;
}

}  // namespace fusor::mapping
