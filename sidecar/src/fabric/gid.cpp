// GID tables: reading a port's table from sysfs and choosing the index `auto` means.
//
// The rules follow what RoCE deployments need (and what NCCL's ncclIbGetGidIndex does in its own
// way): only RoCE v2 entries are routable over UDP/IP; an IPv4-mapped GID is what an IPv4 fabric
// routes; a link-local GID (fe80::/10) works only inside one L2 segment, so it is the last
// resort. Entries the kernel has not populated read as zero and their attributes fail with
// EINVAL; those are skipped, never treated as errors.
#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "tensorlane/sidecar/fabric.hpp"

namespace tensorlane::sidecar {

namespace {

int hexValue(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/// "0-3, 7, 9-10" for a sorted list of indices.
std::string indexRanges(const std::vector<uint32_t> &indices) {
    std::string out;
    for (size_t i = 0; i < indices.size();) {
        size_t j = i;
        while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) {
            ++j;
        }
        out += out.empty() ? "" : ", ";
        out += std::to_string(indices[i]);
        if (j > i) {
            out += "-" + std::to_string(indices[j]);
        }
        i = j + 1;
    }
    return out;
}

/// Why an entry is not what `auto` wants, grouped so the reason lists each kind once.
class PassedOver {
public:
    void add(const std::string &why, uint32_t index) { groups_[why].push_back(index); }
    void addEmpty(uint32_t index) { empty_.push_back(index); }
    std::string text() const {
        std::string out;
        for (const auto &[why, indices] : groups_) {
            out += out.empty() ? "" : "; ";
            out += indexRanges(indices) + " (" + why + ")";
        }
        if (!empty_.empty()) {
            out += out.empty() ? "" : "; ";
            out += std::to_string(empty_.size()) + " empty";
        }
        return out;
    }

private:
    std::map<std::string, std::vector<uint32_t>> groups_;
    std::vector<uint32_t> empty_;
};

/// The kinds of usable GID, best first.
enum class Kind { kIpv4Mapped = 0, kGlobalIpv6 = 1, kLinkLocal = 2 };

Kind kindOf(const Gid &g) {
    if (g.isIpv4Mapped()) {
        return Kind::kIpv4Mapped;
    }
    return g.isLinkLocal() ? Kind::kLinkLocal : Kind::kGlobalIpv6;
}

const char *kindText(Kind k) {
    switch (k) {
        case Kind::kIpv4Mapped:
            return "IPv4-mapped";
        case Kind::kGlobalIpv6:
            return "global IPv6";
        case Kind::kLinkLocal:
            return "link-local";
    }
    return "?";
}

std::string netdevText(std::string_view netdev) {
    return netdev.empty() ? std::string("any non-overlay netdev") : std::string(netdev);
}

}  // namespace

const char *toString(RoceVersion v) {
    switch (v) {
        case RoceVersion::kV1:
            return "v1";
        case RoceVersion::kV2:
            return "v2";
        case RoceVersion::kUnknown:
            break;
    }
    return "unknown";
}

std::optional<Gid> Gid::parse(std::string_view text) {
    Gid g;
    // The sysfs form: exactly 8 groups of 4 hex digits (39 characters).
    if (text.size() == 39) {
        bool ok = true;
        for (size_t group = 0; group < 8 && ok; ++group) {
            const size_t at = group * 5;
            if (group < 7 && text[at + 4] != ':') {
                ok = false;
                break;
            }
            int v[4];
            for (int k = 0; k < 4; ++k) {
                v[k] = hexValue(text[at + static_cast<size_t>(k)]);
                ok = ok && v[k] >= 0;
            }
            if (ok) {
                g.raw[group * 2] = static_cast<uint8_t>(v[0] << 4 | v[1]);
                g.raw[group * 2 + 1] = static_cast<uint8_t>(v[2] << 4 | v[3]);
            }
        }
        if (ok) {
            return g;
        }
    }
    // Anything else inet_pton accepts as IPv6 ("::ffff:10.0.0.2").
    const std::string s(text);
    if (s.size() < INET6_ADDRSTRLEN && ::inet_pton(AF_INET6, s.c_str(), g.raw.data()) == 1) {
        return g;
    }
    return std::nullopt;
}

std::string Gid::text() const {
    char buf[40];
    char *p = buf;
    for (size_t group = 0; group < 8; ++group) {
        // The room left, not a fixed 6: the last group has 5 bytes (4 digits and the NUL), and
        // _FORTIFY_SOURCE aborts on a size larger than the buffer's rest.
        std::snprintf(p, static_cast<size_t>(buf + sizeof buf - p),
                      group < 7 ? "%02x%02x:" : "%02x%02x", raw[group * 2], raw[group * 2 + 1]);
        p += group < 7 ? 5 : 4;
    }
    return std::string(buf, 39);
}

std::string Gid::address() const {
    char buf[INET6_ADDRSTRLEN];
    if (isIpv4Mapped()) {
        ::inet_ntop(AF_INET, raw.data() + 12, buf, sizeof buf);
    } else {
        ::inet_ntop(AF_INET6, raw.data(), buf, sizeof buf);
    }
    return buf;
}

bool Gid::isZero() const {
    return std::all_of(raw.begin(), raw.end(), [](uint8_t b) { return b == 0; });
}

bool Gid::isIpv4Mapped() const {
    return std::all_of(raw.begin(), raw.begin() + 10, [](uint8_t b) { return b == 0; }) &&
           raw[10] == 0xff && raw[11] == 0xff;
}

bool Gid::isLinkLocal() const {
    return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
}

std::vector<GidEntry> readGidTable(const SysfsRoot &root, const std::string &device,
                                   uint32_t port) {
    const std::string base = "class/infiniband/" + device + "/ports/" + std::to_string(port);
    std::vector<GidEntry> table;
    for (const std::string &name : root.list(base + "/gids")) {
        GidEntry e;
        char *end = nullptr;
        const unsigned long index = std::strtoul(name.c_str(), &end, 10);
        if (name.empty() || *end != '\0' || index > 0xffff) {
            continue;
        }
        e.index = static_cast<uint32_t>(index);
        const std::optional<std::string> gid = root.read(base + "/gids/" + name);
        if (gid) {
            e.gid = Gid::parse(*gid);
        }
        if (const auto type = root.read(base + "/gid_attrs/types/" + name)) {
            e.type_text = *type;
            if (*type == "RoCE v2") {
                e.version = RoceVersion::kV2;
            } else if (*type == "IB/RoCE v1" || *type == "RoCE v1") {
                e.version = RoceVersion::kV1;
            }
        }
        if (const auto ndev = root.read(base + "/gid_attrs/ndevs/" + name)) {
            e.netdev = *ndev;
        }
        if (!gid) {
            e.problem = "GID unreadable";
        } else if (!e.gid) {
            e.problem = "GID not parseable";
        } else if (e.gid->isZero()) {
            e.problem = "empty";
        } else if (e.type_text.empty()) {
            e.problem = "type unreadable";
        }
        table.push_back(std::move(e));
    }
    std::sort(table.begin(), table.end(),
              [](const GidEntry &a, const GidEntry &b) { return a.index < b.index; });
    return table;
}

Status chooseGid(const std::vector<GidEntry> &table, std::string_view netdev, GidChoice *out) {
    PassedOver passed;
    const GidEntry *best = nullptr;
    Kind best_kind = Kind::kLinkLocal;
    std::vector<uint32_t> candidates[3];
    for (const GidEntry &e : table) {
        if (e.problem == "empty") {
            passed.addEmpty(e.index);
            continue;
        }
        if (!e.problem.empty()) {
            passed.add(e.problem, e.index);
            continue;
        }
        if (e.version != RoceVersion::kV2) {
            passed.add(e.version == RoceVersion::kV1 ? "RoCE v1" : "type \"" + e.type_text + "\"",
                       e.index);
            continue;
        }
        if (netdev.empty()) {
            if (e.netdev.empty()) {
                passed.add("netdev unreadable", e.index);
                continue;
            }
            if (isOverlayNetdev(e.netdev)) {
                passed.add("overlay netdev " + e.netdev, e.index);
                continue;
            }
        } else if (e.netdev != netdev) {
            passed.add(e.netdev.empty() ? std::string("netdev unreadable") : "of " + e.netdev,
                       e.index);
            continue;
        }
        const Kind k = kindOf(*e.gid);
        candidates[static_cast<int>(k)].push_back(e.index);
        if (best == nullptr || static_cast<int>(k) < static_cast<int>(best_kind)) {
            best = &e;
            best_kind = k;
        }
    }
    if (best == nullptr) {
        const std::string seen = passed.text();
        return {Code::kNotFound, "no usable RoCE v2 GID of " + netdevText(netdev) +
                                     (table.empty() ? std::string(": the GID table is empty")
                                                    : " in the GID table (" + seen + ")")};
    }
    // The other usable kinds are "passed over" too, so the reason shows what else was there.
    for (int k = 0; k < 3; ++k) {
        for (uint32_t idx : candidates[k]) {
            if (idx == best->index) {
                continue;
            }
            if (k == static_cast<int>(best_kind)) {
                passed.add(std::string(kindText(static_cast<Kind>(k))) + ", a lower index first",
                           idx);
            } else {
                passed.add(std::string(kindText(static_cast<Kind>(k))) + ", ranked after " +
                               kindText(best_kind),
                           idx);
            }
        }
    }
    GidChoice c;
    c.index = best->index;
    c.reason = "GID " + std::to_string(best->index) + " (" + best->gid->address() +
               ") is the first RoCE v2 " + kindText(best_kind) + " GID of " + best->netdev;
    if (best_kind == Kind::kLinkLocal) {
        c.reason += " (no routable RoCE v2 GID exists: reachable only within one L2 segment)";
    }
    if (const std::string seen = passed.text(); !seen.empty()) {
        c.reason += "; passed over: " + seen;
    }
    *out = std::move(c);
    return Status::ok();
}

Status checkGidIndex(const std::vector<GidEntry> &table, uint32_t index, std::string_view netdev,
                     GidChoice *out) {
    const auto it = std::find_if(table.begin(), table.end(),
                                 [index](const GidEntry &e) { return e.index == index; });
    const std::string name = "[fabric] gid_index = " + std::to_string(index);
    if (it == table.end()) {
        return {Code::kNotFound,
                name + ": the port has no such GID table entry (" +
                    (table.empty() ? std::string("the table is empty")
                                   : "indices " + std::to_string(table.front().index) + "-" +
                                         std::to_string(table.back().index)) +
                    ")"};
    }
    if (!it->problem.empty()) {
        return {Code::kInvalid,
                name + ": the entry is " +
                    (it->problem == "empty" ? std::string("empty (no address)") : it->problem)};
    }
    if (it->version != RoceVersion::kV2) {
        return {Code::kInvalid, name + " is " +
                                    (it->type_text.empty() ? std::string("of unknown type")
                                                           : "\"" + it->type_text + "\"") +
                                    ", not RoCE v2: it cannot be routed over UDP/IP"};
    }
    if (!netdev.empty() && it->netdev != netdev) {
        return {Code::kInvalid,
                name + " belongs to " +
                    (it->netdev.empty() ? std::string("an unreadable netdev") : it->netdev) +
                    ", not to [fabric] netdev = \"" + std::string(netdev) + "\""};
    }
    GidChoice c;
    c.index = index;
    c.reason = "GID " + std::to_string(index) + " (" + it->gid->address() + ", RoCE v2, " +
               it->netdev + ") is set in the file";
    if (it->gid->isLinkLocal()) {
        c.reason += " (link-local: reachable only within one L2 segment)";
    }
    *out = std::move(c);
    return Status::ok();
}

}  // namespace tensorlane::sidecar
