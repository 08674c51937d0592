#include "common/zoo/onnx_fold.h"

#include "common/codegen/cpu/prelude.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fusor::zoo {
namespace {

using onnx::TensorProto;

// A small tensor's value: its ONNX element type, dims and elements (as
// doubles: exact for the integers shapes are made of).
struct Value {
  int type = TensorProto::INT64;
  std::vector<int64_t> dims;
  std::vector<double> v;
};

// The most elements a folded tensor may have: kMaxFoldedElements, or
// EvaluateConstant's limit while it runs.
thread_local int64_t max_elements = kMaxFoldedElements;

int64_t Count(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || (d > 0 && n > max_elements / d)) return -1;
    n *= d;
  }
  return n;
}

bool Half(int type) { return type == TensorProto::FLOAT16 || type == TensorProto::BFLOAT16; }

bool Folds(int type) {
  return type == TensorProto::INT64 || type == TensorProto::INT32 || type == TensorProto::FLOAT ||
         type == TensorProto::DOUBLE || type == TensorProto::BOOL || Half(type);
}

// A 16-bit float's value from its bits, and the bits of a value rounded to it.
double FromHalf(int type, uint16_t bits) {
  return type == TensorProto::FLOAT16 ? codegen::rt::fusor_f16_to_f32(bits) : codegen::rt::fusor_bf16_to_f32(bits);
}
uint16_t ToHalf(int type, double x) {
  const float f = static_cast<float>(x);
  return type == TensorProto::FLOAT16 ? codegen::rt::fusor_f32_to_f16(f) : codegen::rt::fusor_f32_to_bf16(f);
}

bool IsInt(int type) { return type == TensorProto::INT64 || type == TensorProto::INT32 || type == TensorProto::BOOL; }

template <typename T>
void FromRaw(const std::string& raw, std::vector<double>* out) {
  for (size_t i = 0; i + sizeof(T) <= raw.size(); i += sizeof(T)) {
    T x;
    std::memcpy(&x, raw.data() + i, sizeof(T));
    out->push_back(static_cast<double>(x));
  }
}

std::optional<Value> FromTensor(const TensorProto& t) {
  if (!Folds(t.data_type()) || t.data_location() == TensorProto::EXTERNAL) return std::nullopt;
  Value out{t.data_type(), {t.dims().begin(), t.dims().end()}, {}};
  const int64_t n = Count(out.dims);
  if (n < 0) return std::nullopt;
  if (!t.raw_data().empty()) {
    switch (t.data_type()) {
      case TensorProto::INT64: FromRaw<int64_t>(t.raw_data(), &out.v); break;
      case TensorProto::INT32: FromRaw<int32_t>(t.raw_data(), &out.v); break;
      case TensorProto::FLOAT: FromRaw<float>(t.raw_data(), &out.v); break;
      case TensorProto::DOUBLE: FromRaw<double>(t.raw_data(), &out.v); break;
      case TensorProto::BOOL: FromRaw<uint8_t>(t.raw_data(), &out.v); break;
      default:  // 16-bit floats
        for (size_t i = 0; i + 2 <= t.raw_data().size(); i += 2) {
          uint16_t bits;
          std::memcpy(&bits, t.raw_data().data() + i, 2);
          out.v.push_back(FromHalf(t.data_type(), bits));
        }
    }
  } else if (Half(t.data_type())) {
    for (int32_t x : t.int32_data()) out.v.push_back(FromHalf(t.data_type(), static_cast<uint16_t>(x)));
  } else {
    for (int64_t x : t.int64_data()) out.v.push_back(static_cast<double>(x));
    for (int32_t x : t.int32_data()) out.v.push_back(x);
    for (float x : t.float_data()) out.v.push_back(x);
    for (double x : t.double_data()) out.v.push_back(x);
  }
  if (static_cast<int64_t>(out.v.size()) != n) return std::nullopt;
  return out;
}

// An element as an integer; INT64_MAX and INT64_MIN (Slice's "to the end")
// survive the round trip through double by saturating.
int64_t ToInt(double x) {
  if (x >= 9.2e18) return INT64_MAX;
  if (x <= -9.2e18) return INT64_MIN;
  return static_cast<int64_t>(x);
}

TensorProto ToTensor(const Value& value) {
  TensorProto t;
  t.set_data_type(value.type);
  for (int64_t d : value.dims) t.add_dims(d);
  for (double x : value.v) {
    switch (value.type) {
      case TensorProto::INT64: t.add_int64_data(ToInt(x)); break;
      case TensorProto::INT32:
      case TensorProto::BOOL: t.add_int32_data(static_cast<int32_t>(x)); break;
      case TensorProto::FLOAT: t.add_float_data(static_cast<float>(x)); break;
      case TensorProto::DOUBLE: t.add_double_data(x); break;
      default: t.add_int32_data(ToHalf(value.type, x)); break;  // 16-bit floats
    }
  }
  return t;
}

// Values of integer type round toward zero, as ONNX's Cast and integer
// arithmetic do.
double Typed(int type, double x) {
  if (type == TensorProto::BOOL) return x != 0;
  if (IsInt(type)) return std::trunc(x);
  if (type == TensorProto::FLOAT) return static_cast<float>(x);
  if (Half(type)) return FromHalf(type, ToHalf(type, x));
  return x;
}

// Row-major strides of `dims`.
std::vector<int64_t> Strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

// Numpy broadcasting of the operands' dims, or nullopt.
std::optional<std::vector<int64_t>> Broadcast(const std::vector<const Value*>& in) {
  size_t rank = 0;
  for (const Value* x : in) rank = std::max(rank, x->dims.size());
  std::vector<int64_t> out(rank, 1);
  for (const Value* x : in) {
    const size_t off = rank - x->dims.size();
    for (size_t i = 0; i < x->dims.size(); ++i) {
      const int64_t d = x->dims[i];
      if (d == out[off + i] || d == 1) continue;
      if (out[off + i] != 1) return std::nullopt;
      out[off + i] = d;
    }
  }
  if (Count(out) < 0) return std::nullopt;
  return out;
}

// Walks `x` broadcast to `dims` in row-major order: Index() is the
// element of x at the current output position, Next() moves one on.
class BroadcastWalk {
 public:
  BroadcastWalk(const Value& x, const std::vector<int64_t>& dims)
      : dims_(dims), strides_(dims.size(), 0), pos_(dims.size(), 0) {
    const std::vector<int64_t> own = Strides(x.dims);
    const size_t off = dims.size() - x.dims.size();
    for (size_t i = off; i < dims.size(); ++i) {
      if (x.dims[i - off] != 1) strides_[i] = own[i - off];
    }
  }
  int64_t Index() const { return index_; }
  void Next() {
    for (int i = static_cast<int>(dims_.size()) - 1; i >= 0; --i) {
      index_ += strides_[i];
      if (++pos_[i] < dims_[i]) return;
      index_ -= strides_[i] * dims_[i];
      pos_[i] = 0;
    }
  }

 private:
  std::vector<int64_t> dims_, strides_, pos_;
  int64_t index_ = 0;
};

// Copies `x` through an index map: element i of the result is x.v[index(i)].
Value Gathered(const Value& x, std::vector<int64_t> dims, const std::function<int64_t(int64_t)>& index) {
  Value out{x.type, std::move(dims), {}};
  const int64_t n = Count(out.dims);
  for (int64_t i = 0; i < n; ++i) out.v.push_back(x.v[index(i)]);
  return out;
}

std::optional<Value> Elementwise(const std::vector<const Value*>& in, int type,
                                 const std::function<double(const std::vector<double>&)>& f) {
  auto dims = Broadcast(in);
  if (!dims) return std::nullopt;
  std::vector<BroadcastWalk> reads;
  for (const Value* x : in) reads.emplace_back(*x, *dims);
  Value out{type, *dims, {}};
  const int64_t n = Count(*dims);
  out.v.reserve(static_cast<size_t>(n));
  std::vector<double> args(in.size());
  for (int64_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < in.size(); ++k) {
      args[k] = in[k]->v[reads[k].Index()];
      reads[k].Next();
    }
    out.v.push_back(Typed(type, f(args)));
  }
  return out;
}

int64_t Axis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

const onnx::AttributeProto* Attr(const onnx::NodeProto& n, const char* name) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

int64_t AttrInt(const onnx::NodeProto& n, const char* name, int64_t fallback) {
  const onnx::AttributeProto* a = Attr(n, name);
  return a != nullptr ? a->i() : fallback;
}

std::vector<int64_t> Ints(const Value& v) {
  std::vector<int64_t> out;
  for (double x : v.v) out.push_back(ToInt(x));
  return out;
}

class Folder {
 public:
  // `finite_only`: a value with an infinity or a NaN is not folded.
  Folder(onnx::GraphProto& g, int64_t opset, bool finite_only = true)
      : g_(g), opset_(opset), finite_only_(finite_only) {
    auto add_shape = [&](const onnx::ValueInfoProto& v) {
      if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
      std::vector<int64_t> dims;
      for (const auto& d : v.type().tensor_type().shape().dim()) dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      shapes_[v.name()] = dims;
    };
    for (const auto& v : g.input()) add_shape(v);
    for (const auto& v : g.value_info()) add_shape(v);
    for (const auto& v : g.output()) add_shape(v);
    for (const TensorProto& t : g.initializer()) {
      shapes_[t.name()] = {t.dims().begin(), t.dims().end()};
      if (auto v = FromTensor(t)) values_[t.name()] = std::move(*v);
    }
  }

  // Folds what it can; `rewrite`: replaces each folded node by a Constant.
  int Run(bool rewrite = true) {
    int folded = 0;
    for (onnx::NodeProto& n : *g_.mutable_node()) {
      if (n.output_size() != 1 || !n.domain().empty()) continue;
      std::optional<Value> v = n.op_type() == "Constant" ? ConstantValue(n) : Evaluate(n);
      if (!v || Count(v->dims) < 0 || static_cast<int64_t>(v->v.size()) != Count(v->dims)) continue;
      const bool constant = n.op_type() == "Constant";
      // A division by zero or the like is left to the runtime, not baked in.
      if (!constant && finite_only_ &&
          !std::all_of(v->v.begin(), v->v.end(), [](double x) { return std::isfinite(x); })) {
        continue;
      }
      values_[n.output(0)] = *v;
      if (constant || !rewrite) continue;
      const std::string output = n.output(0), name = n.name();
      n.Clear();
      n.set_op_type("Constant");
      n.set_name(name);
      n.add_output(output);
      onnx::AttributeProto* value = n.add_attribute();
      value->set_name("value");
      value->set_type(onnx::AttributeProto::TENSOR);
      *value->mutable_t() = ToTensor(*v);
      ++folded;
    }
    return folded;
  }

  const Value* Find(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? nullptr : &it->second;
  }

 private:
  std::optional<Value> ConstantValue(const onnx::NodeProto& n) const {
    for (const auto& a : n.attribute()) {
      if (a.name() == "value" && a.has_t()) return FromTensor(a.t());
      if (a.name() == "value_int") return Value{TensorProto::INT64, {}, {static_cast<double>(a.i())}};
      if (a.name() == "value_float") return Value{TensorProto::FLOAT, {}, {a.f()}};
      if (a.name() == "value_ints") {
        Value v{TensorProto::INT64, {a.ints_size()}, {}};
        for (int64_t x : a.ints()) v.v.push_back(static_cast<double>(x));
        return v;
      }
      if (a.name() == "value_floats") {
        Value v{TensorProto::FLOAT, {a.floats_size()}, {}};
        for (float x : a.floats()) v.v.push_back(x);
        return v;
      }
    }
    return std::nullopt;
  }

  const Value* Input(const onnx::NodeProto& n, int i) const {
    if (i >= n.input_size() || n.input(i).empty()) return nullptr;
    auto it = values_.find(n.input(i));
    return it == values_.end() ? nullptr : &it->second;
  }

  // The node's value when every input it reads is known.
  std::optional<Value> Evaluate(const onnx::NodeProto& n) const {
    const std::string& op = n.op_type();
    if (op == "Shape" || op == "Size") return ShapeOf(n);
    // Every other op needs its data inputs known; absent optional inputs
    // are null.
    std::vector<const Value*> in;
    for (int i = 0; i < n.input_size(); ++i) {
      const Value* v = Input(n, i);
      if (v == nullptr && !n.input(i).empty()) return std::nullopt;
      in.push_back(v);
    }
    if (in.empty() || in[0] == nullptr) return std::nullopt;
    auto present = [&](size_t i) { return in.size() > i && in[i] != nullptr; };
    if (op == "Identity") return *in[0];
    if (op == "Unsqueeze" || op == "Squeeze") return Squeezed(n, in);
    if (op == "Concat") return Concat(n, in);
    if (op == "Gather" && present(1)) return Gather(n, *in[0], *in[1]);
    if (op == "Slice" && opset_ >= 10 && present(1) && present(2)) return Slice(in);
    if (op == "Range" && present(1) && present(2)) return Range(*in[0], *in[1], *in[2]);
    if (op == "ConstantOfShape") return ConstantOfShape(n, *in[0]);
    if (op == "Reshape" && present(1)) return Reshape(n, *in[0], Ints(*in[1]));
    if (op == "Expand" && present(1)) return Expand(*in[0], Ints(*in[1]));
    if (op == "Tile" && present(1)) return Tile(*in[0], Ints(*in[1]));
    if (op == "Flatten") return Flatten(n, *in[0]);
    if (op == "GatherND" && present(1)) return GatherNd(n, *in[0], *in[1]);
    if (op == "Trilu") return Trilu(n, *in[0], present(1) ? ToInt(in[1]->v.at(0)) : 0);
    return Arithmetic(n, in);
  }

  std::optional<Value> ShapeOf(const onnx::NodeProto& n) const {
    auto it = shapes_.find(n.input_size() > 0 ? n.input(0) : "");
    if (it == shapes_.end()) return std::nullopt;
    const std::vector<int64_t>& dims = it->second;
    if (std::find(dims.begin(), dims.end(), -1) != dims.end()) return std::nullopt;
    if (n.op_type() == "Size") {
      double n_elems = 1;
      for (int64_t d : dims) n_elems *= static_cast<double>(d);
      return Value{TensorProto::INT64, {}, {n_elems}};
    }
    const int64_t rank = static_cast<int64_t>(dims.size());
    const int64_t start = std::clamp<int64_t>(Axis(AttrInt(n, "start", 0), rank), 0, rank);
    const int64_t end = std::clamp<int64_t>(Axis(AttrInt(n, "end", rank), rank), 0, rank);
    Value v{TensorProto::INT64, {std::max<int64_t>(0, end - start)}, {}};
    for (int64_t i = start; i < end; ++i) v.v.push_back(static_cast<double>(dims[i]));
    return v;
  }

  // Cast and the elementwise ops, broadcast as numpy does.
  static std::optional<Value> Arithmetic(const onnx::NodeProto& n, const std::vector<const Value*>& in) {
    using Args = const std::vector<double>&;
    const std::string& op = n.op_type();
    const Value& x = *in[0];
    if (op == "Cast") {
      const int to = static_cast<int>(AttrInt(n, "to", 0));
      if (!Folds(to)) return std::nullopt;
      return Elementwise({&x}, to, [](Args a) { return a[0]; });
    }
    static const std::map<std::string, std::function<double(double, double)>> kBinary = {
        {"Add", std::plus<double>()},
        {"Sub", std::minus<double>()},
        {"Mul", std::multiplies<double>()},
        {"Div", std::divides<double>()},
        {"Pow", [](double a, double b) { return std::pow(a, b); }},
        {"Min", [](double a, double b) { return std::min(a, b); }},
        {"Max", [](double a, double b) { return std::max(a, b); }},
        {"And", [](double a, double b) { return static_cast<double>(a != 0 && b != 0); }},
        {"Or", [](double a, double b) { return static_cast<double>(a != 0 || b != 0); }}};
    static const std::map<std::string, std::function<bool(double, double)>> kCompare = {
        {"Equal", std::equal_to<double>()},       {"Less", std::less<double>()},
        {"Greater", std::greater<double>()},      {"LessOrEqual", std::less_equal<double>()},
        {"GreaterOrEqual", std::greater_equal<double>()}};
    static const std::map<std::string, std::function<double(double)>> kUnary = {
        {"Neg", [](double a) { return -a; }},           {"Abs", [](double a) { return std::fabs(a); }},
        {"Sqrt", [](double a) { return std::sqrt(a); }}, {"Reciprocal", [](double a) { return 1 / a; }},
        {"Floor", [](double a) { return std::floor(a); }}, {"Ceil", [](double a) { return std::ceil(a); }},
        {"Not", [](double a) { return static_cast<double>(a == 0); }}};
    const bool binary = in.size() == 2 && in[1] != nullptr;
    if (auto it = kBinary.find(op); it != kBinary.end() && binary) {
      const auto& f = it->second;
      return Elementwise({&x, in[1]}, x.type, [&f](Args a) { return f(a[0], a[1]); });
    }
    if (auto it = kCompare.find(op); it != kCompare.end() && binary) {
      const auto& f = it->second;
      return Elementwise({&x, in[1]}, TensorProto::BOOL, [&f](Args a) { return static_cast<double>(f(a[0], a[1])); });
    }
    if (auto it = kUnary.find(op); it != kUnary.end()) {
      const auto& f = it->second;
      return Elementwise({&x}, x.type, [&f](Args a) { return f(a[0]); });
    }
    if (op == "Where" && in.size() == 3 && in[1] != nullptr && in[2] != nullptr) {
      return Elementwise({&x, in[1], in[2]}, in[1]->type, [](Args a) { return a[0] != 0 ? a[1] : a[2]; });
    }
    return std::nullopt;
  }

  // Unsqueeze and Squeeze: axes from the second input (opset 13) or the
  // attribute.
  std::optional<Value> Squeezed(const onnx::NodeProto& n, const std::vector<const Value*>& in) const {
    const Value& x = *in[0];
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    std::vector<int64_t> axes;
    if (opset_ >= 13) {
      if (in.size() > 1 && in[1] != nullptr) axes = Ints(*in[1]);
    } else if (const onnx::AttributeProto* a = Attr(n, "axes")) {
      axes.assign(a->ints().begin(), a->ints().end());
    }
    Value out = x;
    if (n.op_type() == "Squeeze") {
      out.dims.clear();
      for (int64_t i = 0; i < rank; ++i) {
        const bool listed = std::any_of(axes.begin(), axes.end(), [&](int64_t a) { return Axis(a, rank) == i; });
        if (axes.empty() ? x.dims[i] != 1 : !listed) out.dims.push_back(x.dims[i]);
      }
      return out;
    }
    const int64_t out_rank = rank + static_cast<int64_t>(axes.size());
    for (int64_t& a : axes) a = Axis(a, out_rank);
    std::sort(axes.begin(), axes.end());
    for (int64_t a : axes) {
      if (a < 0 || a > static_cast<int64_t>(out.dims.size())) return std::nullopt;
      out.dims.insert(out.dims.begin() + a, 1);
    }
    return out;
  }

  static std::optional<Value> Concat(const onnx::NodeProto& n, const std::vector<const Value*>& in) {
    const Value& x = *in[0];
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    const int64_t axis = Axis(AttrInt(n, "axis", 0), rank);
    if (axis < 0 || axis >= rank) return std::nullopt;
    Value out{x.type, x.dims, {}};
    out.dims[axis] = 0;
    for (const Value* p : in) {
      if (p == nullptr || p->dims.size() != x.dims.size()) return std::nullopt;
      out.dims[axis] += p->dims[axis];
    }
    // Rows before the axis, then each input's block along it.
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.dims[i];
    for (int64_t o = 0; o < outer; ++o) {
      for (const Value* p : in) {
        const int64_t block = Count(p->dims) / std::max<int64_t>(1, outer);
        out.v.insert(out.v.end(), p->v.begin() + o * block, p->v.begin() + (o + 1) * block);
      }
    }
    return out;
  }

  static std::optional<Value> Gather(const onnx::NodeProto& n, const Value& x, const Value& idx) {
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    const int64_t axis = Axis(AttrInt(n, "axis", 0), rank);
    if (axis < 0 || axis >= rank) return std::nullopt;
    std::vector<int64_t> dims(x.dims.begin(), x.dims.begin() + axis);
    dims.insert(dims.end(), idx.dims.begin(), idx.dims.end());
    dims.insert(dims.end(), x.dims.begin() + axis + 1, x.dims.end());
    if (Count(dims) < 0) return std::nullopt;
    for (double i : idx.v) {
      if (i < -x.dims[axis] || i >= x.dims[axis]) return std::nullopt;
    }
    int64_t inner = 1;
    for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dims[i];
    const int64_t n_idx = static_cast<int64_t>(idx.v.size());
    return Gathered(x, dims, [&](int64_t flat) {
      const int64_t in_inner = flat % inner, rest = flat / inner;
      const int64_t k = rest % n_idx, o = rest / n_idx;
      int64_t i = static_cast<int64_t>(idx.v[k]);
      if (i < 0) i += x.dims[axis];
      return (o * x.dims[axis] + i) * inner + in_inner;
    });
  }

  // Slice (opset 10 on): starts, ends, optional axes and steps as inputs.
  static std::optional<Value> Slice(const std::vector<const Value*>& in) {
    const Value& x = *in[0];
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    const std::vector<int64_t> starts = Ints(*in[1]), ends = Ints(*in[2]);
    std::vector<int64_t> axes, steps;
    if (in.size() > 3 && in[3] != nullptr) axes = Ints(*in[3]);
    if (in.size() > 4 && in[4] != nullptr) steps = Ints(*in[4]);
    if (axes.empty()) {
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    }
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) {
      return std::nullopt;
    }
    std::vector<int64_t> begin(rank, 0), step(rank, 1), dims = x.dims;
    for (size_t k = 0; k < starts.size(); ++k) {
      const int64_t a = Axis(axes[k], rank);
      if (a < 0 || a >= rank || steps[k] == 0) return std::nullopt;
      const int64_t d = x.dims[a];
      auto clamp = [&](int64_t i, int64_t lo, int64_t hi) { return std::clamp(i < 0 ? i + d : i, lo, hi); };
      if (steps[k] > 0) {
        begin[a] = clamp(starts[k], 0, d);
        dims[a] = std::max<int64_t>(0, (clamp(ends[k], 0, d) - begin[a] + steps[k] - 1) / steps[k]);
      } else {
        begin[a] = clamp(starts[k], -1, d - 1);
        dims[a] = std::max<int64_t>(0, (begin[a] - clamp(ends[k], -1, d - 1) - steps[k] - 1) / -steps[k]);
      }
      step[a] = steps[k];
    }
    const std::vector<int64_t> out_strides = Strides(dims), strides = Strides(x.dims);
    return Gathered(x, dims, [&](int64_t flat) {
      int64_t index = 0;
      for (int64_t i = 0; i < rank; ++i) index += (begin[i] + (flat / out_strides[i]) % dims[i] * step[i]) * strides[i];
      return index;
    });
  }

  static std::optional<Value> Range(const Value& start, const Value& limit, const Value& delta) {
    if (start.v.empty() || limit.v.empty() || delta.v.empty() || delta.v[0] == 0) return std::nullopt;
    const double count = std::max(0.0, std::ceil((limit.v[0] - start.v[0]) / delta.v[0]));
    if (count > static_cast<double>(max_elements)) return std::nullopt;
    Value out{start.type, {static_cast<int64_t>(count)}, {}};
    for (int64_t i = 0; i < out.dims[0]; ++i) {
      out.v.push_back(Typed(start.type, start.v[0] + static_cast<double>(i) * delta.v[0]));
    }
    return out;
  }

  static std::optional<Value> ConstantOfShape(const onnx::NodeProto& n, const Value& shape) {
    Value fill{TensorProto::FLOAT, {}, {0.0}};
    if (const onnx::AttributeProto* a = Attr(n, "value"); a != nullptr && a->has_t()) {
      auto v = FromTensor(a->t());
      if (!v || v->v.size() != 1) return std::nullopt;
      fill = *v;
    }
    const std::vector<int64_t> dims = Ints(shape);
    if (Count(dims) < 0) return std::nullopt;
    return Value{fill.type, dims, std::vector<double>(static_cast<size_t>(Count(dims)), fill.v[0])};
  }

  static std::optional<Value> Reshape(const onnx::NodeProto& n, const Value& x, std::vector<int64_t> target) {
    int64_t known = 1, infer = -1;
    const bool allowzero = AttrInt(n, "allowzero", 0) != 0;
    for (size_t i = 0; i < target.size(); ++i) {
      if (target[i] == 0 && !allowzero) {
        if (i >= x.dims.size()) return std::nullopt;
        target[i] = x.dims[i];
      }
      if (target[i] == -1) {
        if (infer >= 0) return std::nullopt;
        infer = static_cast<int64_t>(i);
      } else {
        known *= target[i];
      }
    }
    const int64_t total = Count(x.dims);
    if (infer >= 0) {
      if (known <= 0 || total % known != 0) return std::nullopt;
      target[infer] = total / known;
    }
    if (Count(target) != total) return std::nullopt;
    Value out = x;
    out.dims = target;
    return out;
  }

  static std::optional<Value> Expand(const Value& x, const std::vector<int64_t>& target) {
    const Value shape{x.type, target, {}};
    auto dims = Broadcast({&x, &shape});
    if (!dims) return std::nullopt;
    BroadcastWalk read(x, *dims);
    Value out{x.type, *dims, {}};
    const int64_t n = Count(out.dims);
    out.v.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i, read.Next()) out.v.push_back(x.v[read.Index()]);
    return out;
  }

  static std::optional<Value> Tile(const Value& x, const std::vector<int64_t>& repeats) {
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    if (static_cast<int64_t>(repeats.size()) != rank) return std::nullopt;
    std::vector<int64_t> dims = x.dims;
    for (int64_t i = 0; i < rank; ++i) dims[i] *= repeats[i];
    if (Count(dims) < 0) return std::nullopt;
    const std::vector<int64_t> out_strides = Strides(dims), strides = Strides(x.dims);
    return Gathered(x, dims, [&](int64_t flat) {
      int64_t index = 0;
      for (int64_t i = 0; i < rank; ++i) index += (flat / out_strides[i]) % dims[i] % x.dims[i] * strides[i];
      return index;
    });
  }

  static std::optional<Value> Flatten(const onnx::NodeProto& n, const Value& x) {
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    const int64_t axis = Axis(AttrInt(n, "axis", 1), rank);
    if (axis < 0 || axis > rank) return std::nullopt;
    Value out = x;
    out.dims = {1, 1};
    for (int64_t i = 0; i < rank; ++i) out.dims[i < axis ? 0 : 1] *= x.dims[i];
    return out;
  }

  // GatherND: the last axis of `idx` (q long) indexes the data's axes after
  // its first batch_dims, which data and idx share.
  static std::optional<Value> GatherNd(const onnx::NodeProto& n, const Value& x, const Value& idx) {
    const int64_t batch = AttrInt(n, "batch_dims", 0), rank = static_cast<int64_t>(x.dims.size());
    if (idx.dims.empty()) return std::nullopt;
    const int64_t q = idx.dims.back();
    if (batch < 0 || q < 1 || batch + q > rank || static_cast<int64_t>(idx.dims.size()) <= batch) return std::nullopt;
    for (int64_t i = 0; i < batch; ++i) {
      if (idx.dims[i] != x.dims[i]) return std::nullopt;
    }
    std::vector<int64_t> dims(idx.dims.begin(), idx.dims.end() - 1);
    dims.insert(dims.end(), x.dims.begin() + batch + q, x.dims.end());
    if (Count(dims) < 0) return std::nullopt;
    int64_t slice = 1, batches = 1;
    for (int64_t i = batch + q; i < rank; ++i) slice *= x.dims[i];
    for (int64_t i = 0; i < batch; ++i) batches *= x.dims[i];
    const int64_t tuples = Count(idx.dims) / q, per_batch = tuples / std::max<int64_t>(1, batches);
    const std::vector<int64_t> strides = Strides(x.dims);
    for (int64_t t = 0; t < tuples; ++t) {
      for (int64_t j = 0; j < q; ++j) {
        const double i = idx.v[t * q + j];
        if (i < -x.dims[batch + j] || i >= x.dims[batch + j]) return std::nullopt;
      }
    }
    return Gathered(x, dims, [&](int64_t flat) {
      const int64_t t = flat / slice, within = flat % slice;
      int64_t at = (t / per_batch) * (batches > 1 ? strides[batch - 1] : 0) + within;
      for (int64_t j = 0; j < q; ++j) {
        int64_t i = ToInt(idx.v[t * q + j]);
        if (i < 0) i += x.dims[batch + j];
        at += i * strides[batch + j];
      }
      return at;
    });
  }

  // Trilu: the upper (j - i >= k) or lower (j - i <= k) triangle of the
  // last two axes; 0 elsewhere.
  static std::optional<Value> Trilu(const onnx::NodeProto& n, const Value& x, int64_t k) {
    if (x.dims.size() < 2) return std::nullopt;
    const bool upper = AttrInt(n, "upper", 1) != 0;
    const int64_t rows = x.dims[x.dims.size() - 2], cols = x.dims.back();
    Value out = x;
    for (size_t e = 0; e < out.v.size(); ++e) {
      const int64_t j = static_cast<int64_t>(e) % cols, i = static_cast<int64_t>(e) / cols % rows;
      if (upper ? j - i < k : j - i > k) out.v[e] = 0;
    }
    return out;
  }

  onnx::GraphProto& g_;
  const int64_t opset_;
  const bool finite_only_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, Value> values_;
};

}  // namespace

int FoldShapeComputations(onnx::GraphProto& graph, int64_t opset) { return Folder(graph, opset).Run(); }

std::optional<FoldedTensor> EvaluateConstant(onnx::GraphProto graph, int64_t opset, const std::string& name,
                                             int64_t limit) {
  struct Limit {
    const int64_t saved = max_elements;
    explicit Limit(int64_t limit) { max_elements = limit; }
    ~Limit() { max_elements = saved; }
  } scoped(limit);
  Folder folder(graph, opset, /*finite_only=*/false);
  folder.Run(/*rewrite=*/false);
  const Value* v = folder.Find(name);
  if (v == nullptr) return std::nullopt;
  return FoldedTensor{v->type, v->dims, v->v};
}

}  // namespace fusor::zoo
