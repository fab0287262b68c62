/*
 * Topology: a GPU's NVLinks (state, remote end and its kind) and the nearest PCIe common
 * ancestor of two GPUs, as far as the state knows the PCIe tree.
 */
#include "nvmlstate.h"

#include <string.h>

/* ---- NVLink ------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t *isActive)
{
    if (!isActive || link >= MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct gpu *g = gpu_of(h);
    int any = 0;
    for (int i = 0; i < MAX_LINKS; i++)
        any |= g->links[i].active;
    if (!any)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* a GPU without NVLink */
    const struct link *k = &g->links[link];
    if (!k->active)
        return leave(NVML_ERROR_INVALID_ARGUMENT); /* past the GPU's links, as NVML answers */
    *isActive = k->down ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                 nvmlPciInfo_t *pci)
{
    if (!pci || link >= MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct link *k = &gpu_of(h)->links[link];
    if (!k->active)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    fill_pci(pci, k->bus, 0);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    if (!pNvLinkDeviceType || link >= MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct link *k = &gpu_of(h)->links[link];
    if (!k->active)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)k->type;
    return leave(NVML_SUCCESS);
}

/* ---- PCIe topology ----------------------------------------------------------------- */

/* The state knows the host bridge above each GPU and that bridge's NUMA node, not the
 * PCIe switches below it, so the nearest level it can vouch for is
 * NVML_TOPOLOGY_HOSTBRIDGE ("all devices that are connected to the same host bridge");
 * then NVML_TOPOLOGY_NODE ("connected to the same NUMA node but possibly multiple host
 * bridges") and NVML_TOPOLOGY_SYSTEM ("all devices in the system"), which holds for any
 * two GPUs and is the answer where the state says nothing. A GPU with itself shares its
 * board: NVML_TOPOLOGY_INTERNAL. A MIG device is not a PCIe device: NOT_SUPPORTED. */
struct place {
    unsigned gpu;
    int numa;
    char bridge[TEXT];
};

static nvmlReturn_t place_of(nvmlDevice_t device, struct place *out)
{
    const struct handle *h = NULL;
    nvmlReturn_t ret = enter(device, "nvmlDeviceGetTopologyCommonAncestor", &h);
    if (ret != NVML_SUCCESS)
        return ret;
    if (h->slot >= 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    out->gpu = h->gpu;
    out->numa = gpu_of(h)->bridge_numa;
    memcpy(out->bridge, gpu_of(h)->bridge, TEXT);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t *pathInfo)
{
    if (!pathInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct place a, b;
    nvmlReturn_t ret = place_of(device1, &a);
    if (ret == NVML_SUCCESS)
        ret = place_of(device2, &b);
    if (ret != NVML_SUCCESS)
        return ret;
    if (a.gpu == b.gpu)
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else if (a.bridge[0] && strcmp(a.bridge, b.bridge) == 0)
        *pathInfo = NVML_TOPOLOGY_HOSTBRIDGE;
    else if (a.numa >= 0 && a.numa == b.numa)
        *pathInfo = NVML_TOPOLOGY_NODE;
    else
        *pathInfo = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}
