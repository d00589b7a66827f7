// FrameAuth, the tcp frame tags: OpenSSL's Poly1305 and libsodium's give the same tag for the
// same bytes however the frame is cut into update() calls (so peers with either interoperate),
// and both equal the tag of RFC 8439's ChaCha20-Poly1305 AEAD (libsodium's) for the message
// that construction authenticates. A flipped bit, a replayed frame number or a truncated
// frame fails.
#include <gtest/gtest.h>
#include <sodium.h>

#include <cstring>
#include <random>
#include <vector>

#include "net/frame_auth.hpp"

namespace {

using tensorlane::sidecar::FrameAuth;
using Tag = std::array<uint8_t, FrameAuth::kTagBytes>;

FrameAuth::Key randomKey(std::mt19937_64 &rng) {
    FrameAuth::Key k;
    for (auto &b : k) {
        b = static_cast<uint8_t>(rng());
    }
    return k;
}

std::vector<uint8_t> randomBytes(std::mt19937_64 &rng, size_t n) {
    std::vector<uint8_t> v(n);
    for (auto &b : v) {
        b = static_cast<uint8_t>(rng());
    }
    return v;
}

/// The tag of `msg` as `auth`'s next frame, fed in pieces of the sizes `rng` picks.
Tag tagInPieces(FrameAuth &auth, const std::vector<uint8_t> &msg, std::mt19937_64 &rng) {
    auth.begin();
    size_t at = 0;
    while (at < msg.size()) {
        const size_t n = std::min<size_t>(msg.size() - at, 1 + rng() % 5000);
        auth.update(msg.data() + at, n);
        at += n;
    }
    Tag t;
    auth.finish(t.data());
    return t;
}

class FrameAuthTest : public ::testing::Test {
protected:
    void SetUp() override { ASSERT_GE(sodium_init(), 0); }
};

TEST_F(FrameAuthTest, OpenSslIsUsedWhereAvailable) {
    std::mt19937_64 rng(1);
    FrameAuth a(randomKey(rng));
    EXPECT_TRUE(a.enabled());
    EXPECT_TRUE(a.usesOpenSsl()) << "OpenSSL's default provider has no POLY1305 here";
    FrameAuth s(randomKey(rng), FrameAuth::Backend::kSodium);
    EXPECT_FALSE(s.usesOpenSsl());
}

TEST_F(FrameAuthTest, BothBackendsGiveTheSameTagsWhateverThePieces) {
    std::mt19937_64 rng(7);
    for (int k = 0; k < 8; ++k) {
        const FrameAuth::Key key = randomKey(rng);
        FrameAuth ossl(key, FrameAuth::Backend::kOpenSsl);
        FrameAuth sodium(key, FrameAuth::Backend::kSodium);
        ASSERT_TRUE(ossl.usesOpenSsl());
        for (size_t len : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{64},
                           size_t{4096}, size_t{65537}, size_t{(1 << 20) + 3}}) {
            const auto msg = randomBytes(rng, len);
            const Tag a = tagInPieces(ossl, msg, rng);
            const Tag b = tagInPieces(sodium, msg, rng);
            EXPECT_EQ(a, b) << "key " << k << ", " << len << " bytes";
        }
        EXPECT_EQ(ossl.frames(), sodium.frames());
    }
}

// RFC 8439 2.8: the AEAD's tag is Poly1305, under the same one-time key (ChaCha20 block 0 of
// the nonce), of pad16(AAD) || pad16(ciphertext) || le64(|AAD|) || le64(|ciphertext|). With
// no plaintext that is pad16(AAD) || le64(|AAD|) || le64(0): a frame with those bytes, as frame
// number n, must carry the AEAD's tag for nonce le64(n) || 0000.
TEST_F(FrameAuthTest, TagsAreRfc8439Poly1305UnderTheChaCha20OneTimeKey) {
    std::mt19937_64 rng(11);
    for (auto backend : {FrameAuth::Backend::kOpenSsl, FrameAuth::Backend::kSodium}) {
        const FrameAuth::Key key = randomKey(rng);
        FrameAuth auth(key, backend);
        for (uint64_t n = 0; n < 5; ++n) {
            const auto aad = randomBytes(rng, 1 + rng() % 300);
            std::vector<uint8_t> msg(aad);
            msg.resize((aad.size() + 15) / 16 * 16, 0);
            const uint64_t lens[2] = {aad.size(), 0};
            const auto *p = reinterpret_cast<const uint8_t *>(lens);
            msg.insert(msg.end(), p, p + sizeof lens);
            Tag ours;
            auth.sign(msg.data(), msg.size(), nullptr, 0, ours.data());

            uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES] = {};
            std::memcpy(nonce, &n, sizeof n);
            Tag theirs;
            unsigned long long clen = 0;
            ASSERT_EQ(crypto_aead_chacha20poly1305_ietf_encrypt(theirs.data(), &clen, nullptr, 0,
                                                                aad.data(), aad.size(), nullptr,
                                                                nonce, key.data()),
                      0);
            ASSERT_EQ(clen, theirs.size());
            EXPECT_EQ(ours, theirs) << "frame " << n;
        }
    }
}

TEST_F(FrameAuthTest, VerifyRefusesAFlippedBitAReplayAndATruncation) {
    std::mt19937_64 rng(13);
    const FrameAuth::Key key = randomKey(rng);
    for (auto backend : {FrameAuth::Backend::kOpenSsl, FrameAuth::Backend::kSodium}) {
        FrameAuth tx(key, backend), rx(key, backend);
        const auto head = randomBytes(rng, 24);
        const auto data = randomBytes(rng, 100000);
        Tag t0, t1;
        tx.sign(head.data(), head.size(), data.data(), data.size(), t0.data());
        tx.sign(head.data(), head.size(), data.data(), data.size(), t1.data());
        EXPECT_NE(t0, t1) << "two frame numbers, one tag";

        rx.begin();  // frame 0, intact
        rx.update(head.data(), head.size());
        rx.update(data.data(), data.size());
        EXPECT_TRUE(rx.verify(t0.data()));

        rx.begin();  // frame 1 is sent again as frame 0's tag: a replay
        rx.update(head.data(), head.size());
        rx.update(data.data(), data.size());
        EXPECT_FALSE(rx.verify(t0.data()));

        auto bad = data;
        bad[77777] ^= 0x10;
        FrameAuth rx2(key, backend);
        rx2.begin();
        rx2.update(head.data(), head.size());
        rx2.update(bad.data(), bad.size());
        EXPECT_FALSE(rx2.verify(t0.data()));

        FrameAuth rx3(key, backend);
        rx3.begin();
        rx3.update(head.data(), head.size());
        rx3.update(data.data(), data.size() - 1);
        EXPECT_FALSE(rx3.verify(t0.data()));
    }
}

TEST_F(FrameAuthTest, AMovedFromAuthIsDisabledAndTheMovedToOneCarriesOn) {
    std::mt19937_64 rng(17);
    const FrameAuth::Key key = randomKey(rng);
    FrameAuth a(key), ref(key);
    const auto msg = randomBytes(rng, 5000);
    Tag t, r;
    a.sign(msg.data(), msg.size(), nullptr, 0, t.data());
    ref.sign(msg.data(), msg.size(), nullptr, 0, r.data());
    FrameAuth b(std::move(a));
    EXPECT_FALSE(a.enabled());  // NOLINT(bugprone-use-after-move): what a move leaves
    EXPECT_TRUE(b.enabled());
    b.sign(msg.data(), msg.size(), nullptr, 0, t.data());
    ref.sign(msg.data(), msg.size(), nullptr, 0, r.data());
    EXPECT_EQ(t, r) << "the frame counter moved with it";
    FrameAuth c;
    c = std::move(b);
    c.sign(msg.data(), msg.size(), nullptr, 0, t.data());
    ref.sign(msg.data(), msg.size(), nullptr, 0, r.data());
    EXPECT_EQ(t, r);
}

}  // namespace
