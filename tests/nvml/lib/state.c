/*
 * The state file (env NODE_AGENT_NVML_STATE), parsed into a struct state: the node as
 * last read lives here, with the lock that guards it and the count of inits.
 *
 * The file has one record a line, fields separated by tabs, the first the record's kind
 * and the others key=value:
 *   system  driver=... nvml=... cuda=12040 init_hang_ms=0
 *   gpu     index= uuid= name= serial= bus= pci_device_id= memory= minor= numa=
 *           arch= cc= mig_capable= mig= ecc= ecc_uncorrected= lost= error= hang_ms=
 *           bridge= bridge_numa=                  (the PCIe host bridge above the GPU
 *                                                  and that bridge's NUMA node)
 *           pcie_width= pcie_max_width= pcie_gen= pcie_max_gen= pcie_gpu_max_gen=
 *           replays= utilization= clock_events= remap= remap_corr= remap_unc=
 *           memory_used= power_mw= temperature= sm_clock=
 *           remap_pending= remap_failed= retired= retired_pending= recovery_offered= recovery=
 *                                                 (what signals.c answers)
 *   link    gpu= link= type= bus= down=           (an active NVLink; down=1: inactive now)
 *   fabric  gpu= cluster= clique= state= status= health=
 *                                                 (the NVLink fabric it registered with:
 *                                                  cluster UUID as 32 hex digits; none:
 *                                                  the fabric calls answer NOT_SUPPORTED)
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
 *   proc    gpu= pid= used= mps=               (a process running on the GPU, its
 *                                                  memory in bytes (none: not available);
 *                                                  mps=1: an MPS client)
 * The file is read again whenever it changes (inode, size or mtime), so a test changes
 * the node while the agent runs by writing a new file and renaming it over the old one.
 */
#include "nvmlstate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
struct state *g_state;
unsigned g_inits;
static struct stat g_seen;

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
    g->pcie_width = (unsigned)number(f, n, "pcie_width", 16);
    g->pcie_max_width = (unsigned)number(f, n, "pcie_max_width", 16);
    g->pcie_gen = (unsigned)number(f, n, "pcie_gen", 5);
    g->pcie_max_gen = (unsigned)number(f, n, "pcie_max_gen", 5);
    g->pcie_gpu_max_gen = (unsigned)number(f, n, "pcie_gpu_max_gen", g->pcie_max_gen);
    g->replays = (unsigned)number(f, n, "replays", 0);
    g->utilization = (unsigned)number(f, n, "utilization", 0);
    g->clock_events = number(f, n, "clock_events", 0);
    g->remap = (unsigned)number(f, n, "remap", 1);
    g->remap_corr = (unsigned)number(f, n, "remap_corr", 0);
    g->remap_unc = (unsigned)number(f, n, "remap_unc", 0);
    g->remap_pending = (unsigned)number(f, n, "remap_pending", 0);
    g->remap_failed = (unsigned)number(f, n, "remap_failed", 0);
    g->retired = (unsigned)number(f, n, "retired", 1);
    g->retired_pending = (unsigned)number(f, n, "retired_pending", 0);
    g->recovery_offered = (unsigned)number(f, n, "recovery_offered", 0);
    g->recovery = (unsigned)number(f, n, "recovery", 0);
    g->memory_used = (unsigned)number(f, n, "memory_used", 0);
    g->power_mw = (unsigned)number(f, n, "power_mw", 70000);
    g->temperature = (unsigned)number(f, n, "temperature", 30);
    g->sm_clock = (unsigned)number(f, n, "sm_clock", 1980);
    if (i + 1 > s->count)
        s->count = i + 1;
}

static void parse_fabric(struct fabric *fab, char **f, int n)
{
    const char *hex = field(f, n, "cluster");
    fab->present = 1;
    for (unsigned b = 0; hex && b < NVML_GPU_FABRIC_UUID_LEN && hex[2 * b] && hex[2 * b + 1];
         b++) {
        char pair[3] = {hex[2 * b], hex[2 * b + 1], 0};
        fab->cluster[b] = (unsigned char)strtoul(pair, NULL, 16);
    }
    fab->clique = (unsigned)number(f, n, "clique", 0);
    fab->state = (unsigned)number(f, n, "state", NVML_GPU_FABRIC_STATE_COMPLETED);
    fab->status = (unsigned)number(f, n, "status", NVML_SUCCESS);
    fab->health = (unsigned)number(f, n, "health", 0);
}

static void parse_line(struct state *s, char *line)
{
    char *fields[64];
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(line, "\t", &save); tok && n < 64;
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
        s->init_hang_ms = (unsigned)number(fields, n, "init_hang_ms", 0);
    } else if (strcmp(kind, "gpu") == 0) {
        parse_gpu(s, fields, n);
    } else if (strcmp(kind, "link") == 0 && gpu < MAX_GPUS) {
        unsigned l = (unsigned)number(fields, n, "link", MAX_LINKS);
        if (l < MAX_LINKS) {
            struct link *k = &s->gpus[gpu].links[l];
            k->active = 1;
            k->down = (int)number(fields, n, "down", 0);
            k->type = (unsigned)number(fields, n, "type", NVML_NVLINK_DEVICE_TYPE_GPU);
            copy(k->bus, fields, n, "bus");
        }
    } else if (strcmp(kind, "fabric") == 0 && gpu < MAX_GPUS) {
        parse_fabric(&s->gpus[gpu].fabric, fields, n);
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
    } else if (strcmp(kind, "proc") == 0 && gpu < MAX_GPUS && s->nprocs < MAX_PROCS) {
        struct proc *p = &s->procs[s->nprocs++];
        p->gpu = gpu;
        p->pid = (unsigned)number(fields, n, "pid", 0);
        p->mps = (unsigned)number(fields, n, "mps", 0);
        p->used = number(fields, n, "used", (unsigned long long)NVML_VALUE_NOT_AVAILABLE);
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

/* Called with g_lock held: read the file again if it changed. */
nvmlReturn_t refresh(void)
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
    if (first)
        skip_past_events(fresh); /* events before init are history */
    deliver_new_events();
    return NVML_SUCCESS;
}
