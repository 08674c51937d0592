// What the CPU fused kernel and the CPU baseline emit alike: the source's
// preamble, the argument declarations, and vector loads and stores of
// elements `stride` apart (SIMD helpers of simd.inc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/codegen/emit.h"
#include "common/ir/chain.h"

namespace fusor::codegen::cpu {

// Flags every CPU kernel is compiled with (besides -shared -fPIC).
const std::vector<std::string>& CompileFlags();

// "float", or "uint16_t" for the bits of f16 and bf16.
std::string StorageType(ir::DType dtype);

// The metadata every CPU kernel's starts with: its entry point and
// signature, the chain's inputs and outputs, the schedule, the flags.
nlohmann::json KernelJson(const ir::Chain& chain, const std::string& schedule_text);

// The metadata's "prepare" entry of a kernel whose fusor_prepare makes
// `packs` (one line each: what is packed, for which op).
nlohmann::json PrepareJson(const std::vector<std::string>& packs);

// The title comment, includes, the runtime prelude and the SIMD helpers.
std::string Preamble(const std::string& title_comment);

// const T* const g_X = fusor_inputs[i]; T* const g_Y = fusor_outputs[j];
void DeclareArguments(emit::Writer& w, const ir::Chain& chain, const emit::Names& n);

// Where the lanes of one vector live: `ptr` is a C pointer to lane 0's
// element, lane i's is `stride` * i elements further (0: every lane reads
// the same element).
struct Lanes {
  std::string ptr;
  int64_t stride = 1;
  std::string stride_expr;            // a run-time stride instead, when not empty
  ir::DType dtype = ir::DType::kF32;  // of the stored elements
  std::string value;                  // the lanes' values already held (a register): VectorLoad is this
};
// A fusor_vf expression of the lanes' f32 values.
std::string VectorLoad(const Lanes& lanes);
// The statement storing the fusor_vf expression `value` into the lanes.
std::string VectorStore(const Lanes& lanes, const std::string& value);
// The C form of `e` over vectors along dim `d`: accesses become VectorLoad
// of `lanes_of(access)`, functions their fusor_v* forms.
std::string VectorExpr(const ir::Expr& e, const std::function<Lanes(const ir::Access&)>& lanes_of);

// The vector function of a scalar CallFunc name (fusor_vexp for exp, ...).
std::string VectorFunc(ir::Func f);

// A loop over `var` in [0, count): whole vectors of FUSOR_VL lanes, then
// the remaining elements one at a time. `body(true)` emits one vector step
// (lanes var .. var + FUSOR_VL - 1), `body(false)` one element; `define`
// is emitted first in both (e.g. the dim's index from `var`). With
// `masked_tail`, for a body that only loads, computes lane by lane and
// stores (no reduction across lanes or steps), the remaining elements are
// one vector step under a lane mask where the target has AVX-512: its
// loads and stores are the masked twins (simd.inc).
void VectorLoop(emit::Writer& w, const std::string& var, const std::string& count, const std::string& define,
                const std::function<void(bool vector)>& body, bool masked_tail = false);

}  // namespace fusor::codegen::cpu
