#include "common/codegen/cuda/nvrtc.h"

#include <dlfcn.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <memory>
#include <sstream>

namespace fusor::codegen {

// NVRTC's C API (nvrtc.h), declared here so nothing needs its headers.
struct Nvrtc::Api {
  using Program = struct NvrtcProgramOpaque*;
  int (*version)(int*, int*);
  int (*create)(Program*, const char*, const char*, int, const char* const*, const char* const*);
  int (*compile)(Program, int, const char* const*);
  int (*log_size)(Program, size_t*);
  int (*log)(Program, char*);
  int (*cubin_size)(Program, size_t*);
  int (*cubin)(Program, char*);
  int (*ptx_size)(Program, size_t*);
  int (*ptx)(Program, char*);
  int (*destroy)(Program*);
  const char* (*error_string)(int);
};

namespace {

std::vector<std::string> Candidates() {
  std::vector<std::string> names = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"};
  std::vector<std::string> out;
  if (const char* explicit_path = std::getenv("FUSOR_NVRTC")) out.push_back(explicit_path);
  out.insert(out.end(), names.begin(), names.end());
  std::vector<std::string> dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* v = std::getenv(var)) dirs.push_back(std::string(v) + "/lib64");
  }
#ifdef FUSOR_CUDA_LIB_DIR
  dirs.push_back(FUSOR_CUDA_LIB_DIR);
#endif
  dirs.push_back("/usr/local/cuda/lib64");
  for (const std::string& d : dirs) {
    for (const std::string& n : names) out.push_back(d + "/" + n);
  }
  return out;
}

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  return fn != nullptr;
}

// nullptr when no candidate library has NVRTC's entry points.
const Nvrtc::Api* LoadApi(std::string* why) {
  std::vector<std::string> tried = Candidates();
  for (const std::string& path : tried) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) continue;
    auto api = std::make_unique<Nvrtc::Api>();
    bool ok = Resolve(h, "nvrtcVersion", api->version) && Resolve(h, "nvrtcCreateProgram", api->create) &&
              Resolve(h, "nvrtcCompileProgram", api->compile) && Resolve(h, "nvrtcGetProgramLogSize", api->log_size) &&
              Resolve(h, "nvrtcGetProgramLog", api->log) && Resolve(h, "nvrtcGetCUBINSize", api->cubin_size) &&
              Resolve(h, "nvrtcGetCUBIN", api->cubin) && Resolve(h, "nvrtcGetPTXSize", api->ptx_size) &&
              Resolve(h, "nvrtcGetPTX", api->ptx) && Resolve(h, "nvrtcDestroyProgram", api->destroy) &&
              Resolve(h, "nvrtcGetErrorString", api->error_string);
    if (ok) return api.release();
    dlclose(h);
  }
  std::string list;
  for (const std::string& t : tried) list += (list.empty() ? "" : ", ") + t;
  *why = "NVRTC not found (install the CUDA toolkit, or set FUSOR_NVRTC or CUDA_HOME); tried " + list;
  return nullptr;
}

// The number before `unit` in `text` (e.g. "Used 40 registers"), or -1.
int64_t NumberBefore(const std::string& text, const std::string& unit) {
  size_t at = text.find(unit);
  if (at == std::string::npos) return -1;
  size_t end = at;
  while (end > 0 && text[end - 1] == ' ') --end;
  size_t begin = end;
  while (begin > 0 && text[begin - 1] >= '0' && text[begin - 1] <= '9') --begin;
  if (begin == end) return -1;
  return std::strtoll(text.substr(begin, end - begin).c_str(), nullptr, 10);
}

}  // namespace

const Nvrtc* Nvrtc::Get(std::string* why) {
  static std::string error;
  static const Nvrtc* const instance = [] {
    const Api* api = LoadApi(&error);
    return api == nullptr ? nullptr : new Nvrtc(api);
  }();
  if (instance == nullptr && why != nullptr) *why = error;
  return instance;
}

std::string Nvrtc::Version() const {
  int major = 0, minor = 0;
  api_->version(&major, &minor);
  return "NVRTC " + std::to_string(major) + "." + std::to_string(minor);
}

NvrtcOutput Nvrtc::Compile(const std::string& source, const std::string& arch,
                           const std::vector<std::pair<std::string, std::string>>& headers) const {
  NvrtcOutput out;
  out.arch = arch;
  out.options = {"-arch=" + arch, "-std=c++17", "--ptxas-options=-v", "-DNDEBUG"};
  const auto start = std::chrono::steady_clock::now();
  std::vector<const char*> header_text, header_names, options;
  for (const auto& [name, text] : headers) {
    header_names.push_back(name.c_str());
    header_text.push_back(text.c_str());
  }
  for (const std::string& o : out.options) options.push_back(o.c_str());
  Api::Program program = nullptr;
  int rc = api_->create(&program, source.c_str(), "fusor_kernel.cu", static_cast<int>(headers.size()),
                        header_text.data(), header_names.data());
  if (rc != 0) {
    out.log = std::string("nvrtcCreateProgram: ") + api_->error_string(rc);
    return out;
  }
  rc = api_->compile(program, static_cast<int>(options.size()), options.data());
  size_t size = 0;
  if (api_->log_size(program, &size) == 0 && size > 1) {
    out.log.resize(size);
    api_->log(program, out.log.data());
    out.log.resize(std::strlen(out.log.c_str()));
  }
  const bool ptx_only = arch.rfind("compute_", 0) == 0;
  if (rc == 0 && ptx_only && api_->ptx_size(program, &size) == 0 && size > 0) {
    out.ptx.resize(size);
    if (api_->ptx(program, out.ptx.data()) == 0) out.ok = true;
    out.ptx.resize(std::strlen(out.ptx.c_str()));
  } else if (rc == 0 && !ptx_only && api_->cubin_size(program, &size) == 0 && size > 0) {
    out.cubin.resize(size);
    if (api_->cubin(program, out.cubin.data()) == 0) out.ok = true;
  } else if (rc != 0) {
    out.log = std::string(api_->error_string(rc)) + "\n" + out.log;
  }
  api_->destroy(&program);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (out.ok && !ptx_only) out.usage = ParsePtxasReport(out.log);
  return out;
}

ResourceUsage ParsePtxasReport(const std::string& log) {
  ResourceUsage u;
  int64_t regs = NumberBefore(log, " registers");
  u.registers = static_cast<int>(regs);
  u.stack_bytes = NumberBefore(log, " bytes stack frame");
  u.spill_store_bytes = NumberBefore(log, " bytes spill stores");
  u.spill_load_bytes = NumberBefore(log, " bytes spill loads");
  int64_t smem = NumberBefore(log, " bytes smem");
  u.static_shared_bytes = smem < 0 ? 0 : smem;
  return u;
}

std::vector<int64_t> PtxEntryParamBytes(const std::string& ptx, const std::string& kernel) {
  const std::string head = ".entry " + kernel + "(";
  const size_t begin = ptx.find(head);
  if (begin == std::string::npos) return {-1};
  const size_t end = ptx.find(')', begin);
  std::istringstream list(ptx.substr(begin + head.size(), end - begin - head.size()));
  std::vector<int64_t> bytes;
  std::string param;
  while (std::getline(list, param, ',')) {
    std::istringstream words(param);
    std::string word;
    int64_t size = -1;
    while (words >> word) {
      if (const size_t open = word.find('['); open != std::string::npos) {
        size = std::strtoll(word.c_str() + open + 1, nullptr, 10);  // .b8 name[24]
      } else if ((word.size() == 3 || word.size() == 4) && word[0] == '.' &&
                 std::strchr("usbf", word[1]) != nullptr && std::isdigit(static_cast<unsigned char>(word[2]))) {
        size = std::strtoll(word.c_str() + 2, nullptr, 10) / 8;  // .u64, .f32, ...
      }
    }
    bytes.push_back(size);
  }
  return bytes;
}

DeviceLimits LimitsForArch(const std::string& arch) {
  DeviceLimits l;
  if (arch == "sm_80" || arch == "sm_87") {
    l.max_shared_per_block = 163 << 10;
  } else if (arch == "sm_86" || arch == "sm_89") {
    l.max_shared_per_block = 99 << 10;
  } else if (arch.rfind("sm_90", 0) == 0 || arch.rfind("sm_10", 0) == 0) {
    l.max_shared_per_block = 227 << 10;
  }
  return l;
}

std::string CheckResources(const ResourceUsage& usage, int threads, int64_t dynamic_shared,
                           const DeviceLimits& limits) {
  std::ostringstream why;
  const int64_t shared = dynamic_shared + usage.static_shared_bytes;
  if (usage.registers < 0) {
    why << "ptxas reported no register count";
  } else if (usage.spill_store_bytes > 0 || usage.spill_load_bytes > 0) {
    why << "spills registers (" << usage.spill_store_bytes << " bytes stored, " << usage.spill_load_bytes
        << " bytes loaded)";
  } else if (threads > limits.max_threads_per_block) {
    why << threads << " threads per block exceed the device's " << limits.max_threads_per_block;
  } else if (static_cast<int64_t>(usage.registers) * threads > limits.registers_per_sm) {
    why << usage.registers << " registers x " << threads << " threads exceed the " << limits.registers_per_sm
        << " registers of a multiprocessor";
  } else if (shared > limits.max_shared_per_block) {
    why << shared << " bytes of shared memory exceed the device's " << limits.max_shared_per_block << " per block";
  }
  return why.str();
}

bool CompileProgram(const Program& program, const std::string& arch, const std::string& device_header,
                    const DeviceLimits& limits, CompiledProgram* out, std::string* why) {
  *out = CompiledProgram();
  out->cubins.resize(program.steps.size());
  const Nvrtc* nvrtc = nullptr;
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const ProgramStep& step = program.steps[i];
    if (step.is_gemm) continue;
    if (nvrtc == nullptr && (nvrtc = Nvrtc::Get(why)) == nullptr) return false;
    const KernelStep& k = step.kernel;
    NvrtcOutput built = nvrtc->Compile(k.source, arch, {{"fusor_device.h", device_header}});
    out->compile_s += built.seconds;
    out->code_bytes += static_cast<int64_t>(built.cubin.size());
    out->options = built.options;
    out->usage.push_back(built.usage);
    if (!built.ok) {
      *why = step.what + ": NVRTC: " + built.log;
      return false;
    }
    if (std::string reject = CheckResources(built.usage, k.threads, k.shared_bytes, limits); !reject.empty()) {
      *why = step.what + ": " + reject;
      return false;
    }
    out->cubins[i] = std::move(built.cubin);
  }
  return true;
}

}  // namespace fusor::codegen
