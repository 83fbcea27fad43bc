/*
 * A scripted stand-in for libnvidia-ml.so.1, for testing StallScope through the real pynvml
 * bindings on machines without a GPU. Test code only.
 *
 * Build:  gcc -shared -fPIC -O1 -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 stubnvml.c -lpthread
 * Leave a function out (pynvml then raises NVMLError_FunctionNotFound): -DOMIT_<function name>.
 *
 * The script is a text file named by $STUBNVML_SCRIPT, read by the first nvmlInit (and again
 * after the last nvmlShutdown). One "key value" per line, '#' starts a comment:
 *
 *   devices 1                 GPUs NVML reports (uuids GPU-5afe0000-0000-0000-0000-00000000000<i>)
 *   name Stub GPU             device name
 *   mem_total 17179869184     bytes
 *   mem_used 4294967296       bytes while idle
 *   mem_used_busy 8589934592  bytes while busy (default: mem_used)
 *   power_mw 100000           milliwatts while idle
 *   power_busy_mw 250000      milliwatts while busy (default: power_mw)
 *   power_limit_mw 300000     enforced power limit
 *   power_default_limit_mw 0  the board's default power limit (0: the enforced one)
 *   sm_clock 1410             SM clock, MHz, while idle
 *   sm_clock_busy 1410        SM clock, MHz, while busy (default: sm_clock)
 *   sm_clock_max 1980         maximum SM clock, MHz
 *   temperature 60            degrees C
 *   reasons_idle 0x1          clock-event reasons while idle (0x1: GpuIdle)
 *   reasons_busy 0x0          clock-event reasons while busy (0x4: SwPowerCap, 0x20/0x40: thermal)
 *   busy_util 95              utilization (%) of a sample period spent wholly busy
 *   idle_util 0               utilization (%) of a sample period spent wholly idle
 *   sample_period_us 10000    length of one utilization sample period
 *   max_samples 100           samples the driver keeps (older ones are lost)
 *   mig 0                     1: MIG mode on (utilization then reads NOT_SUPPORTED)
 *   fail <function> <code>    that function returns <code> (e.g. 3 NOT_SUPPORTED, 4 NO_PERMISSION)
 *   fail_after <function> <n> <code>
 *                             its first n calls work, later ones return <code> (NVML failing
 *                             part-way through a run)
 *   block_after <function> <n>
 *                             its first n calls work, later ones never return (a wedged driver)
 *   (<function> "*" counts and matches every call after nvmlInit)
 *
 * "Busy" is set by the program under test through stubnvml_set_busy(1/0), as a GPU would be
 * busy while kernels run; a utilization sample is idle_util + (busy_util - idle_util) times the
 * share of its period spent busy. Time is CLOCK_REALTIME in microseconds, like NVML's sample
 * timestamps, unless a test drives it with stubnvml_set_time_us (0 returns to the real clock).
 */
#define _GNU_SOURCE
#include <unistd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct stub_device { int index; } *nvmlDevice_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

#define OK 0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_NOT_FOUND 6
#define ERR_INSUFFICIENT_SIZE 7
#define MAX_DEVICES 8
#define MAX_FAILS 32
#define MAX_TRANSITIONS 65536

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount = 0;
static int init_calls = 0;
static struct stub_device devices[MAX_DEVICES];

static struct {
    int devices;
    char name[96];
    unsigned long long mem_total, mem_used, mem_used_busy;
    unsigned int power_mw, power_busy_mw, power_limit_mw, power_default_limit_mw;
    unsigned int sm_clock, sm_clock_busy, sm_clock_max, temperature;
    unsigned long long reasons_idle, reasons_busy;
    unsigned int busy_util, idle_util;
    unsigned long long period_us;
    unsigned int max_samples;
    int mig;
    int nfails;
    char fail_name[MAX_FAILS][64];
    int fail_code[MAX_FAILS];
    int nafter; /* fail_after / block_after rules */
    char after_name[MAX_FAILS][64];
    unsigned long long after_n[MAX_FAILS], after_calls[MAX_FAILS];
    int after_code[MAX_FAILS]; /* -1: block */
} cfg;

static unsigned long long fake_now_us = 0;
static unsigned long long t0_us = 0;
static int busy = 0;
/* busy-state transitions: time and new state, oldest first */
static unsigned long long tr_time[MAX_TRANSITIONS];
static int tr_state[MAX_TRANSITIONS];
static int ntr = 0;

static unsigned long long now_us(void) {
    if (fake_now_us) return fake_now_us;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

static void defaults(void) {
    memset(&cfg, 0, sizeof cfg);
    cfg.devices = 1;
    strcpy(cfg.name, "Stub GPU");
    cfg.mem_total = 17179869184ULL;
    cfg.mem_used = 4294967296ULL;
    cfg.mem_used_busy = 0;
    cfg.power_mw = 100000;
    cfg.power_limit_mw = 300000;
    cfg.power_default_limit_mw = 0;
    cfg.sm_clock = 1410;
    cfg.sm_clock_max = 1980;
    cfg.temperature = 60;
    cfg.reasons_idle = 0x1;
    cfg.reasons_busy = 0x0;
    cfg.busy_util = 95;
    cfg.idle_util = 0;
    cfg.period_us = 10000;
    cfg.max_samples = 100;
}

static void load_script(void) {
    defaults();
    const char *path = getenv("STUBNVML_SCRIPT");
    if (path && *path) {
        FILE *f = fopen(path, "r");
        if (f) {
            char line[512], key[64], val[400];
            while (fgets(line, sizeof line, f)) {
                char *hash = strchr(line, '#');
                if (hash) *hash = 0;
                if (sscanf(line, "%63s %399[^\n]", key, val) != 2) continue;
                unsigned long long v = strtoull(val, NULL, 0);
                if (!strcmp(key, "devices")) cfg.devices = (int)(v > MAX_DEVICES ? MAX_DEVICES : v);
                else if (!strcmp(key, "name")) snprintf(cfg.name, sizeof cfg.name, "%.95s", val);
                else if (!strcmp(key, "mem_total")) cfg.mem_total = v;
                else if (!strcmp(key, "mem_used")) cfg.mem_used = v;
                else if (!strcmp(key, "mem_used_busy")) cfg.mem_used_busy = v;
                else if (!strcmp(key, "power_mw")) cfg.power_mw = (unsigned)v;
                else if (!strcmp(key, "power_busy_mw")) cfg.power_busy_mw = (unsigned)v;
                else if (!strcmp(key, "power_limit_mw")) cfg.power_limit_mw = (unsigned)v;
                else if (!strcmp(key, "power_default_limit_mw")) cfg.power_default_limit_mw = (unsigned)v;
                else if (!strcmp(key, "sm_clock")) cfg.sm_clock = (unsigned)v;
                else if (!strcmp(key, "sm_clock_busy")) cfg.sm_clock_busy = (unsigned)v;
                else if (!strcmp(key, "sm_clock_max")) cfg.sm_clock_max = (unsigned)v;
                else if (!strcmp(key, "temperature")) cfg.temperature = (unsigned)v;
                else if (!strcmp(key, "reasons_idle")) cfg.reasons_idle = v;
                else if (!strcmp(key, "reasons_busy")) cfg.reasons_busy = v;
                else if (!strcmp(key, "busy_util")) cfg.busy_util = (unsigned)v;
                else if (!strcmp(key, "idle_util")) cfg.idle_util = (unsigned)v;
                else if (!strcmp(key, "sample_period_us")) cfg.period_us = v ? v : 1;
                else if (!strcmp(key, "max_samples")) cfg.max_samples = (unsigned)v;
                else if (!strcmp(key, "mig")) cfg.mig = (int)v;
                else if (!strcmp(key, "fail_after") && cfg.nafter < MAX_FAILS) {
                    int code = 0;
                    if (sscanf(val, "%63s %llu %i", cfg.after_name[cfg.nafter], &cfg.after_n[cfg.nafter], &code) == 3) {
                        cfg.after_code[cfg.nafter++] = code;
                    }
                }
                else if (!strcmp(key, "block_after") && cfg.nafter < MAX_FAILS) {
                    if (sscanf(val, "%63s %llu", cfg.after_name[cfg.nafter], &cfg.after_n[cfg.nafter]) == 2) {
                        cfg.after_code[cfg.nafter++] = -1;
                    }
                }
                else if (!strcmp(key, "fail") && cfg.nfails < MAX_FAILS) {
                    int code = 0;
                    if (sscanf(val, "%63s %i", cfg.fail_name[cfg.nfails], &code) == 2)
                        cfg.fail_code[cfg.nfails++] = code;
                }
            }
            fclose(f);
        }
    }
    if (!cfg.mem_used_busy) cfg.mem_used_busy = cfg.mem_used;
    if (!cfg.power_busy_mw) cfg.power_busy_mw = cfg.power_mw;
    if (!cfg.sm_clock_busy) cfg.sm_clock_busy = cfg.sm_clock;
    for (int i = 0; i < MAX_DEVICES; i++) devices[i].index = i;
    t0_us = now_us();
    ntr = 0;
    if (busy) { /* the program may have started its "kernels" before initialising NVML */
        tr_time[0] = t0_us;
        tr_state[0] = 1;
        ntr = 1;
    }
}

static int failing(const char *fn) {
    for (int i = 0; i < cfg.nfails; i++)
        if (!strcmp(cfg.fail_name[i], fn)) return cfg.fail_code[i];
    int out = 0;
    for (int i = 0; i < cfg.nafter; i++) {
        if (strcmp(cfg.after_name[i], fn) && strcmp(cfg.after_name[i], "*")) continue;
        if (++cfg.after_calls[i] > cfg.after_n[i] && !out) out = cfg.after_code[i];
    }
    return out;
}

/* a wedged driver: this call never returns (the stub's lock is not held meanwhile) */
static void block_forever(void) {
    for (;;) sleep(3600);
}

#define ENTER(fn)                                           \
    pthread_mutex_lock(&lock);                              \
    if (refcount <= 0) { pthread_mutex_unlock(&lock); return ERR_UNINITIALIZED; } \
    { int _f = failing(fn); if (_f) { pthread_mutex_unlock(&lock); if (_f < 0) block_forever(); return _f; } }
#define LEAVE(code) do { pthread_mutex_unlock(&lock); return (code); } while (0)

static int check_device(nvmlDevice_t d) {
    return d && d >= devices && d < devices + cfg.devices;
}

/* share of [a, b) spent busy */
static double busy_share(unsigned long long a, unsigned long long b) {
    if (b <= a) return 0.0;
    int state = 0;
    unsigned long long busy_us = 0, cursor = a;
    int i = 0;
    while (i < ntr && tr_time[i] <= a) state = tr_state[i++];
    for (; i < ntr && tr_time[i] < b; i++) {
        if (state) busy_us += tr_time[i] - cursor;
        cursor = tr_time[i];
        state = tr_state[i];
    }
    if (state) busy_us += b - cursor;
    return (double)busy_us / (double)(b - a);
}

static unsigned int util_over(unsigned long long a, unsigned long long b) {
    double share = busy_share(a, b);
    double u = cfg.idle_util + ((double)cfg.busy_util - (double)cfg.idle_util) * share;
    if (u < 0) u = 0;
    if (u > 100) u = 100;
    return (unsigned int)(u + 0.5);
}

/* -- test controls (not NVML) ------------------------------------------------------------- */

void stubnvml_set_busy(int on) {
    pthread_mutex_lock(&lock);
    on = on ? 1 : 0;
    if (on != busy && ntr < MAX_TRANSITIONS) {
        tr_time[ntr] = now_us();
        tr_state[ntr] = on;
        ntr++;
    }
    busy = on;
    pthread_mutex_unlock(&lock);
}

void stubnvml_set_time_us(unsigned long long t) {
    pthread_mutex_lock(&lock);
    fake_now_us = t;
    pthread_mutex_unlock(&lock);
}

int stubnvml_init_calls(void) { return init_calls; }

/* -- init ---------------------------------------------------------------------------------- */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&lock);
    init_calls++;
    if (refcount == 0) load_script();
    int f = failing("nvmlInit");
    if (f) { pthread_mutex_unlock(&lock); return f; }
    refcount++;
    pthread_mutex_unlock(&lock);
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }
nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
nvmlReturn_t nvmlInit(void) { return do_init(); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (refcount <= 0) { pthread_mutex_unlock(&lock); return ERR_UNINITIALIZED; }
    refcount--;
    pthread_mutex_unlock(&lock);
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER("nvmlSystemGetDriverVersion");
    snprintf(version, length, "999.99-stub");
    LEAVE(OK);
}

/* -- devices ------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER("nvmlDeviceGetCount_v2");
    *count = (unsigned)cfg.devices;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER("nvmlDeviceGetHandleByIndex_v2");
    if (index >= (unsigned)cfg.devices) LEAVE(ERR_INVALID_ARGUMENT);
    *device = &devices[index];
    LEAVE(OK);
}

static void uuid_of(int index, char *out, unsigned int length) {
    snprintf(out, length, "GPU-5afe0000-0000-0000-0000-%012d", index);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    ENTER("nvmlDeviceGetHandleByUUID");
    char buf[96];
    for (int i = 0; i < cfg.devices; i++) {
        uuid_of(i, buf, sizeof buf);
        if (uuid && !strcmp(buf, uuid)) { *device = &devices[i]; LEAVE(OK); }
    }
    LEAVE(ERR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER("nvmlDeviceGetUUID");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    uuid_of(device->index, uuid, length);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    ENTER("nvmlDeviceGetIndex");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    *index = (unsigned)device->index;
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER("nvmlDeviceGetName");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    snprintf(name, length, "%s", cfg.name);
    LEAVE(OK);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    ENTER("nvmlDeviceGetMigMode");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    *current = *pending = (unsigned)cfg.mig;
    LEAVE(OK);
}

/* -- utilization --------------------------------------------------------------------------- */

#ifndef OMIT_nvmlDeviceGetSamples
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, int type, unsigned long long lastSeen,
                                  int *valueType, unsigned int *count, nvmlSample_t *samples) {
    ENTER("nvmlDeviceGetSamples");
    if (!check_device(device) || !count || !valueType) LEAVE(ERR_INVALID_ARGUMENT);
    if (type != 1) LEAVE(ERR_NOT_SUPPORTED); /* only NVML_GPU_UTILIZATION_SAMPLES */
    if (cfg.mig) LEAVE(ERR_NOT_SUPPORTED);
    unsigned long long now = now_us(), p = cfg.period_us;
    /* complete periods k >= 1 end at t0 + k p; keep those after lastSeen, at most max_samples */
    unsigned long long last_k = now >= t0_us ? (now - t0_us) / p : 0;
    unsigned long long first_k = lastSeen >= t0_us ? (lastSeen - t0_us) / p + 1 : 1;
    if (last_k + 1 > cfg.max_samples && first_k < last_k + 1 - cfg.max_samples)
        first_k = last_k + 1 - cfg.max_samples;
    unsigned long long available = last_k >= first_k ? last_k - first_k + 1 : 0;
    if (available == 0) LEAVE(ERR_NOT_FOUND);
    *valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (!samples) { *count = (unsigned)available; LEAVE(OK); }
    unsigned int n = *count < available ? *count : (unsigned)available;
    for (unsigned int i = 0; i < n; i++) {
        unsigned long long end = t0_us + (first_k + i) * p;
        samples[i].timeStamp = end;
        samples[i].sampleValue.uiVal = util_over(end - p, end);
    }
    *count = n;
    LEAVE(OK);
}
#endif

#ifndef OMIT_nvmlDeviceGetUtilizationRates
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    ENTER("nvmlDeviceGetUtilizationRates");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    if (cfg.mig) LEAVE(ERR_NOT_SUPPORTED);
    unsigned long long now = now_us(), p = cfg.period_us;
    util->gpu = util_over(now > p ? now - p : 0, now);
    util->memory = util->gpu / 2;
    LEAVE(OK);
}
#endif

/* -- memory, power, clocks, temperature ------------------------------------------------------ */

#ifndef OMIT_nvmlDeviceGetMemoryInfo
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ENTER("nvmlDeviceGetMemoryInfo");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    memory->total = cfg.mem_total;
    memory->used = busy ? cfg.mem_used_busy : cfg.mem_used;
    memory->free = memory->total - memory->used;
    LEAVE(OK);
}
#endif

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    ENTER("nvmlDeviceGetMemoryInfo_v2");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    memory->total = cfg.mem_total;
    memory->reserved = 0;
    memory->used = busy ? cfg.mem_used_busy : cfg.mem_used;
    memory->free = memory->total - memory->used;
    LEAVE(OK);
}

#ifndef OMIT_nvmlDeviceGetPowerUsage
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    ENTER("nvmlDeviceGetPowerUsage");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    *power = busy ? cfg.power_busy_mw : cfg.power_mw;
    LEAVE(OK);
}
#endif

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    ENTER("nvmlDeviceGetEnforcedPowerLimit");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    *limit = cfg.power_limit_mw;
    LEAVE(OK);
}

#ifndef OMIT_nvmlDeviceGetPowerManagementDefaultLimit
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit) {
    ENTER("nvmlDeviceGetPowerManagementDefaultLimit");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    *limit = cfg.power_default_limit_mw ? cfg.power_default_limit_mw : cfg.power_limit_mw;
    LEAVE(OK);
}
#endif

#ifndef OMIT_nvmlDeviceGetClockInfo
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    ENTER("nvmlDeviceGetClockInfo");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    (void)type;
    *clock = busy ? cfg.sm_clock_busy : cfg.sm_clock;
    LEAVE(OK);
}
#endif

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    ENTER("nvmlDeviceGetMaxClockInfo");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    (void)type;
    *clock = cfg.sm_clock_max;
    LEAVE(OK);
}

#ifndef OMIT_nvmlDeviceGetCurrentClocksEventReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    ENTER("nvmlDeviceGetCurrentClocksEventReasons");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    *reasons = busy ? cfg.reasons_busy : cfg.reasons_idle;
    LEAVE(OK);
}
#endif

#ifndef OMIT_nvmlDeviceGetCurrentClocksThrottleReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    ENTER("nvmlDeviceGetCurrentClocksThrottleReasons");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    *reasons = busy ? cfg.reasons_busy : cfg.reasons_idle;
    LEAVE(OK);
}
#endif

#ifndef OMIT_nvmlDeviceGetTemperature
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    ENTER("nvmlDeviceGetTemperature");
    if (!check_device(device)) LEAVE(ERR_INVALID_ARGUMENT);
    (void)sensor;
    *temp = cfg.temperature;
    LEAVE(OK);
}
#endif
