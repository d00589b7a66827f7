// The peer key file: one line "tensorlane-key-v1:" + 64 hex digits (key_file.hpp,
// docs/peers.md "Key file"). Read by the config checks and the peer layer, written by
// `tensorlane keygen`.
#include "tensorlane/config/key_file.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>  // renameat2, RENAME_NOREPLACE
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace tensorlane::config {
namespace {

constexpr size_t kHexDigits = 2 * kKeyFileBytes;
/// The whole line a key file holds, with its newline: what keygen writes.
constexpr size_t kLineBytes = kKeyFilePrefix.size() + kHexDigits + 1;

std::string errnoText(int err) {
    return std::strerror(err);
}

/// How to make a key, for the messages that should say it.
std::string keygenHint(const std::string &path, bool replace) {
    return std::string(replace ? "make a new one" : "make one") + " with `tensorlane keygen " +
           (replace ? "--force " : "") + path + "` and copy it to every peer";
}

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

/// One byte of the file named for people. The byte is never a hex digit (those are key).
std::string describeByte(char c) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == ' ') {
        return "a space";
    }
    if (c == '\t') {
        return "a tab";
    }
    if (c == '\n' || c == '\r') {
        return "a line break";
    }
    if (byte > 0x20 && byte < 0x7F) {
        return std::string("'") + c + "'";
    }
    char buf[16];
    std::snprintf(buf, sizeof buf, "byte 0x%02X", byte);
    return buf;
}

KeyFileResult accessProblem(std::string detail) {
    return {KeyFileResult::Problem::kAccess, std::move(detail)};
}

KeyFileResult formatProblem(std::string detail) {
    return {KeyFileResult::Problem::kFormat, std::move(detail)};
}

/// Regular file, owner-only: the key authenticates peers, so anyone else who can read it can
/// impersonate this node, and anyone who can write it can lock the nodes out.
KeyFileResult checkStat(const struct stat &st, const std::string &path) {
    if (!S_ISREG(st.st_mode)) {
        return accessProblem("not a regular file; " + keygenHint(path, false));
    }
    if ((st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) != 0) {
        char mode[16];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
        return accessProblem(std::string("mode ") + mode +
                             ": group or others can read or write it (chmod 600 " + path + ")");
    }
    if (st.st_size > static_cast<off_t>(kKeyFileMaxBytes)) {
        return formatProblem(std::to_string(st.st_size) + " bytes, not a key file (one line of " +
                             std::to_string(kLineBytes) + " bytes); " + keygenHint(path, true));
    }
    return {};
}

/// Removes a temporary file on every path out of writeNewKeyFile but success.
struct TempFile {
    std::string path;
    ~TempFile() {
        if (!path.empty()) {
            ::unlink(path.c_str());
        }
    }
};

bool writeAll(int fd, const char *p, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

}  // namespace

KeyBytes::~KeyBytes() {
    sodium_memzero(bytes_.data(), bytes_.size());
}

KeyFileResult parseKeyText(std::string_view text, KeyBytes *key) {
    if (text.empty()) {
        return formatProblem("empty");
    }
    if (text.substr(0, kKeyFilePrefix.size()) != kKeyFilePrefix) {
        constexpr std::string_view kFamily = "tensorlane-key-";
        if (text.substr(0, kFamily.size()) == kFamily) {
            // A later format: name it (up to the colon, printable characters only).
            std::string version;
            for (size_t i = kFamily.size(); i < text.size() && i < kFamily.size() + 16; ++i) {
                const char c = text[i];
                if (c == ':' || static_cast<unsigned char>(c) <= 0x20 ||
                    static_cast<unsigned char>(c) >= 0x7F) {
                    break;
                }
                version += c;
            }
            return formatProblem("a tensorlane-key-" + version +
                                 " file; this version reads tensorlane-key-v1 files only");
        }
        return formatProblem(
            "not a tensorlane key file (raw secrets, the format before tensorlane-key-v1, are no "
            "longer read)");
    }
    const std::string_view body = text.substr(kKeyFilePrefix.size());
    size_t digits = 0;
    while (digits < body.size() && hexValue(body[digits]) >= 0) {
        ++digits;
    }
    if (digits > kHexDigits) {
        return formatProblem(
            "more than 64 hex digits after tensorlane-key-v1: (the key is 32 "
            "bytes)");
    }
    if (digits < kHexDigits) {
        if (digits == body.size() || body[digits] == '\n' || body[digits] == '\r') {
            return formatProblem(std::to_string(digits) +
                                 " hex digits after tensorlane-key-v1:, 64 are needed (the key "
                                 "is 32 bytes)");
        }
        return formatProblem("character " + std::to_string(kKeyFilePrefix.size() + digits + 1) +
                             " of the line is " + describeByte(body[digits]) + ", not a hex digit");
    }
    const std::string_view rest = body.substr(kHexDigits);
    if (!rest.empty() && rest != "\n" && rest != "\r\n") {
        return formatProblem(rest[0] == '\n' || rest[0] == '\r'
                                 ? std::string("more than one line (a key file is one line)")
                                 : "text after the key: " + describeByte(rest[0]) +
                                       " after the 64 hex digits");
    }
    for (size_t i = 0; i < kKeyFileBytes; ++i) {
        key->data()[i] =
            static_cast<uint8_t>(hexValue(body[2 * i]) << 4 | hexValue(body[2 * i + 1]));
    }
    return {};
}

KeyFileResult readKeyFile(const std::string &path, KeyBytes *key) {
    // stat first: the mode is worth reporting even when this user cannot open the file.
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT) {
            return accessProblem("no such file; " + keygenHint(path, false));
        }
        return accessProblem(errnoText(err));
    }
    if (KeyFileResult r = checkStat(st, path); !r.ok()) {
        return r;
    }
    // O_NONBLOCK: a FIFO swapped in after the stat must not hang the sidecar's start.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        return accessProblem("cannot be read: " + errnoText(errno) +
                             " (it must be owned by the user the sidecar runs as)");
    }
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    // Checked again on what was opened: the path may have been replaced since the stat.
    if (::fstat(fd, &st) != 0) {
        return accessProblem("cannot be read: " + errnoText(errno));
    }
    if (KeyFileResult r = checkStat(st, path); !r.ok()) {
        return r;
    }
    std::array<char, kKeyFileMaxBytes + 1> buf{};
    size_t got = 0;
    while (got < buf.size()) {
        const ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            const int err = errno;
            sodium_memzero(buf.data(), buf.size());
            return accessProblem("cannot be read: " + errnoText(err));
        }
        if (r == 0) {
            break;
        }
        got += static_cast<size_t>(r);
    }
    KeyFileResult result = got > kKeyFileMaxBytes
                               ? formatProblem("grew while it was read")
                               : parseKeyText(std::string_view(buf.data(), got), key);
    sodium_memzero(buf.data(), buf.size());
    if (result.problem == KeyFileResult::Problem::kFormat) {
        result.detail += "; " + keygenHint(path, true);
    }
    return result;
}

std::string formatKeyText(const KeyBytes &key) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string text(kKeyFilePrefix);
    text.reserve(kLineBytes);
    for (size_t i = 0; i < kKeyFileBytes; ++i) {
        text += kHex[key.data()[i] >> 4];
        text += kHex[key.data()[i] & 15];
    }
    text += '\n';
    return text;
}

std::string writeNewKeyFile(const std::string &path, bool replace) {
    if (path.empty()) {
        return "no key file named";
    }
    struct stat st {};
    if (!replace && ::lstat(path.c_str(), &st) == 0) {
        return path + " exists; `tensorlane keygen --force " + path +
               "` replaces it (then copy the new file to every peer: the old key stops working)";
    }
    if (replace && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        return path + " is a directory";
    }
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) {
        dir = ".";
    }
    if (sodium_init() < 0) {
        return "libsodium failed to initialise";
    }
    KeyBytes key;
    randombytes_buf(key.data(), kKeyFileBytes);
    std::string text = formatKeyText(key);

    // A temporary file next to the target (same file system, so the link or rename is atomic),
    // created 0600 by mkostemp and set to 0600 again whatever the umask.
    std::string tmpl =
        (dir / ("." + std::filesystem::path(path).filename().string() + ".tmp-XXXXXX")).string();
    const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) {
        const int err = errno;
        sodium_memzero(text.data(), text.size());
        if (err == ENOENT) {
            return "cannot write " + path + ": the directory " + dir.string() +
                   " does not exist (mkdir -p " + dir.string() + ")";
        }
        return "cannot create a file in " + dir.string() + ": " + errnoText(err);
    }
    TempFile tmp{tmpl};
    const bool written =
        ::fchmod(fd, 0600) == 0 && writeAll(fd, text.data(), text.size()) && ::fsync(fd) == 0;
    const int write_err = errno;
    sodium_memzero(text.data(), text.size());
    if (::close(fd) != 0 || !written) {
        return "cannot write " + tmpl + ": " + errnoText(written ? errno : write_err);
    }
    if (replace) {
        if (::rename(tmpl.c_str(), path.c_str()) != 0) {
            return "cannot replace " + path + ": " + errnoText(errno);
        }
        tmp.path.clear();  // renamed: nothing left to remove
    } else if (::renameat2(AT_FDCWD, tmpl.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) {
        tmp.path.clear();
    } else {
        // RENAME_NOREPLACE fails if path appeared meanwhile; a file system without the flag
        // gets link(), which has the same no-overwrite guarantee (the temporary name goes).
        int err = errno;
        if ((err == EINVAL || err == ENOSYS) && ::link(tmpl.c_str(), path.c_str()) == 0) {
            err = 0;
        } else if (err == EINVAL || err == ENOSYS) {
            err = errno;
        }
        if (err != 0) {
            return err == EEXIST
                       ? path + " exists; `tensorlane keygen --force " + path + "` replaces it"
                       : "cannot create " + path + ": " + errnoText(err);
        }
    }
    // The new name is durable once the directory is synced.
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd >= 0) {
        (void)::fsync(dir_fd);
        ::close(dir_fd);
    }
    return {};
}

}  // namespace tensorlane::config
