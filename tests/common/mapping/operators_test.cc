// Mapping counts of the AMOS operator list (examples/operators) onto a
// 16x16x16 GEMM intrinsic, and a property test: every mapping the validator
// accepts, executed by an interpreter of the mapped loop nest that loads
// each operand tile as a view (every tensor dim driven by one intrinsic
// axis), computes what the operator computes.
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "common/mapping/mapping.h"

namespace fusor::mapping {
namespace {

ir::Chain Load(const std::string& name) {
  std::ifstream in(std::string(FUSOR_SOURCE_DIR) + "/examples/operators/" + name + ".fusor");
  std::stringstream text;
  text << in.rdbuf();
  auto chain = ir::ParseChainText(text.str());
  EXPECT_TRUE(chain.ok()) << name << ": " << chain.status();
  return *chain;
}

TEST(OperatorMappingsTest, CountsOntoA16x16x16Intrinsic) {
  const hw::Intrinsic& wmma = *hw::FindIntrinsic("wmma.m16n16k16.f16");
  // kind-compatible, basic, mappings, valid, strict (bench/RESULTS.md has the table).
  const std::map<std::string, std::array<int, 5>> expected = {
      {"gemm", {2, 1, 1, 1, 1}},
      {"gemv", {0, 0, 0, 0, 0}},
      {"batched_gemm", {6, 1, 1, 1, 1}},
      {"conv1d", {12, 3, 6, 5, 2}},
      {"conv2d", {36, 7, 35, 21, 10}},
      {"conv3d", {80, 13, 180, 77, 14}},
      {"transposed_conv2d", {36, 7, 35, 21, 10}},
      {"grouped_conv2d", {60, 7, 35, 21, 10}},
      {"dilated_conv2d", {36, 7, 35, 21, 10}},
      {"depthwise_conv2d", {24, 0, 0, 0, 0}},
      {"batched_conv2d", {60, 7, 35, 21, 2}},
      {"capsule_conv2d", {120, 28, 585, 339, 48}},
  };
  for (const auto& [name, want] : expected) {
    ir::Chain chain = Load(name);
    auto sw = ViewOp(chain, 0);
    ASSERT_TRUE(sw.ok()) << name;
    MappingCounts c = CountMappings(chain, *sw, wmma);
    EXPECT_EQ((std::array<int, 5>{c.kind_compatible, c.basic, c.mappings, c.valid, c.strict}), want) << name;
  }
}

// Values of every loop, by dim id; -1 when not set.
using Point = std::vector<int64_t>;

// Splits a fused coordinate into the loops fused onto the axis (row-major,
// chain order); false if it lies in the padding.
bool Decompose(const ir::Chain& chain, const std::vector<int>& loops, int64_t x, Point& p) {
  for (int i = static_cast<int>(loops.size()) - 1; i >= 0; --i) {
    const int64_t e = chain.dims[loops[i]].extent;
    p[loops[i]] = x % e;
    x /= e;
  }
  return x == 0;
}

// A view of one operand for one tile: each tensor dim takes its index from
// the outer point and from the single axis that moves it (rule 1). Reads
// element (coordinates per intrinsic axis) of tensor `t`; nullopt if a dim
// moves with two axes (no view exists).
std::optional<double> ViewLoad(const ir::Chain& chain, const ir::Access& a, const std::vector<double>& data,
                               const Mapping& m, const Point& outer, const std::array<int64_t, 3>& coord) {
  const ir::Tensor& t = chain.tensors[a.tensor];
  int64_t offset = 0;
  for (size_t d = 0; d < a.index.size(); ++d) {
    int axis = -1;
    int64_t value = a.index[d].constant;
    for (const auto& [l, c] : a.index[d].terms) {
      int on = -1;
      for (int x = 0; x < 3; ++x) {
        if (std::find(m.axes[x].begin(), m.axes[x].end(), l) != m.axes[x].end()) on = x;
      }
      if (on < 0) {
        value += c * outer[l];
        continue;
      }
      if (axis >= 0 && axis != on) return std::nullopt;
      axis = on;
      Point p(chain.dims.size(), -1);
      if (!Decompose(chain, m.axes[on], coord[on], p)) return 0.0;  // padding
      value += c * p[l];
    }
    offset = offset * t.shape[d] + value;
  }
  return data[offset];
}

// Runs the op through the mapped nest: every point of the loops on no axis,
// then every intrinsic tile of the fused axes, C[i, j] += A[i, k] * B[k, j].
bool RunMapped(const ir::Chain& chain, const SoftwareOp& sw, const Mapping& m,
               const std::vector<std::vector<double>>& inputs, std::vector<double>& out) {
  const ir::Op& op = chain.ops[sw.op];
  const hw::Intrinsic& x = *m.intrinsic;
  std::array<int64_t, 3> fused{1, 1, 1}, padded{};
  for (int a = 0; a < 3; ++a) {
    for (int l : m.axes[a]) fused[a] *= chain.dims[l].extent;
    padded[a] = (fused[a] + x.Extent(a) - 1) / x.Extent(a) * x.Extent(a);
  }
  std::vector<int> outside;
  for (int l : sw.spatial) {
    if (std::count(m.axes[0].begin(), m.axes[0].end(), l) + std::count(m.axes[1].begin(), m.axes[1].end(), l) == 0) {
      outside.push_back(l);
    }
  }
  for (int l : sw.reduced) {
    if (std::count(m.axes[2].begin(), m.axes[2].end(), l) == 0) outside.push_back(l);
  }
  auto data_of = [&](int tensor) -> const std::vector<double>& {
    for (size_t i = 0; i < chain.inputs.size(); ++i) {
      if (chain.inputs[i] == tensor) return inputs[i];
    }
    return inputs[0];
  };
  const std::vector<ir::Access>& a_side = m.swapped ? sw.b_side : sw.a_side;
  const std::vector<ir::Access>& b_side = m.swapped ? sw.a_side : sw.b_side;
  out.assign(chain.tensors[op.output].NumElements(), 0.0);
  Point outer(chain.dims.size(), 0);
  while (true) {
    for (int64_t i = 0; i < padded[0]; ++i) {
      for (int64_t j = 0; j < padded[1]; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < padded[2]; ++k) {
          double av = sw.scale, bv = 1;
          for (const ir::Access& f : a_side) {
            auto v = ViewLoad(chain, f, data_of(f.tensor), m, outer, {i, j, k});
            if (!v) return false;
            av *= *v;
          }
          for (const ir::Access& f : b_side) {
            auto v = ViewLoad(chain, f, data_of(f.tensor), m, outer, {i, j, k});
            if (!v) return false;
            bv *= *v;
          }
          acc += av * bv;
        }
        Point p = outer;
        if (!Decompose(chain, m.axes[0], i, p) || !Decompose(chain, m.axes[1], j, p)) continue;  // padding
        int64_t offset = 0;
        for (size_t d = 0; d < op.index.size(); ++d) offset = offset * chain.dims[op.index[d]].extent + p[op.index[d]];
        out[offset] += acc;
      }
    }
    size_t d = 0;
    while (d < outside.size() && ++outer[outside[d]] == chain.dims[outside[d]].extent) outer[outside[d++]] = 0;
    if (d == outside.size()) break;
  }
  return true;
}

// Small instances of the operators, so that every mapping can be run.
const char* kSmallOperators[] = {
    "dim m=20 n=12 k=9\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n] * 0.5\nout C",
    "dim b=2 m=6 n=5 k=7\nin A[b,m,k] B[b,k,n]\nC[b,m,n] = sum(k) A[b,m,k] * B[b,k,n]\nout C",
    "dim n=2 k=5 c=3 p=6 r=3 x=8\nin I[n,c,x] W[k,c,r]\nO[n,k,p] = sum(c,r) I[n,c,p+r] * W[k,c,r]\nout O",
    "dim n=2 k=4 c=3 p=3 q=4 r=2 s=2 y=8 x=10\nin I[n,c,y,x] W[k,c,r,s]\n"
    "O[n,k,p,q] = sum(c,r,s) I[n,c,p*2+r,q*2+s] * W[k,c,r,s]\nout O",
    "dim n=1 k=3 c=2 p=4 q=4 r=3 s=3 y=8 x=8\nin I[n,c,y,x] W[k,c,r,s]\n"
    "O[n,k,p,q] = sum(c,r,s) I[n,c,p+2*r,q+2*s] * W[k,c,r,s]\nout O",
    "dim n=1 k=3 c=2 p=4 q=3 r=2 s=2 y=5 x=4\nin I[n,c,y,x] W[c,k,r,s]\n"
    "O[n,k,p,q] = sum(c,r,s) I[n,c,p+1-r,q+1-s] * W[c,k,r,s]\nout O",
    "dim n=1 g=2 k=2 c=3 p=3 q=3 r=2 s=2 y=4 x=4\nin I[n,g,c,y,x] W[g,k,c,r,s]\n"
    "O[n,g,k,p,q] = sum(c,r,s) I[n,g,c,p+r,q+s] * W[g,k,c,r,s]\nout O",
    "dim n=1 k=2 c=2 p=2 q=2 r=2 s=2 i=2 j=3 l=2 y=3 x=3\nin I[n,c,y,x,i,l] W[k,c,r,s,l,j]\n"
    "O[n,k,p,q,i,j] = sum(c,r,s,l) I[n,c,p+r,q+s,i,l] * W[k,c,r,s,l,j]\nout O",
};

TEST(OperatorMappingsTest, EveryAcceptedMappingComputesTheOperator) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  const hw::Intrinsic& unit = *hw::FindIntrinsic("mma.sync.m16n8k16.f16");
  int checked = 0, views_refused = 0;
  for (const char* text : kSmallOperators) {
    auto chain = ir::ParseChainText(text);
    ASSERT_TRUE(chain.ok()) << chain.status();
    auto sw = ViewOp(*chain, 0);
    ASSERT_TRUE(sw.ok());
    std::vector<std::vector<double>> inputs;
    for (int t : chain->inputs) {
      inputs.emplace_back(chain->tensors[t].NumElements());
      for (double& v : inputs.back()) v = u(rng);
    }
    auto ref = ir::EvaluateReference(*chain, inputs);
    ASSERT_TRUE(ref.ok());
    MappingSet set = GenerateMappings(*chain, *sw, unit);
    std::vector<Mapping> all = set.mappings;
    for (const Mapping& m : KindCompatibleMatchings(*sw, unit)) all.push_back(m);
    for (const Mapping& m : all) {
      Verdict v = Validate(*chain, *sw, m);
      std::vector<double> out;
      const bool ran = RunMapped(*chain, *sw, m, inputs, out);
      if (!v.valid) {
        // A dim moving with two axes has no view: the rule-1 rejections.
        views_refused += !ran;
        continue;
      }
      ASSERT_TRUE(ran) << MappingToText(m, *chain);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_NEAR(out[i], (*ref)[0][i], 1e-9) << text << "\n" << MappingToText(m, *chain) << " element " << i;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(views_refused, 10);
}

}  // namespace
}  // namespace fusor::mapping
