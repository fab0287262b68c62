/*
 * The compute mode of a device or MIG device: nvmlDeviceGetComputeMode and
 * nvmlDeviceSetComputeMode. Documented: "takes effect immediately", "not persistent
 * across reboots and always resets to Default": kept in the library's memory, DEFAULT at
 * load. Root is required: an injected NO_PERMISSION models a caller that is not.
 */
#include "nvmlstate.h"

static nvmlComputeMode_t g_modes[MAX_GPUS][MAX_MIGS + 1]; /* [gpu][0]: the GPU itself */

static nvmlComputeMode_t *mode_of(const struct handle *h)
{
    return &g_modes[h->gpu][h->slot + 1];
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    *mode = *mode_of(h);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode)
{
    if (mode != NVML_COMPUTEMODE_DEFAULT && mode != NVML_COMPUTEMODE_PROHIBITED &&
        mode != NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        return NVML_ERROR_INVALID_ARGUMENT; /* EXCLUSIVE_THREAD: "Support Removed" */
    ENTER(device, h);
    *mode_of(h) = mode;
    return leave(NVML_SUCCESS);
}
