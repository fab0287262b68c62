/*
 * The project's own libnvidia-ml.so.1 for tests: the NVML calls the agent makes through
 * pynvml, answered from a node described in a state file (tests/nvml/state.py writes it).
 *
 * Built at test time against NVIDIA's nvml.h (PyPI package nvidia-nvml-dev), so every
 * prototype and structure is the header's own. Behaviour follows the header's
 * documentation; each place where a choice was made says which documented behaviour it
 * models.
 *
 * The state file (env NODE_AGENT_NVML_STATE) has one record a line, fields separated by
 * tabs, the first the record's kind and the others key=value:
 *   system  driver=... nvml=... cuda=12040
 *   gpu     index= uuid= name= serial= bus= pci_device_id= memory= minor= numa=
 *           arch= cc= mig_capable= mig= ecc= ecc_uncorrected= lost= error= hang_ms=
 *           bridge= bridge_numa=                  (the PCIe host bridge above the GPU
 *                                                  and that bridge's NUMA node)
 *   link    gpu= link= type= bus=                 (an active NVLink)
 *   gip     gpu= profile= id= slices= instances= memory_mib= sm=
 *                                                 (a GPU instance profile the GPU offers,
 *                                                  by its NVML_GPU_INSTANCE_PROFILE_* index)
 *   mig     gpu= slot= uuid= gi= ci= gi_slices= ci_slices= memory_mib= sm=
 *           gi_profile= ci_profile= start= size=  (one GPU instance holding one compute
 *                                                  instance; profiles by index, placement
 *                                                  in memory slices)
 *   fail    gpu= call= code=                      (that call about that GPU fails so)
 *   event   id= gpu= type= data= gi= ci=          (delivered once, to the event sets
 *                                                  registered when it first appears)
 * The file is read again whenever it changes (inode, size or mtime), so a test changes
 * the node while the agent runs by writing a new file and renaming it over the old one.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_GPUS 64
#define MAX_MIGS 8
#define MAX_LINKS NVML_NVLINK_MAX_LINKS
#define MAX_FAILS 64
#define MAX_EVENTS 256
#define MAX_SETS 16
#define QUEUE 256
#define TEXT 96
#define POLL_MS 5
#define NO_INSTANCE 0xFFFFFFFFu

struct mig {
    int present;
    char uuid[TEXT];
    unsigned gi, ci, gi_slices, ci_slices, sm, gi_profile, ci_profile, start, size;
    unsigned long long memory_mib;
};

struct gip {
    int present;
    unsigned id, slices, instances, sm;
    unsigned long long memory_mib;
};

struct link {
    int active;
    unsigned type;
    char bus[TEXT];
};

struct gpu {
    char uuid[TEXT], name[TEXT], serial[TEXT], bus[TEXT], bridge[TEXT];
    unsigned pci_device_id, minor, arch, cc, mig_capable, mig, ecc, lost, error, hang_ms;
    int numa, bridge_numa;
    unsigned long long memory, ecc_uncorrected;
    struct link links[MAX_LINKS];
    struct mig migs[MAX_MIGS];
    struct gip gips[NVML_GPU_INSTANCE_PROFILE_COUNT];
};

struct fail {
    unsigned gpu, code;
    char call[TEXT];
};

struct event {
    unsigned long long id, type, data;
    unsigned gpu, gi, ci;
};

struct state {
    char driver[TEXT], nvml[TEXT];
    int cuda;
    unsigned count;
    struct gpu gpus[MAX_GPUS];
    unsigned nfails;
    struct fail fails[MAX_FAILS];
    unsigned nevents;
    struct event events[MAX_EVENTS];
};

/* A handle is the address of one of these: stable for the life of the process, so a
 * handle stays valid across reloads of the state (NVML's handles stay valid until
 * nvmlShutdown). */
struct handle {
    unsigned gpu;
    int slot; /* -1: the GPU itself; else its MIG device at this index */
};

struct set {
    int used;
    unsigned long long mask[MAX_GPUS];
    nvmlEventData_t queue[QUEUE];
    unsigned head, tail;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct state *g_state;
static struct stat g_seen;
static unsigned long long g_last_event;
static unsigned g_inits;
static struct handle g_gpu_handles[MAX_GPUS];
static struct handle g_mig_handles[MAX_GPUS][MAX_MIGS];
static struct handle g_gi_handles[MAX_GPUS][MAX_MIGS]; /* the GPU instance of each */
static struct handle g_ci_handles[MAX_GPUS][MAX_MIGS]; /* and its compute instance */
static struct set g_sets[MAX_SETS];

__attribute__((constructor)) static void make_handles(void)
{
    for (unsigned i = 0; i < MAX_GPUS; i++) {
        g_gpu_handles[i] = (struct handle){i, -1};
        for (int s = 0; s < MAX_MIGS; s++)
            g_mig_handles[i][s] = g_gi_handles[i][s] = g_ci_handles[i][s] =
                (struct handle){i, s};
    }
}

/* ---- the state file ---------------------------------------------------------------- */

static const char *field(char **fields, int n, const char *key)
{
    size_t len = strlen(key);
    for (int i = 1; i < n; i++)
        if (strncmp(fields[i], key, len) == 0 && fields[i][len] == '=')
            return fields[i] + len + 1;
    return NULL;
}

static unsigned long long number(char **fields, int n, const char *key, unsigned long long dflt)
{
    const char *v = field(fields, n, key);
    return v ? strtoull(v, NULL, 0) : dflt;
}

static void copy(char *dst, char **fields, int n, const char *key)
{
    const char *v = field(fields, n, key);
    snprintf(dst, TEXT, "%s", v ? v : "");
}

static void parse_gpu(struct state *s, char **f, int n)
{
    unsigned i = (unsigned)number(f, n, "index", MAX_GPUS);
    if (i >= MAX_GPUS)
        return;
    struct gpu *g = &s->gpus[i];
    copy(g->uuid, f, n, "uuid");
    copy(g->name, f, n, "name");
    copy(g->serial, f, n, "serial");
    g->arch = (unsigned)number(f, n, "arch", NVML_DEVICE_ARCH_HOPPER);
    g->cc = (unsigned)number(f, n, "cc", 90); /* compute capability, major * 10 + minor */
    copy(g->bus, f, n, "bus");
    g->pci_device_id = (unsigned)number(f, n, "pci_device_id", 0x233010DE);
    g->memory = number(f, n, "memory", 0);
    g->minor = (unsigned)number(f, n, "minor", i);
    g->numa = (int)(long long)number(f, n, "numa", (unsigned long long)-1);
    g->mig_capable = (unsigned)number(f, n, "mig_capable", 0);
    g->mig = (unsigned)number(f, n, "mig", 0);
    g->ecc = (unsigned)number(f, n, "ecc", 1);
    g->ecc_uncorrected = number(f, n, "ecc_uncorrected", 0);
    g->lost = (unsigned)number(f, n, "lost", 0);
    g->error = (unsigned)number(f, n, "error", 0);
    g->hang_ms = (unsigned)number(f, n, "hang_ms", 0);
    copy(g->bridge, f, n, "bridge");
    g->bridge_numa = (int)(long long)number(f, n, "bridge_numa", (unsigned long long)-1);
    if (i + 1 > s->count)
        s->count = i + 1;
}

static void parse_line(struct state *s, char *line)
{
    char *fields[32];
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(line, "\t", &save); tok && n < 32;
         tok = strtok_r(NULL, "\t", &save))
        fields[n++] = tok;
    if (n == 0 || fields[0][0] == '#')
        return;
    const char *kind = fields[0];
    unsigned gpu = (unsigned)number(fields, n, "gpu", MAX_GPUS);
    if (strcmp(kind, "system") == 0) {
        copy(s->driver, fields, n, "driver");
        copy(s->nvml, fields, n, "nvml");
        s->cuda = (int)number(fields, n, "cuda", 12000);
    } else if (strcmp(kind, "gpu") == 0) {
        parse_gpu(s, fields, n);
    } else if (strcmp(kind, "link") == 0 && gpu < MAX_GPUS) {
        unsigned l = (unsigned)number(fields, n, "link", MAX_LINKS);
        if (l < MAX_LINKS) {
            struct link *k = &s->gpus[gpu].links[l];
            k->active = 1;
            k->type = (unsigned)number(fields, n, "type", NVML_NVLINK_DEVICE_TYPE_GPU);
            copy(k->bus, fields, n, "bus");
        }
    } else if (strcmp(kind, "mig") == 0 && gpu < MAX_GPUS) {
        unsigned slot = (unsigned)number(fields, n, "slot", MAX_MIGS);
        if (slot < MAX_MIGS) {
            struct mig *m = &s->gpus[gpu].migs[slot];
            m->present = 1;
            copy(m->uuid, fields, n, "uuid");
            m->gi = (unsigned)number(fields, n, "gi", 0);
            m->ci = (unsigned)number(fields, n, "ci", 0);
            m->gi_slices = (unsigned)number(fields, n, "gi_slices", 1);
            m->ci_slices = (unsigned)number(fields, n, "ci_slices", m->gi_slices);
            m->sm = (unsigned)number(fields, n, "sm", 16);
            m->memory_mib = number(fields, n, "memory_mib", 0);
            m->gi_profile = (unsigned)number(fields, n, "gi_profile", 0);
            m->ci_profile = (unsigned)number(fields, n, "ci_profile", 0);
            m->start = (unsigned)number(fields, n, "start", 0);
            m->size = (unsigned)number(fields, n, "size", m->gi_slices);
        }
    } else if (strcmp(kind, "gip") == 0 && gpu < MAX_GPUS) {
        unsigned p = (unsigned)number(fields, n, "profile", NVML_GPU_INSTANCE_PROFILE_COUNT);
        if (p < NVML_GPU_INSTANCE_PROFILE_COUNT) {
            struct gip *g = &s->gpus[gpu].gips[p];
            g->present = 1;
            g->id = (unsigned)number(fields, n, "id", 0);
            g->slices = (unsigned)number(fields, n, "slices", 1);
            g->instances = (unsigned)number(fields, n, "instances", 1);
            g->sm = (unsigned)number(fields, n, "sm", 16);
            g->memory_mib = number(fields, n, "memory_mib", 0);
        }
    } else if (strcmp(kind, "fail") == 0 && s->nfails < MAX_FAILS) {
        struct fail *x = &s->fails[s->nfails++];
        x->gpu = gpu;
        x->code = (unsigned)number(fields, n, "code", NVML_ERROR_UNKNOWN);
        copy(x->call, fields, n, "call");
    } else if (strcmp(kind, "event") == 0 && s->nevents < MAX_EVENTS) {
        struct event *e = &s->events[s->nevents++];
        e->id = number(fields, n, "id", 0);
        e->gpu = gpu;
        e->type = number(fields, n, "type", nvmlEventTypeXidCriticalError);
        e->data = number(fields, n, "data", 0);
        e->gi = (unsigned)number(fields, n, "gi", NO_INSTANCE);
        e->ci = (unsigned)number(fields, n, "ci", NO_INSTANCE);
    }
}

static struct state *parse_file(const char *path)
{
    FILE *file = fopen(path, "r");
    if (!file)
        return NULL;
    struct state *s = calloc(1, sizeof *s);
    char line[4096];
    while (s && fgets(line, sizeof line, file)) {
        line[strcspn(line, "\r\n")] = 0;
        parse_line(s, line);
    }
    fclose(file);
    return s;
}

/* Events that appeared since the last read go to the sets registered for them now:
 * an event set receives only events that occur after its registration. */
static void deliver_new_events(void)
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

/* Called with g_lock held: read the file again if it changed. */
static nvmlReturn_t refresh(void)
{
    const char *path = getenv("NODE_AGENT_NVML_STATE");
    struct stat now;
    if (!path || stat(path, &now) != 0)
        return g_state ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
    if (g_state && now.st_ino == g_seen.st_ino && now.st_size == g_seen.st_size &&
        now.st_mtim.tv_sec == g_seen.st_mtim.tv_sec &&
        now.st_mtim.tv_nsec == g_seen.st_mtim.tv_nsec)
        return NVML_SUCCESS;
    struct state *fresh = parse_file(path);
    if (!fresh)
        return g_state ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
    int first = g_state == NULL;
    free(g_state);
    g_state = fresh;
    g_seen = now;
    if (first) {
        for (unsigned i = 0; i < fresh->nevents; i++) /* events before init are history */
            if (fresh->events[i].id > g_last_event)
                g_last_event = fresh->events[i].id;
    }
    deliver_new_events();
    return NVML_SUCCESS;
}

/* ---- looking a device up ----------------------------------------------------------- */

static void pause_ms(unsigned ms)
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
static nvmlReturn_t enter(nvmlDevice_t device, const char *call, const struct handle **out)
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

#define ENTER(device, h)                                                                     \
    const struct handle *h = NULL;                                                           \
    do {                                                                                     \
        nvmlReturn_t entered_ = enter((device), __func__, &h);                               \
        if (entered_ != NVML_SUCCESS)                                                        \
            return entered_;                                                                 \
    } while (0)

static nvmlReturn_t leave(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&g_lock);
    return ret;
}

static nvmlReturn_t put_text(char *dst, unsigned length, const char *text)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, const char *bus, unsigned device_id)
{
    unsigned domain = 0, b = 0, dev = 0, fn = 0;
    memset(pci, 0, sizeof *pci);
    sscanf(bus, "%x:%x:%x.%x", &domain, &b, &dev, &fn);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xFFFF,
             b, dev, fn);
    pci->domain = domain;
    pci->bus = b;
    pci->device = dev;
    pci->pciDeviceId = device_id;
}

/* ---- the library's life ------------------------------------------------------------ */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
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
            memset(g_sets, 0, sizeof g_sets);
        ret = NVML_SUCCESS;
    }
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

static nvmlReturn_t system_text(char *dst, unsigned length, int driver)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_ERROR_UNINITIALIZED;
    if (g_inits > 0) {
        refresh();
        ret = put_text(dst, length, driver ? g_state->driver : g_state->nvml);
    }
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
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_ERROR_UNINITIALIZED;
    if (g_inits > 0) {
        refresh();
        *cudaDriverVersion = g_state->cuda;
        ret = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
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
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_ERROR_UNINITIALIZED;
    if (g_inits > 0) {
        refresh();
        *deviceCount = g_state->count; /* a lost GPU is still counted */
        ret = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!device || index >= MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    int ready = g_inits > 0;
    if (ready)
        refresh();
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
    pthread_mutex_lock(&g_lock);
    if (g_inits == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    refresh();
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

/* ---- what a device is -------------------------------------------------------------- */

static const struct gpu *gpu_of(const struct handle *h) { return &g_state->gpus[h->gpu]; }

static const struct mig *mig_of(const struct handle *h)
{
    return h->slot < 0 ? NULL : &gpu_of(h)->migs[h->slot];
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    ENTER(device, h);
    const struct mig *m = mig_of(h);
    return leave(put_text(uuid, length, m ? m->uuid : gpu_of(h)->uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    ENTER(device, h);
    char text[2 * TEXT];
    const struct mig *m = mig_of(h);
    if (m) /* a MIG device is named after its parent and profile, as nvidia-smi shows */
        snprintf(text, sizeof text, "%s MIG %ug.%llugb", gpu_of(h)->name, m->gi_slices,
                 (m->memory_mib + 1023) / 1024);
    else
        snprintf(text, sizeof text, "%s", gpu_of(h)->name);
    return leave(put_text(name, length, text));
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    ENTER(device, h);
    return leave(put_text(serial, length, gpu_of(h)->serial));
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    if (!type)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    *type = NVML_BRAND_NVIDIA;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    if (!arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    *arch = gpu_of(h)->arch;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    *major = (int)(gpu_of(h)->cc / 10);
    *minor = (int)(gpu_of(h)->cc % 10);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    *index = h->gpu;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (h->slot >= 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *minorNumber = gpu_of(h)->minor;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    fill_pci(pci, gpu_of(h)->bus, gpu_of(h)->pci_device_id); /* a MIG device: its parent's */
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (gpu_of(h)->numa < 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *node = (unsigned)gpu_of(h)->numa;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    const struct mig *m = mig_of(h);
    memory->total = m ? m->memory_mib << 20 : gpu_of(h)->memory;
    memory->used = 0;
    memory->free = memory->total;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    ENTER(device, h);
    const struct mig *m = mig_of(h);
    memory->total = m ? m->memory_mib << 20 : gpu_of(h)->memory;
    memory->reserved = 0;
    memory->used = 0;
    memory->free = memory->total;
    return leave(NVML_SUCCESS);
}

/* ---- ECC --------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                  nvmlEnableState_t *pending)
{
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    *current = *pending = gpu_of(h)->ecc ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts)
{
    if (!eccCounts || counterType >= NVML_ECC_COUNTER_TYPE_COUNT ||
        errorType >= NVML_MEMORY_ERROR_TYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    ENTER(device, h);
    if (!gpu_of(h)->ecc)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* "if the device does not support ECC" */
    *eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? gpu_of(h)->ecc_uncorrected
                                                                 : 0;
    return leave(NVML_SUCCESS);
}

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
    *isActive = g->links[link].active ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
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

/* ---- MIG --------------------------------------------------------------------------- */

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

/* ---- GPU and compute instances ----------------------------------------------------- */

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
    const struct handle *h = NULL;
    nvmlReturn_t ret = enter_instance(gpuInstance, g_gi_handles, __func__, &h);
    if (ret != NVML_SUCCESS)
        return ret;
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
    const struct handle *h = NULL;
    nvmlReturn_t ret = enter_instance(gpuInstance, g_gi_handles, __func__, &h);
    if (ret != NVML_SUCCESS)
        return ret;
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
    const struct handle *h = NULL;
    nvmlReturn_t ret = enter_instance(gpuInstance, g_gi_handles, __func__, &h);
    if (ret != NVML_SUCCESS)
        return ret;
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
    const struct handle *h = NULL;
    nvmlReturn_t ret = enter_instance(computeInstance, g_ci_handles, "nvmlComputeInstanceGetInfo",
                                      &h);
    if (ret != NVML_SUCCESS)
        return ret;
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

/* ---- events ------------------------------------------------------------------------ */

#define SUPPORTED_EVENTS                                                                     \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |  \
     nvmlEventTypeXidCriticalError)

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
