/*
 * The GPU's NVLink fabric: nvmlDeviceGetGpuFabricInfo and its versioned wrapper.
 * Documented: "NVML_ERROR_NOT_SUPPORTED If device doesn't support gpu fabric"; a MIG
 * device is not a GPU of the fabric (its handle answers NOT_SUPPORTED too).
 */
#include "nvmlstate.h"

#include <string.h>

static const struct fabric *fabric_of(const struct handle *h)
{
    const struct fabric *fab = &gpu_of(h)->fabric;
    return h->slot < 0 && fab->present ? fab : NULL;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct fabric *fab = fabric_of(h);
    if (!fab)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    memcpy(info->clusterUuid, fab->cluster, sizeof info->clusterUuid);
    info->status = (nvmlReturn_t)fab->status;
    info->cliqueId = fab->clique;
    info->state = (nvmlGpuFabricState_t)fab->state;
    return leave(NVML_SUCCESS);
}
#pragma GCC diagnostic pop

/* Documented: the caller sets the version; v2 and v3 share their first fields, v3 adds
 * a health summary (not modelled: NOT_SUPPORTED, 0). */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuFabricInfo_v2 && info->version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    ENTER(device, h);
    const struct fabric *fab = fabric_of(h);
    if (!fab)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    memcpy(info->clusterUuid, fab->cluster, sizeof info->clusterUuid);
    info->status = (nvmlReturn_t)fab->status;
    info->cliqueId = fab->clique;
    info->state = (nvmlGpuFabricState_t)fab->state;
    info->healthMask = fab->health;
    if (info->version == nvmlGpuFabricInfo_v3)
        info->healthSummary = NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED;
    return leave(NVML_SUCCESS);
}
