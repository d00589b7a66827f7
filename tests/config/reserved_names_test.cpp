// [security] reserved_names: name prefixes that only some uids/gids may expose (DESIGN.md,
// "Locally, an exposed region is writable by its owner's uid and root").
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::allErrors;
using testing::onlyError;
using testing::parse;

const TransportChoice kTcpNoDevice{TransportKind::kTcp, "no RDMA device"};

TEST(ConfigReservedNames, DefaultIsNone) {
    const ParseResult r = parse("");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_TRUE(r.config->security.reserved_names.empty());
}

TEST(ConfigReservedNames, EntriesAreReadInOrder) {
    const ParseResult r = parse(R"([security]
reserved_names = [{ prefix = "kv.", uids = [1000], gids = [] },
                  { prefix = "prefill/", gids = [4242, 17] }]
)");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const auto &v = r.config->security.reserved_names;
    ASSERT_EQ(v.size(), 2u);
    EXPECT_EQ(v[0].prefix, "kv.");
    EXPECT_EQ(v[0].uids, std::vector<uint32_t>{1000});
    EXPECT_TRUE(v[0].gids.empty());
    EXPECT_EQ(v[1].prefix, "prefill/");
    EXPECT_TRUE(v[1].uids.empty());
    EXPECT_EQ(v[1].gids, (std::vector<uint32_t>{4242, 17}));
    // --check-config shows them, text and JSON.
    const std::string text = describeText(*r.config, kTcpNoDevice);
    EXPECT_NE(text.find("reserved_names = [{ prefix = \"kv.\", uids = [1000], gids = [] }, "
                        "{ prefix = \"prefill/\", uids = [], gids = [4242, 17] }]\n"),
              std::string::npos)
        << text;
    const auto j = nlohmann::json::parse(describeJson(*r.config, kTcpNoDevice));
    ASSERT_EQ(j["security"]["reserved_names"].size(), 2u);
    EXPECT_EQ(j["security"]["reserved_names"][0]["prefix"], "kv.");
    EXPECT_EQ(j["security"]["reserved_names"][1]["gids"][1], 17);
}

TEST(ConfigReservedNames, NoneIsSaidInTheDescription) {
    const ParseResult r = parse("");
    ASSERT_TRUE(r.ok());
    const std::string text = describeText(*r.config, kTcpNoDevice);
    EXPECT_NE(text.find("reserved_names = [] (any local client may expose any name)\n"),
              std::string::npos)
        << text;
    const auto j = nlohmann::json::parse(describeJson(*r.config, kTcpNoDevice));
    EXPECT_EQ(j["security"]["reserved_names"], nlohmann::json::array());
}

TEST(ConfigReservedNames, BadEntriesNameTheKey) {
    Error e = onlyError(parse("[security]\nreserved_names = \"kv.\"\n"));
    EXPECT_EQ(e.key, "security.reserved_names");
    EXPECT_NE(e.expected.find("an array of"), std::string::npos) << e.text();

    e = onlyError(parse("[security]\nreserved_names = [1]\n"));
    EXPECT_EQ(e.key, "security.reserved_names[0]");

    e = onlyError(parse("[security]\nreserved_names = [{ uids = [1] }]\n"));
    EXPECT_EQ(e.key, "security.reserved_names[0].prefix");
    EXPECT_EQ(e.found, "no prefix key");

    e = onlyError(parse("[security]\nreserved_names = [{ prefix = \"a b\" }]\n"));
    EXPECT_EQ(e.key, "security.reserved_names[0].prefix");
    EXPECT_NE(e.expected.find("name prefix"), std::string::npos) << e.text();

    e = onlyError(parse("[security]\nreserved_names = [{ prefix = \"\" }]\n"));
    EXPECT_EQ(e.key, "security.reserved_names[0].prefix");

    e = onlyError(parse("[security]\nreserved_names = [{ prefix = \"kv.\", uids = [-1] }]\n"));
    EXPECT_EQ(e.key, "security.reserved_names[0].uids[0]");

    e = onlyError(parse("[security]\nreserved_names = [{ prefix = \"kv.\", uid = [1] }]\n"));
    EXPECT_EQ(e.key, "security.reserved_names[0].uid");
    EXPECT_EQ(e.found, "unknown key");

    e = onlyError(
        parse("[security]\nreserved_names = [{ prefix = \"kv.\" }, { prefix = \"kv.\" }]\n"));
    EXPECT_EQ(e.key, "security.reserved_names[1].prefix");
    EXPECT_NE(e.expected.find("no other"), std::string::npos) << e.text();
}

}  // namespace
}  // namespace tensorlane::config
