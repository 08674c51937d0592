#include "worker/cpu/compiler.h"

#include <sys/stat.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/util/process.h"

namespace fusor::worker {

CompileOutcome CompileKernel(const codegen::KernelSource& kernel, const std::string& workdir,
                             const std::string& compiler, double timeout_s, const std::string& lib_dir) {
  CompileOutcome out;
  const std::string src = workdir + "/kernel.cc";
  const std::string so = workdir + "/kernel.so";
  const std::string log = workdir + "/compile.log";
  std::vector<std::pair<std::string, std::string>> files = kernel.extra_files;
  files.emplace_back("kernel.cc", kernel.source);
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
  argv.insert(argv.end(), kernel.compile_flags.begin(), kernel.compile_flags.end());
  argv.insert(argv.end(), {"-shared", "-fPIC"});
  out.flags = absl::StrJoin(std::vector<std::string>(argv.begin() + 1, argv.end()), " ");
  std::vector<std::string> link;
  if (!kernel.link_libs.empty() && !lib_dir.empty()) link = {"-L" + lib_dir, "-Wl,-rpath," + lib_dir};
  for (const std::string& lib : kernel.link_libs) link.push_back("-l" + lib);
  for (const std::string& l : link) absl::StrAppend(&out.flags, " ", l);
  argv.insert(argv.end(), {"-o", so, src});
  argv.insert(argv.end(), link.begin(), link.end());

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
