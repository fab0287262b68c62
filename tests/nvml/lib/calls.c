/*
 * How every call about a device begins and ends: its handle, then the checks in order
 * (uninitialised, bad handle, a hang, GPU lost or failing, injected failures), and the
 * text NVML gives for each answer.
 */
#include "nvmlstate.h"

#include <errno.h>
#include <string.h>
#include <time.h>

struct handle g_gpu_handles[MAX_GPUS];
struct handle g_mig_handles[MAX_GPUS][MAX_MIGS];
struct handle g_gi_handles[MAX_GPUS][MAX_MIGS];
struct handle g_ci_handles[MAX_GPUS][MAX_MIGS];

__attribute__((constructor)) static void make_handles(void)
{
    for (unsigned i = 0; i < MAX_GPUS; i++) {
        g_gpu_handles[i] = (struct handle){i, -1};
        for (int s = 0; s < MAX_MIGS; s++)
            g_mig_handles[i][s] = g_gi_handles[i][s] = g_ci_handles[i][s] =
                (struct handle){i, s};
    }
}

void pause_ms(unsigned ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

static int valid_handle(nvmlDevice_t device)
{
    const struct handle *h = (const struct handle *)device;
    const struct handle *g0 = &g_gpu_handles[0], *m0 = &g_mig_handles[0][0];
    return (h >= g0 && h < g0 + MAX_GPUS) || (h >= m0 && h < m0 + MAX_GPUS * MAX_MIGS);
}

/* A call about one GPU blocks while the state says it hangs: as long as hang_ms, or
 * until a new state lets it go. Runs with g_lock released. */
static void hang_if_asked(unsigned gpu)
{
    unsigned waited = 0;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        refresh();
        unsigned hang = gpu < g_state->count ? g_state->gpus[gpu].hang_ms : 0;
        pthread_mutex_unlock(&g_lock);
        if (waited >= hang)
            return;
        pause_ms(POLL_MS);
        waited += POLL_MS;
    }
}

/* What a call named `call` about `device` answers before it reads anything: the common
 * checks of every device query. On success g_lock is held and *out is the GPU. */
nvmlReturn_t enter(nvmlDevice_t device, const char *call, const struct handle **out)
{
    if (!device || !valid_handle(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct handle *h = (const struct handle *)device;
    pthread_mutex_lock(&g_lock);
    int ready = g_inits > 0;
    pthread_mutex_unlock(&g_lock);
    if (!ready)
        return NVML_ERROR_UNINITIALIZED;
    hang_if_asked(h->gpu);
    pthread_mutex_lock(&g_lock);
    refresh();
    nvmlReturn_t ret = NVML_SUCCESS;
    if (g_inits == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (h->gpu >= g_state->count || !g_state->gpus[h->gpu].uuid[0]) {
        ret = NVML_ERROR_GPU_IS_LOST; /* taken off the node: no longer reachable */
    } else {
        const struct gpu *g = &g_state->gpus[h->gpu];
        if (g->lost)
            ret = NVML_ERROR_GPU_IS_LOST; /* fallen off the bus: every call says so */
        else if (g->error)
            ret = (nvmlReturn_t)g->error;
        else if (h->slot >= 0 && (!g->mig || !g->migs[h->slot].present))
            ret = NVML_ERROR_INVALID_ARGUMENT; /* a MIG handle whose instance is gone */
        for (unsigned i = 0; ret == NVML_SUCCESS && i < g_state->nfails; i++) {
            const struct fail *x = &g_state->fails[i];
            if (x->gpu == h->gpu && (strcmp(x->call, call) == 0 || strcmp(x->call, "*") == 0))
                ret = (nvmlReturn_t)x->code;
        }
    }
    if (ret != NVML_SUCCESS) {
        pthread_mutex_unlock(&g_lock);
        return ret;
    }
    *out = h;
    return NVML_SUCCESS;
}

nvmlReturn_t leave(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&g_lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    default: return "Unknown Error";
    }
}
