// Helpers shared by the CPU and CUDA code generators: indented writing,
// literals, names of generated variables and the C form of the IR's
// affine indices and expressions. Both backends' kernels define the same
// scalar helpers (fusor_f16_to_f32, fusor_gelu, ...), so expressions print
// the same way for either.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/ir/chain.h"

namespace fusor::codegen::emit {

// Indented source text.
class Writer {
 public:
  void Line(absl::string_view text) {
    out_.append(2 * indent_, ' ');
    out_.append(text.data(), text.size());
    out_ += '\n';
  }
  void Open(absl::string_view head) {
    Line(absl::StrCat(head, " {"));
    ++indent_;
  }
  void Close(absl::string_view tail = "") {
    --indent_;
    Line(absl::StrCat("}", tail));
  }
  void Raw(absl::string_view text) { out_.append(text.data(), text.size()); }
  int depth() const { return indent_; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
  int indent_ = 0;
};

// Names of generated variables; every user name gets a prefix, so dims
// and tensors may be named anything the front end accepts.
struct Names {
  const ir::Chain& chain;
  std::string V(int d) const { return "v_" + chain.dims[d].name; }  // absolute index
  std::string I(int d) const { return "i_" + chain.dims[d].name; }  // index within range
  std::string O(int d) const { return "o_" + chain.dims[d].name; }  // range origin
  std::string N(int d) const { return "n_" + chain.dims[d].name; }  // range length
  std::string Global(int t) const { return "g_" + chain.tensors[t].name; }
  std::string Local(int t) const { return "l_" + chain.tensors[t].name; }
  std::string Full(int t) const { return "f_" + chain.tensors[t].name; }
};

std::string FloatLit(double v);
// The f32 value of a stored element (f16/bf16 storage converts).
std::string LoadConvert(ir::DType dtype, const std::string& lvalue);
std::string StoreConvert(ir::DType dtype, const std::string& value);
// sum of coefficient * variable + constant, as C.
std::string LinearToC(const std::vector<std::pair<int64_t, std::string>>& terms, int64_t constant);
std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& shape);
// Flat offset of an access into its tensor's row-major global layout.
std::string GlobalOffset(const ir::Access& a, const Names& n);
// Per dim: the stride of the dim's variable in `a`'s flat global offset.
std::map<int, int64_t> GlobalStrides(const ir::Access& a, const ir::Chain& chain, int64_t* constant);
std::string CallFunc(ir::Func f, const std::string& arg);
using LoadFn = std::function<std::string(const ir::Access&)>;
std::string ExprToC(const ir::Expr& e, const LoadFn& load);
// Product of `factors` times `scale` as a C float expression.
std::string ProductToC(const std::vector<ir::Access>& factors, double scale, const LoadFn& load);
// Horner form of the flat index of dims within their ranges.
std::string FlatIndex(const std::vector<int>& dims, const Names& n);
// The product of the dims' range lengths.
std::string Count(const std::vector<int>& dims, const Names& n);
// name, dtype and shape of each tensor, for kernel metadata.
nlohmann::json TensorsJson(const ir::Chain& chain, const std::vector<int>& ids);

}  // namespace fusor::codegen::emit
