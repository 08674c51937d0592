#include "worker/cpu/compiler.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/util/files.h"
#include "common/util/process.h"
#include "common/util/sha256.h"

namespace fusor::worker {
namespace {

// `kernel`'s source with its preamble replaced by an #include of the
// precompiled copy in `pch_dir` (built here first when it is not there
// yet); the source as it is when it has no preamble or the copy cannot be
// built.
std::string WithPrecompiledPreamble(const codegen::KernelSource& kernel, const std::string& compiler,
                                    const std::vector<std::string>& flags, double timeout_s,
                                    const std::string& pch_dir) {
  const std::string preamble = codegen::CpuKernelPreamble();
  const size_t at = kernel.source.find(preamble);
  if (at == std::string::npos) return kernel.source;
  // Only comments may come before it (a precompiled header must come first).
  for (absl::string_view line : absl::StrSplit(absl::string_view(kernel.source).substr(0, at), '\n')) {
    if (!line.empty() && !absl::StartsWith(line, "//")) return kernel.source;
  }
  const std::string key = Sha256Hex(absl::StrCat(compiler, "\n", absl::StrJoin(flags, " "), "\n", preamble));
  const std::string header = absl::StrCat(pch_dir, "/fusor_preamble_", key.substr(0, 16), ".h");
  std::error_code ec;
  // A compiler that could not build it once is not asked again.
  if (std::filesystem::exists(header + ".failed", ec)) return kernel.source;
  if (!std::filesystem::exists(header + ".gch", ec)) {
    // One job builds it; the others (compiling ahead, together) wait for it.
    std::filesystem::create_directories(pch_dir, ec);
    // Without the lock file each job builds its own copy, as before.
    absl::StatusOr<FileLock> building = FileLock::Wait(header + ".lock");
    if (std::filesystem::exists(header + ".failed", ec)) return kernel.source;
    if (!std::filesystem::exists(header + ".gch", ec)) {
      // Written aside and renamed, so that a job that did not wait (an
      // older worker's) sees all of it or nothing.
      const std::string part = absl::StrCat(header, ".", getpid());
      {
        std::ofstream f(part);
        f << preamble;
        if (!f) return kernel.source;
      }
      std::filesystem::rename(part, header, ec);
      std::vector<std::string> argv = {compiler};
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.insert(argv.end(), {"-x", "c++-header", "-o", part + ".gch", header});
      auto run = RunProcess(argv, part + ".log", timeout_s);
      std::filesystem::remove(part + ".log", ec);
      if (!run.ok() || run->timed_out || run->signaled || run->exit_code != 0) {
        std::filesystem::remove(part + ".gch", ec);
        std::ofstream(header + ".failed") << "the precompiled header could not be built\n";
        return kernel.source;
      }
      std::filesystem::rename(part + ".gch", header + ".gch", ec);
      if (ec) return kernel.source;
    }
  }
  return absl::StrCat(kernel.source.substr(0, at), "#include \"", header, "\"\n",
                      kernel.source.substr(at + preamble.size()));
}

}  // namespace

CompileOutcome CompileKernel(const codegen::KernelSource& kernel, const std::string& workdir,
                             const std::string& compiler, double timeout_s, const std::string& lib_dir,
                             const std::string& pch_dir, const std::string& object_dir) {
  namespace fs = std::filesystem;
  CompileOutcome out;
  const std::string src = workdir + "/kernel.cc";
  const std::string so = workdir + "/kernel.so";
  const std::string log = workdir + "/compile.log";
  std::vector<std::string> pic_flags = kernel.compile_flags;
  pic_flags.insert(pic_flags.end(), {"-shared", "-fPIC"});
  std::vector<std::pair<std::string, std::string>> files = kernel.extra_files;
  const std::string source =
      pch_dir.empty() ? kernel.source : WithPrecompiledPreamble(kernel, compiler, pic_flags, timeout_s, pch_dir);
  files.emplace_back("kernel.cc", source);
  for (const auto& [name, text] : files) {
    const std::string path = workdir + "/" + name;
    std::ofstream f(path);
    f << text;
    if (!f) {
      out.error = "cannot write " + path;
      return out;
    }
  }
  std::vector<std::string> argv = {compiler};
  argv.insert(argv.end(), pic_flags.begin(), pic_flags.end());
  if (source != kernel.source) argv.push_back("-Winvalid-pch");  // a header it cannot use says so in the log
  out.flags = absl::StrJoin(std::vector<std::string>(argv.begin() + 1, argv.end()), " ");
  std::vector<std::string> link;
  if (!kernel.link_libs.empty() && !lib_dir.empty()) link = {"-L" + lib_dir, "-Wl,-rpath," + lib_dir};
  for (const std::string& lib : kernel.link_libs) link.push_back("-l" + lib);
  for (const std::string& l : link) absl::StrAppend(&out.flags, " ", l);
  argv.insert(argv.end(), {"-o", so, src});
  argv.insert(argv.end(), link.begin(), link.end());
  std::string kept;
  std::error_code ec;
  if (!object_dir.empty()) {
    std::string key = absl::StrCat(compiler, "\n", out.flags);
    for (const auto& [name, text] : files) absl::StrAppend(&key, "\n", name, "\n", text.size(), "\n", text);
    kept = absl::StrCat(object_dir, "/", Sha256Hex(key).substr(0, 32), ".so");
    if (fs::exists(kept, ec) && fs::copy_file(kept, so, fs::copy_options::overwrite_existing, ec) && !ec) {
      fs::last_write_time(kept, fs::file_time_type::clock::now(), ec);  // recently used
      out.ok = true;
      out.cached = true;
      out.so_path = so;
      out.code_bytes = static_cast<int64_t>(fs::file_size(so, ec));
      return out;
    }
  }

  auto run = RunProcess(argv, log, timeout_s);
  if (!run.ok()) {
    out.error = std::string(run.status().message());
    return out;
  }
  out.seconds = run->seconds;
  if (run->timed_out) {
    out.error = absl::StrCat("compiler timed out after ", timeout_s, " s");
    return out;
  }
  if (run->signaled || run->exit_code != 0) {
    out.error = absl::StrCat("compiler failed (", run->signaled ? "signal " : "exit ",
                             run->signaled ? run->signal : run->exit_code, "): ", ReadTail(log, 4000));
    return out;
  }
  struct stat st;
  if (stat(so.c_str(), &st) != 0) {
    out.error = "compiler produced no shared object";
    return out;
  }
  out.ok = true;
  out.so_path = so;
  out.code_bytes = st.st_size;
  if (!kept.empty()) {
    // Copied aside and renamed: a job reading it sees all of it or nothing.
    fs::create_directories(object_dir, ec);
    const std::string part = absl::StrCat(kept, ".", getpid(), ".part");
    if (fs::copy_file(so, part, fs::copy_options::overwrite_existing, ec) && !ec) {
      fs::rename(part, kept, ec);
      if (ec) fs::remove(part, ec);
      EvictLeastRecentlyUsed(object_dir, kObjectCacheBytes, kept);
    }
  }
  return out;
}

absl::StatusOr<std::string> CompilerVersion(const std::string& compiler, const std::string& workdir) {
  const std::string log = workdir + "/version.log";
  auto run = RunProcess({compiler, "--version"}, log, 30);
  if (!run.ok()) return run.status();
  if (run->timed_out || run->signaled || run->exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat("'", compiler, " --version' failed"));
  }
  std::string text = ReadTail(log, 4096);
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  return lines.empty() ? std::string() : lines[0];
}

}  // namespace fusor::worker
