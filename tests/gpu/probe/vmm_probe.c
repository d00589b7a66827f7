// What the CUDA driver answers about VMM mappings (cuMemCreate + cuMemMap), device- and
// host-located: cuMemGetAddressRange, the pointer's range attributes, the allocation handle's
// location. A diagnostic for the GPU machine, not built by CMake (shim/src/cuda_memory.cpp,
// vmmMappingAround, relies on what it showed there: driver 580, CUDA 13):
//   gcc vmm_probe.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -o vmm_probe
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
static void q(const char *what, CUdeviceptr p) {
    CUdeviceptr b = 0;
    size_t s = 0;
    CUresult rc = cuMemGetAddressRange(&b, &s, p);
    unsigned long long st = 0;
    size_t sz = 0;
    CUresult r2 = cuPointerGetAttribute(&st, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    CUresult r3 = cuPointerGetAttribute(&sz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
    int mapped = -1;
    CUresult r4 = cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, p);
    CUmemGenericAllocationHandle h = 0;
    CUresult r5 = cuMemRetainAllocationHandle(&h, (void *)p);
    CUmemAllocationProp prop = {0};
    CUresult r6 = r5 == 0 ? cuMemGetAllocationPropertiesFromHandle(&prop, h) : 999;
    printf(
        "%s p=%#llx: GetAddressRange rc=%d base=%#llx size=%#zx | RANGE_START rc=%d %#llx "
        "RANGE_SIZE rc=%d %#zx | MAPPED rc=%d %d | retain rc=%d props rc=%d loc type %d id %d\n",
        what, (unsigned long long)p, rc, (unsigned long long)b, s, r2, st, r3, sz, r4, mapped, r5,
        r6, prop.location.type, prop.location.id);
    if (r5 == 0)
        cuMemRelease(h);
}
static void run(int host) {
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t g = 0;
    cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    size_t piece = 2 << 20;
    if (piece % g)
        piece = (piece / g + 1) * g;
    CUdeviceptr va = 0;
    CUresult rc = cuMemAddressReserve(&va, piece * 2, 0, 0, 0);
    printf("host=%d gran %#zx piece %#zx reserve rc=%d va=%#llx\n", host, g, piece, rc,
           (unsigned long long)va);
    for (int i = 0; i < 2; ++i) {
        CUmemGenericAllocationHandle h;
        rc = cuMemCreate(&h, piece, &prop, 0);
        printf(" create rc=%d\n", rc);
        rc = cuMemMap(va + i * piece, piece, 0, h, 0);
        printf(" map rc=%d\n", rc);
    }
    CUmemAccessDesc a[2] = {{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
                            {{prop.location.type, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
    rc = cuMemSetAccess(va, piece * 2, a, host ? 2 : 1);
    printf(" access rc=%d\n", rc);
    q("first+4108", va + 4108);
    q("second+5", va + piece + 5);
    q("base", va);
}
int main(void) {
    cuInit(0);
    CUdevice d;
    cuDeviceGet(&d, 0);
    CUcontext c;
    cuDevicePrimaryCtxRetain(&c, d);
    cuCtxSetCurrent(c);
    int v = 0;
    cuDriverGetVersion(&v);
    printf("driver %d\n", v);
    run(0);
    run(1);
    return 0;
}
