#include "common/ir/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"

namespace fusor::ir {

double ApplyFunc(Func func, double x) {
  switch (func) {
    case Func::kRelu: return x > 0 ? x : 0;
    case Func::kGelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Func::kGeluTanh: return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Func::kExp: return std::exp(x);
    case Func::kTanh: return std::tanh(x);
    case Func::kSigmoid: return 1 / (1 + std::exp(-x));
  }
  return x;
}

namespace {

// An access as a flat offset: base + sum over dims of stride[d] * value[d].
struct FlatAccess {
  const double* data = nullptr;
  int64_t base = 0;
  std::vector<int64_t> stride;  // per chain dim
};

FlatAccess Flatten(const Access& a, const Chain& chain, const double* data) {
  const Tensor& t = chain.tensors[a.tensor];
  FlatAccess f;
  f.data = data;
  f.stride.assign(chain.dims.size(), 0);
  int64_t axis_stride = 1;
  for (int axis = static_cast<int>(t.shape.size()) - 1; axis >= 0; --axis) {
    const AffineExpr& e = a.index[axis];
    f.base += e.constant * axis_stride;
    for (const auto& [d, c] : e.terms) f.stride[d] += c * axis_stride;
    axis_stride *= t.shape[axis];
  }
  return f;
}

// An expression tree whose accesses are pre-flattened.
struct Node {
  Expr::Kind kind;
  double value = 0;
  Func func = Func::kRelu;
  FlatAccess access;
  std::vector<Node> args;
};

Node Compile(const Expr& e, const Chain& chain, const std::vector<const double*>& buffers) {
  Node n;
  n.kind = e.kind;
  n.value = e.value;
  n.func = e.func;
  if (e.kind == Expr::Kind::kAccess) n.access = Flatten(e.access, chain, buffers[e.access.tensor]);
  for (const Expr& arg : e.args) n.args.push_back(Compile(arg, chain, buffers));
  return n;
}

double Eval(const Node& n, const std::vector<int64_t>& v) {
  switch (n.kind) {
    case Expr::Kind::kConst: return n.value;
    case Expr::Kind::kAccess: {
      int64_t off = n.access.base;
      for (size_t d = 0; d < v.size(); ++d) off += n.access.stride[d] * v[d];
      return n.access.data[off];
    }
    case Expr::Kind::kAdd: return Eval(n.args[0], v) + Eval(n.args[1], v);
    case Expr::Kind::kSub: return Eval(n.args[0], v) - Eval(n.args[1], v);
    case Expr::Kind::kMul: return Eval(n.args[0], v) * Eval(n.args[1], v);
    case Expr::Kind::kDiv: return Eval(n.args[0], v) / Eval(n.args[1], v);
    case Expr::Kind::kNeg: return -Eval(n.args[0], v);
    case Expr::Kind::kCall: return ApplyFunc(n.func, Eval(n.args[0], v));
  }
  return 0;
}

// Collects the factors of a product of accesses and constants; false if the
// body is anything else.
bool ProductFactors(const Node& n, double& scale, std::vector<const FlatAccess*>& factors) {
  switch (n.kind) {
    case Expr::Kind::kMul:
      return ProductFactors(n.args[0], scale, factors) && ProductFactors(n.args[1], scale, factors);
    case Expr::Kind::kConst: scale *= n.value; return true;
    case Expr::Kind::kNeg: scale = -scale; return ProductFactors(n.args[0], scale, factors);
    case Expr::Kind::kAccess: factors.push_back(&n.access); return true;
    default: return false;
  }
}

// Calls fn() for every point of `dims`, setting v[d] for each.
template <typename Fn>
void ForEachPoint(const std::vector<int>& dims, const Chain& chain, std::vector<int64_t>& v, Fn&& fn) {
  for (int d : dims) v[d] = 0;
  if (dims.empty()) {
    fn();
    return;
  }
  while (true) {
    fn();
    int i = static_cast<int>(dims.size()) - 1;
    while (i >= 0) {
      int d = dims[i];
      if (++v[d] < chain.dims[d].extent) break;
      v[d] = 0;
      --i;
    }
    if (i < 0) return;
  }
}

// Runs fn(w, rest) on threads that split the largest of `dims` among
// them: w is a thread's copy of `v` with that dim set (fn iterates `rest`,
// the other dims, itself). One thread for small work.
template <typename Fn>
void ParallelOver(const std::vector<int>& dims, const Chain& chain, const std::vector<int64_t>& v, Fn&& fn) {
  if (dims.empty()) {
    std::vector<int64_t> w = v;
    fn(w, dims);
    return;
  }
  const int split = *std::max_element(dims.begin(), dims.end(), [&](int a, int b) {
    return chain.dims[a].extent < chain.dims[b].extent;
  });
  std::vector<int> rest;
  for (int d : dims) {
    if (d != split) rest.push_back(d);
  }
  const int64_t extent = chain.dims[split].extent;
  const int64_t threads = std::min<int64_t>(extent, std::max(1u, std::thread::hardware_concurrency()));
  auto part = [&](int64_t t) {
    std::vector<int64_t> w = v;
    for (w[split] = t; w[split] < extent; w[split] += threads) fn(w, rest);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(part, t);
  part(0);
  for (std::thread& t : pool) t.join();
}

// The step in op's output of each of its dims (its index is plain dims).
std::vector<int64_t> OutputStrides(const Chain& chain, const Op& op) {
  std::vector<int64_t> out_stride(chain.dims.size(), 0);
  int64_t s = 1;
  for (int axis = static_cast<int>(op.index.size()) - 1; axis >= 0; --axis) {
    out_stride[op.index[axis]] = s;
    s *= chain.tensors[op.output].shape[axis];
  }
  return out_stride;
}

// A sum of a product of two: a row of points along the output's last dim
// at once, under the reduction loops, so that the loads run along the row
// (each point still sums in the order of SumPoints's loop).
void SumProductRows(const Chain& chain, const Op& op, const FlatAccess& fa, const FlatAccess& fb, double scale,
                    const std::vector<int64_t>& out_stride, const std::vector<int64_t>& v, std::vector<double>& out) {
  const int inner = op.reduce.back();
  const std::vector<int> outer_reduce(op.reduce.begin(), op.reduce.end() - 1);
  const int64_t inner_extent = chain.dims[inner].extent;
  const int lane = op.index.back();
  const int64_t n = chain.dims[lane].extent;
  const std::vector<int> rows(op.index.begin(), op.index.end() - 1);
  ParallelOver(rows, chain, v, [&](std::vector<int64_t>& w, const std::vector<int>& rest) {
    std::vector<double> acc(n);
    ForEachPoint(rest, chain, w, [&] {
      std::fill(acc.begin(), acc.end(), 0.0);
      w[lane] = 0;
      ForEachPoint(outer_reduce, chain, w, [&] {
        w[inner] = 0;
        int64_t oa = fa.base, ob = fb.base;
        for (size_t d = 0; d < w.size(); ++d) {
          oa += fa.stride[d] * w[d];
          ob += fb.stride[d] * w[d];
        }
        for (int64_t i = 0; i < inner_extent; ++i) {
          const double* a = fa.data + oa + i * fa.stride[inner];
          const double* b = fb.data + ob + i * fb.stride[inner];
          for (int64_t j = 0; j < n; ++j) acc[j] += scale * a[j * fa.stride[lane]] * b[j * fb.stride[lane]];
        }
      });
      int64_t at = 0;
      for (int d : op.index) at += out_stride[d] * w[d];
      for (int64_t j = 0; j < n; ++j) out[at + j * out_stride[lane]] = acc[j];
    });
  });
}

// Any other sum, point by point: a product's factors read along the inner
// reduction by their strides, any other body evaluated.
void SumPoints(const Chain& chain, const Op& op, const Node& body, bool product, double scale,
               const std::vector<const FlatAccess*>& factors, const std::vector<int64_t>& out_stride,
               const std::vector<int64_t>& v, std::vector<double>& out) {
  const int inner = op.reduce.back();
  const std::vector<int> outer_reduce(op.reduce.begin(), op.reduce.end() - 1);
  const int64_t inner_extent = chain.dims[inner].extent;
  ParallelOver(op.index, chain, v, [&](std::vector<int64_t>& w, const std::vector<int>& rest) {
    std::vector<int64_t> off(factors.size()), step(factors.size());
    ForEachPoint(rest, chain, w, [&] {
      double acc = 0;
      ForEachPoint(outer_reduce, chain, w, [&] {
        if (!product) {
          for (w[inner] = 0; w[inner] < inner_extent; ++w[inner]) acc += Eval(body, w);
          return;
        }
        w[inner] = 0;
        for (size_t f = 0; f < factors.size(); ++f) {
          off[f] = factors[f]->base;
          for (size_t d = 0; d < w.size(); ++d) off[f] += factors[f]->stride[d] * w[d];
          step[f] = factors[f]->stride[inner];
        }
        for (int64_t i = 0; i < inner_extent; ++i) {
          double p = scale;
          for (size_t f = 0; f < factors.size(); ++f) p *= factors[f]->data[off[f] + i * step[f]];
          acc += p;
        }
      });
      int64_t at = 0;
      for (int d : op.index) at += out_stride[d] * w[d];
      out[at] = acc;
    });
  });
}

// A softmax along op.axis, row by row; a causal one keeps the entries up
// to the row's bound, the rest are 0.
void Softmax(const Chain& chain, const Op& op, const Node& body, const std::vector<int64_t>& out_stride,
             std::vector<int64_t>& v, std::vector<double>& out) {
  std::vector<int> rows;
  for (int d : op.index) {
    if (d != op.axis) rows.push_back(d);
  }
  int64_t n = chain.dims[op.axis].extent;
  std::vector<double> vals(n);
  auto out_offset = [&]() {
    int64_t off = 0;
    for (int d : op.index) off += out_stride[d] * v[d];
    return off;
  };
  ForEachPoint(rows, chain, v, [&] {
    const int64_t kept = op.Causal() ? std::min(n, v[op.causal_row] + op.causal_offset + 1) : n;
    double mx = -std::numeric_limits<double>::infinity();
    for (v[op.axis] = 0; v[op.axis] < kept; ++v[op.axis]) {
      vals[v[op.axis]] = Eval(body, v);
      mx = std::max(mx, vals[v[op.axis]]);
    }
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      vals[i] = i < kept ? std::exp(vals[i] - mx) : 0.0;
      sum += vals[i];
    }
    for (v[op.axis] = 0; v[op.axis] < n; ++v[op.axis]) out[out_offset()] = vals[v[op.axis]] / sum;
  });
}

}  // namespace

absl::StatusOr<std::vector<std::vector<double>>> EvaluateReference(
    const Chain& chain, const std::vector<std::vector<double>>& inputs) {
  if (inputs.size() != chain.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", chain.inputs.size(),
                                                   " inputs, got ", inputs.size()));
  }
  std::vector<std::vector<double>> storage(chain.tensors.size());
  std::vector<const double*> buffers(chain.tensors.size(), nullptr);
  for (size_t i = 0; i < chain.inputs.size(); ++i) {
    const Tensor& t = chain.tensors[chain.inputs[i]];
    if (static_cast<int64_t>(inputs[i].size()) != t.NumElements()) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "' has ", inputs[i].size(),
                                                     " elements, expected ", t.NumElements()));
    }
    buffers[chain.inputs[i]] = inputs[i].data();
  }

  std::vector<int64_t> v(chain.dims.size(), 0);
  for (const Op& op : chain.ops) {
    std::vector<double>& out = storage[op.output];
    out.assign(chain.tensors[op.output].NumElements(), 0.0);
    Node body = Compile(op.body, chain, buffers);
    const std::vector<int64_t> out_stride = OutputStrides(chain, op);
    if (op.kind == OpKind::kSum) {
      // Each output point is summed in the same order whichever thread
      // computes it: the result does not depend on the threads.
      double scale = 1;
      std::vector<const FlatAccess*> factors;
      const bool product = ProductFactors(body, scale, factors);
      if (product && factors.size() == 2 && !op.index.empty()) {
        SumProductRows(chain, op, *factors[0], *factors[1], scale, out_stride, v, out);
      } else {
        SumPoints(chain, op, body, product, scale, factors, out_stride, v, out);
      }
    } else if (op.kind == OpKind::kMap) {
      ForEachPoint(op.index, chain, v, [&] {
        int64_t off = 0;
        for (int d : op.index) off += out_stride[d] * v[d];
        out[off] = Eval(body, v);
      });
    } else {
      Softmax(chain, op, body, out_stride, v, out);
    }
    buffers[op.output] = out.data();
  }
  std::vector<std::vector<double>> result;
  for (int t : chain.outputs) result.push_back(std::move(storage[t]));
  return result;
}

}  // namespace fusor::ir
