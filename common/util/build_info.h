// What this build of fusor is (its version, the commit it was built from,
// the compiler), and the command-line conventions every fusor program
// shares: --version, and exit status 2 for a usage error.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace fusor {

struct BuildInfo {
  std::string version;   // the project's, from CMakeLists.txt
  std::string commit;    // git's short hash when the build was configured; "unknown" outside a checkout
  std::string compiler;  // e.g. "GNU 12.2.0"
};

const BuildInfo& Build();

// "PROGRAM VERSION (commit C, COMPILER)".
inline std::string VersionLine(const std::string& program) {
  const BuildInfo& b = Build();
  return program + " " + b.version + " (commit " + b.commit + ", " + b.compiler + ")";
}

// Adds --version to `app` and parses the command line: nullopt to go on,
// else the exit status: 0 after --help or --version (printed), 2 for a
// usage error (the message printed with a hint to --help).
inline std::optional<int> ParseCommandLine(CLI::App& app, const std::string& program, int argc, char** argv) {
  app.set_version_flag("--version", VersionLine(program), "print the version, the commit and the compiler, and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace fusor
