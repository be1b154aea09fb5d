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
 */
#ifndef LOWBIT_WORK_POOL_H
#define LOWBIT_WORK_POOL_H
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
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

/* fn(ctx, i) for every i in [0, items), on up to `threads` threads (the caller among them). */
static void pool_run(pool_item_fn fn, const void *ctx, int64_t items, int threads) {
    if (threads > POOL_MAX_WORKERS + 1) threads = POOL_MAX_WORKERS + 1;
    if (threads <= 1 || items <= 1 || items > POOL_MAX_ITEMS || pthread_mutex_trylock(&pool_.call) != 0) {
        for (int64_t i = 0; i < items; i++) fn(ctx, i);
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
