// The client socket protocol: the listening socket, admitting clients (Admission) and setting
// up their sessions (segment, rings, doorbells, greeting), the infrequent calls that travel over
// each session's socket (alloc, register, deregister, expose, lookup, status, the stream-ordered
// calls' setup; CUDA registrations through CudaRegistrar), and tearing a session down once it
// closed. Requests themselves never come here: they go through the request pipeline.
//
// Engine thread only. The engine's loop calls acceptClients(), socketEvent() and
// finishCudaChecks() for the fds this class put into its epoll set, and reapClosed() after
// each turn.
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "admission.hpp"
#include "cuda_registrar.hpp"
#include "engine_counters.hpp"
#include "session_table.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class PeerManager;
class RegionLifecycle;
class RequestPipeline;

class ControlServer {
public:
    /// The status document for tl_sidecar_status; with a uid, that uid's clients alone.
    using StatusText = std::function<std::string(std::optional<uid_t> only_uid)>;

    /// `epoll_fd`: the engine's. `peers` may be null (no [[peers]]). The references must
    /// outlive this object.
    ControlServer(const config::Config &cfg, int epoll_fd, SessionTable &sessions,
                  RegionTable &regions, RegionLifecycle &lifecycle, RequestPipeline &pipeline,
                  PeerManager *peers, EngineCounters &counters, StatusText status);
    /// Removes the socket file if it listened.
    ~ControlServer();
    ControlServer(const ControlServer &) = delete;
    ControlServer &operator=(const ControlServer &) = delete;

    /// Listens on [node] socket with the mode the credential check calls for (its directory
    /// made if need be) and adds it to the epoll set (kTagListen).
    Status listen();
    /// The socket file's mode (0600, 0660 or 0666), once listen() succeeded.
    unsigned socketMode() const { return mode_; }
    /// The fds open once the sidecar opened everything of its own ([limits] fd_reserve).
    void takeFdBaseline() { admission_.takeFdBaseline(); }

    /// The socket is readable: accepts a batch of clients.
    void acceptClients();
    /// Whether accepting pauses after an error (EMFILE), and until when.
    bool listenPaused() const { return listen_paused_; }
    std::chrono::steady_clock::time_point listenPausedUntil() const { return listen_paused_until_; }
    /// Watches the socket again once the pause is over (and accepts what waits).
    void resumeListener();

    /// epoll said `events` for session `s`'s socket: its calls are read and answered, a
    /// hang-up closes it.
    void socketEvent(Session &s, uint32_t events);
    /// The CUDA import checker's fd is readable (kTagCudaCheck).
    void finishCudaChecks() { cuda_.finishChecks(); }
    /// Tears down the sessions closed since the last call.
    void reapClosed();

private:
    void refuse(int fd, Code code, const std::string &why);
    /// Closes and tears down the sessions of `cred`'s uid or pid whose clients hung up (or that
    /// are closing) and are still counted; returns how many.
    size_t reapHungUp(const ipc::PeerCred &cred);
    /// Releases everything of a closed session: its queued and gated writes, its regions, its
    /// segments and its place in the caps; then destroys it.
    void destroySession(SessionId id);

    void readControl(Session &s);
    void handleControl(Session &s, const unsigned char *msg, size_t bytes, ipc::UniqueFd *fds,
                       size_t nfds);
    void reply(Session &s, uint64_t seq, Code status, uint64_t v0, uint64_t v1,
               const std::string &error, int fd = -1);
    /// Copies a fixed-size message out of the datagram (wrong size: an error reply) and runs
    /// its handler.
    template <class Msg>
    void dispatch(Session &s, const ipc::MsgHeader &h, const unsigned char *msg, size_t bytes,
                  void (ControlServer::*handler)(Session &, const Msg &));
    void onAllocHost(Session &s, const ipc::AllocHostMsg &m);
    void onRegister(Session &s, const ipc::RegisterMsg &m);
    void onDeregister(Session &s, const ipc::DeregisterMsg &m);
    void onExpose(Session &s, const ipc::ExposeMsg &m);
    void onExposeAccess(Session &s, const ipc::ExposeAccessMsg &m);
    /// tl_expose and tl_expose_access: checks the name (reserved prefixes included) and
    /// exposes the client's `region` with `access` (its owner_uid is filled in here).
    void exposeRegion(Session &s, uint64_t seq, uint64_t region, const char *field,
                      RegionAccess access, const char *call);
    /// kPermission, with the reason, when [security] reserved_names keeps `name` from `s`.
    Status checkReservedName(const Session &s, std::string_view name) const;
    void onLookup(Session &s, const ipc::LookupMsg &m);
    void onStatus(Session &s, const ipc::StatusMsg &m);
    // The stream-ordered calls (docs/gpu.md, "Stream-ordered writes").
    void onStreamSetup(Session &s, const ipc::MsgHeader &m);
    void onStreamSubscribe(Session &s, const ipc::StreamSubscribeMsg &m);
    void onStreamCredit(Session &s, const ipc::StreamCreditMsg &m);
    std::string remotesQuotaText() const;

    const config::Config &cfg_;
    const int epoll_fd_;
    SessionTable &sessions_;
    RegionTable &regions_;
    RegionLifecycle &lifecycle_;
    RequestPipeline &pipeline_;
    PeerManager *const peers_;
    EngineCounters &counters_;
    StatusText status_;
    std::shared_ptr<spdlog::logger> log_;
    Admission admission_;
    CudaRegistrar cuda_;
    ipc::UniqueFd listen_;
    unsigned mode_ = 0600;
    std::chrono::steady_clock::time_point listen_paused_until_{};
    bool listen_paused_ = false;
};

}  // namespace tensorlane::sidecar
