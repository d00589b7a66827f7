// The TCP data path of one authenticated session: the sending side (OutLink: writes split into
// chunks, striped over the data connections, completed by the target's ACKs) and the receiving
// side (InLink: chunks read straight into the target region, writes delivered in sequence order,
// each one notified before it is acknowledged).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "tensorlane/sidecar/transport.hpp"
#include "net/connection.hpp"

namespace tensorlane::sidecar {

/// A write that ended, to be reported through EventSink::completed().
struct Completion {
    uint64_t op_id = 0;
    Code code = Code::kOk;
    std::string reason;
    uint64_t bytes = 0;
};

/// The sender's half: sequence numbers, chunking, striping, in-flight bookkeeping.
class OutLink {
public:
    /// `data` are the session's authenticated data connections (owned by the session, which
    /// outlives this link).
    OutLink(std::vector<Connection *> data, uint32_t chunk_bytes, size_t window);

    /// Queues `op` to land in the target's region `remote_region` and starts sending. kAgain
    /// when `window` writes are already in flight. Never blocks.
    Status post(WriteOp op, uint64_t remote_region, int64_t now_ms);

    /// The target ended write `seq` with `code`. False when `seq` is not the oldest write in
    /// flight (targets acknowledge in sequence order, so anything else is a protocol error).
    bool onAck(uint64_t seq, Code code, std::vector<Completion> *out);

    /// Ends every write in flight with `code` (the session died). Call after the connections
    /// dropped their queued output, which points into the writes' source regions.
    void failAll(Code code, const std::string &reason, std::vector<Completion> *out);

    size_t inFlight() const { return inflight_.size(); }

private:
    struct InFlight {
        uint64_t seq = 0;
        WriteOp op;
    };

    std::vector<Connection *> data_;
    uint32_t chunk_bytes_;
    size_t window_;
    uint64_t next_seq_ = 1;
    size_t next_conn_ = 0;
    std::deque<InFlight> inflight_;
};

/// The receiver's half for one peer session.
class InLink {
public:
    InLink(RegionTable &regions, std::string peer_name, uint32_t max_chunk, size_t window);

    /// Reads chunk frames from data connection `c`, at most about `budget` bytes. Returns 0
    /// (the socket is drained or the budget used), ECONNRESET/errno on a socket error, or EPROTO
    /// with `*error` set when the peer broke the protocol.
    int onReadable(Connection &c, size_t budget, int64_t now_ms, std::string *error);

    /// Reports the writes that are complete, in sequence order: arrived() for those that landed,
    /// then an ACK on `control` (so the writer's completion follows the owner's notification).
    size_t deliver(EventSink &sink, Connection &control);
    /// True when deliver() has something to do.
    bool deliverable() const;

    uint64_t writesReceived() const { return writes_received_; }
    uint64_t bytesReceived() const { return bytes_received_; }

private:
    struct RxWrite {
        std::shared_ptr<Region> region;  ///< keeps the memory mapped while bytes land
        uint64_t region_id = 0;
        uint64_t offset = 0;
        uint64_t total = 0;
        uint64_t received = 0;
        uint32_t imm = 0;
        Code code = Code::kOk;
    };

    /// Starts receiving the chunk whose frame header is buffered in `c`.
    int beginChunk(Connection &c, std::string *error);
    void finishChunk(Connection &c);

    RegionTable &regions_;
    std::string peer_name_;
    uint32_t max_chunk_;
    uint64_t window_;
    std::map<uint64_t, RxWrite> pending_;  ///< by sequence number; node addresses are stable
    uint64_t next_deliver_ = 1;
    std::vector<uint8_t> scratch_;  ///< where rejected writes' bytes are read to
    uint64_t writes_received_ = 0;
    uint64_t bytes_received_ = 0;
};

}  // namespace tensorlane::sidecar
