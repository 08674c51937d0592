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
#include "common/space/loop_nest.h"

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
  std::string E(int d) const { return "e_" + chain.dims[d].name; }  // a causal axis's end in the block
  std::string X(int d) const { return "x_" + chain.dims[d].name; }  // a ranged dim's size in this call
  std::string T(int d) const { return "t_" + chain.dims[d].name; }  // a ranged dim's tiles in this call
  // A dim's size as C: a ranged dim's x_<name>, else its extent.
  std::string Extent(int d) const {
    return chain.dims[d].Ranged() ? X(d) : absl::StrCat(chain.dims[d].extent, "L");
  }
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
// Flat offset of an access into its tensor's row-major global layout (an
// axis outside one sized by a ranged dim strides by that dim's x_<name>).
std::string GlobalOffset(const ir::Access& a, const Names& n);
// Per dim: the stride of the dim's variable in `a`'s flat global offset,
// with ranged dims at their largest sizes.
std::map<int, int64_t> GlobalStrides(const ir::Access& a, const ir::Chain& chain, int64_t* constant);
// Whether that stride of dim d changes with the sizes of ranged dims.
bool RuntimeGlobalStride(const ir::Access& a, int d, const ir::Chain& chain);
// That stride as C (a literal where it does not change).
std::string GlobalStrideC(const ir::Access& a, int d, const Names& n);
// The elements of tensor t as C (a product of ranged sizes where it has
// ranged axes).
std::string ElementsC(int t, const Names& n);
std::string CallFunc(ir::Func f, const std::string& arg);
// A softmax's value `x` at the current point (v_<axis>, v_<row> defined),
// or `minus_infinity` where a causal softmax drops the entry.
std::string CausalValue(const ir::Op& softmax, const Names& n, const std::string& x, const std::string& minus_infinity);
// The entries a causal softmax keeps in the current row's range
// [o_<axis>, o_<axis> + n_<axis>), as a C expression (v_<row> defined).
std::string CausalKept(const ir::Op& softmax, const Names& n);
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

// Opens one loop per dim over [o_d, o_d + n_d), defining i_d and v_d.
// Returns how many scopes it opened.
int OpenPointLoops(Writer& w, const std::vector<int>& dims, const Names& n, const std::string& pragma_on_first = "");
void CloseScopes(Writer& w, int count);

// The index arithmetic of a fused loop nest that both generators emit the
// same way: tile ranges, offsets into block-local buffers and online
// softmax state, and where an op's result goes.
class NestIndex {
 public:
  NestIndex(const ir::Chain& chain, const space::LoopNest& nest);

  bool IsBlock(int d) const { return block_[d]; }
  // Dim d's tiles (loop trips) as C: t_<name> for a ranged dim.
  std::string Trips(int d) const;
  // The blocks of the launch as C (a product over ranged dims' tiles).
  std::string Blocks() const;
  // x_<name> and t_<name> of each ranged dim: from `dims` (a C array of
  // their sizes, in RangedDims() order), or at their largest sizes when
  // `dims` is empty.
  void DeclareSizes(Writer& w, const std::string& dims) const;
  // min(tile, extent - origin); the tile itself where it divides the extent.
  std::string RangeOf(int d, const std::string& origin) const;
  // Offset into a block-local buffer (see space::LocalBuffer).
  std::string LocalOffset(const ir::Access& a) const;
  // Offset into an online softmax's per-row state (its dims but the axis).
  std::string StateOffset(const ir::Op& softmax) const;
  // How far LocalOffset(a) and StateOffset(softmax) move per step of dim d.
  int64_t LocalStride(const ir::Access& a, int d) const;
  int64_t StateStride(const ir::Op& softmax, int d) const;
  // The f32 value of an access inside an op: its block-local buffer, or
  // global memory converted from the chain's dtype.
  std::string Load(const ir::Access& a) const;
  // o_d = 0, n_d = extent for the op's dims no block, stream or own loop
  // ranges over; n_d = e_d for a causal axis the op sees end there
  // (space::CausalBounded; `in_stream`: the op's statements are emitted
  // inside the stream loop, not hoisted out of it).
  void DefineFullRanges(Writer& w, const space::OpNest& on, bool in_stream = true) const;
  // for (o_d = 0; o_d < extent; o_d += tile) with n_d its range: op `on`'s
  // own loop, or (null) the stream loop. A causal axis bounded there runs
  // up to e_d; the stream loop over a causal softmax's rows defines e_<axis>
  // for its tile.
  void OpenTileLoop(Writer& w, int d, const space::OpNest* on = nullptr) const;
  // o_d and n_d of every block dim from the block's flat index (a causal
  // softmax's row dim counted down: the longest rows first), and e_<axis>
  // when the rows are a block dim.
  void DefineBlockOrigins(Writer& w, const std::string& block_index) const;
  // Whether op `on` sees dim d end at e_d.
  bool Bounded(int d, const space::OpNest* on, bool in_stream = true) const {
    return space::CausalBounded(chain_, nest_, d, on, in_stream);
  }
  // Writes `value` to the op's result at the current point: its local
  // buffer (accumulating across the stream loop when the op does, rescaled
  // by an online softmax's sscale<op>) and its global output (unless that
  // waits for the end of the stream loop).
  void Store(Writer& w, const space::OpNest& on, const std::string& value) const;

 private:
  // e_<axis>: where the causal axis ends for the current row tile.
  void DefineCausalEnd(Writer& w) const;

  const ir::Chain& chain_;
  const space::LoopNest& nest_;
  Names n_;
  std::vector<bool> block_;
};

}  // namespace fusor::codegen::emit
