/* Counts the native allocation calls of a process: malloc, calloc, realloc, posix_memalign, aligned_alloc and
 * memalign (C++'s operator new calls malloc), from every thread, and hands the count to whoever asks
 * (npukit_allocation_calls, read through ctypes). Loaded with LD_PRELOAD by benchmarks/runtime_allocations.py; the
 * real allocator is found with dlsym(RTLD_NEXT); the few allocations dlsym itself makes while resolving are served
 * from a static buffer and never freed to the real allocator. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

static atomic_long calls;
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static _Alignas(64) char boot[1 << 16];
static size_t boot_used;
static int resolving;

static void *boot_alloc(size_t n) {
    n = (n + 63) & ~(size_t)63;
    if (boot_used + n > sizeof boot) return NULL;
    void *p = boot + boot_used;
    boot_used += n;
    return p;
}

static void resolve(void) {
    resolving = 1;
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_free = dlsym(RTLD_NEXT, "free");
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    real_memalign = dlsym(RTLD_NEXT, "memalign");
    resolving = 0;
}

static int in_boot(void *p) { return (char *)p >= boot && (char *)p < boot + sizeof boot; }

void *malloc(size_t n) {
    if (!real_malloc) { if (resolving) return boot_alloc(n); resolve(); }
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    return real_malloc(n);
}

void *calloc(size_t a, size_t b) {
    if (!real_calloc) {
        if (resolving) { void *p = boot_alloc(a * b); if (p) memset(p, 0, a * b); return p; }
        resolve();
    }
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    return real_calloc(a, b);
}

void *realloc(void *p, size_t n) {
    if (!real_realloc) resolve();
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    if (in_boot(p)) { void *q = real_malloc(n); if (q && p) memcpy(q, p, n); return q; }
    return real_realloc(p, n);
}

void free(void *p) {
    if (!p || in_boot(p)) return;
    if (!real_free) resolve();
    real_free(p);
}

int posix_memalign(void **out, size_t align, size_t n) {
    if (!real_posix_memalign) resolve();
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    return real_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n) {
    if (!real_aligned_alloc) resolve();
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    return real_aligned_alloc(align, n);
}

void *memalign(size_t align, size_t n) {
    if (!real_memalign) resolve();
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    return real_memalign(align, n);
}

long npukit_allocation_calls(void) { return atomic_load(&calls); }
