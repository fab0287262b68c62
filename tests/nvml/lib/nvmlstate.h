/*
 * The project's own libnvidia-ml.so.1 for tests: the NVML calls the agent makes through
 * pynvml, answered from a node described in a state file (tests/nvml/state.py writes it;
 * state.c reads it and describes its records).
 *
 * Built at test time against NVIDIA's nvml.h (PyPI package nvidia-nvml-dev), so every
 * prototype and structure is the header's own. Behaviour follows the header's
 * documentation; each place where a choice was made says which documented behaviour it
 * models.
 *
 * This header is private to the library's sources. They are compiled with
 * -fvisibility=hidden: only what nvml.h declares (the NVML entry points) is exported.
 */
#ifndef NVMLSTATE_H
#define NVMLSTATE_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#pragma GCC visibility push(default)
#include <nvml.h>
#pragma GCC visibility pop

#include <pthread.h>
#include <sys/stat.h>

#define MAX_GPUS 64
#define MAX_MIGS 8
#define MAX_LINKS NVML_NVLINK_MAX_LINKS
#define MAX_FAILS 64
#define MAX_EVENTS 256
#define MAX_PROCS 256
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
    int down; /* an active link whose state is now inactive */
    unsigned type;
    char bus[TEXT];
};

/* fabric.c: the NVLink fabric the GPU registered with; present=0: NOT_SUPPORTED. */
struct fabric {
    int present;
    unsigned char cluster[NVML_GPU_FABRIC_UUID_LEN];
    unsigned clique, state, status, health;
};

struct gpu {
    char uuid[TEXT], name[TEXT], serial[TEXT], bus[TEXT], bridge[TEXT];
    unsigned pci_device_id, minor, arch, cc, mig_capable, mig, ecc, lost, error, hang_ms;
    int numa, bridge_numa;
    unsigned long long memory, ecc_uncorrected;
    /* signals.c: what a degraded device is judged by; a PCIe figure of 0: not offered */
    unsigned pcie_width, pcie_max_width, pcie_gen, pcie_max_gen, pcie_gpu_max_gen, replays;
    unsigned utilization, remap, remap_corr, remap_unc, remap_pending, remap_failed;
    unsigned retired, retired_pending, recovery_offered, recovery;
    unsigned long long clock_events;
    /* signals.c: telemetry; memory_used in MiB, power in milliwatts */
    unsigned memory_used, power_mw, temperature, sm_clock;
    struct fabric fabric;
    struct link links[MAX_LINKS];
    struct mig migs[MAX_MIGS];
    struct gip gips[NVML_GPU_INSTANCE_PROFILE_COUNT];
};

struct fail {
    unsigned gpu, code;
    char call[TEXT];
};

/* processes.c: a process running on a GPU; mps=1: an MPS client */
struct proc {
    unsigned gpu, pid, mps;
    unsigned long long used; /* bytes; NVML_VALUE_NOT_AVAILABLE when not given */
};

struct event {
    unsigned long long id, type, data;
    unsigned gpu, gi, ci;
};

struct state {
    char driver[TEXT], nvml[TEXT];
    int cuda;
    unsigned init_hang_ms; /* nvmlInit blocks this long: a driver that does not answer */
    unsigned count;
    struct gpu gpus[MAX_GPUS];
    unsigned nfails;
    struct fail fails[MAX_FAILS];
    unsigned nevents;
    struct event events[MAX_EVENTS];
    unsigned nprocs;
    struct proc procs[MAX_PROCS];
};

/* A handle is the address of one of these: stable for the life of the process, so a
 * handle stays valid across reloads of the state (NVML's handles stay valid until
 * nvmlShutdown). */
struct handle {
    unsigned gpu;
    int slot; /* -1: the GPU itself; else its MIG device at this index */
};

/* state.c: the node as last read, and the library's life. */
extern pthread_mutex_t g_lock;
extern struct state *g_state;
extern unsigned g_inits;
nvmlReturn_t refresh(void);

/* calls.c: the handles, and the checks every call about a device makes. */
extern struct handle g_gpu_handles[MAX_GPUS];
extern struct handle g_mig_handles[MAX_GPUS][MAX_MIGS];
extern struct handle g_gi_handles[MAX_GPUS][MAX_MIGS]; /* the GPU instance of each */
extern struct handle g_ci_handles[MAX_GPUS][MAX_MIGS]; /* and its compute instance */
void pause_ms(unsigned ms);
nvmlReturn_t enter(nvmlDevice_t device, const char *call, const struct handle **out);
nvmlReturn_t leave(nvmlReturn_t ret);

#define ENTER(device, h)                                                                     \
    const struct handle *h = NULL;                                                           \
    do {                                                                                     \
        nvmlReturn_t entered_ = enter((device), __func__, &h);                               \
        if (entered_ != NVML_SUCCESS)                                                        \
            return entered_;                                                                 \
    } while (0)

static inline const struct gpu *gpu_of(const struct handle *h) { return &g_state->gpus[h->gpu]; }

static inline const struct mig *mig_of(const struct handle *h)
{
    return h->slot < 0 ? NULL : &gpu_of(h)->migs[h->slot];
}

/* device.c: answers in NVML's own forms. */
nvmlReturn_t put_text(char *dst, unsigned length, const char *text);
void fill_pci(nvmlPciInfo_t *pci, const char *bus, unsigned device_id);

/* events.c: what a new state brings to the event sets. */
void skip_past_events(const struct state *s);
void deliver_new_events(void);
void free_event_sets(void);

#endif
