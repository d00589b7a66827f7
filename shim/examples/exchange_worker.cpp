// An example worker: exposes a receive buffer, writes its shard of random data into a peer
// worker's buffer, waits for the peer's shard, verifies it, and prints sizes, times and GB/s.
// scripts/demo.sh runs two of these against two sidecars; on a real pair, one on each node checks
// the deployment (docs/deploy.md).
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tensorlane/tensorlane.hpp"

namespace {

void fillShard(void *p, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto *w = static_cast<uint64_t *>(p);
    for (size_t i = 0; i < n / 8; ++i) {
        w[i] = rng() | 1;  // never zero: a zero buffer would verify by accident
    }
}

bool checkShard(const void *p, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const auto *w = static_cast<const uint64_t *>(p);
    for (size_t i = 0; i < n / 8; ++i) {
        if (w[i] != (rng() | 1)) {
            return false;
        }
    }
    return true;
}

constexpr const char *kUsage =
    "usage: tensorlane-example-exchange --peer NODE [--socket PATH] [--bytes N] [--iterations N]\n"
    "                                   [--seed N] [--peer-seed N] [--hold FILE]\n"
    "\n"
    "Exposes a receive buffer (demo-recv), writes a shard of random data into NODE's worker's,\n"
    "waits for NODE's shard, verifies it, and prints sizes, times and GB/s.\n"
    "  --peer NODE       the node whose worker runs the other end (its [node] name)\n"
    "  --socket PATH     the sidecar's socket (default: $TENSORLANE_SOCKET, else\n"
    "                    /run/tensorlane/sidecar.sock)\n"
    "  --bytes N         shard size in bytes, a multiple of 8 (default 67108864)\n"
    "  --iterations N    exchanges (default 5)\n"
    "  --seed N          seed of this worker's data (default 1)\n"
    "  --peer-seed N     seed of the peer worker's data (default 2)\n"
    "  --hold FILE       when done, create FILE and stay connected, buffers exposed, until FILE\n"
    "                    is removed (at most 60 s), so `tensorlane status` can show this worker\n";

int usageError(const std::string &what) {
    std::fprintf(stderr, "tensorlane-example-exchange: %s (--help lists the options)\n",
                 what.c_str());
    return 2;
}

/// A whole decimal number in [min, max], nothing else ("64MiB", "abc", "-1", "" are not).
bool parseNumber(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    if (*text == '\0') {
        return false;
    }
    uint64_t v = 0;
    for (const char *p = text; *p != '\0'; ++p) {
        if (*p < '0' || *p > '9') {
            return false;
        }
        const uint64_t digit = static_cast<uint64_t>(*p - '0');
        if (v > (max - digit) / 10) {
            return false;
        }
        v = v * 10 + digit;
    }
    if (v < min) {
        return false;
    }
    *out = v;
    return true;
}

/// Creates `path` and waits, connected, until someone removes it or 60 s pass.
void hold(const std::string &me, const std::string &path) {
    std::FILE *f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
        std::fprintf(stderr, "[%s] cannot create %s: %s\n", me.c_str(), path.c_str(),
                     std::strerror(errno));
        return;
    }
    std::fclose(f);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (::access(path.c_str(), F_OK) == 0) {
        if (std::chrono::steady_clock::now() > give_up) {
            std::fprintf(stderr, "[%s] %s still there after 60 s; disconnecting\n", me.c_str(),
                         path.c_str());
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

}  // namespace

int main(int argc, char **argv) {
    std::string socket, peer, hold_file;
    uint64_t bytes = 64 << 20;
    uint64_t iterations = 5;
    uint64_t seed = 1, peer_seed = 2;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        if (k == "-h" || k == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (k != "--socket" && k != "--peer" && k != "--bytes" && k != "--iterations" &&
            k != "--seed" && k != "--peer-seed" && k != "--hold") {
            return usageError("unknown argument '" + k + "'");
        }
        if (i + 1 >= argc) {
            return usageError(k + " needs a value");
        }
        const char *v = argv[++i];
        const auto bad = [&](const std::string &expected) {
            return usageError(k + " '" + v + "': expected " + expected);
        };
        if (k == "--socket") {
            socket = v;
        } else if (k == "--peer") {
            peer = v;
        } else if (k == "--hold") {
            hold_file = v;
        } else if (k == "--bytes") {
            // Two shards of it are allocated for receiving; 1 TiB is far past any host here.
            if (!parseNumber(v, 8, uint64_t{1} << 40, &bytes) || bytes % 8 != 0) {
                return bad("a whole number of bytes, a multiple of 8, from 8 to 2^40");
            }
        } else if (k == "--iterations") {
            if (!parseNumber(v, 1, 1000000, &iterations)) {
                return bad("a whole number from 1 to 1000000");
            }
        } else if (!parseNumber(v, 0, UINT64_MAX, k == "--seed" ? &seed : &peer_seed)) {
            return bad("a whole number");
        }
    }
    if (peer.empty()) {
        return usageError("--peer NODE is required");
    }
    auto client = tensorlane::Client::connect(socket);
    if (!client.ok()) {
        std::fprintf(stderr, "connect: %s: %s\n", client.error().name(),
                     client.error().detail.c_str());
        return 1;
    }
    const std::string me = client->nodeName();
    // Two halves: iteration k lands in half k % 2, so the peer's next shard never overwrites
    // the one being verified.
    auto recv = client->allocHost(2 * bytes);
    auto send = client->allocHost(bytes);
    if (!recv.ok() || !send.ok()) {
        std::fprintf(stderr, "alloc: %s\n",
                     (recv.ok() ? send.error() : recv.error()).detail.c_str());
        return 1;
    }
    std::memset(recv->data(), 0, 2 * bytes);
    if (auto e = recv->expose("demo-recv"); !e.ok()) {
        std::fprintf(stderr, "expose: %s\n", e.error().detail.c_str());
        return 1;
    }
    // The peer worker may not have exposed its buffer yet (TL_ENOENT), or its sidecar may not
    // be up yet (TL_EPEER): retry for a while, saying so every 2 s. Anything else (a name that
    // is no configured peer, a refusal) cannot get better by waiting: stop at once.
    tensorlane::Result<tensorlane::Remote> remote = tensorlane::Error{TL_ENOENT, ""};
    const auto start = std::chrono::steady_clock::now();
    const auto give_up = start + std::chrono::seconds(30);
    auto next_note = start + std::chrono::seconds(2);
    while (!(remote = client->lookup(peer, "demo-recv")).ok() &&
           (remote.error().status == TL_ENOENT || remote.error().status == TL_EPEER) &&
           std::chrono::steady_clock::now() < give_up) {
        if (const auto now = std::chrono::steady_clock::now(); now >= next_note) {
            next_note = now + std::chrono::seconds(2);
            std::fprintf(
                stderr,
                "[%s] waiting for %s's worker to expose demo-recv (%lld s of 30 s): %s: %s\n",
                me.c_str(), peer.c_str(),
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::seconds>(now - start).count()),
                remote.error().name(), remote.error().detail.c_str());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!remote.ok()) {
        std::fprintf(stderr, "[%s] lookup %s/demo-recv: %s: %s\n", me.c_str(), peer.c_str(),
                     remote.error().name(), remote.error().detail.c_str());
        return 1;
    }
    double total_s = 0;
    for (int it = 0; it < static_cast<int>(iterations); ++it) {
        fillShard(send->data(), bytes, seed * 1000003 + it);
        auto t0 = std::chrono::steady_clock::now();
        auto ticket =
            client->write(*send, 0, *remote, (it % 2) * bytes, bytes, static_cast<uint32_t>(it));
        if (!ticket.ok()) {
            std::fprintf(stderr, "write: %s\n", ticket.error().detail.c_str());
            return 1;
        }
        tl_status s = ticket->wait(std::chrono::seconds(60));
        auto t1 = std::chrono::steady_clock::now();
        if (s != TL_OK) {
            std::fprintf(stderr, "[%s] write %d: %s: %s\n", me.c_str(), it, tl_status_str(s),
                         tl_last_error());
            return 1;
        }
        auto note = client->waitNotification(std::chrono::seconds(60));
        if (!note.ok() || note->imm != static_cast<uint32_t>(it) ||
            note->offset != (it % 2) * bytes || note->bytes != bytes || peer != note->peer) {
            std::fprintf(stderr, "[%s] notification %d missing or wrong\n", me.c_str(), it);
            return 1;
        }
        bool ok = checkShard(static_cast<char *>(recv->data()) + note->offset, bytes,
                             peer_seed * 1000003 + it);
        double s_write = std::chrono::duration<double>(t1 - t0).count();
        total_s += s_write;
        std::printf(
            "[%s] iteration %d: wrote %zu bytes to %s in %.3f ms (%.2f GB/s); received "
            "%zu bytes from %s, contents %s\n",
            me.c_str(), it, bytes, peer.c_str(), s_write * 1e3, bytes / s_write / 1e9,
            static_cast<size_t>(note->bytes), note->peer, ok ? "verified" : "WRONG");
        std::fflush(stdout);
        if (!ok) {
            return 1;
        }
    }
    std::printf("[%s] %d x %zu bytes: mean %.2f GB/s\n", me.c_str(), static_cast<int>(iterations),
                static_cast<size_t>(bytes),
                iterations * static_cast<double>(bytes) / total_s / 1e9);
    std::fflush(stdout);
    if (!hold_file.empty()) {
        hold(me, hold_file);
    }
    return 0;
}
