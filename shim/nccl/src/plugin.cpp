// libnccl-net-tensorlane.so's exported tables: ncclNetPlugin_v8 (every NCCL from 2.19 on loads
// it) and ncclNetPlugin_v9 (size_t sizes; one device each). Both are thin: net.cpp does the work.
#include "net.hpp"

namespace {

using tensorlane::nccl::Net;

ncclResult_t init(ncclDebugLogger_t log) {
    return Net::get().init(log);
}
ncclResult_t devices(int *ndev) {
    if (ndev == nullptr) {
        return ncclInvalidArgument;
    }
    *ndev = 1;  // one device per sidecar
    return ncclSuccess;
}
ncclResult_t properties8(int dev, ncclNetProperties_v8_t *p) {
    return Net::get().properties(dev, p);
}
ncclResult_t properties9(int dev, ncclNetProperties_v9_t *p) {
    if (p == nullptr) {
        return ncclInvalidArgument;
    }
    ncclNetProperties_v8_t v8{};
    if (ncclResult_t r = Net::get().properties(dev, &v8); r != ncclSuccess) {
        return r;
    }
    *p = ncclNetProperties_v9_t{};
    p->name = v8.name;
    p->pciPath = v8.pciPath;
    p->guid = v8.guid;
    p->ptrSupport = v8.ptrSupport;
    p->regIsGlobal = v8.regIsGlobal;
    p->forceFlush = 0;  // the sidecar notifies once the data is in place
    p->speed = v8.speed;
    p->port = v8.port;
    p->latency = v8.latency;
    p->maxComms = v8.maxComms;
    p->maxRecvs = v8.maxRecvs;
    p->netDeviceType = v8.netDeviceType;
    p->netDeviceVersion = v8.netDeviceVersion;
    p->vProps.ndevs = 1;
    p->vProps.devs[0] = dev;
    p->maxP2pBytes = size_t{1} << 40;  // NCCL_MAX_NET_SIZE_BYTES: a write is any uint64_t
    p->maxCollBytes = size_t{1} << 40;
    return ncclSuccess;
}
ncclResult_t listen(int dev, void *handle, void **comm) {
    return Net::get().listen(dev, handle, comm);
}
ncclResult_t connect8(int dev, void *handle, void **comm, ncclNetDeviceHandle_v8_t **) {
    return Net::get().connect(dev, handle, comm);
}
ncclResult_t accept8(void *listen_comm, void **comm, ncclNetDeviceHandle_v8_t **) {
    return Net::get().accept(listen_comm, comm);
}
ncclResult_t regMr(void *comm, void *data, size_t size, int type, void **mh) {
    return Net::get().regMr(comm, data, size, type, mh);
}
ncclResult_t regMrDmaBuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                         void **mh) {
    return Net::get().regMrDmaBuf(comm, data, size, type, offset, fd, mh);
}
ncclResult_t deregMr(void *comm, void *mh) {
    return Net::get().deregMr(comm, mh);
}
ncclResult_t isend8(void *comm, void *data, int size, int tag, void *mh, void **req) {
    if (size < 0) {
        return ncclInvalidArgument;
    }
    return Net::get().isend(comm, data, static_cast<uint64_t>(size), tag, mh, req);
}
ncclResult_t isend9(void *comm, void *data, size_t size, int tag, void *mh, void **req) {
    return Net::get().isend(comm, data, size, tag, mh, req);
}
ncclResult_t irecv8(void *comm, int n, void **data, int *sizes, int *tags, void **mhs, void **req) {
    if (n < 1 || n > tensorlane::nccl::kMaxRecvs || sizes == nullptr) {
        return ncclInvalidArgument;
    }
    uint64_t s[tensorlane::nccl::kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        if (sizes[i] < 0) {
            return ncclInvalidArgument;
        }
        s[i] = static_cast<uint64_t>(sizes[i]);
    }
    return Net::get().irecv(comm, n, data, s, tags, mhs, req);
}
ncclResult_t irecv9(void *comm, int n, void **data, size_t *sizes, int *tags, void **mhs,
                    void **req) {
    if (n < 1 || n > tensorlane::nccl::kMaxRecvs || sizes == nullptr) {
        return ncclInvalidArgument;
    }
    uint64_t s[tensorlane::nccl::kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        s[i] = sizes[i];
    }
    return Net::get().irecv(comm, n, data, s, tags, mhs, req);
}
ncclResult_t iflush(void *, int, void **, int *, void **, void **req) {
    // Nothing to flush: a receive ends when the sidecar has the data in place (after its own
    // copies into GPU memory, or the verbs transport's GPUDirect flush read).
    if (req != nullptr) {
        *req = nullptr;
    }
    return ncclSuccess;
}
ncclResult_t test(void *req, int *done, int *sizes) {
    return Net::get().test(req, done, sizes);
}
ncclResult_t closeComm(void *comm) {
    return Net::get().close(comm);
}
ncclResult_t getDeviceMr(void *, void *, void **dptr) {
    if (dptr != nullptr) {
        *dptr = nullptr;  // no device offload
    }
    return ncclSuccess;
}
ncclResult_t irecvConsumed(void *, int, void *) {
    return ncclSuccess;
}

}  // namespace

extern "C" {

/// For tests: the plugin's own client of its sidecar, once NCCL's init() made it (null before).
/// A test registers ranges of this client's tl_alloc_host buffers as NCCL host buffers: memory
/// tl_register shares, so the plugin's in-place path runs where no CUDA is.
__attribute__((visibility("default"))) tl_client *tensorlane_nccl_test_client(void) {
    return tensorlane::nccl::Net::get().client();
}

__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8 = {
    "tensorlane", init,        devices,   properties8, listen,        connect8, accept8,
    regMr,        regMrDmaBuf, deregMr,   isend8,      irecv8,        iflush,   test,
    closeComm,    closeComm,   closeComm, getDeviceMr, irecvConsumed,
};

__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9 = {
    "tensorlane", init,        devices,   properties9, listen,        connect8, accept8,
    regMr,        regMrDmaBuf, deregMr,   isend9,      irecv9,        iflush,   test,
    closeComm,    closeComm,   closeComm, getDeviceMr, irecvConsumed, nullptr,
};
}
