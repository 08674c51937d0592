// Readiness for a service manager: systemd's sd_notify protocol (a datagram
// to the unix socket $NOTIFY_SOCKET), without linking libsystemd. Each call
// is a no-op outside a `Type=notify` unit.
#pragma once

#include <string>

namespace fusor {

// "READY=1" and a status line: the service is serving.
void NotifyReady(const std::string& status = "");
// "STOPPING=1": the service is shutting down.
void NotifyStopping();

}  // namespace fusor
