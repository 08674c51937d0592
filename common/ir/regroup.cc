#include "common/ir/regroup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fusor::ir {
namespace {

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// A body that is a product of accesses and constants.
bool AsProduct(const Expr& e, double& scale, std::vector<Access>& factors) {
  switch (e.kind) {
    case Expr::Kind::kMul: return AsProduct(e.args[0], scale, factors) && AsProduct(e.args[1], scale, factors);
    case Expr::Kind::kConst: scale *= e.value; return true;
    case Expr::Kind::kNeg: scale = -scale; return AsProduct(e.args[0], scale, factors);
    case Expr::Kind::kAccess: factors.push_back(e.access); return true;
    default: return false;
  }
}

// The dims an access depends on, in order of appearance.
std::vector<int> DimsOf(const Access& a) {
  std::vector<int> dims;
  for (const AffineExpr& e : a.index) {
    for (const auto& [d, c] : e.terms) {
      if (!Contains(dims, d)) dims.push_back(d);
    }
  }
  return dims;
}

// A producer/consumer pair of sums that regrouping applies to.
struct Pair {
  int producer = -1, consumer = -1;
  double scale = 1;               // both sums' constants
  std::vector<Access> factors;    // the producer's two, then the consumer's other one
};

// Every such pair of `chain`, in the consumer's op order.
std::vector<Pair> Pairs(const Chain& chain) {
  std::vector<Pair> out;
  for (size_t q = 0; q < chain.ops.size(); ++q) {
    const Op& consumer = chain.ops[q];
    if (consumer.kind != OpKind::kSum) continue;
    double sq = 1;
    std::vector<Access> qf;
    if (!AsProduct(consumer.body, sq, qf) || qf.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const Access& c = qf[side];
      const Tensor& ct = chain.tensors[c.tensor];
      if (ct.producer < 0 || ct.role == TensorRole::kOutput) continue;
      const Op& producer = chain.ops[ct.producer];
      if (producer.kind != OpKind::kSum) continue;
      // Read at the point it was produced, and nowhere else.
      bool plain = c.index.size() == producer.index.size();
      for (size_t i = 0; plain && i < c.index.size(); ++i) plain = c.index[i] == AffineExpr::OfDim(producer.index[i]);
      int reads = 0;
      for (const Op& op : chain.ops) ForEachAccess(op.body, [&](const Access& a) { reads += a.tensor == c.tensor; });
      if (!plain || reads != 1) continue;
      Pair p;
      p.producer = ct.producer;
      p.consumer = static_cast<int>(q);
      p.scale = sq;
      if (!AsProduct(producer.body, p.scale, p.factors) || p.factors.size() != 2) continue;
      p.factors.push_back(qf[1 - side]);
      std::vector<int> tensors;
      for (const Access& a : p.factors) tensors.push_back(a.tensor);
      std::sort(tensors.begin(), tensors.end());
      if (std::adjacent_find(tensors.begin(), tensors.end()) != tensors.end()) continue;
      out.push_back(p);
    }
  }
  return out;
}

struct Plan {
  std::vector<int> t_dims, inner_reduce, outer_reduce;
};

// How `pair` regroups with factors `a` and `b` (indices into pair.factors)
// contracted first; false when it does not.
bool PlanOf(const Chain& chain, const Pair& pair, int a, int b, Plan& plan) {
  const int c = 3 - a - b;
  const Op& consumer = chain.ops[pair.consumer];
  const std::vector<int> dc = DimsOf(pair.factors[c]);
  std::vector<int> grouped = DimsOf(pair.factors[a]);
  for (int d : DimsOf(pair.factors[b])) {
    if (!Contains(grouped, d)) grouped.push_back(d);
  }
  for (int d : grouped) {
    (Contains(dc, d) || Contains(consumer.index, d) ? plan.t_dims : plan.inner_reduce).push_back(d);
  }
  if (plan.inner_reduce.empty() || plan.t_dims.empty()) return false;  // an outer product, or a scalar
  for (const std::vector<int>* dims : {&dc, static_cast<const std::vector<int>*>(&plan.t_dims)}) {
    for (int d : *dims) {
      if (!Contains(consumer.index, d) && !Contains(plan.outer_reduce, d)) plan.outer_reduce.push_back(d);
    }
  }
  // Every dim the chain sums is summed once, at a level holding every
  // factor that depends on it.
  std::vector<int> before = chain.ops[pair.producer].reduce, after = plan.inner_reduce;
  before.insert(before.end(), consumer.reduce.begin(), consumer.reduce.end());
  after.insert(after.end(), plan.outer_reduce.begin(), plan.outer_reduce.end());
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  if (before != after) return false;
  double elements = 1;
  for (int d : plan.t_dims) elements *= static_cast<double>(chain.dims[d].extent);
  if (elements > static_cast<double>(int64_t{1} << 30)) return false;
  // The inner sum takes the producer's place: what it reads must exist then.
  for (int f : {a, b}) {
    const int producer = chain.tensors[pair.factors[f].tensor].producer;
    if (producer >= pair.producer) return false;
  }
  return true;
}

// The (a, b) factor indices `r` contracts first in `pair`, or false.
bool FirstOf(const Pair& pair, const Regroup& r, int& a, int& b) {
  if (pair.consumer != r.consumer || r.first.size() != 2) return false;
  a = b = -1;
  for (int i = 0; i < 3; ++i) {
    if (pair.factors[i].tensor == r.first[0]) a = i;
    if (pair.factors[i].tensor == r.first[1]) b = i;
  }
  if (a < 0 || b < 0 || a == b) return false;
  if (a > b) std::swap(a, b);
  return !(a == 0 && b == 1);  // the chain as written
}

}  // namespace

std::vector<Regroup> Regroupings(const Chain& chain) {
  std::vector<Regroup> out;
  for (const Pair& pair : Pairs(chain)) {
    for (const auto& [a, b] : {std::pair{1, 2}, std::pair{0, 2}}) {
      Plan plan;
      if (!PlanOf(chain, pair, a, b, plan)) continue;
      out.push_back({pair.consumer, {pair.factors[a].tensor, pair.factors[b].tensor}});
    }
  }
  return out;
}

absl::StatusOr<Chain> ApplyRegroup(const Chain& chain, const Regroup& r) {
  for (const Pair& pair : Pairs(chain)) {
    int a = 0, b = 0;
    Plan plan;
    if (!FirstOf(pair, r, a, b) || !PlanOf(chain, pair, a, b, plan)) continue;
    Chain out = chain;
    const int t = chain.ops[pair.producer].output;
    Tensor& tensor = out.tensors[t];
    std::string name = absl::StrCat(chain.tensors[pair.factors[a].tensor].name, "_",
                                    chain.tensors[pair.factors[b].tensor].name);
    for (int i = 2; out.FindTensor(name) >= 0 && out.FindTensor(name) != t; ++i) {
      name = absl::StrCat(chain.tensors[pair.factors[a].tensor].name, "_", chain.tensors[pair.factors[b].tensor].name,
                          "_", i);
    }
    tensor.name = name;
    tensor.shape.clear();
    for (int d : plan.t_dims) tensor.shape.push_back(chain.dims[d].extent);
    tensor.axis_dims = plan.t_dims;
    Op& inner = out.ops[pair.producer];
    inner.index = plan.t_dims;
    inner.reduce = plan.inner_reduce;
    inner.body = Expr::Binary(Expr::Kind::kMul, Expr::Of(pair.factors[a]), Expr::Of(pair.factors[b]));
    Access t_access;
    t_access.tensor = t;
    for (int d : plan.t_dims) t_access.index.push_back(AffineExpr::OfDim(d));
    const int c = 3 - a - b;
    // The outer product in the factors' order, the group where its first
    // member was.
    Expr body = c < a ? Expr::Binary(Expr::Kind::kMul, Expr::Of(pair.factors[c]), Expr::Of(t_access))
                      : Expr::Binary(Expr::Kind::kMul, Expr::Of(t_access), Expr::Of(pair.factors[c]));
    if (pair.scale != 1) body = Expr::Binary(Expr::Kind::kMul, std::move(body), Expr::Const(pair.scale));
    Op& outer = out.ops[pair.consumer];
    outer.reduce = plan.outer_reduce;
    outer.body = std::move(body);
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", RegroupToText(chain, r), "' is not a regrouping of chain '", chain.name, "'"));
}

std::string RegroupToText(const Chain& chain, const Regroup& r) {
  for (const Pair& pair : Pairs(chain)) {
    int a = 0, b = 0;
    if (!FirstOf(pair, r, a, b)) continue;
    const int c = 3 - a - b;
    auto name = [&](int i) { return chain.tensors[pair.factors[i].tensor].name; };
    const std::string group = absl::StrCat("(", name(a), "*", name(b), ")");
    return absl::StrCat(chain.tensors[chain.ops[r.consumer].output].name, "=",
                        c < a ? absl::StrCat(name(c), "*", group) : absl::StrCat(group, "*", name(c)));
  }
  return "?";
}

absl::StatusOr<Regroup> ParseRegroup(absl::string_view text, const Chain& chain) {
  std::string s;
  for (char ch : text) {
    if (ch != ' ') s += ch;
  }
  auto fail = [&]() {
    return absl::InvalidArgumentError(absl::StrCat("regrouping '", text,
                                                   "': expected OUT=X*(Y*Z) or OUT=(X*Y)*Z over the factors of two "
                                                   "chained sums"));
  };
  const size_t eq = s.find('='), open = s.find('('), close = s.find(')');
  if (eq == std::string::npos || open == std::string::npos || close == std::string::npos || close < open) {
    return fail();
  }
  const int out = chain.FindTensor(s.substr(0, eq));
  if (out < 0 || chain.tensors[out].producer < 0) return fail();
  std::vector<std::string> group = absl::StrSplit(s.substr(open + 1, close - open - 1), '*');
  if (group.size() != 2) return fail();
  Regroup r;
  r.consumer = chain.tensors[out].producer;
  for (const std::string& g : group) r.first.push_back(chain.FindTensor(g));
  // The factor outside the parentheses.
  std::string rest = s.substr(eq + 1, open - eq - 1) + s.substr(close + 1);
  rest.erase(std::remove(rest.begin(), rest.end(), '*'), rest.end());
  for (const Pair& pair : Pairs(chain)) {
    int a = 0, b = 0;
    if (!FirstOf(pair, r, a, b) || chain.tensors[pair.factors[3 - a - b].tensor].name != rest) continue;
    for (const Regroup& known : Regroupings(chain)) {
      if (known.consumer == r.consumer && FirstOf(pair, known, a, b) &&
          std::is_permutation(known.first.begin(), known.first.end(), r.first.begin())) {
        return known;
      }
    }
  }
  return fail();
}

}  // namespace fusor::ir
