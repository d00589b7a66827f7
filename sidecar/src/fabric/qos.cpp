// Parsers for the QoS read-back of mlnx_qos and iproute2's dcb, and for ethtool's pause
// counters. They take the text the tools print and never fail: what they cannot find stays
// unset, and diag says it could not be read.
#include <cctype>
#include <sstream>

#include "fabric/internal.hpp"

namespace tensorlane::sidecar {

namespace {

std::string trim(std::string_view s) {
    size_t a = 0;
    size_t b = s.size();
    while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) {
        ++a;
    }
    while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) {
        --b;
    }
    return std::string(s.substr(a, b - a));
}

std::vector<std::string> lines(std::string_view text) {
    std::vector<std::string> out;
    std::istringstream in{std::string(text)};
    for (std::string line; std::getline(in, line);) {
        out.push_back(line);
    }
    return out;
}

bool parseInt(std::string_view s, int lo, int hi, int *out) {
    if (s.empty() || s.size() > 6) {
        return false;
    }
    int v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') {
            return false;
        }
        v = v * 10 + (c - '0');
    }
    if (v < lo || v > hi) {
        return false;
    }
    *out = v;
    return true;
}

/// A DSCP that two entries map to different priorities.
constexpr int kConflict = -2;

void mapDscp(std::array<int, 64> &map, int dscp, int prio) {
    map[dscp] = map[dscp] == -1 || map[dscp] == prio ? prio : kConflict;
}

}  // namespace

QosSettings parseMlnxQos(std::string_view text) {
    QosSettings q;
    q.source = "mlnx_qos";
    std::array<int, 64> map;
    map.fill(-1);
    bool any_map = false;
    bool in_pfc = false;
    for (const std::string &raw : lines(text)) {
        const std::string line = trim(raw);
        // "Priority trust state: dscp" (older releases: "Priority trust mode: dscp").
        if (line.rfind("Priority trust", 0) == 0) {
            const size_t colon = line.find(':');
            if (colon != std::string::npos) {
                q.trust = trim(line.substr(colon + 1));
            }
            continue;
        }
        // "prio:3 dscp:31,30,29,28,27,26,25,24,"
        if (line.rfind("prio:", 0) == 0) {
            const size_t sp = line.find(" dscp:");
            int prio = 0;
            if (sp == std::string::npos || !parseInt(line.substr(5, sp - 5), 0, 7, &prio)) {
                continue;
            }
            std::stringstream list(line.substr(sp + 6));
            for (std::string item; std::getline(list, item, ',');) {
                int dscp = 0;
                if (parseInt(trim(item), 0, 63, &dscp)) {
                    mapDscp(map, dscp, prio);
                    any_map = true;
                }
            }
            continue;
        }
        if (line.rfind("PFC configuration", 0) == 0) {
            in_pfc = true;
            continue;
        }
        // "enabled     0   0   0   1   0   0   0   0"
        if (in_pfc && line.rfind("enabled", 0) == 0) {
            std::istringstream in(line.substr(7));
            std::array<bool, 8> pfc{};
            int n = 0;
            for (std::string v; n < 8 && in >> v; ++n) {
                pfc[static_cast<size_t>(n)] = v == "1";
            }
            if (n == 8) {
                q.pfc = pfc;
            }
            in_pfc = false;
        }
    }
    if (any_map) {
        q.dscp_to_prio = map;
    }
    return q;
}

QosSettings parseDcb(std::string_view pfc_text, std::string_view app_text) {
    QosSettings q;
    q.source = "dcb";
    for (const std::string &line : lines(pfc_text)) {
        // "prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off"
        std::istringstream in(line);
        std::string word;
        if (!(in >> word) || word != "prio-pfc") {
            continue;
        }
        std::array<bool, 8> pfc{};
        int seen = 0;
        while (in >> word) {
            const size_t colon = word.find(':');
            int prio = 0;
            if (colon == std::string::npos || !parseInt(word.substr(0, colon), 0, 7, &prio)) {
                continue;
            }
            pfc[static_cast<size_t>(prio)] = word.substr(colon + 1) == "on";
            seen |= 1 << prio;
        }
        if (seen == 0xff) {
            q.pfc = pfc;
        }
    }
    std::array<int, 64> map;
    map.fill(-1);
    bool any_map = false;
    bool listed = false;
    for (const std::string &line : lines(app_text)) {
        // "dscp-prio 0:0 26:3 48:6" (printed with -N, so DSCP values are numbers)
        std::istringstream in(line);
        std::string word;
        if (!(in >> word) || word != "dscp-prio") {
            continue;
        }
        listed = true;
        while (in >> word) {
            const size_t colon = word.find(':');
            int dscp = 0;
            int prio = 0;
            if (colon != std::string::npos && parseInt(word.substr(0, colon), 0, 63, &dscp) &&
                parseInt(word.substr(colon + 1), 0, 7, &prio)) {
                mapDscp(map, dscp, prio);
                any_map = true;
            }
        }
    }
    if (any_map || listed) {
        q.dscp_to_prio = map;
    }
    return q;
}

std::vector<std::pair<std::string, uint64_t>> parsePauseCounters(std::string_view text) {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const std::string &raw : lines(text)) {
        const std::string line = trim(raw);
        const size_t colon = line.find(':');
        if (colon == std::string::npos) {
            continue;
        }
        const std::string name = trim(line.substr(0, colon));
        const std::string value = trim(line.substr(colon + 1));
        if (name.find("pause") == std::string::npos || value.empty() ||
            value.find_first_not_of("0123456789") != std::string::npos || value.size() > 19) {
            continue;
        }
        out.emplace_back(name, std::stoull(value));
    }
    return out;
}

}  // namespace tensorlane::sidecar
