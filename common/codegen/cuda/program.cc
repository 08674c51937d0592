#include "common/codegen/cuda/program.h"

#include <sstream>

namespace fusor::codegen {
namespace {

// Free text as "<length>\n<bytes>\n".
void PutText(std::ostringstream& out, const std::string& text) { out << text.size() << "\n" << text << "\n"; }

bool GetText(std::istringstream& in, std::string* text) {
  size_t n = 0;
  if (!(in >> n) || in.get() != '\n') return false;
  text->resize(n);
  if (n > 0 && !in.read(text->data(), static_cast<std::streamsize>(n))) return false;
  return in.get() == '\n';
}

}  // namespace

std::string ProgramToText(const Program& p) {
  std::ostringstream out;
  out.precision(17);
  out << "fusor-program 2\n" << p.buffers.size() << " buffers\n";
  for (const ProgramBuffer& b : p.buffers) {
    out << b.bytes << " " << b.input << " " << b.output << " " << b.zeroed << "\n";
  }
  out << p.steps.size() << " steps\n";
  for (const ProgramStep& s : p.steps) {
    out << (s.is_gemm ? "gemm " : "kernel ");
    PutText(out, s.what);
    if (s.is_gemm) {
      const GemmStep& g = s.gemm;
      out << g.dtype << " " << g.trans_a << " " << g.trans_b << " " << g.m << " " << g.n << " " << g.k << " " << g.lda
          << " " << g.ldb << " " << g.ldc << " " << g.stride_a << " " << g.stride_b << " " << g.stride_c << " "
          << g.batch << " " << g.alpha << " " << g.a << " " << g.b << " " << g.c << " " << g.offset_a << " "
          << g.offset_b << " " << g.offset_c << "\n";
    } else {
      const KernelStep& k = s.kernel;
      out << k.name << " " << k.grid << " " << k.threads << " " << k.shared_bytes << " " << k.args.size();
      for (int a : k.args) out << " " << a;
      out << " ";
      PutText(out, k.source);
    }
  }
  return out.str();
}

bool ProgramFromText(const std::string& text, Program* p, std::string* why) {
  std::istringstream in(text);
  std::string magic, word;
  int version = 0;
  size_t count = 0;
  auto fail = [&](const std::string& what) {
    *why = "malformed program: " + what;
    return false;
  };
  if (!(in >> magic >> version) || magic != "fusor-program" || version != 2) return fail("header");
  if (!(in >> count >> word) || word != "buffers") return fail("buffer count");
  p->buffers.assign(count, {});
  for (ProgramBuffer& b : p->buffers) {
    if (!(in >> b.bytes >> b.input >> b.output >> b.zeroed)) return fail("buffer");
  }
  if (!(in >> count >> word) || word != "steps") return fail("step count");
  p->steps.assign(count, {});
  const int buffers = static_cast<int>(p->buffers.size());
  auto valid = [&](int id) { return id >= 0 && id < buffers; };
  for (ProgramStep& s : p->steps) {
    if (!(in >> word) || (word != "gemm" && word != "kernel")) return fail("step kind");
    s.is_gemm = word == "gemm";
    if (!GetText(in, &s.what)) return fail("step description");
    if (s.is_gemm) {
      GemmStep& g = s.gemm;
      if (!(in >> g.dtype >> g.trans_a >> g.trans_b >> g.m >> g.n >> g.k >> g.lda >> g.ldb >> g.ldc >> g.stride_a >>
            g.stride_b >> g.stride_c >> g.batch >> g.alpha >> g.a >> g.b >> g.c >> g.offset_a >> g.offset_b >>
            g.offset_c)) {
        return fail("gemm step");
      }
      if (!valid(g.a) || !valid(g.b) || !valid(g.c)) return fail("gemm buffer");
    } else {
      KernelStep& k = s.kernel;
      size_t args = 0;
      if (!(in >> k.name >> k.grid >> k.threads >> k.shared_bytes >> args)) return fail("kernel step");
      k.args.assign(args, -1);
      for (int& a : k.args) {
        if (!(in >> a) || !valid(a)) return fail("kernel argument");
      }
      if (!GetText(in, &k.source)) return fail("kernel source");
    }
  }
  return true;
}

}  // namespace fusor::codegen
