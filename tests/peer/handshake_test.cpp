// Unit tests of the key file, the wire messages and the challenge-response, without sockets.
#include <gtest/gtest.h>
#include <sodium.h>

#include <cstring>
#include <random>

#include "harness.hpp"
#include "peer/handshake.hpp"
#include "peer/key.hpp"
#include "peer/wire.hpp"

namespace tensorlane::sidecar {
namespace {

using peertest::TempDir;

PeerKey keyOf(char digit) {
    PeerKey k;
    EXPECT_TRUE(PeerKey::fromText(peertest::keyText(digit), &k).isOk());
    return k;
}

HandshakeIdentity ident(const std::string &name, uint32_t integrity = 1) {
    HandshakeIdentity id;
    id.name = name;
    randombytes_buf(&id.incarnation, sizeof id.incarnation);
    id.caps = PeerCaps{5000, 1000, integrity};
    return id;
}

ServerHandshake::AdmitFn admitAll() {
    return [](const HelloMsg &) { return Status::ok(); };
}

std::string hex(const uint8_t *p, size_t n) {
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    for (size_t i = 0; i < n; ++i) {
        out += kHex[p[i] >> 4];
        out += kHex[p[i] & 15];
    }
    return out;
}

TEST(PeerKey, DerivesTheMacKeyFromTheFilesBytes) {
    // A known answer: BLAKE2b-256 of the bytes 00..1f keyed with "tensorlane peer key v1".
    // Nodes of different versions must derive the same key from the same file.
    PeerKey k;
    ASSERT_TRUE(PeerKey::fromText("tensorlane-key-v1:000102030405060708090a0b0c0d0e0f101112131415"
                                  "161718191a1b1c1d1e1f\n",
                                  &k)
                    .isOk());
    EXPECT_EQ(hex(k.data(), PeerKey::kBytes),
              "7da4700bd8d3e6a7e0e39923fefc0d4f402834feb6a5353dc06be612aa76ab1c");
}

TEST(PeerKey, AFileGivesTheKeyOfItsText) {
    TempDir dir;
    PeerKey a, b, c;
    ASSERT_TRUE(PeerKey::fromFile(dir.writeFile("a", peertest::keyText('1')), &a).isOk());
    ASSERT_TRUE(PeerKey::fromText(peertest::keyText('1'), &b).isOk());
    ASSERT_TRUE(PeerKey::fromFile(dir.writeFile("c", peertest::keyText('2')), &c).isOk());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), PeerKey::kBytes));
    EXPECT_NE(0, std::memcmp(a.data(), c.data(), PeerKey::kBytes));
}

TEST(PeerKey, RefusesOldMissingAndOpenFilesSayingWhatToDo) {
    TempDir dir;
    PeerKey k;
    // The format before tensorlane-key-v1: a raw secret, which was trimmed. Refused by name.
    const std::string old = dir.writeFile("old", "  0123456789abcdef0123\n");
    Status s = PeerKey::fromFile(old, &k);
    EXPECT_EQ(s.code(), Code::kInvalid);
    EXPECT_NE(s.message().find("peer key file " + old + ": not a tensorlane key file"),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("tensorlane keygen --force " + old), std::string::npos)
        << s.message();

    s = PeerKey::fromFile(dir.path() + "/missing", &k);
    EXPECT_EQ(s.code(), Code::kPermission);
    EXPECT_NE(s.message().find("tensorlane keygen " + dir.path() + "/missing"), std::string::npos)
        << s.message();

    s = PeerKey::fromFile(dir.writeFile("open", peertest::keyText('1'), 0644), &k);
    EXPECT_EQ(s.code(), Code::kPermission);
    EXPECT_NE(s.message().find("0644"), std::string::npos) << s.message();

    s = PeerKey::fromFile(dir.writeFile("big", std::string(5000, 'x')), &k);
    EXPECT_EQ(s.code(), Code::kInvalid);

    s = PeerKey::fromText("tensorlane-key-v1:0123", &k);
    EXPECT_EQ(s.code(), Code::kInvalid);
    EXPECT_NE(s.message().find("4 hex digits"), std::string::npos) << s.message();
}

TEST(PeerHandshake, BothEndsAuthenticateAndLearnEachOther) {
    const PeerKey key = keyOf('1');
    const auto a = ident("node-a");
    const auto b = ident("node-b");
    ClientHandshake client(key, a, "node-b", LinkRole::kControl, 0, 0);
    ServerHandshake server(key, b);
    std::vector<uint8_t> challenge, auth;
    ASSERT_TRUE(server.onHello(client.hello(), admitAll(), 77, &challenge).isOk());
    HandshakeOutcome at_client, at_server;
    Status s = client.onChallenge(challenge, &auth, &at_client);
    ASSERT_TRUE(s.isOk()) << s.message();
    s = server.onAuth(auth, &at_server);
    ASSERT_TRUE(s.isOk()) << s.message();
    EXPECT_EQ(at_client.peer_name, "node-b");
    EXPECT_EQ(at_client.peer_incarnation, b.incarnation);
    EXPECT_EQ(at_client.session_id, 77u);
    EXPECT_EQ(at_server.peer_name, "node-a");
    EXPECT_EQ(at_server.peer_incarnation, a.incarnation);
    EXPECT_EQ(at_server.session_id, 77u);
}

TEST(PeerHandshake, WrongKeyIsRefusedByBothEnds) {
    const PeerKey k1 = keyOf('1');
    const PeerKey k2 = keyOf('2');
    ClientHandshake client(k1, ident("node-a"), "node-b", LinkRole::kControl, 0, 0);
    ServerHandshake server(k2, ident("node-b"));
    std::vector<uint8_t> challenge, auth;
    ASSERT_TRUE(server.onHello(client.hello(), admitAll(), 1, &challenge).isOk());
    HandshakeOutcome out;
    // The client catches the server's bad proof first...
    Status s = client.onChallenge(challenge, &auth, &out);
    EXPECT_EQ(s.code(), Code::kPermission);
    EXPECT_NE(s.message().find("authentication failed"), std::string::npos);
    // ...and a client that answered anyway, without the key, fails at the server.
    std::vector<uint8_t> forged(kMacBytes);
    randombytes_buf(forged.data(), forged.size());
    s = server.onAuth(forged, &out);
    EXPECT_EQ(s.code(), Code::kPermission);
    EXPECT_NE(s.message().find("node-a"), std::string::npos);
}

TEST(PeerHandshake, ReplayedClientProofIsRefused) {
    const PeerKey key = keyOf('1');
    const auto b = ident("node-b");
    ClientHandshake client(key, ident("node-a"), "node-b", LinkRole::kControl, 0, 0);
    ServerHandshake first(key, b);
    std::vector<uint8_t> challenge, auth;
    ASSERT_TRUE(first.onHello(client.hello(), admitAll(), 1, &challenge).isOk());
    HandshakeOutcome out;
    ASSERT_TRUE(client.onChallenge(challenge, &auth, &out).isOk());
    ASSERT_TRUE(first.onAuth(auth, &out).isOk());

    // An eavesdropper replays HELLO and AUTH: the server's fresh nonce makes the old proof void.
    ServerHandshake second(key, b);
    std::vector<uint8_t> challenge2;
    ASSERT_TRUE(second.onHello(client.hello(), admitAll(), 2, &challenge2).isOk());
    Status s = second.onAuth(auth, &out);
    EXPECT_EQ(s.code(), Code::kPermission);
    EXPECT_NE(s.message().find("replayed"), std::string::npos) << s.message();
}

TEST(PeerHandshake, ReplayedServerProofIsRefused) {
    const PeerKey key = keyOf('1');
    const auto a = ident("node-a");
    ClientHandshake first(key, a, "node-b", LinkRole::kControl, 0, 0);
    ServerHandshake server(key, ident("node-b"));
    std::vector<uint8_t> challenge, auth;
    ASSERT_TRUE(server.onHello(first.hello(), admitAll(), 1, &challenge).isOk());
    // A fake server replays the recorded CHALLENGE to a new connection of the same client.
    ClientHandshake second(key, a, "node-b", LinkRole::kControl, 0, 0);
    HandshakeOutcome out;
    Status s = second.onChallenge(challenge, &auth, &out);
    EXPECT_EQ(s.code(), Code::kPermission);
}

TEST(PeerHandshake, TamperedHelloBreaksTheProof) {
    const PeerKey key = keyOf('1');
    ClientHandshake client(key, ident("node-a"), "node-b", LinkRole::kControl, 0, 0);
    ServerHandshake server(key, ident("node-b"));
    std::vector<uint8_t> hello = client.hello();
    hello[hello.size() - 1 - 6 - 1] ^= 0x01;  // a byte of the client's name
    std::vector<uint8_t> challenge, auth;
    ASSERT_TRUE(server.onHello(hello, admitAll(), 1, &challenge).isOk());
    HandshakeOutcome out;
    EXPECT_EQ(client.onChallenge(challenge, &auth, &out).code(), Code::kPermission);
}

TEST(PeerHandshake, VersionMismatchNamesBothVersions) {
    const PeerKey key = keyOf('1');
    ClientHandshake client(key, ident("node-a"), "node-b", LinkRole::kControl, 0, 0);
    ServerHandshake server(key, ident("node-b"));
    std::vector<uint8_t> hello = client.hello();
    hello[0] = 9;  // version 9
    hello[1] = 0;
    std::vector<uint8_t> challenge;
    Status s = server.onHello(hello, admitAll(), 1, &challenge);
    EXPECT_EQ(s.code(), Code::kInvalid);
    EXPECT_NE(s.message().find("version " + std::to_string(kPeerProtocolVersion)),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("version 9"), std::string::npos) << s.message();
}

TEST(PeerHandshake, SharedSettingMismatchNamesBothValues) {
    const PeerKey key = keyOf('1');
    ClientHandshake client(key, ident("node-a", 1), "node-b", LinkRole::kControl, 0, 0);
    ServerHandshake server(key, ident("node-b", 0));
    std::vector<uint8_t> challenge, auth;
    ASSERT_TRUE(server.onHello(client.hello(), admitAll(), 1, &challenge).isOk());
    HandshakeOutcome out;
    Status s = client.onChallenge(challenge, &auth, &out);
    EXPECT_EQ(s.code(), Code::kInvalid);
    EXPECT_NE(s.message().find("tcp_integrity"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("\"mac\""), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("\"none\""), std::string::npos) << s.message();

    Status t = checkSharedCaps("node-a", PeerCaps{5000, 1000, 1}, "node-b", PeerCaps{0, 1000, 1});
    EXPECT_NE(t.message().find("zero timeout"), std::string::npos) << t.message();
}

TEST(PeerHandshake, AdmitRefusalIsPassedOn) {
    const PeerKey key = keyOf('1');
    ClientHandshake client(key, ident("intruder"), "node-b", LinkRole::kControl, 0, 0);
    ServerHandshake server(key, ident("node-b"));
    std::vector<uint8_t> challenge;
    Status s = server.onHello(
        client.hello(),
        [](const HelloMsg &m) {
            return Status{Code::kPermission, "unknown peer '" + m.from + "'"};
        },
        1, &challenge);
    EXPECT_EQ(s.code(), Code::kPermission);
    EXPECT_TRUE(challenge.empty());
}

TEST(PeerWire, DecodersRejectTruncatedAndRandomInput) {
    HelloMsg m;
    m.from = "node-a";
    m.to = "node-b";
    const auto hello = encodeHello(m);
    HelloMsg out;
    std::string err;
    ASSERT_TRUE(decodeHello(hello, &out, &err)) << err;
    for (size_t n = 0; n < hello.size(); ++n) {
        EXPECT_FALSE(decodeHello(std::span(hello.data(), n), &out, &err)) << n;
    }
    auto longer = hello;
    longer.push_back(0);
    EXPECT_FALSE(decodeHello(longer, &out, &err));

    std::mt19937_64 rng(7);
    for (int i = 0; i < 2000; ++i) {
        std::vector<uint8_t> junk(rng() % 300);
        for (auto &b : junk) {
            b = static_cast<uint8_t>(rng());
        }
        ChallengeMsg c;
        RegionDescriptor d;
        (void)decodeHello(junk, &out, &err);
        (void)decodeChallenge(junk, &c, &err);
        (void)decodeRegionAdd(1, junk, &d);
    }
}

}  // namespace
}  // namespace tensorlane::sidecar
