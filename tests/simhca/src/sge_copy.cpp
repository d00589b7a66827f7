#include "sge_copy.hpp"

#include "memory_region.hpp"
#include "mr_table.hpp"

namespace tensorlane::simhca {
namespace {

const MemoryRegion *checked(const Segment &s, uint64_t off, uint64_t len, ibv_pd *pd, int access) {
    const MemoryRegion *mr = MrTable::instance().lookupLocked(s.lkey);
    if (mr == nullptr || mr->pd() != pd || !mr->contains(s.addr + off, len) ||
        (access != 0 && (mr->access() & access) != access)) {
        return nullptr;
    }
    return mr;
}

// Calls fn(mr, iova, n, consumed) for each piece of [offset, offset+len) of the list.
template <typename Fn>
bool forEachPiece(const Segment *sges, uint32_t n, uint64_t offset, uint32_t len, ibv_pd *pd,
                  int access, Fn fn) {
    uint64_t done = 0;
    for (uint32_t i = 0; i < n && done < len; ++i) {
        const Segment &s = sges[i];
        if (offset >= s.length) {
            offset -= s.length;
            continue;
        }
        const uint64_t take = std::min<uint64_t>(s.length - offset, len - done);
        const MemoryRegion *mr = checked(s, offset, take, pd, access);
        if (mr == nullptr || !fn(*mr, s.addr + offset, take, done)) {
            return false;
        }
        done += take;
        offset = 0;
    }
    return done == len;
}

}  // namespace

bool sgesValid(const Segment *sges, uint32_t n, ibv_pd *pd, int access) {
    for (uint32_t i = 0; i < n; ++i) {
        if (sges[i].length != 0 && checked(sges[i], 0, sges[i].length, pd, access) == nullptr) {
            return false;
        }
    }
    return true;
}

bool gatherToPacket(TxPath &tx, TxPacket &p, const Segment *sges, uint32_t n, uint64_t offset,
                    uint32_t len, ibv_pd *pd) {
    bool all_host = true;
    if (!forEachPiece(sges, n, offset, len, pd, 0,
                      [&](const MemoryRegion &mr, uint64_t, uint64_t, uint64_t) {
                          all_host = all_host && mr.isHost();
                          return true;
                      })) {
        return false;
    }
    if (all_host) {
        return forEachPiece(sges, n, offset, len, pd, 0,
                            [&](const MemoryRegion &mr, uint64_t iova, uint64_t take, uint64_t) {
                                tx.addPayload(p, mr.hostAddress(iova), take);
                                return true;
                            });
    }
    uint8_t *b = tx.bounce(p, len);
    if (!forEachPiece(sges, n, offset, len, pd, 0,
                      [&](const MemoryRegion &mr, uint64_t iova, uint64_t take, uint64_t at) {
                          return mr.read(iova, b + at, take);
                      })) {
        return false;
    }
    tx.addPayload(p, b, len);
    return true;
}

bool scatterFromPacket(const Segment *sges, uint32_t n, uint64_t offset, const uint8_t *data,
                       uint32_t len, ibv_pd *pd) {
    return forEachPiece(sges, n, offset, len, pd, IBV_ACCESS_LOCAL_WRITE,
                        [&](const MemoryRegion &mr, uint64_t iova, uint64_t take, uint64_t at) {
                            return mr.write(iova, data + at, take);
                        });
}

}  // namespace tensorlane::simhca
