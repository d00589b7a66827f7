// What a node registers under /tensorlane/<cluster>/nodes/<name>: a JSON document, read back by
// every other node as untrusted input (bounded, every field checked; docs/directory.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/config/key_file.hpp"

namespace tensorlane::sidecar {

/// One transport a node offers, with what a peer needs to know of it before the handshake.
struct NodeTransport {
    std::string name;  ///< "tcp", "verbs"
    std::string info;  ///< a JSON object's text (tcp: chunk_bytes, connections; verbs: device, mtu)
};

/// A node as the directory lists it.
struct NodeRecord {
    std::string name;
    config::Endpoint address;  ///< its bootstrap address ([directory] advertise)
    std::vector<NodeTransport> transports;
    /// keyFingerprint() of its peer key: 32 hex digits.
    std::string key_fingerprint;
    /// Its boot epoch (the peer layer's incarnation): a new one under the same name is a restart.
    uint64_t epoch = 0;
    /// From etcd, not the document: the key's last change and its lease.
    int64_t mod_revision = 0;
    int64_t lease = 0;
};

/// The largest value read back; anything longer is refused unread.
inline constexpr size_t kMaxNodeRecordBytes = 16384;

/// The record as the JSON registered in etcd ({"v":1,...}).
std::string encodeNodeRecord(const NodeRecord &r);
/// Parses the value of the key `.../nodes/<key_name>`; false with the reason when it is not a
/// valid record of that name (malformed, oversized, a name other than the key's, bad fields).
bool decodeNodeRecord(std::string_view key_name, std::string_view value, NodeRecord *out,
                      std::string *why);

/// A fingerprint of a peer key for the directory: BLAKE2b-128 keyed with a fixed label
/// (libsodium crypto_generichash), as 32 hex digits. It shows whether two nodes hold the same
/// key, and nothing of the key.
std::string keyFingerprint(const config::KeyBytes &key);

}  // namespace tensorlane::sidecar
