/*
 * What a device is: its identity, PCI address, NUMA node, memory and ECC, for a GPU and
 * for a MIG device (which answers with its parent's PCI address), in NVML's own forms.
 */
#include "nvmlstate.h"

#include <stdio.h>
#include <string.h>

nvmlReturn_t put_text(char *dst, unsigned length, const char *text)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

void fill_pci(nvmlPciInfo_t *pci, const char *bus, unsigned device_id)
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
    memory->used = m ? 0 : (unsigned long long)gpu_of(h)->memory_used << 20;
    memory->free = memory->total - memory->used;
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
