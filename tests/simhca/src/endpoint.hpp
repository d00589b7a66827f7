// A RoCEv2 endpoint: the UDP socket bound to <IPv4 address of a RoCE v2 GID>:4791 on which the
// simulated port receives (Annex A17.4.5.1). Opened when the device's first QP is created and
// closed with its last, so a second process that opens the same simulated device gets
// EADDRINUSE from ibv_create_qp() instead of silently sharing the port.
#pragma once

#include <cstdint>

namespace tensorlane::simhca {

class SimDevice;

/// One bound receive socket.
class Endpoint {
public:
    /// An endpoint of dev's port for ip (host order); call open().
    Endpoint(SimDevice *dev, uint8_t port, uint32_t ip) : dev_(dev), port_(port), ip_(ip) {}
    ~Endpoint();
    Endpoint(const Endpoint &) = delete;
    Endpoint &operator=(const Endpoint &) = delete;

    /// Binds the socket; 0 or an errno value.
    [[nodiscard]] int open();
    /// The socket.
    [[nodiscard]] int fd() const { return fd_; }
    /// The local address (host order).
    [[nodiscard]] uint32_t ip() const { return ip_; }
    /// The device.
    [[nodiscard]] SimDevice *device() const { return dev_; }
    /// The port (1-based).
    [[nodiscard]] uint8_t port() const { return port_; }

private:
    SimDevice *dev_;
    uint8_t port_;
    uint32_t ip_;
    int fd_ = -1;
};

}  // namespace tensorlane::simhca
