#include "worker/cpu/cpu_target.h"

#include <sched.h>
#include <sys/utsname.h>

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util/status_macros.h"
#include "worker/cpu/compiler.h"

namespace fusor::worker {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "48K", "2048K", "32M" -> bytes.
int64_t ParseCacheSize(std::string text) {
  text = std::string(absl::StripAsciiWhitespace(text));
  int64_t mult = 1;
  if (!text.empty() && (text.back() == 'K' || text.back() == 'M')) {
    mult = text.back() == 'K' ? 1024 : 1024 * 1024;
    text.pop_back();
  }
  int64_t v = 0;
  return absl::SimpleAtoi(text, &v) ? v * mult : 0;
}

}  // namespace

absl::StatusOr<hw::TargetDesc> DescribeCpu(const std::string& compiler, const std::string& workdir) {
  hw::TargetDesc t;
  t.backend = hw::Backend::kCpu;

  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(cpuinfo, line)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
    std::string key(absl::StripAsciiWhitespace(kv.first));
    std::string value(absl::StripAsciiWhitespace(kv.second));
    if (t.device_name.empty() && (key == "model name" || key == "Model" || key == "CPU part")) {
      t.device_name = value;
    }
    if (flags.empty() && (key == "flags" || key == "Features")) {
      for (absl::string_view f : absl::StrSplit(value, ' ', absl::SkipEmpty())) flags.insert(std::string(f));
    }
  }
  for (const char* f : {"avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c", "avx", "sse4_2", "asimd",
                        "fphp", "sve"}) {
    if (flags.count(f)) t.isa_features.push_back(f);
  }
  struct utsname u;
  std::string machine = uname(&u) == 0 ? u.machine : "unknown";
  if (machine == "x86_64") {
    t.arch = t.HasFeature("avx512f") ? "x86-64-avx512" : t.HasFeature("avx2") ? "x86-64-avx2" : "x86-64";
    t.vector_lanes_f32 = t.HasFeature("avx512f") ? 16 : t.HasFeature("avx") ? 8 : 4;
  } else {
    t.arch = machine;
    t.vector_lanes_f32 = 4;
  }

  cpu_set_t set;
  CPU_ZERO(&set);
  t.compute_units = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;

  for (int i = 0; i < 8; ++i) {
    std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    std::string level = ReadFirstLine(dir + "/level");
    if (level.empty()) break;
    std::string type = ReadFirstLine(dir + "/type");
    int64_t size = ParseCacheSize(ReadFirstLine(dir + "/size"));
    if (level == "1" && type == "Data") t.l1d_bytes = size;
    if (level == "2") t.l2_bytes = size;
    if (level == "3") t.l3_bytes = size;
  }
  ASSIGN_OR_RETURN(t.compiler, CompilerVersion(compiler, workdir));
  return t;
}

}  // namespace fusor::worker
