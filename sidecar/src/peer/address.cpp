#include "peer/address.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <cstring>

namespace tensorlane::sidecar {

std::string HostAddress::text() const {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (family == AF_INET || family == AF_INET6) {
        ::inet_ntop(family, bytes.data(), buf, sizeof buf);
        return buf;
    }
    return "<no address>";
}

HostAddress hostOf(const SockAddr &a) {
    HostAddress h;
    if (a.storage.ss_family == AF_INET) {
        const auto *v4 = reinterpret_cast<const sockaddr_in *>(&a.storage);
        h.family = AF_INET;
        std::memcpy(h.bytes.data(), &v4->sin_addr, 4);
    } else if (a.storage.ss_family == AF_INET6) {
        const auto *v6 = reinterpret_cast<const sockaddr_in6 *>(&a.storage);
        if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
            h.family = AF_INET;
            std::memcpy(h.bytes.data(), v6->sin6_addr.s6_addr + 12, 4);
        } else {
            h.family = AF_INET6;
            std::memcpy(h.bytes.data(), &v6->sin6_addr, 16);
        }
    }
    return h;
}

int resolveAllHosts(const std::string &host, std::vector<HostAddress> *out, std::string *error) {
    SockAddr numeric;
    if (parseNumericAddress(host, 1, &numeric)) {
        *out = {hostOf(numeric)};
        return 0;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo *res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), "1", &hints, &res);
    if (rc != 0) {
        *error = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
        return rc < 0 ? rc : -rc;
    }
    std::vector<HostAddress> hosts;
    for (const addrinfo *p = res; p != nullptr; p = p->ai_next) {
        SockAddr a;
        std::memcpy(&a.storage, p->ai_addr, std::min<size_t>(p->ai_addrlen, sizeof a.storage));
        a.len = p->ai_addrlen;
        const HostAddress h = hostOf(a);
        if (!h.empty() && std::find(hosts.begin(), hosts.end(), h) == hosts.end()) {
            hosts.push_back(h);
        }
    }
    ::freeaddrinfo(res);
    *out = std::move(hosts);
    return 0;
}

std::string hostListText(const std::vector<HostAddress> &hosts) {
    if (hosts.empty()) {
        return "not resolved yet";
    }
    std::string out;
    for (size_t i = 0; i < hosts.size() && i < 4; ++i) {
        out += (i == 0 ? "" : ", ") + hosts[i].text();
    }
    if (hosts.size() > 4) {
        out += ", ...";
    }
    return out;
}

}  // namespace tensorlane::sidecar
