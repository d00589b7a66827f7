// An engine in the test's own process (Engine::create, start, run() on a thread of its own), so
// tests reach the request pipeline's edge cases through real clients without spawning the
// sidecar binary. Clients connect to socket() as they would to the daemon.
//
// Threads: while run() runs, the engine's state is its thread's alone, so status() asks the
// engine over its socket (a private observer client; the engine thread answers) and
// finalStatus() reads Engine::statusJson() directly only once run() has returned.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/engine.hpp"
#include "tensorlane/tensorlane.h"

namespace tltest {

struct InProcessOptions {
    std::string name = "node-a";
    /// event: the engine sleeps whenever it is idle, so every request goes through the
    /// doorbell protocol (and the machine's few cores are left to the clients).
    std::string poll_mode = "event";
    uint32_t ring_depth = 64;
    /// The peer port; only opened when there are peers. 0: a free one.
    uint16_t listen_port = 0;
    std::vector<PeerEntry> peers;
    /// The key the peers share; empty: a fresh one in the engine's directory.
    std::string key_file;
    std::string tcp;     ///< body of a [tcp] table
    std::string limits;  ///< body of a [limits] table
    /// Makes the remote transports to use instead of the configured ones (Engine::create's
    /// third argument), e.g. a loop_transport.hpp one; empty: tcp as configured.
    std::function<std::vector<std::unique_ptr<tensorlane::sidecar::Transport>>()> transports;
};

/// One engine on a thread of this process; stopped, joined and destroyed at destruction.
class InProcessEngine {
public:
    explicit InProcessEngine(InProcessOptions opts = {}) : opts_(std::move(opts)) {
        socket_ = dir_.file("sidecar.sock");
        if (opts_.listen_port == 0) {
            opts_.listen_port = freePort();
        }
        std::string key = opts_.key_file;
        if (key.empty()) {
            key = dir_.file("peer.key");
            writeFile(key, keyText('0'), 0600);
        }
        std::string toml =
            "[node]\nname = \"" + opts_.name +
            "\"\nlisten = \"127.0.0.1:" + std::to_string(opts_.listen_port) + "\"\nsocket = \"" +
            socket_ + "\"\n[ipc]\nring_depth = " + std::to_string(opts_.ring_depth) +
            "\npoll_mode = \"" + opts_.poll_mode + "\"\n[security]\npeer_key_file = \"" + key +
            "\"\n[fabric]\ntransport = \"tcp\"\n";
        if (!opts_.tcp.empty()) {
            toml += "[tcp]\n" + opts_.tcp + "\n";
        }
        if (!opts_.limits.empty()) {
            toml += "[limits]\n" + opts_.limits + "\n";
        }
        for (const auto &p : opts_.peers) {
            toml += "[[peers]]\nname = \"" + p.name + "\"\naddress = \"" + p.address + "\"\n";
        }
        auto parsed = tensorlane::config::parseString(toml, dir_.file("sidecar.toml"));
        if (!parsed.ok()) {
            error_ = "config: " +
                     (parsed.errors.empty() ? std::string("?") : parsed.errors.front().text());
            return;
        }
        tensorlane::sidecar::Status st;
        engine_ = opts_.transports
                      ? tensorlane::sidecar::Engine::create(*parsed.config, &st, opts_.transports())
                      : tensorlane::sidecar::Engine::create(*parsed.config, &st);
        if (!engine_) {
            error_ = "Engine::create: " + st.message();
            return;
        }
        if (st = engine_->start(); !st.isOk()) {
            error_ = "Engine::start: " + st.message();
            engine_.reset();
            return;
        }
        std::promise<void> returned;
        run_returned_ = returned.get_future();
        thread_ = std::thread([this, p = std::move(returned)]() mutable {
            engine_->run();
            p.set_value();
        });
        if (tl_connect(socket_.c_str(), &observer_) != TL_OK) {
            error_ = std::string("observer tl_connect: ") + tl_last_error();
            return;
        }
        // The observer is the only client yet: its session is the one entry.
        const nlohmann::json j = rawStatus();
        if (!j.is_object() || j["clients"].size() != 1) {
            error_ = "observer: no status, or not the only client";
            return;
        }
        observer_session_ = j["clients"][0].value("session", uint64_t{0});
    }
    ~InProcessEngine() { destroy(); }
    InProcessEngine(const InProcessEngine &) = delete;
    InProcessEngine &operator=(const InProcessEngine &) = delete;

    /// Created, started, running, and the observer is connected.
    bool ok() const { return error_.empty() && engine_ != nullptr; }
    const std::string &error() const { return error_; }
    const std::string &socket() const { return socket_; }
    const std::string &name() const { return opts_.name; }
    uint16_t listenPort() const { return opts_.listen_port; }
    /// "127.0.0.1:PORT", for another engine's [[peers]].
    std::string address() const { return "127.0.0.1:" + std::to_string(opts_.listen_port); }
    tensorlane::sidecar::Engine *engine() { return engine_.get(); }

    /// The status document as the engine thread serves it (tl_sidecar_status), with the
    /// observer's own session left out of "clients". Null while the engine does not run.
    nlohmann::json status() {
        nlohmann::json j = rawStatus();
        if (j.is_object() && j.contains("clients")) {
            nlohmann::json others = nlohmann::json::array();
            for (const auto &c : j["clients"]) {
                if (c.value("session", uint64_t{0}) != observer_session_) {
                    others.push_back(c);
                }
            }
            j["clients"] = others;
        }
        return j;
    }
    /// counters.NAME of status(); UINT64_MAX when there is no status.
    uint64_t counter(const std::string &name) {
        const nlohmann::json j = status();
        return j.is_object() ? j["counters"].value(name, UINT64_MAX) : UINT64_MAX;
    }
    /// The clients status() shows, the observer left out; -1 without a status.
    int clients() {
        const nlohmann::json j = status();
        return j.is_object() ? static_cast<int>(j["clients"].size()) : -1;
    }

    /// Asks run() to return and joins its thread; false when it did not return within
    /// `timeout` (the thread is then joined at destruction, however long that takes).
    bool stop(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
        if (!thread_.joinable()) {
            return engine_ != nullptr;
        }
        engine_->stop();
        if (run_returned_.wait_for(timeout) != std::future_status::ready) {
            return false;
        }
        thread_.join();
        return true;
    }
    /// Engine::statusJson() itself, observer included: only once stop() has returned true.
    nlohmann::json finalStatus() const {
        if (!engine_ || thread_.joinable()) {
            return {};
        }
        return nlohmann::json::parse(engine_->statusJson(), nullptr, false);
    }
    /// Stops (if need be) and destroys the engine: its sessions close, its socket goes.
    void destroy() {
        if (thread_.joinable()) {
            engine_->stop();
            thread_.join();
        }
        engine_.reset();
        tl_disconnect(observer_);  // after the engine: never blocks on a stopped one
        observer_ = nullptr;
    }

private:
    nlohmann::json rawStatus() {
        if (!observer_) {
            return {};
        }
        std::string buf(1 << 20, '\0');
        size_t len = 0;
        if (tl_sidecar_status(observer_, buf.data(), buf.size(), &len) != TL_OK) {
            return {};
        }
        buf.resize(std::min(len, buf.size() - 1));
        return nlohmann::json::parse(buf, nullptr, false);
    }

    InProcessOptions opts_;
    TempDir dir_;
    std::string socket_;
    std::string error_;
    std::unique_ptr<tensorlane::sidecar::Engine> engine_;
    std::future<void> run_returned_;
    std::thread thread_;
    tl_client *observer_ = nullptr;
    uint64_t observer_session_ = 0;
};

/// File descriptors this process has open (engine and clients together).
inline int openFds() {
    return countEntries("/proc/self/fd");
}

/// Shared-memory mappings of this process (sessions and host buffers, both sides).
inline int shmMappings() {
    return countShmMappings(::getpid());
}

}  // namespace tltest
