#include "cluster/node_record.hpp"

#include <sodium.h>

#include <cstdio>
#include <nlohmann/json.hpp>

namespace tensorlane::sidecar {

namespace {

using Json = nlohmann::json;

constexpr int kRecordVersion = 1;
constexpr size_t kMaxTransports = 8;

bool validNodeName(std::string_view s) {
    if (s.empty() || s.size() > 63) {
        return false;
    }
    for (char ch : s) {
        const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                        (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
        if (!ok) {
            return false;
        }
    }
    return true;
}

bool isHex(std::string_view s) {
    for (char ch : s) {
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) {
            return false;
        }
    }
    return true;
}

/// "host:port" or "[v6]:port" with a host of address or DNS name characters.
bool parseAddress(std::string_view text, config::Endpoint *out) {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 >= text.size() ||
        text.size() > 300) {
        return false;
    }
    std::string_view host = text.substr(0, colon);
    const std::string_view port = text.substr(colon + 1);
    if (host.front() == '[') {
        if (host.back() != ']' || host.size() < 3) {
            return false;
        }
        host = host.substr(1, host.size() - 2);
    } else if (host.find(':') != std::string_view::npos) {
        return false;
    }
    for (char ch : host) {
        const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                        (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == ':';
        if (!ok) {
            return false;
        }
    }
    uint32_t p = 0;
    for (char ch : port) {
        if (ch < '0' || ch > '9' || p > 65535) {
            return false;
        }
        p = p * 10 + static_cast<uint32_t>(ch - '0');
    }
    if (p == 0 || p > 65535 || host == "0.0.0.0" || host == "::") {
        return false;
    }
    out->host = std::string(host);
    out->port = static_cast<uint16_t>(p);
    return true;
}

}  // namespace

std::string encodeNodeRecord(const NodeRecord &r) {
    Json transports = Json::array();
    for (const NodeTransport &t : r.transports) {
        Json info = Json::parse(t.info, nullptr, false);
        transports.push_back(
            {{"name", t.name}, {"info", info.is_object() ? info : Json::object()}});
    }
    char epoch[20];
    std::snprintf(epoch, sizeof epoch, "%016llx", static_cast<unsigned long long>(r.epoch));
    const Json j{{"v", kRecordVersion},
                 {"name", r.name},
                 {"address", r.address.text()},
                 {"transports", std::move(transports)},
                 {"key_fingerprint", r.key_fingerprint},
                 {"epoch", epoch}};
    return j.dump();
}

bool decodeNodeRecord(std::string_view key_name, std::string_view value, NodeRecord *out,
                      std::string *why) {
    auto bad = [why](std::string w) {
        *why = std::move(w);
        return false;
    };
    if (value.size() > kMaxNodeRecordBytes) {
        return bad("its value has " + std::to_string(value.size()) + " bytes, more than " +
                   std::to_string(kMaxNodeRecordBytes));
    }
    if (!validNodeName(key_name)) {
        return bad("its key does not end in a node name (1-63 characters [A-Za-z0-9._-])");
    }
    const Json j = Json::parse(value, nullptr, false);
    if (!j.is_object()) {
        return bad("its value is not a JSON object");
    }
    if (!j.contains("v") || !j["v"].is_number_integer() ||
        j["v"].get<int64_t>() != kRecordVersion) {
        return bad("its record version is not " + std::to_string(kRecordVersion));
    }
    NodeRecord r;
    const auto str = [&j](const char *k) -> const std::string * {
        const auto it = j.find(k);
        return it != j.end() && it->is_string() ? &it->get_ref<const std::string &>() : nullptr;
    };
    const std::string *name = str("name");
    if (name == nullptr || *name != key_name) {
        return bad("its record names another node than its key");
    }
    r.name = *name;
    const std::string *address = str("address");
    if (address == nullptr || !parseAddress(*address, &r.address)) {
        return bad("its address is not a \"host:port\" peers can dial");
    }
    const std::string *fp = str("key_fingerprint");
    if (fp == nullptr || fp->size() != 32 || !isHex(*fp)) {
        return bad("its key_fingerprint is not 32 lower-case hex digits");
    }
    r.key_fingerprint = *fp;
    const std::string *epoch = str("epoch");
    if (epoch == nullptr || epoch->size() != 16 || !isHex(*epoch)) {
        return bad("its epoch is not 16 lower-case hex digits");
    }
    r.epoch = std::stoull(*epoch, nullptr, 16);
    if (r.epoch == 0) {
        return bad("its epoch is 0");
    }
    const auto t = j.find("transports");
    if (t == j.end() || !t->is_array() || t->size() > kMaxTransports) {
        return bad("its transports are not an array of at most " + std::to_string(kMaxTransports));
    }
    for (const Json &e : *t) {
        if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
            e["name"].get_ref<const std::string &>().size() > 16) {
            return bad("a transport of it has no name");
        }
        NodeTransport nt;
        nt.name = e["name"].get<std::string>();
        nt.info = e.contains("info") && e["info"].is_object() ? e["info"].dump() : "{}";
        r.transports.push_back(std::move(nt));
    }
    *out = std::move(r);
    return true;
}

std::string keyFingerprint(const config::KeyBytes &key) {
    // The label is BLAKE2b's key (16-64 bytes): the fingerprint is of this use only, never a
    // hash another protocol computes over the same key.
    static constexpr char kLabel[] = "tensorlane-key-fingerprint-v1";
    unsigned char out[16];
    crypto_generichash(out, sizeof out, key.data(), config::kKeyFileBytes,
                       reinterpret_cast<const unsigned char *>(kLabel), sizeof kLabel - 1);
    char hex[sizeof out * 2 + 1];
    sodium_bin2hex(hex, sizeof hex, out, sizeof out);
    return hex;
}

}  // namespace tensorlane::sidecar
