#include "region_lifecycle.hpp"

#include <unistd.h>

#include <fstream>

#include "cuda/import.hpp"
#include "logging.hpp"
#include "tensorlane/ipc/memory_limits.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/sidecar/engine.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {
namespace {

/// How many mappings the sidecar allows itself: vm.max_map_count less headroom for the
/// libraries, threads and transports (verbs and CUDA map too). Every session and every
/// tl_alloc_host buffer is one mapping, so without this one client could use them all up
/// and every later mmap of the process would fail.
uint64_t mappingBudget() {
    uint64_t max_map = 65530;  // the kernel's default
    std::ifstream in("/proc/sys/vm/max_map_count");
    if (in) {
        in >> max_map;
    }
    constexpr uint64_t kHeadroom = 4096;
    return max_map > 2 * kHeadroom ? max_map - kHeadroom : max_map / 2;
}

}  // namespace

NodeQuotas NodeQuotas::resolve(const config::LimitsConfig &limits) {
    NodeQuotas q;
    q.max_mappings = mappingBudget();
    // The node-wide cap on host buffers: all of them are charged to our memory cgroup (we back
    // them), so together they must leave the sidecar room to live.
    if (limits.node_registered_bytes != 0) {
        q.registered_cap = limits.node_registered_bytes;
        q.cap_source = "set";
        return q;
    }
    const std::string root = ipc::memoryRoot();
    const uint64_t budget = ipc::memoryBudget(root);
    const ipc::CgroupMemory cg = ipc::readCgroupMemory(root);
    const bool by_cgroup = cg.version != 0 && cg.limit == budget;
    q.registered_cap =
        budget == UINT64_MAX
            ? limits.registered_bytes
            : static_cast<uint64_t>(static_cast<unsigned __int128>(budget) *
                                    config::LimitsConfig::kAutoNodeRegisteredPercent / 100);
    q.cap_source =
        "auto: " + std::to_string(config::LimitsConfig::kAutoNodeRegisteredPercent) + "% of " +
        (budget == UINT64_MAX ? std::string("an unknown memory size (the per-client quota)")
         : by_cgroup
             ? "the cgroup v" + std::to_string(cg.version) + " limit " + config::formatBytes(budget)
             : "MemTotal " + config::formatBytes(budget));
    return q;
}

RegionLifecycle::RegionLifecycle(const config::LimitsConfig &limits, NodeQuotas quotas,
                                 RegionTable &table, TransportSet &transports,
                                 SessionTable &sessions, PeerManager *peers,
                                 EngineCounters &counters)
    : limits_(limits),
      quotas_(std::move(quotas)),
      table_(table),
      transports_(transports),
      sessions_(sessions),
      peers_(peers),
      counters_(counters),
      log_(sidecarLogger()) {}

Status RegionLifecycle::checkQuota(const Session &s, uint64_t new_bytes, bool new_mapping) {
    Status st;
    if (table_.countOfSession(s.id) >= limits_.regions) {
        st = {Code::kNoMemory, "quota: this client holds " +
                                   std::to_string(table_.countOfSession(s.id)) +
                                   " regions, the most [limits] regions allows"};
    } else if (new_bytes > limits_.registered_bytes ||
               s.host_bytes > limits_.registered_bytes - new_bytes) {
        st = {Code::kNoMemory, "quota: " + std::to_string(new_bytes) +
                                   " more bytes would take "
                                   "this client past [limits] registered_bytes = " +
                                   config::formatBytes(limits_.registered_bytes) + " (it holds " +
                                   std::to_string(s.host_bytes) + ")"};
    } else if (new_bytes > 0 && (new_bytes > quotas_.registered_cap ||
                                 node_host_bytes_ > quotas_.registered_cap - new_bytes)) {
        st = {Code::kNoMemory, "quota: " + std::to_string(new_bytes) +
                                   " more bytes would take all clients together past [limits] "
                                   "node_registered_bytes = " +
                                   config::formatBytes(quotas_.registered_cap) + " (" +
                                   quotas_.cap_source + "; they hold " +
                                   std::to_string(node_host_bytes_) + ")"};
    } else if (new_mapping && !mappingRoom()) {
        st = {Code::kNoMemory,
              "the sidecar maps " + std::to_string(mappings_) +
                  " segments, the most vm.max_map_count leaves it room for; free some "
                  "buffers or raise vm.max_map_count"};
    }
    if (!st.isOk()) {
        ++counters_.quota_refusals;
    }
    return st;
}

Status RegionLifecycle::registerWithTransports(Region &r) {
    r.id = table_.takeId();  // every transport sees the id the region will have
    Status st = transports_.registerRegion(r);
    if (!st.isOk()) {
        transports_.deregisterRegion(r.id);  // those that took it let go: it is never added
    }
    return st;
}

Status RegionLifecycle::allocHost(Session &s, uint64_t bytes, RegionId *id, ipc::UniqueFd *fd) {
    if (Status q = checkQuota(s, bytes, true); !q.isOk()) {
        return q;
    }
    ipc::SharedSegment seg;
    std::string error;
    if (ipc::createSegment(bytes, s.cred.uid, s.cred.gid, &seg, &error)) {
        log_->warn("session {}: tl_alloc_host({}) failed: {}", s.id, bytes, error);
        return {Code::kNoMemory, error};
    }
    auto r = std::make_shared<Region>();
    r->owner = s.id;
    r->kind = MemoryKind::kHost;
    // What was asked for, not the page-rounded mapping: the client, the peers and every bounds
    // check agree on one size.
    r->bytes = bytes;
    r->base = static_cast<unsigned char *>(seg.mapping.data());
    r->mapping = std::make_shared<ipc::Mapping>(std::move(seg.mapping));
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        return st;
    }
    *id = table_.add(r);
    s.host_bytes += r->bytes;
    node_host_bytes_ += r->bytes;
    ++s.mappings;
    ++mappings_;
    *fd = std::move(seg.fd);
    return Status::ok();
}

Status RegionLifecycle::addRange(const Session &s, RegionId parent_id, uint64_t offset,
                                 uint64_t bytes, RegionId *id) {
    auto parent = table_.find(parent_id);
    if (!parent || parent->owner != s.id || parent->parent != 0) {
        return {Code::kInvalid, "host memory must lie in a buffer from tl_alloc_host"};
    }
    if (!parent->contains(offset, bytes)) {
        return {Code::kInvalid, "range outside its buffer"};
    }
    // A range of a buffer already counted: one more region, no more bytes or mappings.
    if (Status q = checkQuota(s, 0, false); !q.isOk()) {
        return q;
    }
    auto r = std::make_shared<Region>();
    r->owner = s.id;
    r->parent = parent->id;
    r->kind = MemoryKind::kHost;
    r->base = parent->base + offset;
    r->bytes = bytes;
    r->mapping = parent->mapping;
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        return st;
    }
    *id = table_.add(r);
    return Status::ok();
}

Status RegionLifecycle::addCuda(const Session &s, const ipc::RegisterMsg &m,
                                const std::shared_ptr<CudaImport> &imp, RegionId *id) {
    auto r = std::make_shared<Region>();
    r->owner = s.id;
    r->kind = MemoryKind::kCuda;
    r->bytes = m.bytes;
    if (imp->host()) {
        // Pinned host memory mapped for our CPU (kRegisterVmmHost): a host region that every
        // transport reads and writes in place; the import keeps it mapped.
        uint64_t va = 0;
        if (Status st = imp->base(&va); !st.isOk()) {
            return st;
        }
        r->kind = MemoryKind::kHost;
        r->base = reinterpret_cast<unsigned char *>(va + m.offset);
    }
    r->cuda.device = m.device_ordinal;
    r->cuda.ipc_handle = imp->handle();
    r->cuda.dmabuf = imp->dmabuf();
    r->cuda.alloc_bytes = imp->allocBytes();
    r->cuda.alloc_offset = m.offset;
    r->cuda.client_address = m.address;
    r->cuda.import = imp;
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        return st;
    }
    *id = table_.add(r);
    return Status::ok();
}

Status RegionLifecycle::addCudaDmabuf(const Session &s, const ipc::RegisterMsg &m,
                                      std::shared_ptr<ipc::UniqueFd> dmabuf, uint64_t dmabuf_bytes,
                                      RegionId *id) {
    auto r = std::make_shared<Region>();
    r->owner = s.id;
    r->kind = MemoryKind::kCuda;
    r->bytes = m.bytes;
    r->cuda.device = m.device_ordinal;
    r->cuda.dmabuf = std::move(dmabuf);
    r->cuda.alloc_bytes = dmabuf_bytes;
    r->cuda.alloc_offset = m.offset;
    // The NIC's address of the region (its MR's iova follows the owner's addresses): a
    // tl_register_dmabuf region has none, so its dma-buf starts at 0.
    r->cuda.client_address = m.address != 0 ? m.address : m.offset;
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        return st;
    }
    *id = table_.add(r);
    return Status::ok();
}

Status RegionLifecycle::exposeProbe() {
    ipc::SharedSegment seg;
    std::string error;
    if (ipc::createSegment(4096, ::getuid(), ::getgid(), &seg, &error)) {
        return {Code::kNoMemory, "the peer probe's region: " + error};
    }
    auto r = std::make_shared<Region>();
    r->owner = 0;  // no session: arrived() counts its notifications and tells no one
    r->kind = MemoryKind::kHost;
    r->bytes = 4096;
    r->base = static_cast<unsigned char *>(seg.mapping.data());
    r->mapping = std::make_shared<ipc::Mapping>(std::move(seg.mapping));
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        return st;
    }
    probe_region_ = table_.add(r);
    return table_.expose(probe_region_, kProbeRegionName);
}

void RegionLifecycle::release(const std::shared_ptr<Region> &r) {
    bool was_exposed = !r->exposed_name.empty();
    if (!table_.remove(r->id)) {
        return;  // already released (a range released with its buffer)
    }
    // A tl_alloc_host buffer (or the probe's): not a range of one, nor VMM host memory.
    const bool host_buffer = r->parent == 0 && r->kind == MemoryKind::kHost && !r->cuda.import;
    if (Session *s = sessions_.find(r->owner); s != nullptr && host_buffer) {
        s->host_bytes -= r->bytes;
        --s->mappings;
    }
    if (host_buffer) {
        --mappings_;
        if (r->owner != 0) {
            node_host_bytes_ -= r->bytes;  // a client's tl_alloc_host buffer (allocHost)
        }
    }
    if (was_exposed && peers_) {
        peers_->regionRevoked(r->id);
    }
    if (Session *s = sessions_.find(r->owner); s != nullptr && s->streams) {
        s->streams->regionReleased(r->id);  // its stream waits are released, never left hanging
    }
    // Transports let go of it once no write uses it any more (DESIGN.md: "deregistered only
    // after the work in flight on it has ended").
    if (r->users == 0) {
        retire(r);
    } else {
        retiring_.emplace(r->id, r);
    }
    // Ranges registered inside a host buffer go with it.
    if (r->parent == 0) {
        for (auto &child : table_.ofSession(r->owner)) {
            if (child->parent == r->id) {
                release(child);
            }
        }
    }
}

size_t RegionLifecycle::releaseSession(SessionId id) {
    size_t released = 0;
    for (auto &r : table_.ofSession(id)) {
        release(r);
        ++released;
    }
    return released;
}

void RegionLifecycle::retireLast(const std::shared_ptr<Region> &r) {
    if (auto it = retiring_.find(r->id); it != retiring_.end()) {
        retiring_.erase(it);
        retire(r);
    }
}

void RegionLifecycle::retire(const std::shared_ptr<Region> &r) {
    transports_.deregisterRegion(r->id);
}

}  // namespace tensorlane::sidecar
