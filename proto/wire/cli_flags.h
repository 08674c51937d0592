// Command-line flags shared by the programs that dial a scheduler (fusor
// and fusor-worker). Header-only: CLI11 is header-only too.
#pragma once

#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "proto/wire/channel.h"

namespace fusor::wire {

// --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name; the files
// default to FUSOR_TLS_CA, FUSOR_TLS_CERT and FUSOR_TLS_KEY.
inline void AddClientTlsFlags(CLI::App& app, ClientTls& tls) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  tls.ca_file = env("FUSOR_TLS_CA");
  tls.cert_file = env("FUSOR_TLS_CERT");
  tls.key_file = env("FUSOR_TLS_KEY");
  app.add_flag("--tls", tls.enabled, "TLS to the scheduler, verified against the system's roots (or --tls-ca)");
  app.add_option("--tls-ca", tls.ca_file, "PEM CA certificate that signed the scheduler's (implies --tls; env FUSOR_TLS_CA)");
  app.add_option("--tls-cert", tls.cert_file, "PEM certificate of this side, for a scheduler that requires mutual TLS "
                                             "(env FUSOR_TLS_CERT)");
  app.add_option("--tls-key", tls.key_file, "PEM private key of --tls-cert (env FUSOR_TLS_KEY)");
  app.add_option("--tls-server-name", tls.server_name,
                 "name to verify in the scheduler's certificate when it differs from the address's host");
}

}  // namespace fusor::wire
