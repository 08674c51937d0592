// --config FILE for the daemons: a YAML map from flag names (without the
// leading --) to values (a list for an option taking several), read before
// the command line, whose flags override it. An unknown name, a nested map
// or YAML that does not parse is a usage error (exit 2), naming the line.
//   listen: 0.0.0.0:7788
//   tls-cert: /etc/fusor/tls/scheduler.pem
//   insecure: false
#pragma once

#include <CLI/CLI.hpp>

namespace fusor {

void AddConfigFile(CLI::App& app);

}  // namespace fusor
