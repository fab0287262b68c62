/*
 * The answers a degraded device is judged by: PCIe link width and generation, the replay
 * counter, utilization, clock event reasons, remapped rows, pages pending retirement and
 * the GPU recovery action field. Each is NOT_SUPPORTED where the state says the GPU does
 * not offer it (a value of 0 for the PCIe figures), and for a MIG device, which is not a
 * PCIe function of its own.
 */
#include "nvmlstate.h"

#include <stddef.h>
#include <string.h>
#include <sys/time.h>

/* A PCIe figure of the GPU (not of a MIG device), 0 meaning "not available". */
static nvmlReturn_t pcie_figure(nvmlDevice_t device, unsigned int *out, size_t offset,
                                const char *call)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct handle *h = NULL;
    nvmlReturn_t ret = enter(device, call, &h);
    if (ret != NVML_SUCCESS)
        return ret;
    unsigned value = *(const unsigned *)((const char *)gpu_of(h) + offset);
    if (h->slot >= 0 || value == 0)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* "if PCIe link information is not available" */
    *out = value;
    return leave(NVML_SUCCESS);
}

#define PCIE(name, member)                                                                   \
    nvmlReturn_t name(nvmlDevice_t device, unsigned int *value)                              \
    {                                                                                        \
        return pcie_figure(device, value, offsetof(struct gpu, member), #name);              \
    }

PCIE(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
PCIE(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
PCIE(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
PCIE(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
PCIE(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_gpu_max_gen)

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    if (!value)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (h->slot >= 0 || !gpu_of(h)->pcie_max_width)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *value = gpu_of(h)->replays;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (h->slot >= 0 || gpu_of(h)->mig) /* "On MIG-enabled GPUs ... not currently supported" */
        return leave(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = gpu_of(h)->utilization;
    utilization->memory = gpu_of(h)->utilization;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    if (!power)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (h->slot >= 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *power = gpu_of(h)->power_mw;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                      unsigned int *temp)
{
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (h->slot >= 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *temp = gpu_of(h)->temperature;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    if (!clock)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (h->slot >= 0 || type != NVML_CLOCK_SM)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *clock = gpu_of(h)->sm_clock;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t clock_events(nvmlDevice_t device, unsigned long long *reasons,
                                 const char *call)
{
    if (!reasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct handle *h = NULL;
    nvmlReturn_t ret = enter(device, call, &h);
    if (ret != NVML_SUCCESS)
        return ret;
    *reasons = gpu_of(h)->clock_events;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *clocksEventReasons)
{
    return clock_events(device, clocksEventReasons, __func__);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons)
{
    return clock_events(device, clocksThrottleReasons, __func__);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred)
{
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct gpu *g = gpu_of(h);
    /* "NOT_SUPPORTED If MIG is enabled or if the device doesn't support this feature" */
    if (h->slot >= 0 || g->mig || !g->remap)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *corrRows = g->remap_corr;
    *uncRows = g->remap_unc;
    *isPending = g->remap_pending;
    *failureOccurred = g->remap_failed;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                    nvmlEnableState_t *isPending)
{
    if (!isPending)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (!gpu_of(h)->retired) /* "if the device doesn't support this feature": from Ampere on,
                              * row remapping replaces page retirement */
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *isPending = gpu_of(h)->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(NVML_SUCCESS);
}

/* "you must check the nvmlReturn field of each value": a field the GPU does not offer is
 * NOT_SUPPORTED there, and the call itself succeeds. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values)
{
    if (!values || valuesCount < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct gpu *g = gpu_of(h);
    struct timeval now;
    gettimeofday(&now, NULL);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000LL + now.tv_usec;
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof v->value);
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && g->recovery_offered &&
            h->slot < 0) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = g->recovery;
            v->nvmlReturn = NVML_SUCCESS;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return leave(NVML_SUCCESS);
}
