// An example worker: exposes a receive buffer, writes its shard of random data into a peer
// worker's buffer, waits for the peer's shard, verifies it, and prints sizes, times and GB/s.
// scripts/demo.sh runs two of these against two sidecars.
#include <chrono>
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

int usage() {
    std::fprintf(stderr,
                 "usage: tensorlane-example-exchange --socket PATH --peer NODE [--bytes N] "
                 "[--iterations N] [--seed N] [--peer-seed N]\n");
    return 2;
}

}  // namespace

int main(int argc, char **argv) {
    std::string socket, peer;
    size_t bytes = 64 << 20;
    int iterations = 5;
    uint64_t seed = 1, peer_seed = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        const char *v = argv[i + 1];
        if (k == "--socket")
            socket = v;
        else if (k == "--peer")
            peer = v;
        else if (k == "--bytes")
            bytes = std::strtoull(v, nullptr, 0);
        else if (k == "--iterations")
            iterations = std::atoi(v);
        else if (k == "--seed")
            seed = std::strtoull(v, nullptr, 0);
        else if (k == "--peer-seed")
            peer_seed = std::strtoull(v, nullptr, 0);
        else
            return usage();
    }
    if (socket.empty() || peer.empty() || bytes < 8 || bytes % 8 != 0 || iterations < 1) {
        return usage();
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
    // The peer worker may not have exposed its buffer yet: retry for a while.
    tensorlane::Result<tensorlane::Remote> remote = tensorlane::Error{TL_ENOENT, ""};
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!(remote = client->lookup(peer, "demo-recv")).ok() &&
           std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!remote.ok()) {
        std::fprintf(stderr, "[%s] lookup %s/demo-recv: %s: %s\n", me.c_str(), peer.c_str(),
                     remote.error().name(), remote.error().detail.c_str());
        return 1;
    }
    double total_s = 0;
    for (int it = 0; it < iterations; ++it) {
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
    std::printf("[%s] %d x %zu bytes: mean %.2f GB/s\n", me.c_str(), iterations, bytes,
                iterations * static_cast<double>(bytes) / total_s / 1e9);
    return 0;
}
