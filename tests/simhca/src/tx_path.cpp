#include "tx_path.hpp"

#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "headers.hpp"

namespace tensorlane::simhca {

uint16_t roceSourcePort(uint32_t qpn) {
    // hash_32() of include/linux/hash.h: multiply by GOLDEN_RATIO_32, keep the top bits.
    const uint32_t hash = (qpn * 0x61C88647u) >> (32 - 14);
    return static_cast<uint16_t>(0xc000 | (hash & 0x3fff));
}

TxPath::~TxPath() {
    if (fd_ >= 0) {
        ::close(fd_);
    }
}

int TxPath::open(uint32_t src_ip, uint16_t src_port, uint32_t dst_ip, uint8_t tos, uint8_t ttl) {
    if (fd_ >= 0) {
        ::close(fd_);
    }
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
        return errno;
    }
    const int one = 1;
    // Two QPs whose numbers hash alike share a source port, as on real NICs.
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    // DF on every datagram: RoCE is never fragmented, and DF on an unconnected socket gives
    // IPv4 id 0, which the receiver's ICRC check assumes.
    const int pmtu = IP_PMTUDISC_PROBE;
    ::setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
    const int sndbuf = 8 << 20;
    if (::setsockopt(fd_, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf)) != 0) {
        ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    }
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(src_ip);
    src.sin_port = htons(src_port);
    if (::bind(fd_, reinterpret_cast<sockaddr *>(&src), sizeof(src)) != 0) {
        // The port is taken by a socket without SO_REUSEPORT: fall back to any port rather than
        // failing the QP (the ICRC covers the port, and the receiver reads it from recvmmsg).
        src.sin_port = 0;
        if (::bind(fd_, reinterpret_cast<sockaddr *>(&src), sizeof(src)) != 0) {
            const int err = errno;
            ::close(fd_);
            fd_ = -1;
            return err;
        }
        socklen_t len = sizeof(src);
        ::getsockname(fd_, reinterpret_cast<sockaddr *>(&src), &len);
        src_port = ntohs(src.sin_port);
    }
    setTosTtl(tos, ttl);
    flow_.src_ip = src_ip;
    flow_.dst_ip = dst_ip;
    flow_.src_port = src_port;
    flow_.dst_port = kRoceV2Port;
    dst_.sin_family = AF_INET;
    dst_.sin_addr.s_addr = htonl(dst_ip);
    dst_.sin_port = htons(kRoceV2Port);
    buildIpv4UdpHeader(ip_udp_template_, flow_, 0);
    return 0;
}

void TxPath::setTosTtl(uint8_t tos, uint8_t ttl) {
    // UDP keeps the ECN bits of IP_TOS (do_ip_setsockopt() strips them for TCP only), so the
    // GRH traffic class goes on the wire whole: DSCP << 2 | ECN.
    const int t = tos;
    ::setsockopt(fd_, IPPROTO_IP, IP_TOS, &t, sizeof(t));
    const int l = ttl == 0 ? 64 : ttl;
    ::setsockopt(fd_, IPPROTO_IP, IP_TTL, &l, sizeof(l));
}

TxPacket &TxPath::begin(size_t header_len) {
    if (count_ == kTxBatch) {
        flush();
    }
    TxPacket &p = packets_[count_];
    p.header_len = header_len;
    p.payload_len = 0;
    p.iov[0] = iovec{p.header, header_len};
    p.niov = 1;
    return p;
}

void TxPath::addPayload(TxPacket &p, const uint8_t *data, size_t n) {
    if (n == 0) {
        return;
    }
    if (p.niov == kTxIov - 1) {
        // More pieces than iovecs: gather into the bounce buffer instead.
        uint8_t *b = bounce(p, 0);
        size_t off = 0;
        for (int i = 1; i < p.niov; ++i) {
            std::memmove(b + off, p.iov[i].iov_base, p.iov[i].iov_len);
            off += p.iov[i].iov_len;
        }
        std::memcpy(b + off, data, n);
        p.niov = 2;
        p.iov[1] = iovec{b, off + n};
        p.payload_len += n;
        return;
    }
    p.iov[p.niov++] = iovec{const_cast<uint8_t *>(data), n};
    p.payload_len += n;
}

uint8_t *TxPath::bounce(TxPacket &p, size_t) {
    if (!p.bounce) {
        p.bounce = std::make_unique<uint8_t[]>(4096);
    }
    return p.bounce.get();
}

void TxPath::finish(TxPacket &p) {
    const size_t pad = (4 - (p.payload_len & 3)) & 3;
    // The BTH's pad count must be in the header before the ICRC is taken over it.
    p.header[1] = static_cast<uint8_t>((p.header[1] & ~0x30) | (pad << 4));
    const size_t udp_len = p.header_len + p.payload_len + pad + kIcrcBytes;
    uint8_t ip_udp[kIpv4UdpBytes];
    std::memcpy(ip_udp, ip_udp_template_, kIpv4UdpBytes);
    const size_t ip_total = udp_len + kIpv4UdpBytes;
    ip_udp[2] = static_cast<uint8_t>(ip_total >> 8);
    ip_udp[3] = static_cast<uint8_t>(ip_total);
    ip_udp[24] = static_cast<uint8_t>((udp_len + 8) >> 8);
    ip_udp[25] = static_cast<uint8_t>(udp_len + 8);
    uint32_t crc = icrcBegin(ip_udp, p.header);
    crc = icrcUpdate(crc, p.header + kBthBytes, p.header_len - kBthBytes);
    for (int i = 1; i < p.niov; ++i) {
        crc = icrcUpdate(crc, static_cast<const uint8_t *>(p.iov[i].iov_base), p.iov[i].iov_len);
    }
    std::memset(p.trailer, 0, pad);
    crc = icrcUpdate(crc, p.trailer, pad);
    icrcStore(crc, p.trailer + pad);
    p.iov[p.niov++] = iovec{p.trailer, pad + kIcrcBytes};
    mmsghdr &m = msgs_[count_];
    m.msg_hdr = msghdr{};
    m.msg_hdr.msg_name = &dst_;
    m.msg_hdr.msg_namelen = sizeof(dst_);
    m.msg_hdr.msg_iov = p.iov;
    m.msg_hdr.msg_iovlen = static_cast<size_t>(p.niov);
    ++count_;
}

int TxPath::flush() {
    int sent = 0;
    while (sent < count_) {
        const int n = ::sendmmsg(fd_, msgs_.data() + sent, static_cast<unsigned>(count_ - sent), 0);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            // ENETDOWN, ENETUNREACH, ENOBUFS...: the packet is lost on the wire, as a real link
            // would lose it; the transport timer recovers.
            ++sent;
            continue;
        }
        sent += n;
        if (sent < count_) {
            // A blocking socket stops short only where a datagram failed (its error is not
            // reported: sendmmsg(2)); that one is lost on the wire like the case above. Sending it
            // again at once would hide the loss a firewall rule or a full device queue models:
            // an nft drop in the middle of a batch came back as an instant resend, so no
            // retransmission ever showed.
            ++sent;
        }
    }
    const int total = count_;
    count_ = 0;
    return total;
}

}  // namespace tensorlane::simhca
