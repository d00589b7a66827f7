// Unit tests of the connection buffer logic over a socketpair (no TCP, no manager).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "net/connection.hpp"
#include "net/socket.hpp"
#include "socket_pair.hpp"

namespace tensorlane::sidecar {
namespace {

TEST(PeerConnection, FlushToAClosedPeerFailsWithoutSigpipe) {
    Poller poller;
    ASSERT_EQ(0, poller.open());
    SocketPair sp;
    Connection c(poller, ipc::UniqueFd(sp.ours), "test", ConnRole::kOutData, 0, false);
    ::close(sp.theirs);
    sp.theirs = -1;
    std::vector<uint8_t> payload(100, 7);
    c.queueFrame(FrameType::kHeartbeat, 1, payload);
    // With writev this raised SIGPIPE and killed the process; now it is an error code.
    EXPECT_EQ(EPIPE, c.flush(0));
}

TEST(PeerConnection, ReadIntoPutsTheOverflowInTheBuffer) {
    Poller poller;
    ASSERT_EQ(0, poller.open());
    SocketPair sp;
    Connection c(poller, ipc::UniqueFd(sp.ours), "test", ConnRole::kInData, 0, false);
    // 10 payload bytes, then a frame header that belongs to the next frame.
    std::vector<uint8_t> wire(10 + kFrameHeaderBytes, 0xab);
    encodeFrameHeader(wire.data() + 10, FrameType::kHeartbeat, 0, 42);
    ASSERT_EQ(static_cast<ssize_t>(wire.size()), ::send(sp.theirs, wire.data(), wire.size(), 0));

    uint8_t dest[10] = {};
    size_t got = 0;
    ASSERT_EQ(0, c.readInto(dest, sizeof dest, &got, 0));
    EXPECT_EQ(got, 10u);
    EXPECT_EQ(dest[9], 0xab);
    EXPECT_EQ(c.buffered(), kFrameHeaderBytes);
    FrameHeader h;
    std::span<const uint8_t> p;
    std::string err;
    ASSERT_EQ(Connection::Parse::kFrame, c.nextFrame(64, &h, &p, &err));
    EXPECT_EQ(h.type, FrameType::kHeartbeat);
    EXPECT_EQ(h.arg, 42u);
    c.consumeFrame(h);
    EXPECT_EQ(EAGAIN, c.readInto(dest, sizeof dest, &got, 0));
}

TEST(PeerConnection, OversizedAndForeignFramesAreRejectedFromTheHeader) {
    Poller poller;
    ASSERT_EQ(0, poller.open());
    SocketPair sp;
    Connection c(poller, ipc::UniqueFd(sp.ours), "test", ConnRole::kPendingIn, 0, false);
    uint8_t head[kFrameHeaderBytes];
    encodeFrameHeader(head, FrameType::kHello, 1u << 30, 0);
    ASSERT_EQ(16, ::send(sp.theirs, head, sizeof head, 0));
    ASSERT_EQ(0, c.fill(0));
    FrameHeader h;
    std::span<const uint8_t> p;
    std::string err;
    EXPECT_EQ(Connection::Parse::kBad, c.nextFrame(kMaxHandshakePayload, &h, &p, &err));
    EXPECT_NE(err.find("exceeds the limit"), std::string::npos) << err;

    c.consume(c.buffered());
    const char http[] = "GET / HTTP/1.1\r\n\r\n";
    ASSERT_GT(::send(sp.theirs, http, sizeof http - 1, 0), 0);
    ASSERT_EQ(0, c.fill(0));
    EXPECT_EQ(Connection::Parse::kBad, c.nextFrame(kMaxHandshakePayload, &h, &p, &err));
    EXPECT_NE(err.find("magic"), std::string::npos) << err;
}

TEST(PeerConnection, NumericAddressesParseAndNamesDoNot) {
    SockAddr a;
    ASSERT_TRUE(parseNumericAddress("127.0.0.1", 80, &a));
    EXPECT_EQ(a.text(), "127.0.0.1:80");
    ASSERT_TRUE(parseNumericAddress("[::1]", 81, &a));
    EXPECT_EQ(a.text(), "[::1]:81");
    EXPECT_FALSE(parseNumericAddress("node-b.example", 80, &a));
}

}  // namespace
}  // namespace tensorlane::sidecar
