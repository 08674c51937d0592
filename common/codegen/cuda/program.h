// A GPU program: what runs for one measurement of a chain. Device buffers
// (the chain's inputs and outputs, and scratch for intermediates) and
// steps in order: kernel launches (CUDA source compiled by NVRTC) and
// strided batched GEMMs (cuBLAS). A fused candidate is one kernel; the
// unfused baseline is one step per op.
//
// Plain C++17 with a line-based text form, so the GPU device check can
// carry programs generated here to a machine that has only CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusor::codegen {

struct ProgramBuffer {
  int64_t bytes = 0;
  int input = -1;   // index among the chain's inputs, or
  int output = -1;  // among its outputs; neither: scratch
  // Scratch filled with zeros once, when it is allocated: a split kernel's
  // workspace, whose counters each launch leaves at zero again.
  bool zeroed = false;
};

// Row-major C[m, n] = alpha * A[m, k] * B[k, n] per batch, each operand
// at buffer + offset + batch * stride (elements); `trans_a`: A is stored
// [k][m] (row length lda), `trans_b`: B is stored [n][k].
struct GemmStep {
  // f32 (tf32 tensor cores), f16, bf16, all with f32 accumulation; or
  // f32-exact: f32 arithmetic throughout (the validation reference).
  std::string dtype = "f32";
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int64_t batch = 1;
  double alpha = 1;
  int a = -1, b = -1, c = -1;  // buffers
  int64_t offset_a = 0, offset_b = 0, offset_c = 0;
};

// The kernel's one argument is the buffers' addresses in `args` order.
struct KernelStep {
  std::string name;
  std::string source;
  int64_t grid = 1;
  int threads = 128;
  int64_t shared_bytes = 0;
  std::vector<int> args;
};

struct ProgramStep {
  std::string what;  // for people, e.g. "S = sum(k) Q*K (cuBLAS)"
  bool is_gemm = false;
  GemmStep gemm;
  KernelStep kernel;
};

struct Program {
  std::vector<ProgramBuffer> buffers;
  std::vector<ProgramStep> steps;
};

std::string ProgramToText(const Program& program);
// false (with `why`) on malformed text.
bool ProgramFromText(const std::string& text, Program* program, std::string* why);

}  // namespace fusor::codegen
