/*
 * The processes running on a GPU: nvmlDeviceGetComputeRunningProcesses_v3 (compute
 * processes, `proc` records with mps=0) and nvmlDeviceGetMPSComputeRunningProcesses_v3
 * (MPS clients, mps=1). Documented: "call this function with *infoCount = 0. The return
 * code will be NVML_ERROR_INSUFFICIENT_SIZE, or NVML_SUCCESS if none are running. For
 * this call infos is allowed to be NULL"; a table too small answers INSUFFICIENT_SIZE
 * with the count needed. A process whose memory the record leaves out reports
 * NVML_VALUE_NOT_AVAILABLE, as the header says a driver may. A MIG device lists none.
 */
#include "nvmlstate.h"

static nvmlReturn_t listed(const struct handle *h, unsigned mps, unsigned *count,
                           nvmlProcessInfo_t *infos)
{
    unsigned found = 0;
    for (unsigned i = 0; i < g_state->nprocs; i++) {
        const struct proc *p = &g_state->procs[i];
        if (h->slot >= 0 || p->gpu != h->gpu || p->mps != mps)
            continue;
        if (infos && found < *count) {
            infos[found].pid = p->pid;
            infos[found].usedGpuMemory = p->used;
            infos[found].gpuInstanceId = NO_INSTANCE;
            infos[found].computeInstanceId = NO_INSTANCE;
        }
        found++;
    }
    if (found == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (!infos || found > *count) {
        *count = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = found;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    return leave(listed(h, 0, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    return leave(listed(h, 1, infoCount, infos));
}
