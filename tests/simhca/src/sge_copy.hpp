// Moving bytes between packets and scatter/gather lists, with the local key checks an HCA makes
// on every SGE (IB spec 10.6.3.3: the L_Key must be valid, of the QP's PD, cover the range, and
// allow local write where the HCA writes). The caller holds MrTable::mutex() shared.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "tx_path.hpp"
#include "work_queues.hpp"

namespace tensorlane::simhca {

/// Whether every SGE names a region of pd that covers it and grants access (IBV_ACCESS_* bits;
/// 0: read access, which every region has).
[[nodiscard]] bool sgesValid(const Segment *sges, uint32_t n, ibv_pd *pd, int access);
/// Adds len bytes at offset of the SGE list to packet p: zero-copy pieces for host memory,
/// a bounce copy for device memory. False on a key or copy failure.
[[nodiscard]] bool gatherToPacket(TxPath &tx, TxPacket &p, const Segment *sges, uint32_t n,
                                  uint64_t offset, uint32_t len, ibv_pd *pd);
/// Copies len bytes into the SGE list at offset. False on a key or copy failure.
[[nodiscard]] bool scatterFromPacket(const Segment *sges, uint32_t n, uint64_t offset,
                                     const uint8_t *data, uint32_t len, ibv_pd *pd);

}  // namespace tensorlane::simhca
