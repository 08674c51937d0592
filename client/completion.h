// `fusor completion bash|zsh`: a shell completion script for the commands
// and options of an app, generated from the app itself (so it never falls
// behind the command line).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace fusor::cli {

struct CompletionCommand {
  CLI::App* cmd = nullptr;
  std::string shell;
};
void AddCompletion(CLI::App& app, CompletionCommand& c);
// The script for `shell` ("bash" or "zsh") completing `app`, whose name is
// the program's.
std::string CompletionScript(CLI::App& app, const std::string& program, const std::string& shell);

}  // namespace fusor::cli
