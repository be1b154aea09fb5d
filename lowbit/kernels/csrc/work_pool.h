/* Threads for the native kernels that a busy machine cannot stall.
 *
 * OpenMP's fork/join ends every parallel region in a barrier: when another process holds one of
 * the cores, each call waits for the descheduled thread to be given a time slice (measured on 2
 * cores: 4-bit GEMV 21x slower, torch's own F.linear unchanged). Here the caller never waits for a
 * thread that has not started: items are claimed one at a time from one atomic word (generation |
 * item count | next item), the caller claims too and finishes whatever nobody took, and it waits
 * only for items another thread has claimed and not yet finished (each a few microseconds of work).
 * A worker that wakes late finds the generation changed and claims nothing, so it never touches a
 * finished call's arguments. Workers spin briefly after a call (decode calls come back to back),
 * then sleep on a condition variable. A second caller while a call runs (ctypes releases the GIL)
 * runs its items alone, and so does a call whose items exceed the word's 16-bit count. After fork
 * the child starts with no workers. Which thread runs an item never changes its result.
 *
 * Inside an engine whose own operators are OpenMP regions (vLLM: torch's operators and its C++
 * kernels, back to back), a second set of threads fights torch's team for the cores: its threads
 * spin after each region, so a pool worker waits for a time slice and then holds the core while the
 * next torch region waits for it. With LOWBIT_THREADS=omp the items run on torch's own OpenMP team
 * instead (GOMP_parallel, the entry point `#pragma omp parallel` compiles to, found in the process
 * where torch's libgomp or libiomp5 is loaded; the pool where it is not), claimed from one atomic
 * counter as here; one call at a time, a forked child on the pool. Each library reads the setting at
 * its first call. LOWBIT_THREADS=pool (the default) keeps the pool, which holds up better when
 * another process takes a core.
 */
#ifndef LOWBIT_WORK_POOL_H
#define LOWBIT_WORK_POOL_H
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_RELAX() _mm_pause()
#else
#define POOL_RELAX() ((void)0)
#endif

#define POOL_MAX_WORKERS 63
#define POOL_MAX_ITEMS 0xffff
#define POOL_SPIN 2000 /* pause loops (~0.05-0.1 ms) a worker waits for the next call before it sleeps: long enough
                        * for back-to-back decode calls, short enough not to hold a core from torch's threads */

typedef void (*pool_item_fn)(const void *ctx, int64_t item);

static struct {
    pthread_mutex_t mu, call;
    pthread_cond_t wake;
    int workers;             /* started (under mu) */
    uint32_t posted, gen;    /* the newest generation announced to sleepers (under mu); the caller's counter */
    _Atomic uint64_t word;   /* gen << 32 | items << 16 | next */
    _Atomic int64_t done;    /* items finished in this generation */
    _Atomic int want;        /* threads the current call asked for, the caller included */
    pool_item_fn fn;
    const void *ctx;
    int atfork;
} pool_ = {.mu = PTHREAD_MUTEX_INITIALIZER, .call = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static int pool_claim(uint32_t gen, int64_t *item) {
    uint64_t w = atomic_load_explicit(&pool_.word, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(w >> 32) != gen || (w & 0xffff) >= ((w >> 16) & 0xffff)) return 0;
        if (atomic_compare_exchange_weak_explicit(&pool_.word, &w, w + 1, memory_order_acq_rel, memory_order_acquire)) {
            *item = (int64_t)(w & 0xffff);
            return 1;
        }
    }
}

/* Claim and run items of generation gen until none is left; fn and ctx are stable meanwhile (a new
 * call only starts once every item of this one is done, ours included). */
static void pool_drain(uint32_t gen) {
    int64_t item;
    while (pool_claim(gen, &item)) {
        pool_.fn(pool_.ctx, item);
        atomic_fetch_add_explicit(&pool_.done, 1, memory_order_release);
    }
}

static void *pool_worker(void *arg) {
    const int index = (int)(intptr_t)arg; /* 1.. : the caller is thread 0 */
    uint32_t seen = (uint32_t)(atomic_load_explicit(&pool_.word, memory_order_acquire) >> 32);
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = (uint32_t)(atomic_load_explicit(&pool_.word, memory_order_acquire) >> 32)) == seen) {
            if (++spins < POOL_SPIN) {
                POOL_RELAX();
                continue;
            }
            pthread_mutex_lock(&pool_.mu);
            while (pool_.posted == seen) pthread_cond_wait(&pool_.wake, &pool_.mu);
            pthread_mutex_unlock(&pool_.mu);
            spins = 0;
        }
        seen = gen;
        if (index < atomic_load_explicit(&pool_.want, memory_order_acquire)) pool_drain(gen);
    }
    return NULL;
}

static void pool_after_fork_child(void) { /* the child has none of the parent's threads */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    pool_.mu = m, pool_.call = m, pool_.wake = c;
    pool_.workers = 0;
}

static void pool_start_workers(int n) {
    pthread_mutex_lock(&pool_.mu);
    if (!pool_.atfork) pool_.atfork = 1, pthread_atfork(NULL, NULL, pool_after_fork_child);
    while (pool_.workers < n) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, pool_worker, (void *)(intptr_t)(pool_.workers + 1));
        pthread_attr_destroy(&attr);
        if (failed) break; /* fewer workers: the caller does more items */
        pool_.workers++;
    }
    pthread_mutex_unlock(&pool_.mu);
}

#ifndef RTLD_DEFAULT /* glibc declares it only under _GNU_SOURCE on some versions */
#define RTLD_DEFAULT ((void *)0)
#endif
typedef void (*pool_gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);

static _Atomic int pool_omp_state; /* 0 undecided, 1 the pool, 2 the OpenMP team */
static _Atomic(pool_gomp_parallel_fn) pool_omp_fn;

/* A forked child has none of the parent's OpenMP threads, and GNU libgomp's next region would wait
 * for them forever: a child's calls always use the pool (which starts its own workers). Registered
 * when the library loads, so a fork before its first call is covered too. */
static void pool_omp_after_fork_child(void) { atomic_store_explicit(&pool_omp_state, 1, memory_order_release); }
__attribute__((constructor)) static void pool_omp_register_atfork(void) {
    pthread_atfork(NULL, NULL, pool_omp_after_fork_child);
}

/* GOMP_parallel of the process's OpenMP runtime where LOWBIT_THREADS=omp asks for it, else NULL
 * (decided at the first call, without a lock: getenv and dlsym give every racing caller the same). */
static pool_gomp_parallel_fn pool_omp(void) {
    int st = atomic_load_explicit(&pool_omp_state, memory_order_acquire);
    if (st == 0) {
        const char *env = getenv("LOWBIT_THREADS");
        pool_gomp_parallel_fn f = NULL;
        if (env && env[0] == 'o' && env[1] == 'm' && env[2] == 'p' && env[3] == 0)
            f = (pool_gomp_parallel_fn)dlsym(RTLD_DEFAULT, "GOMP_parallel");
        atomic_store_explicit(&pool_omp_fn, f, memory_order_release);
        int expect = 0;
        atomic_compare_exchange_strong(&pool_omp_state, &expect, f ? 2 : 1);
        st = atomic_load_explicit(&pool_omp_state, memory_order_acquire);
    }
    return st == 2 ? atomic_load_explicit(&pool_omp_fn, memory_order_acquire) : NULL;
}

/* 2 where this library's calls run on the process's OpenMP team (LOWBIT_THREADS=omp), else 1. */
int pool_threads_mode(void) { return pool_omp() ? 2 : 1; }

struct pool_omp_job {
    pool_item_fn fn;
    const void *ctx;
    int64_t items;
    _Atomic int64_t next;
};

static void pool_omp_body(void *arg) { /* every thread of the team claims items until none is left */
    struct pool_omp_job *job = arg;
    for (int64_t i; (i = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed)) < job->items;)
        job->fn(job->ctx, i);
}

/* fn(ctx, i) for every i in [0, items), on up to `threads` threads (the caller among them). */
static void pool_run(pool_item_fn fn, const void *ctx, int64_t items, int threads) {
    if (threads > POOL_MAX_WORKERS + 1) threads = POOL_MAX_WORKERS + 1;
    const pool_gomp_parallel_fn omp = threads > 1 && items > 1 ? pool_omp() : NULL;
    /* one call at a time on the pool or the team: a second caller (another Python thread) runs alone */
    if (threads <= 1 || items <= 1 || (!omp && items > POOL_MAX_ITEMS) || pthread_mutex_trylock(&pool_.call) != 0) {
        for (int64_t i = 0; i < items; i++) fn(ctx, i);
        return;
    }
    if (omp) {
        struct pool_omp_job job = {fn, ctx, items, 0};
        omp(pool_omp_body, &job, (unsigned)(threads < items ? threads : items), 0);
        pthread_mutex_unlock(&pool_.call);
        return;
    }
    pool_start_workers(threads - 1);
    pool_.fn = fn, pool_.ctx = ctx;
    atomic_store_explicit(&pool_.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool_.want, threads, memory_order_relaxed);
    if (++pool_.gen == 0) pool_.gen = 1;
    const uint32_t gen = pool_.gen;
    atomic_store_explicit(&pool_.word, (uint64_t)gen << 32 | (uint64_t)items << 16, memory_order_release);
    pthread_mutex_lock(&pool_.mu);
    pool_.posted = gen;
    pthread_cond_broadcast(&pool_.wake);
    pthread_mutex_unlock(&pool_.mu);
    pool_drain(gen);
    for (int spins = 0; atomic_load_explicit(&pool_.done, memory_order_acquire) < items;)
        if (++spins < 64) POOL_RELAX();
        else sched_yield(); /* a claimed item's thread was preempted: let it run */
    pthread_mutex_unlock(&pool_.call);
}
#endif
