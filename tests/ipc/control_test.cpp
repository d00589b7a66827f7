// Unit tests of the control protocol helpers: fixed name fields and status codes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/status.hpp"

namespace tensorlane::ipc {
namespace {

TEST(Control, CopyNameFitsAndZeroFills) {
    char field[kPeerNameBytes];
    std::memset(field, 'x', sizeof(field));
    copyName(field, sizeof(field), "node-a");
    EXPECT_STREQ(field, "node-a");
    for (size_t i = std::strlen("node-a"); i < sizeof(field); ++i) {
        ASSERT_EQ(field[i], '\0') << "byte " << i << " not cleared (would leak stale bytes)";
    }
}

TEST(Control, CopyNameTruncatesAndTerminates) {
    char field[kPeerNameBytes];
    const std::string exact(kPeerNameBytes - 1, 'a');
    copyName(field, sizeof(field), exact.c_str());
    EXPECT_EQ(std::string(field), exact);

    const std::string one_over(kPeerNameBytes, 'b');
    copyName(field, sizeof(field), one_over.c_str());
    EXPECT_EQ(std::string(field), one_over.substr(0, kPeerNameBytes - 1));
    EXPECT_EQ(field[kPeerNameBytes - 1], '\0');

    const std::string long_name(1000, 'c');
    copyName(field, sizeof(field), long_name.c_str());
    EXPECT_EQ(std::strlen(field), kPeerNameBytes - 1);
    EXPECT_EQ(field[kPeerNameBytes - 1], '\0');

    char tiny[1] = {'z'};
    copyName(tiny, sizeof(tiny), "abc");
    EXPECT_EQ(tiny[0], '\0');
}

TEST(Control, CopyNameHandlesNullAndZeroSize) {
    char field[8];
    std::memset(field, 'x', sizeof(field));
    copyName(field, sizeof(field), nullptr);
    for (char c : field) {
        EXPECT_EQ(c, '\0');
    }
    std::memset(field, 'x', sizeof(field));
    copyName(field, 0, "abc");  // nothing may be written
    for (char c : field) {
        EXPECT_EQ(c, 'x');
    }
}

TEST(Control, ReadNameAcceptsTerminatedField) {
    char field[kRegionNameBytes] = {};
    copyName(field, sizeof(field), "kv-cache");
    const char *out = nullptr;
    ASSERT_TRUE(readName(field, sizeof(field), &out));
    EXPECT_EQ(out, field);
    EXPECT_STREQ(out, "kv-cache");

    // The longest legal name: n - 1 bytes and the NUL in the last byte.
    std::memset(field, 'q', sizeof(field) - 1);
    field[sizeof(field) - 1] = '\0';
    ASSERT_TRUE(readName(field, sizeof(field), &out));
    EXPECT_EQ(std::strlen(out), sizeof(field) - 1);
}

TEST(Control, ReadNameRejectsEmptyField) {
    char field[kRegionNameBytes] = {};
    const char *out = reinterpret_cast<const char *>(0x1);
    EXPECT_FALSE(readName(field, sizeof(field), &out));
    EXPECT_EQ(out, reinterpret_cast<const char *>(0x1)) << "output set on failure";
    // Bytes after a leading NUL do not make it a name.
    std::memset(field + 1, 'a', sizeof(field) - 2);
    EXPECT_FALSE(readName(field, sizeof(field), &out));
}

TEST(Control, ReadNameRejectsUnterminatedField) {
    // Exactly the field, in a larger buffer whose next byte is a NUL: readName must not look
    // past the field to find a terminator.
    char buf[kRegionNameBytes + 1];
    std::memset(buf, 'a', kRegionNameBytes);
    buf[kRegionNameBytes] = '\0';
    const char *out = nullptr;
    EXPECT_FALSE(readName(buf, kRegionNameBytes, &out));
    EXPECT_EQ(out, nullptr);
}

TEST(Control, MessageLayoutIsFixed) {
    EXPECT_EQ(sizeof(MsgHeader), 16u);
    EXPECT_EQ(sizeof(HelloMsg), 16u + 32u + kPeerNameBytes + kErrorBytes);
    EXPECT_EQ(offsetof(HelloMsg, node_name), 48u);
    EXPECT_EQ(sizeof(RegisterMsg), 160u);
    EXPECT_LE(sizeof(ReplyMsg) + kMaxStatusText, kMaxControlMessage);
}

TEST(Control, StatusCodesHaveStableNames) {
    EXPECT_STREQ(codeName(Code::kOk), "TL_OK");
    EXPECT_STREQ(codeName(Code::kAgain), "TL_EAGAIN");
    EXPECT_STREQ(codeName(Code::kInternal), "TL_EINTERNAL");
    EXPECT_STREQ(codeName(static_cast<Code>(99)), "TL_EUNKNOWN");
    EXPECT_EQ(static_cast<int>(Code::kPeer), 7);
    EXPECT_EQ(static_cast<int>(Code::kInternal), 10);
}

TEST(Control, SanitizeCodeMapsUntrustedValues) {
    for (int32_t raw = 0; raw <= 10; ++raw) {
        EXPECT_EQ(static_cast<int32_t>(sanitizeCode(raw)), raw);
    }
    EXPECT_EQ(sanitizeCode(-1), Code::kInternal);
    EXPECT_EQ(sanitizeCode(11), Code::kDeadline);
    EXPECT_EQ(sanitizeCode(12), Code::kInternal);
    EXPECT_EQ(sanitizeCode(INT32_MIN), Code::kInternal);
    EXPECT_EQ(sanitizeCode(INT32_MAX), Code::kInternal);
}

}  // namespace
}  // namespace tensorlane::ipc
