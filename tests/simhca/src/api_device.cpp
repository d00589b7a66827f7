// Exported verbs: devices, contexts, ports, GIDs and async events (libibverbs/device.c,
// libibverbs/verbs.c of rdma-core for the contracts; man pages ibv_get_device_list(3),
// ibv_open_device(3), ibv_query_device(3), ibv_query_port(3), ibv_query_gid(3),
// ibv_get_async_event(3)).
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <net/if.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "context.hpp"
#include "device.hpp"
#include "log.hpp"
#include "qp.hpp"
#include "simulator.hpp"
#include "sysfs_tree.hpp"
#include "verbs_ops.hpp"

#undef ibv_get_device_list
#undef ibv_query_port

using namespace tensorlane::simhca;

namespace {

// The fields of ibv_device_attr this device reports (kept in one place for query_device and
// query_device_ex).
void fillDeviceAttr(SimDevice &dev, ibv_device_attr &a) {
    const DeviceInfo info = dev.info();
    a = ibv_device_attr{};
    std::snprintf(a.fw_ver, sizeof(a.fw_ver), "%s", info.fw_ver.c_str());
    a.node_guid = htobe64(info.node_guid);
    a.sys_image_guid = htobe64(info.sys_image_guid);
    a.max_mr_size = ~uint64_t{0};
    a.page_size_cap = 0xfffff000;
    a.vendor_id = info.vendor_id;
    a.vendor_part_id = info.vendor_part_id;
    a.hw_ver = info.hw_ver;
    a.max_qp = 1 << 16;
    a.max_qp_wr = kMaxQpWr;
    a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT |
                         IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_CHANGE_PHY_PORT;
    a.max_sge = kMaxSge;
    a.max_sge_rd = kMaxSge;
    a.max_cq = 1 << 16;
    a.max_cqe = kMaxCqe;
    a.max_mr = 1 << 20;
    a.max_pd = 1 << 16;
    a.max_qp_rd_atom = kMaxRdAtomic;
    a.max_res_rd_atom = kMaxRdAtomic << 16;
    a.max_qp_init_rd_atom = kMaxRdAtomic;
    a.atomic_cap = IBV_ATOMIC_NONE;  // atomics are not modelled
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = static_cast<uint8_t>(info.ports.size());
}

}  // namespace

extern "C" {

ibv_device **ibv_get_device_list(int *num_devices) {
    const auto devs = Simulator::instance().scanDevices();
    auto **list = static_cast<ibv_device **>(calloc(devs.size() + 1, sizeof(ibv_device *)));
    if (list == nullptr) {
        errno = ENOMEM;
        return nullptr;
    }
    for (size_t i = 0; i < devs.size(); ++i) {
        list[i] = devs[i]->ibv();
    }
    if (num_devices != nullptr) {
        *num_devices = static_cast<int>(devs.size());
    }
    return list;
}

void ibv_free_device_list(ibv_device **list) {
    free(list);
}

const char *ibv_get_device_name(ibv_device *device) {
    return device->name;
}

__be64 ibv_get_device_guid(ibv_device *device) {
    return htobe64(SimDevice::from(device)->info().node_guid);
}

int ibv_get_device_index(ibv_device *device) {
    int index = -1;
    std::sscanf(device->dev_name, "uverbs%d", &index);
    return index;
}

ibv_context *ibv_open_device(ibv_device *device) {
    return Simulator::instance().openContext(SimDevice::from(device))->ibv();
}

ibv_context *ibv_import_device(int) {
    errno = EOPNOTSUPP;  // there is no kernel context to import
    return nullptr;
}

int ibv_close_device(ibv_context *context) {
    Simulator::instance().closeContext(SimContext::from(context));
    return 0;
}

int ibv_query_device(ibv_context *context, ibv_device_attr *device_attr) {
    fillDeviceAttr(SimContext::from(context)->device(), *device_attr);
    return 0;
}

// The pre-1.1 entry point: programs reach it only through ___ibv_query_port() when a provider
// lacks verbs_context::query_port, which this one has; kept for old binaries.
int ibv_query_port(ibv_context *context, uint8_t port_num, _compat_ibv_port_attr *port_attr) {
    return ops::queryPort(context, port_num, reinterpret_cast<ibv_port_attr *>(port_attr),
                          sizeof(ibv_port_attr));
}

int ibv_query_gid(ibv_context *context, uint8_t port_num, int index, ibv_gid *gid) {
    const DeviceInfo info = SimContext::from(context)->device().info();
    if (port_num < 1 || port_num > info.ports.size() || index < 0 ||
        static_cast<size_t>(index) >= info.ports[port_num - 1].gids.size()) {
        errno = EINVAL;
        return -1;
    }
    // An empty entry reads as zeros (sysfs shows 0000:...:0000), as the real ibv_query_gid.
    const GidEntry &g = info.ports[port_num - 1].gids[static_cast<size_t>(index)];
    *gid = g.valid ? g.gid : ibv_gid{};
    return 0;
}

int _ibv_query_gid_ex(ibv_context *context, uint32_t port_num, uint32_t gid_index,
                      ibv_gid_entry *entry, uint32_t flags, size_t entry_size) {
    if (flags != 0 || entry_size < sizeof(ibv_gid_entry)) {
        return EINVAL;
    }
    const DeviceInfo info = SimContext::from(context)->device().info();
    if (port_num < 1 || port_num > info.ports.size() ||
        gid_index >= info.ports[port_num - 1].gids.size()) {
        return EINVAL;
    }
    const GidEntry &g = info.ports[port_num - 1].gids[gid_index];
    if (!g.valid) {
        return ENODATA;  // ibv_query_gid_ex(3): the entry is empty
    }
    *entry = ibv_gid_entry{};
    entry->gid = g.gid;
    entry->gid_index = gid_index;
    entry->port_num = port_num;
    entry->gid_type = g.roce_v2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
    entry->ndev_ifindex = g.ndev.empty() ? 0 : if_nametoindex(g.ndev.c_str());
    return 0;
}

ssize_t _ibv_query_gid_table(ibv_context *context, ibv_gid_entry *entries, size_t max_entries,
                             uint32_t flags, size_t entry_size) {
    if (flags != 0 || entry_size < sizeof(ibv_gid_entry)) {
        return -EINVAL;
    }
    const DeviceInfo info = SimContext::from(context)->device().info();
    size_t n = 0;
    for (size_t p = 0; p < info.ports.size(); ++p) {
        for (size_t i = 0; i < info.ports[p].gids.size(); ++i) {
            if (!info.ports[p].gids[i].valid) {
                continue;
            }
            if (n == max_entries) {
                return -EINVAL;
            }
            auto *e = reinterpret_cast<ibv_gid_entry *>(reinterpret_cast<char *>(entries) +
                                                        n * entry_size);
            if (_ibv_query_gid_ex(context, static_cast<uint32_t>(p + 1), static_cast<uint32_t>(i),
                                  e, 0, entry_size) == 0) {
                ++n;
            }
        }
    }
    return static_cast<ssize_t>(n);
}

int ibv_query_pkey(ibv_context *context, uint8_t port_num, int index, __be16 *pkey) {
    const DeviceInfo info = SimContext::from(context)->device().info();
    if (port_num < 1 || port_num > info.ports.size() || index != 0) {
        errno = EINVAL;
        return -1;
    }
    *pkey = htons(0xffff);  // RoCE ports have the default P_Key only
    return 0;
}

int ibv_get_pkey_index(ibv_context *context, uint8_t port_num, __be16 pkey) {
    __be16 p;
    if (ibv_query_pkey(context, port_num, 0, &p) == 0 && p == pkey) {
        return 0;
    }
    errno = ENOENT;
    return -1;
}

int ibv_get_async_event(ibv_context *context, ibv_async_event *event) {
    return SimContext::from(context)->events().get(event);
}

void ibv_ack_async_event(ibv_async_event *event) {
    ibv_context *ctx = nullptr;
    if (event != nullptr && AsyncEventQueue::objectOf(*event, &ctx) != nullptr && ctx != nullptr) {
        SimContext::from(ctx)->events().ack(*event);
    }
}

int ibv_fork_init(void) {
    return 0;
}

enum ibv_fork_status ibv_is_fork_initialized(void) {
    return IBV_FORK_UNNEEDED;
}

int ibv_dontfork_range(void *, size_t) {
    return 0;
}

int ibv_dofork_range(void *, size_t) {
    return 0;
}

int ibv_get_sysfs_path(char *buf, size_t size) {
    const std::string root = sysfsRoot();
    std::snprintf(buf, size, "%s", root.empty() ? "/sys" : root.c_str());
    return 0;
}

int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size) {
    const std::string path = std::string(dir) + "/" + file;
    FILE *f = std::fopen(path.c_str(), "r");
    if (f == nullptr) {
        return -1;
    }
    const size_t n = std::fread(buf, 1, size > 0 ? size - 1 : 0, f);
    std::fclose(f);
    buf[n] = '\0';
    if (n > 0 && buf[n - 1] == '\n') {
        buf[n - 1] = '\0';
    }
    return static_cast<int>(n);
}

// IBVERBS_PRIVATE_34 (libibverbs/driver.h): enum ibv_gid_type_sysfs { IB_ROCE_V1, ROCE_V2 }.
int ibv_query_gid_type(ibv_context *context, uint8_t port_num, unsigned int index, int *type) {
    const DeviceInfo info = SimContext::from(context)->device().info();
    if (port_num < 1 || port_num > info.ports.size() ||
        index >= info.ports[port_num - 1].gids.size() ||
        !info.ports[port_num - 1].gids[index].valid) {
        errno = EINVAL;
        return -1;
    }
    *type = info.ports[port_num - 1].gids[index].roce_v2 ? 1 : 0;
    return 0;
}

}  // extern "C"

namespace tensorlane::simhca::ops {

int queryPort(ibv_context *ctx, uint8_t port, ibv_port_attr *attr, size_t attr_len) {
    const DeviceInfo info = SimContext::from(ctx)->device().info();
    if (port < 1 || port > info.ports.size()) {
        return EINVAL;
    }
    const PortInfo &p = info.ports[port - 1];
    ibv_port_attr a{};
    a.state = p.state;
    a.max_mtu = IBV_MTU_4096;
    a.active_mtu = p.active_mtu;
    size_t gids = p.gids.size();
    a.gid_tbl_len = static_cast<int>(gids);
    a.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
    a.max_msg_sz = 1u << 31;
    a.bad_pkey_cntr = 0;
    a.qkey_viol_cntr = 0;
    a.pkey_tbl_len = 1;
    a.lid = 0;  // RoCE ports have no LID
    a.sm_lid = 0;
    a.lmc = 0;
    a.max_vl_num = 1;
    a.sm_sl = 0;
    a.subnet_timeout = 0;
    a.init_type_reply = 0;
    a.active_width = p.active_width;
    a.active_speed = p.active_speed;
    a.phys_state = p.phys_state;
    a.link_layer = p.ethernet ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
    a.flags = 0;
    a.port_cap_flags2 = 0;
    // Copy only what the caller's struct has room for (older binaries pass a shorter one).
    std::memcpy(attr, &a, std::min(attr_len, sizeof(a)));
    return 0;
}

int queryDeviceEx(ibv_context *ctx, const ibv_query_device_ex_input *, ibv_device_attr_ex *attr,
                  size_t attr_size) {
    ibv_device_attr_ex a{};
    fillDeviceAttr(SimContext::from(ctx)->device(), a.orig_attr);
    a.max_dm_size = 0;
    a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
    std::memcpy(attr, &a, std::min(attr_size, sizeof(a)));
    return 0;
}

int queryRtValues(ibv_context *, ibv_values_ex *values) {
    values->comp_mask = 0;  // no clock: completion timestamps are not modelled
    return 0;
}

}  // namespace tensorlane::simhca::ops
