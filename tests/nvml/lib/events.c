/*
 * Events: event sets, the devices registered with them, and the events (XIDs, ECC) the
 * state brings, delivered to each set that was registered before the event appeared.
 */
#include "nvmlstate.h"

#include <string.h>
#include <time.h>

#define SUPPORTED_EVENTS                                                                     \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |  \
     nvmlEventTypeXidCriticalError)

struct set {
    int used;
    unsigned long long mask[MAX_GPUS];
    nvmlEventData_t queue[QUEUE];
    unsigned head, tail;
};

static struct set g_sets[MAX_SETS];
static unsigned long long g_last_event;

/* Called with g_lock held, on the first read of the state. */
void skip_past_events(const struct state *s)
{
    for (unsigned i = 0; i < s->nevents; i++)
        if (s->events[i].id > g_last_event)
            g_last_event = s->events[i].id;
}

/* Events that appeared since the last read go to the sets registered for them now:
 * an event set receives only events that occur after its registration. */
void deliver_new_events(void)
{
    unsigned long long last = g_last_event;
    for (unsigned i = 0; i < g_state->nevents; i++) {
        struct event *e = &g_state->events[i];
        if (e->id > last) {
            if (e->id > g_last_event)
                g_last_event = e->id;
            for (int k = 0; k < MAX_SETS; k++) {
                struct set *set = &g_sets[k];
                if (!set->used || e->gpu >= MAX_GPUS || !(set->mask[e->gpu] & e->type))
                    continue;
                if (set->tail - set->head >= QUEUE)
                    continue; /* a full queue drops, as a driver's ring would */
                nvmlEventData_t *d = &set->queue[set->tail++ % QUEUE];
                d->device = (nvmlDevice_t)&g_gpu_handles[e->gpu];
                d->eventType = e->type;
                d->eventData = e->data;
                d->gpuInstanceId = e->gi;
                d->computeInstanceId = e->ci;
            }
        }
    }
}

/* Called with g_lock held, when the last init is shut down. */
void free_event_sets(void) { memset(g_sets, 0, sizeof g_sets); }

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    if (!eventTypes)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    *eventTypes = SUPPORTED_EVENTS;
    return leave(NVML_SUCCESS);
}

static struct set *set_of(nvmlEventSet_t set)
{
    struct set *s = (struct set *)set;
    if (s < g_sets || s >= g_sets + MAX_SETS || !s->used)
        return NULL;
    return s;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = g_inits ? NVML_ERROR_MEMORY : NVML_ERROR_UNINITIALIZED;
    for (int i = 0; g_inits && i < MAX_SETS; i++)
        if (!g_sets[i].used) {
            memset(&g_sets[i], 0, sizeof g_sets[i]);
            g_sets[i].used = 1;
            *set = (nvmlEventSet_t)&g_sets[i];
            ret = NVML_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    pthread_mutex_lock(&g_lock);
    struct set *s = set_of(set);
    if (s)
        s->used = 0;
    pthread_mutex_unlock(&g_lock);
    return s ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set)
{
    ENTER(device, h);
    struct set *s = set_of(set);
    if (!s || h->slot >= 0) /* per-instance registration is not supported (header) */
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    s->mask[h->gpu] |= eventTypes;
    return leave(NVML_SUCCESS);
}

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Waits up to timeoutms for an event of the set; TIMEOUT when none came. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ms() + timeoutms;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (g_inits == 0) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_UNINITIALIZED;
        }
        refresh();
        struct set *s = set_of(set);
        if (!s) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if (s->head != s->tail) {
            *data = s->queue[s->head++ % QUEUE];
            pthread_mutex_unlock(&g_lock);
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&g_lock);
        long long left = deadline - now_ms();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        pause_ms(left < POLL_MS ? (unsigned)left : POLL_MS);
    }
}
