// Unit tests of the connection buffer logic over a socketpair (no TCP, no manager).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "net/connection.hpp"
#include "net/frame_reader.hpp"
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

// ---- readFrames: the one frame-reading loop

namespace {

/// `n` frames of type HEARTBEAT with args 1..n and `payload` bytes each, as one byte string.
std::vector<uint8_t> frames(int n, size_t payload) {
    std::vector<uint8_t> wire;
    for (int i = 1; i <= n; ++i) {
        const size_t at = wire.size();
        wire.resize(at + kFrameHeaderBytes + payload, static_cast<uint8_t>(i));
        encodeFrameHeader(wire.data() + at, FrameType::kHeartbeat, static_cast<uint32_t>(payload),
                          static_cast<uint64_t>(i));
    }
    return wire;
}

}  // namespace

/// A control connection whose other end (sp.theirs) the test writes frames into.
class ReadFrames : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(0, poller.open());
        conn = std::make_unique<Connection>(poller, ipc::UniqueFd(sp.ours), "test",
                                            ConnRole::kOutControl, 0, false);
    }
    Poller poller;
    SocketPair sp;
    std::unique_ptr<Connection> conn;
};

TEST_F(ReadFrames, AFrameSplitAcrossFillsIsHandledOnceWhole) {
    Connection &c = *conn;
    const std::vector<uint8_t> wire = frames(3, 40);
    std::vector<uint64_t> seen;
    auto handler = [&](const FrameHeader &h, std::span<const uint8_t> payload) {
        EXPECT_EQ(payload.size(), 40u);
        EXPECT_EQ(payload[0], static_cast<uint8_t>(h.arg));
        seen.push_back(h.arg);
        return FrameStep::kNext;
    };
    // One frame and a half, then the rest.
    const size_t cut = kFrameHeaderBytes + 40 + 20;
    ASSERT_EQ(static_cast<ssize_t>(cut), ::send(sp.theirs, wire.data(), cut, 0));
    FramesRead r = readFrames(c, 0, 64u, handler);
    EXPECT_EQ(r.end, FramesRead::End::kDrained);
    EXPECT_EQ(seen, (std::vector<uint64_t>{1}));
    ASSERT_EQ(static_cast<ssize_t>(wire.size() - cut),
              ::send(sp.theirs, wire.data() + cut, wire.size() - cut, 0));
    r = readFrames(c, 0, 64u, handler);
    EXPECT_EQ(r.end, FramesRead::End::kDrained);
    EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2, 3}));
    EXPECT_EQ(c.buffered(), 0u);
    // Nothing more: drained again, nothing handled.
    r = readFrames(c, 0, 64u, handler);
    EXPECT_EQ(r.end, FramesRead::End::kDrained);
    EXPECT_EQ(r.rc, EAGAIN);
    EXPECT_EQ(seen.size(), 3u);
}

TEST_F(ReadFrames, AFrameOverItsLimitIsBadAndTheFramesBeforeItWereHandled) {
    Connection &c = *conn;
    std::vector<uint8_t> wire = frames(1, 8);
    const std::vector<uint8_t> big = frames(1, 100);
    wire.insert(wire.end(), big.begin(), big.end());
    ASSERT_EQ(static_cast<ssize_t>(wire.size()), ::send(sp.theirs, wire.data(), wire.size(), 0));
    int handled = 0;
    // The limit may change from frame to frame (a handshake's, then the control one's).
    int asked = 0;
    const FramesRead r = readFrames(
        c, 0, [&] { return ++asked == 1 ? 64u : 50u; },
        [&](const FrameHeader &, std::span<const uint8_t>) {
            ++handled;
            return FrameStep::kNext;
        });
    EXPECT_EQ(handled, 1);
    EXPECT_EQ(asked, 2);
    EXPECT_EQ(r.end, FramesRead::End::kBad);
    EXPECT_NE(r.error.find("exceeds the limit"), std::string::npos) << r.error;
}

TEST_F(ReadFrames, EndOfStreamInTheMiddleOfAFrameIsClosedAfterTheWholeOnes) {
    Connection &c = *conn;
    const std::vector<uint8_t> wire = frames(2, 16);
    const size_t part = wire.size() - 5;  // the second frame lacks its last bytes
    ASSERT_EQ(static_cast<ssize_t>(part), ::send(sp.theirs, wire.data(), part, 0));
    ::close(sp.theirs);
    sp.theirs = -1;
    int handled = 0;
    auto count = [&](const FrameHeader &, std::span<const uint8_t>) {
        ++handled;
        return FrameStep::kNext;
    };
    // One fill a pass: the bytes first (the whole frame is handled), the end of the stream on
    // the pass its epoll event brings, with the partial frame never handed over.
    FramesRead r = readFrames(c, 0, 64u, count);
    EXPECT_EQ(handled, 1);
    EXPECT_EQ(r.end, FramesRead::End::kDrained);
    r = readFrames(c, 0, 64u, count);
    EXPECT_EQ(handled, 1);
    EXPECT_EQ(r.end, FramesRead::End::kClosed);
    EXPECT_EQ(r.rc, ECONNRESET);
    EXPECT_EQ(errnoText(r.rc), "connection closed by the peer");
}

TEST_F(ReadFrames, AHandlerThatStopsLeavesTheRestUnreadAndUnconsumed) {
    Connection &c = *conn;
    const std::vector<uint8_t> wire = frames(3, 4);
    ASSERT_EQ(static_cast<ssize_t>(wire.size()), ::send(sp.theirs, wire.data(), wire.size(), 0));
    std::vector<uint64_t> seen;
    FramesRead r = readFrames(c, 0, 64u, [&](const FrameHeader &h, std::span<const uint8_t>) {
        seen.push_back(h.arg);
        return h.arg == 2 ? FrameStep::kStop : FrameStep::kNext;
    });
    EXPECT_EQ(r.end, FramesRead::End::kStopped);
    EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2}));
    // The stopping frame was not consumed: the next pass starts with it (a handler that
    // hands the connection over leaves it as it was).
    EXPECT_EQ(c.buffered(), 2 * (kFrameHeaderBytes + 4));
    r = readFrames(c, 0, 64u, [&](const FrameHeader &h, std::span<const uint8_t>) {
        seen.push_back(h.arg);
        return FrameStep::kNext;
    });
    EXPECT_EQ(r.end, FramesRead::End::kDrained);
    EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2, 2, 3}));
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
