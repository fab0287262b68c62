/*
 * GPU and compute instances: the GPU instance profiles a GPU offers, its GPU instances by
 * ID, and the compute instances inside them, with their profiles and placements.
 */
#include "nvmlstate.h"

#include <string.h>

/* Each MIG device of the state is one GPU instance holding one compute instance. A GPU or
 * compute instance handle answers through the MIG device it backs: the checks of every
 * call about that device (GPU lost, MIG off, instance gone: INVALID_ARGUMENT). */
static nvmlReturn_t enter_instance(const void *instance, struct handle (*base)[MAX_MIGS],
                                   const char *call, const struct handle **out)
{
    const struct handle *h = instance, *first = &base[0][0];
    if (!h || h < first || h >= first + MAX_GPUS * MAX_MIGS)
        return NVML_ERROR_INVALID_ARGUMENT;
    return enter((nvmlDevice_t)&g_mig_handles[h->gpu][h->slot], call, out);
}

/* ENTER for a GPU or compute instance handle of `base`: checked as its MIG device. */
#define ENTER_INSTANCE(instance, base, call, h)                                              \
    const struct handle *h = NULL;                                                           \
    do {                                                                                     \
        nvmlReturn_t entered_ = enter_instance((instance), (base), (call), &h);              \
        if (entered_ != NVML_SUCCESS)                                                        \
            return entered_;                                                                 \
    } while (0)

/* Documented: NOT_SUPPORTED "If device doesn't support MIG or profile isn't supported";
 * INVALID_ARGUMENT for an invalid profile, which ends an enumeration from 0. The
 * profiles a GPU offers are the state's gip records: immutable while MIG mode lasts. */
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info)
{
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct gip *p = &gpu_of(h)->gips[profile];
    if (h->slot >= 0 || !gpu_of(h)->mig_capable || !p->present)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(info, 0, sizeof *info);
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sm;
    info->copyEngineCount = p->slices; /* one per slice; media engines not modelled */
    info->memorySizeMB = p->memory_mib;
    return leave(NVML_SUCCESS);
}

/* Documented: NOT_SUPPORTED "If device doesn't have MIG mode enabled", NOT_FOUND "If the
 * GPU instance is not found". A MIG device has no GPU instances of its own. */
nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance)
{
    if (!gpuInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct gpu *g = gpu_of(h);
    if (h->slot >= 0 || !g->mig_capable || !g->mig)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    for (int s = 0; s < MAX_MIGS; s++)
        if (g->migs[s].present && g->migs[s].gi == id) {
            *gpuInstance = (nvmlGpuInstance_t)&g_gi_handles[h->gpu][s];
            return leave(NVML_SUCCESS);
        }
    return leave(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER_INSTANCE(gpuInstance, g_gi_handles, __func__, h);
    const struct mig *m = mig_of(h);
    memset(info, 0, sizeof *info);
    info->device = (nvmlDevice_t)&g_gpu_handles[h->gpu];
    info->id = m->gi;
    info->profileId = gpu_of(h)->gips[m->gi_profile % NVML_GPU_INSTANCE_PROFILE_COUNT].id;
    info->placement.start = m->start;
    info->placement.size = m->size;
    return leave(NVML_SUCCESS);
}

/* Compute slices of each NVML_COMPUTE_INSTANCE_PROFILE_*; 0: a kind this library does not
 * offer (8 and 6 slices, rev1, NVL). A profile's ID is its index, as the driver gives. */
static const unsigned CI_SLICES[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7};

/* Documented: INVALID_ARGUMENT for an invalid profile or engProfile; NOT_SUPPORTED "If
 * profile isn't supported": here, one wider than the GPU instance. */
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance,
                                                          unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info)
{
    if (!info || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
        engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER_INSTANCE(gpuInstance, g_gi_handles, __func__, h);
    const struct mig *m = mig_of(h);
    unsigned slices = CI_SLICES[profile];
    if (!slices || slices > m->gi_slices)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = m->gi_slices / slices;
    info->multiprocessorCount = m->sm / (m->ci_slices ? m->ci_slices : 1) * slices;
    info->sharedCopyEngineCount = m->gi_slices;
    return leave(NVML_SUCCESS);
}

/* Documented: NOT_FOUND "If the compute instance is not found". */
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                   nvmlComputeInstance_t *computeInstance)
{
    if (!computeInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER_INSTANCE(gpuInstance, g_gi_handles, __func__, h);
    if (mig_of(h)->ci != id)
        return leave(NVML_ERROR_NOT_FOUND);
    *computeInstance = (nvmlComputeInstance_t)&g_ci_handles[h->gpu][h->slot];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                           nvmlComputeInstanceInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER_INSTANCE(computeInstance, g_ci_handles, "nvmlComputeInstanceGetInfo", h);
    const struct mig *m = mig_of(h);
    memset(info, 0, sizeof *info);
    info->device = (nvmlDevice_t)&g_gpu_handles[h->gpu];
    info->gpuInstance = (nvmlGpuInstance_t)&g_gi_handles[h->gpu][h->slot];
    info->id = m->ci;
    info->profileId = m->ci_profile;
    info->placement.start = 0; /* "within the GPU instance's compute slice range" */
    info->placement.size = m->ci_slices;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                        nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}
