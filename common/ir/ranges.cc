#include "common/ir/ranges.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ir/parse.h"
#include "common/ir/spec.h"

namespace fusor::ir {

std::pair<int64_t, int64_t> RangeFor(int64_t size) {
  const int64_t largest = Limits().max_extent;
  if (size <= 1) return {1, 1};
  if (size <= 16) return {2, 16};
  int64_t hi = 64;
  while (hi < size && hi < largest) hi *= 4;
  hi = std::min(hi, largest);
  return {hi / 4 + 1, hi};
}

namespace {

// `chain` with every input axis declared by a number that is exactly a
// dim's (its extent, and indexed by the dim alone wherever it is read)
// declared with that dim: `X[128,64]` read as X[m,k] is X[m,k]. Chains
// written either way are then one family, and the axis follows the dim
// when its size changes.
Chain WithAxisDims(const Chain& chain) {
  Chain out = chain;
  for (int t : out.inputs) {
    Tensor& tensor = out.tensors[t];
    for (size_t a = 0; a < tensor.shape.size(); ++a) {
      if (tensor.axis_dims[a] >= 0) continue;
      int dim = -1;
      bool plain = true, read = false;
      for (const Op& op : out.ops) {
        ForEachAccess(op.body, [&](const Access& x) {
          if (x.tensor != t) return;
          read = true;
          const AffineExpr& e = x.index[a];
          if (!e.IsPlainDim() || (dim >= 0 && e.terms[0].first != dim)) {
            plain = false;
            return;
          }
          dim = e.terms[0].first;
        });
      }
      if (read && plain && dim >= 0 && out.dims[dim].extent == tensor.shape[a]) tensor.axis_dims[a] = dim;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Chain> Widen(const Chain& chain, const std::vector<std::string>& dims) {
  Chain widened = WithAxisDims(chain);
  for (const std::string& name : dims) {
    const int d = chain.FindDim(name);
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("vary: '", name, "' is not a dim of chain '", chain.name, "'"));
    }
    const auto [lo, hi] = RangeFor(chain.dims[d].extent);
    widened.dims[d].min = lo < hi ? lo : 0;
    widened.dims[d].extent = hi;
  }
  // Through the text front end: every check a ranged chain must pass, with its message.
  absl::StatusOr<Chain> checked = ParseChainText(ChainToText(widened));
  if (!checked.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("vary ", absl::StrJoin(dims, ","), ": chain '", chain.name,
                                                   "' cannot serve a range of sizes there: ",
                                                   checked.status().message()));
  }
  return checked;
}

CanonicalForm CanonicalFamily(const Chain& chain) {
  // Every dim a range of the same (arbitrary) sizes: the form keeps the
  // axes declared with dims by name, and orders nothing by size.
  constexpr int64_t kOpen = 1 << 20;
  Chain open = WithAxisDims(chain);
  for (Dim& d : open.dims) {
    d.min = 1;
    d.extent = kOpen;
  }
  for (Tensor& t : open.tensors) {
    for (size_t a = 0; a < t.shape.size(); ++a) {
      if (t.axis_dims[a] >= 0) t.shape[a] = kOpen;
    }
  }
  return Canonicalize(open);
}

std::vector<int> FamilyDims(const CanonicalForm& family, size_t family_dims) {
  std::vector<int> at(family_dims, -1);
  for (size_t d = 0; d < family.dim_map.size(); ++d) {
    if (family.dim_map[d] >= 0 && static_cast<size_t>(family.dim_map[d]) < family_dims) {
      at[family.dim_map[d]] = static_cast<int>(d);
    }
  }
  return at;
}

bool Covers(const Chain& record, const CanonicalForm& record_family, const Chain& request,
            const CanonicalForm& request_family) {
  if (record_family.key != request_family.key) return false;
  const size_t n = record_family.chain.dims.size();
  const std::vector<int> a = FamilyDims(record_family, n), b = FamilyDims(request_family, n);
  for (size_t f = 0; f < n; ++f) {
    if (a[f] < 0 || b[f] < 0) return false;
    const Dim& have = record.dims[a[f]];
    const Dim& want = request.dims[b[f]];
    // An exact size is not served by a ranged kernel: its callers lay out their buffers at that size, while
    // the kernel's fusor_run runs at the range's largest.
    if (have.Ranged() != want.Ranged()) return false;
    const int64_t have_lo = have.Ranged() ? have.min : have.extent;
    const int64_t want_lo = want.Ranged() ? want.min : want.extent;
    if (want_lo < have_lo || want.extent > have.extent) return false;
  }
  return true;
}

double SizeDistance(const Chain& a, const CanonicalForm& a_family, const Chain& b, const CanonicalForm& b_family) {
  const size_t n = a_family.chain.dims.size();
  const std::vector<int> x = FamilyDims(a_family, n), y = FamilyDims(b_family, n);
  double distance = 0;
  for (size_t f = 0; f < n; ++f) {
    if (x[f] < 0 || y[f] < 0) continue;
    distance += std::abs(std::log2(static_cast<double>(a.dims[x[f]].extent) / static_cast<double>(b.dims[y[f]].extent)));
  }
  return distance;
}

absl::StatusOr<Chain> WithSizesOf(const Chain& chain, const CanonicalForm& family, const Chain& other,
                                  const CanonicalForm& other_family) {
  if (family.key != other_family.key) {
    return absl::InvalidArgumentError(absl::StrCat("chain '", other.name, "' is not chain '", chain.name,
                                                   "' at other sizes"));
  }
  const size_t n = family.chain.dims.size();
  const std::vector<int> mine = FamilyDims(family, n), theirs = FamilyDims(other_family, n);
  Chain resized = WithAxisDims(chain);
  for (size_t f = 0; f < n; ++f) {
    if (mine[f] < 0 || theirs[f] < 0) continue;
    resized.dims[mine[f]].min = other.dims[theirs[f]].min;
    resized.dims[mine[f]].extent = other.dims[theirs[f]].extent;
  }
  return ParseChainText(ChainToText(resized));
}

std::string RangedText(const Chain& chain) {
  std::vector<std::string> parts;
  for (int d : chain.RangedDims()) parts.push_back(absl::StrCat(chain.dims[d].name, "=", ExtentText(chain.dims[d])));
  return absl::StrJoin(parts, " ");
}

}  // namespace fusor::ir
