#include "endpoint.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "headers.hpp"

namespace tensorlane::simhca {

Endpoint::~Endpoint() {
    if (fd_ >= 0) {
        ::close(fd_);
    }
}

int Endpoint::open() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
        return errno;
    }
    // A large receive buffer stands in for the NIC's: bursts of a send window must not be
    // dropped by the socket (drops are recovered, but cost a go-back-N). SO_RCVBUFFORCE needs
    // CAP_NET_ADMIN; without it the kernel caps SO_RCVBUF at net.core.rmem_max.
    const int rcvbuf = 32 << 20;
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)) != 0) {
        ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(ip_);
    addr.sin_port = htons(kRoceV2Port);
    if (::bind(fd_, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
        const int err = errno;
        ::close(fd_);
        fd_ = -1;
        return err;
    }
    return 0;
}

}  // namespace tensorlane::simhca
