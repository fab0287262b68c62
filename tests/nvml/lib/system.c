/*
 * The library's life (init and shutdown), what it says of the system (driver, NVML and
 * CUDA versions), and finding devices: the count and handles by index or UUID.
 */
#include "nvmlstate.h"

#include <string.h>

/* nvmlInit blocks while the state says so (as long as init_hang_ms, or until a new state
 * lets it go): a driver that does not answer. */
static void init_hang_if_asked(void)
{
    unsigned waited = 0;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        unsigned hang = refresh() == NVML_SUCCESS ? g_state->init_hang_ms : 0;
        pthread_mutex_unlock(&g_lock);
        if (waited >= hang)
            return;
        pause_ms(POLL_MS);
        waited += POLL_MS;
    }
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    init_hang_if_asked();
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = refresh();
    if (ret == NVML_SUCCESS)
        g_inits++; /* NVML counts inits: each needs its own nvmlShutdown */
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_ERROR_UNINITIALIZED;
    if (g_inits > 0) {
        if (--g_inits == 0)
            free_event_sets();
        ret = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

/* Takes g_lock and, while NVML is initialized, reads the state afresh; 0 when it is not.
 * The caller releases g_lock either way. */
static int lock_initialized(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_inits == 0)
        return 0;
    refresh();
    return 1;
}

static nvmlReturn_t system_text(char *dst, unsigned length, int driver)
{
    nvmlReturn_t ret = NVML_ERROR_UNINITIALIZED;
    if (lock_initialized())
        ret = put_text(dst, length, driver ? g_state->driver : g_state->nvml);
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return system_text(version, length, 1);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return system_text(version, length, 0);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    int ready = lock_initialized();
    if (ready)
        *cudaDriverVersion = g_state->cuda;
    pthread_mutex_unlock(&g_lock);
    return ready ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- finding devices --------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    int ready = lock_initialized();
    if (ready)
        *deviceCount = g_state->count; /* a lost GPU is still counted */
    pthread_mutex_unlock(&g_lock);
    return ready ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!device || index >= MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    int ready = lock_initialized();
    int in_range = ready && index < g_state->count && g_state->gpus[index].uuid[0];
    pthread_mutex_unlock(&g_lock);
    if (!ready)
        return NVML_ERROR_UNINITIALIZED;
    if (!in_range)
        return NVML_ERROR_INVALID_ARGUMENT; /* "if index is invalid" */
    /* The documented GPU_IS_LOST / NO_PERMISSION answers come from the device itself. */
    ENTER((nvmlDevice_t)&g_gpu_handles[index], h);
    *device = (nvmlDevice_t)&g_gpu_handles[h->gpu];
    return leave(NVML_SUCCESS);
}

/* Documented: NVML may initialize other GPUs as it searches for the target, and answers
 * GPU_IS_LOST "if any GPU has fallen off the bus". Modelled as a search in index order:
 * a lost GPU before the target fails the lookup. */
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!lock_initialized()) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    int found_gpu = -1, found_slot = -1;
    nvmlReturn_t ret = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < g_state->count && found_gpu < 0; i++) {
        const struct gpu *g = &g_state->gpus[i];
        if (!g->uuid[0])
            continue;
        if (g->lost) {
            ret = NVML_ERROR_GPU_IS_LOST;
            break;
        }
        if (strcmp(g->uuid, uuid) == 0)
            found_gpu = (int)i;
        for (int s = 0; s < MAX_MIGS && g->mig && found_gpu < 0; s++)
            if (g->migs[s].present && strcmp(g->migs[s].uuid, uuid) == 0) {
                found_gpu = (int)i;
                found_slot = s;
            }
    }
    pthread_mutex_unlock(&g_lock);
    if (found_gpu < 0)
        return ret;
    struct handle *h = found_slot < 0 ? &g_gpu_handles[found_gpu]
                                      : &g_mig_handles[found_gpu][found_slot];
    ENTER((nvmlDevice_t)h, entered);
    *device = (nvmlDevice_t)entered;
    return leave(NVML_SUCCESS);
}
