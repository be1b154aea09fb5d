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
 * its first call. LOWBIT_THREADS=pool keeps the pool, which holds up better when another process
 * takes a core: there the team's join waits for a thread that shares its core with the other
 * process, a time slice of milliseconds (GOMP's spin after a region, ~4-9 ms on the AMX Xeon,
 * keeps that thread runnable). The default, LOWBIT_THREADS=auto, takes the team while it answers
 * and the pool for a while after two regions in a row whose last thread came POOL_LATE_NS or more
 * after the items ran out and later than four items take on average (a descheduled thread, not a
 * long item; one such region alone happens on a quiet machine too, about one call in 30 measured
 * on the AMX Xeon VM): 0.1 s, doubled up to 3.2 s while the team keeps coming late, so that a busy
 * machine's late calls cost little, and back to 0.1 s after a region on time. One level down, the
 * same rule for the pool: two pool calls in a row whose worker was preempted while holding a claimed
 * item (the caller waited out the other process's time slice for it) run the next calls on the
 * caller alone, for the same backoff: twice a quiet call's time on two cores, not a time slice.
 */
#ifndef LOWBIT_WORK_POOL_H
#define LOWBIT_WORK_POOL_H
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
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

static _Atomic int pool_omp_state; /* 0 undecided, 1 the pool, 2 the OpenMP team, 3 auto */
static _Atomic(pool_gomp_parallel_fn) pool_omp_fn;

#define POOL_LATE_NS 500000LL          /* auto: a straggle this long is a descheduled thread ... */
#define POOL_BACKOFF_NS 100000000LL    /* ... and calls take the pool this long before the team again, */
#define POOL_BACKOFF_MAX 3200000000LL  /* doubled up to this while the team keeps coming late */
static _Atomic int64_t pool_team_resume_ns; /* auto: calls before this time take the pool */
static _Atomic int64_t pool_backoff_ns = POOL_BACKOFF_NS;
#ifndef POOL_LATE_RUN
#define POOL_LATE_RUN 2 /* late regions in a row before the pool */
#endif
static _Atomic int pool_late_run; /* auto: late regions in a row */
/* auto, one level down: when the pool's own worker comes late too (preempted while it holds a claimed
 * item, so the caller waits out the other process's time slice), calls run on the caller alone for a
 * while: at worst twice a quiet call's time on two cores, never a time slice */
static _Atomic int64_t pool_solo_resume_ns;
static _Atomic int64_t pool_solo_backoff_ns = POOL_BACKOFF_NS;
static _Atomic int pool_pool_late_run;
/* auto: calls on the team, on the pool, team calls found late, pool calls found late, calls run alone */
static _Atomic int64_t pool_counts[5];

static int64_t pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A forked child has none of the parent's OpenMP threads, and GNU libgomp's next region would wait
 * for them forever: a child's calls always use the pool (which starts its own workers). Registered
 * when the library loads, so a fork before its first call is covered too. */
static void pool_omp_after_fork_child(void) { atomic_store_explicit(&pool_omp_state, 1, memory_order_release); }
__attribute__((constructor)) static void pool_omp_register_atfork(void) {
    pthread_atfork(NULL, NULL, pool_omp_after_fork_child);
}

/* The mode (1 pool, 2 team, 3 auto) and, for 2 and 3, GOMP_parallel of the process's OpenMP
 * runtime (decided at the first call, without a lock: getenv and dlsym give every racing caller the
 * same). LOWBIT_THREADS=pool or no OpenMP runtime loaded: the pool; omp: the team; else auto. */
static int pool_mode(pool_gomp_parallel_fn *fn) {
    int st = atomic_load_explicit(&pool_omp_state, memory_order_acquire);
    if (st == 0) {
        const char *env = getenv("LOWBIT_THREADS");
        const int pool = env && env[0] == 'p' && env[1] == 'o' && env[2] == 'o' && env[3] == 'l' && env[4] == 0;
        const int omp = env && env[0] == 'o' && env[1] == 'm' && env[2] == 'p' && env[3] == 0;
        pool_gomp_parallel_fn f = pool ? NULL : (pool_gomp_parallel_fn)dlsym(RTLD_DEFAULT, "GOMP_parallel");
        atomic_store_explicit(&pool_omp_fn, f, memory_order_release);
        int expect = 0;
        atomic_compare_exchange_strong(&pool_omp_state, &expect, !f ? 1 : omp ? 2 : 3);
        st = atomic_load_explicit(&pool_omp_state, memory_order_acquire);
    }
    *fn = st >= 2 ? atomic_load_explicit(&pool_omp_fn, memory_order_acquire) : NULL;
    return st;
}

/* 1 where this library's calls run on its own pool (LOWBIT_THREADS=pool, no OpenMP runtime in the
 * process, or a forked child), 2 on the process's OpenMP team (omp), 3 auto (the default). */
int pool_threads_mode(void) {
    pool_gomp_parallel_fn f;
    return pool_mode(&f);
}

/* auto's record in this library: calls on the team, calls on the pool, team calls found late, pool
 * calls found late, calls run on the caller alone. */
void pool_auto_counts(int64_t out[5]) {
    for (int i = 0; i < 5; i++) out[i] = atomic_load_explicit(&pool_counts[i], memory_order_relaxed);
}

struct pool_omp_job {
    pool_item_fn fn;
    const void *ctx;
    int64_t items;
    _Atomic int64_t next;
    int timed;                 /* auto: note when the items ran out */
    _Atomic int64_t drained_ns;
};

static void pool_omp_body(void *arg) { /* every thread of the team claims items until none is left */
    struct pool_omp_job *job = arg;
    for (int64_t i; (i = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed)) < job->items;)
        job->fn(job->ctx, i);
    if (job->timed && atomic_load_explicit(&job->drained_ns, memory_order_relaxed) == 0) {
        int64_t none = 0; /* the first thread to find none left: the others only finish or arrive now */
        atomic_compare_exchange_strong(&job->drained_ns, &none, pool_now_ns());
    }
}

/* auto: after a call that ended at `end` and whose items ran out at `drained` (0: not noted), items
 * of `item` ns on average: two calls in a row whose last thread came late send the next calls down a
 * level (team -> pool, pool -> the caller alone) until *resume, for a backoff that doubles while
 * they keep coming late. */
static void pool_note_lateness(int64_t end, int64_t drained, int64_t item, _Atomic int *run, _Atomic int64_t *resume,
                               _Atomic int64_t *backoff_ns, int late_count) {
    const int64_t late = end - drained, backoff = atomic_load_explicit(backoff_ns, memory_order_relaxed);
    if (drained && late >= POOL_LATE_NS && late > 4 * item) {
        atomic_fetch_add_explicit(&pool_counts[late_count], 1, memory_order_relaxed);
        if (atomic_fetch_add_explicit(run, 1, memory_order_relaxed) + 1 < POOL_LATE_RUN) return;
        atomic_store_explicit(resume, end + backoff, memory_order_relaxed);
        if (backoff < POOL_BACKOFF_MAX) atomic_store_explicit(backoff_ns, 2 * backoff, memory_order_relaxed);
    } else {
        atomic_store_explicit(run, 0, memory_order_relaxed);
        if (backoff != POOL_BACKOFF_NS) atomic_store_explicit(backoff_ns, POOL_BACKOFF_NS, memory_order_relaxed);
    }
}

/* The items on the team; auto: a region whose last thread came late sends the next calls to the pool. */
static void pool_team_run(pool_gomp_parallel_fn omp, int mode, pool_item_fn fn, const void *ctx, int64_t items,
                          int threads) {
    struct pool_omp_job job = {fn, ctx, items, 0, mode == 3, 0};
    const int64_t start = mode == 3 ? pool_now_ns() : 0, team = threads < items ? threads : items;
    omp(pool_omp_body, &job, (unsigned)team, 0);
    if (mode != 3) return;
    atomic_fetch_add_explicit(&pool_counts[0], 1, memory_order_relaxed);
    const int64_t end = pool_now_ns(), drained = atomic_load_explicit(&job.drained_ns, memory_order_relaxed);
    pool_note_lateness(end, drained, (drained - start) * team / items, &pool_late_run, &pool_team_resume_ns,
                       &pool_backoff_ns, 2);
}

/* fn(ctx, i) for every i in [0, items), on up to `threads` threads (the caller among them). */
static void pool_run(pool_item_fn fn, const void *ctx, int64_t items, int threads) {
    if (threads > POOL_MAX_WORKERS + 1) threads = POOL_MAX_WORKERS + 1;
    pool_gomp_parallel_fn omp = NULL;
    const int mode = threads > 1 && items > 1 ? pool_mode(&omp) : 1;
    int solo = 0;
    if (mode == 3) { /* the clock is read only once the team has come late at all */
        const int64_t resume = atomic_load_explicit(&pool_team_resume_ns, memory_order_relaxed);
        const int64_t solo_until = atomic_load_explicit(&pool_solo_resume_ns, memory_order_relaxed);
        const int64_t now = resume || solo_until ? pool_now_ns() : 0;
        if (resume && now < resume) omp = NULL;
        solo = !omp && solo_until && now < solo_until;
        if (solo) atomic_fetch_add_explicit(&pool_counts[4], 1, memory_order_relaxed);
    }
    /* one call at a time on the pool or the team: a second caller (another Python thread) runs alone */
    if (solo || threads <= 1 || items <= 1 || (!omp && items > POOL_MAX_ITEMS) || pthread_mutex_trylock(&pool_.call) != 0) {
        for (int64_t i = 0; i < items; i++) fn(ctx, i);
        return;
    }
    if (omp) {
        pool_team_run(omp, mode, fn, ctx, items, threads);
        pthread_mutex_unlock(&pool_.call);
        return;
    }
    const int64_t start = mode == 3 ? pool_now_ns() : 0;
    if (mode == 3) atomic_fetch_add_explicit(&pool_counts[1], 1, memory_order_relaxed);
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
    const int64_t drained = mode == 3 ? pool_now_ns() : 0;
    for (int spins = 0; atomic_load_explicit(&pool_.done, memory_order_acquire) < items;)
        if (++spins < 64) POOL_RELAX();
        else sched_yield(); /* a claimed item's thread was preempted: let it run */
    pthread_mutex_unlock(&pool_.call);
    if (mode == 3) {
        pool_note_lateness(pool_now_ns(), drained, (drained - start) * threads / items, &pool_pool_late_run,
                           &pool_solo_resume_ns, &pool_solo_backoff_ns, 3);
    }
}

/* A check of the threading itself (tests/kernels/cpu/test_work_pool.py): `items` items on `threads`
 * threads, each item sleeping caller_us on the calling thread and other_us on any other. Returns
 * how many the caller ran. */
struct pool_probe_job {
    pthread_t caller;
    int64_t caller_us, other_us;
    _Atomic int64_t by_caller;
};

static void pool_probe_item(const void *ctx, int64_t item) {
    struct pool_probe_job *J = (struct pool_probe_job *)ctx; /* only the atomic count is written */
    (void)item;
    const int mine = pthread_equal(pthread_self(), J->caller);
    const int64_t us = mine ? J->caller_us : J->other_us;
    struct timespec ts = {us / 1000000, us % 1000000 * 1000};
    nanosleep(&ts, NULL);
    if (mine) atomic_fetch_add_explicit(&J->by_caller, 1, memory_order_relaxed);
}

int64_t pool_probe(int64_t items, int threads, int64_t caller_us, int64_t other_us) {
    struct pool_probe_job J = {pthread_self(), caller_us, other_us, 0};
    pool_run(pool_probe_item, &J, items, threads);
    return atomic_load(&J.by_caller);
}
#endif
