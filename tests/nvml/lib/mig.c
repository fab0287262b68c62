/*
 * MIG: a GPU's MIG mode, its MIG devices by index and their parent, and what a MIG
 * device says of the GPU and compute instance behind it.
 */
#include "nvmlstate.h"

#include <string.h>

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode)
{
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (!gpu_of(h)->mig_capable || h->slot >= 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *currentMode = *pendingMode = gpu_of(h)->mig ? NVML_DEVICE_MIG_ENABLE
                                                 : NVML_DEVICE_MIG_DISABLE;
    return leave(NVML_SUCCESS);
}

/* Documented: "Returns zero if MIG is not supported or enabled." */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct gpu *g = gpu_of(h);
    *count = g->mig_capable && g->mig && h->slot < 0 ? 7 : 0;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice)
{
    if (!migDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct gpu *g = gpu_of(h);
    if (h->slot >= 0 || !g->mig_capable)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (index >= MAX_MIGS || !g->mig)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->migs[index].present)
        return leave(NVML_ERROR_NOT_FOUND); /* "if no valid MIG device was found at index" */
    *migDevice = (nvmlDevice_t)&g_mig_handles[h->gpu][index];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    if (!isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    *isMigDevice = h->slot >= 0;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device)
{
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(migDevice, h);
    if (h->slot < 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT); /* not a MIG device handle */
    *device = (nvmlDevice_t)&g_gpu_handles[h->gpu];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(nvmlDevice_t device, const char *call, unsigned *id, int gi)
{
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct handle *h = NULL;
    nvmlReturn_t ret = enter(device, call, &h);
    if (ret != NVML_SUCCESS)
        return ret;
    const struct mig *m = mig_of(h);
    if (!m)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* a GPU handle has no instance IDs */
    *id = gi ? m->gi : m->ci;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, __func__, id, 1);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, __func__, id, 0);
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    if (!attributes)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct mig *m = mig_of(h);
    memset(attributes, 0, sizeof *attributes);
    if (m) {
        attributes->multiprocessorCount = m->sm;
        attributes->gpuInstanceSliceCount = m->gi_slices;
        attributes->computeInstanceSliceCount = m->ci_slices;
        attributes->memorySizeMB = m->memory_mib;
    } else {
        if (!gpu_of(h)->mig_capable)
            return leave(NVML_ERROR_NOT_SUPPORTED);
        attributes->multiprocessorCount = 132;
        attributes->gpuInstanceSliceCount = 7;
        attributes->computeInstanceSliceCount = 7;
        attributes->memorySizeMB = gpu_of(h)->memory >> 20;
    }
    attributes->sharedCopyEngineCount = 1;
    return leave(NVML_SUCCESS);
}
