#include "peer/key.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::sidecar {

namespace {

// Domain separation: the same secret used elsewhere never yields this key.
constexpr std::string_view kKeyContext = "tensorlane peer key v1";

bool isSpace(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

PeerKey::~PeerKey() {
    sodium_memzero(bytes_.data(), bytes_.size());
}

Status PeerKey::fromSecret(std::string_view secret, PeerKey *out) {
    while (!secret.empty() && isSpace(secret.front())) {
        secret.remove_prefix(1);
    }
    while (!secret.empty() && isSpace(secret.back())) {
        secret.remove_suffix(1);
    }
    if (secret.size() < kMinSecretBytes) {
        return {Code::kInvalid, "the peer key is " + std::to_string(secret.size()) +
                                    " bytes after trimming whitespace; at least " +
                                    std::to_string(kMinSecretBytes) +
                                    " are needed (e.g. `openssl rand -hex 32`)"};
    }
    if (sodium_init() < 0) {
        return {Code::kInternal, "libsodium failed to initialise"};
    }
    PeerKey k;
    // BLAKE2b-256 keyed with the context string: any length of secret becomes a uniform
    // 32-byte HMAC key.
    crypto_generichash(k.bytes_.data(), k.bytes_.size(),
                       reinterpret_cast<const unsigned char *>(secret.data()), secret.size(),
                       reinterpret_cast<const unsigned char *>(kKeyContext.data()),
                       kKeyContext.size());
    *out = k;
    return Status::ok();
}

Status PeerKey::fromFile(const std::string &path, PeerKey *out) {
    ipc::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (!fd) {
        const int err = errno;
        return {Code::kPermission,
                "cannot open the peer key file " + path + ": " + std::strerror(err)};
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
        const int err = errno;
        return {Code::kPermission,
                "cannot stat the peer key file " + path + ": " + std::strerror(err)};
    }
    if (!S_ISREG(st.st_mode)) {
        return {Code::kInvalid, "the peer key file " + path + " is not a regular file"};
    }
    if ((st.st_mode & 077) != 0) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
        return {Code::kPermission, "the peer key file " + path + " has mode " + mode +
                                       "; group and others must have no access (chmod 600 " + path +
                                       ")"};
    }
    if (st.st_size > static_cast<off_t>(kMaxFileBytes)) {
        return {Code::kInvalid, "the peer key file " + path + " is " + std::to_string(st.st_size) +
                                    " bytes; at most " + std::to_string(kMaxFileBytes) +
                                    " are allowed"};
    }
    std::string secret(kMaxFileBytes + 1, '\0');
    size_t got = 0;
    while (got < secret.size()) {
        ssize_t r = ::read(fd.get(), secret.data() + got, secret.size() - got);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            const int err = errno;
            sodium_memzero(secret.data(), secret.size());
            return {Code::kPermission,
                    "cannot read the peer key file " + path + ": " + std::strerror(err)};
        }
        if (r == 0) {
            break;
        }
        got += static_cast<size_t>(r);
    }
    Status s = got > kMaxFileBytes
                   ? Status{Code::kInvalid, "the peer key file " + path + " grew while read"}
                   : fromSecret(std::string_view(secret.data(), got), out);
    sodium_memzero(secret.data(), secret.size());
    if (!s.isOk() && s.code() == Code::kInvalid && got <= kMaxFileBytes) {
        return {s.code(), path + ": " + s.message()};
    }
    return s;
}

}  // namespace tensorlane::sidecar
