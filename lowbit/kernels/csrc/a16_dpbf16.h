/* AVX512_BF16 dot products for bfloat16 calls of the batched W4A16 / W8A16 kernel on CPUs without
 * AMX (included by a16_gemm.c after a16_bf16_pairs.h). Defines A16_DPBF16 (1 where the build has
 * AVX512_BF16), and then a16_dpbf16_run().
 *
 * Why: there, a many-token call used to unpack the whole weight to bfloat16 in memory and hand it
 * to torch's matmul, which packs it again; both passes go through memory, and the matmul already
 * runs near the VDPBF16PS peak, so W4A16 trailed BF16 by those passes (0.93x at 512 tokens of
 * 4096², AMD Zen 4). Here each work item unpacks its 64 rows once per call (per chunk of
 * tokens where a call is split, below) into the channel-pair vectors VDPBF16PS reads
 * (a16_bf16_pairs.h: the same bfloat16 values), kept in L2, and multiplies the caller's bfloat16
 * activations as they are over register tiles of 4 tokens x 64 rows: float32 sums over the
 * whole row, no rescale, one rounding to bfloat16 per output. The arithmetic of torch's bfloat16
 * linear on the unpacked weight (products exact in float32, float32 sums in another order;
 * VDPBF16PS reads subnormal inputs as zero and flushes subnormal sums), so within that path's
 * bound: 2^-8 sum|x w| + 2^-126 sum|w| + the output's rounding (tested). */
#ifndef LOWBIT_A16_DPBF16_H
#define LOWBIT_A16_DPBF16_H
#if A16_BF16_PAIRS
#include <stdatomic.h>
#define A16_DPBF16 1
/* Tokens x DP_NV vectors of 16 rows: 16 accumulators, 4 weight vectors, 1 broadcast. 6 x 4 (24
 * accumulators) was no faster: as an array GCC 12 kept some on the stack, as 24 named variables
 * it ran 0.95-1.01x this (2 threads, Zen 4, 4096² and the default model's shapes, 64-2048 tokens). */
#define DP_MR 4
#define DP_NV 4

struct dp_args {
    const struct a16_weight *W;
    int64_t t, k;        /* tokens; channels of x (the weight's pairs past k meet no activation) */
    int64_t chunk, nch;  /* tokens per item, items per block of rows */
    uint64_t call;       /* this call's number: a thread's unpacked rows are reused only within it */
    const uint16_t *x;   /* [t, k] bfloat16 */
    uint16_t *y;         /* [t, out] bfloat16 */
    _Atomic int failed;  /* an item found no memory for its weight */
};

static __thread uint8_t *dp_buf;
static __thread int64_t dp_cap;
static __thread uint64_t dp_call; /* the call and first row dp_buf holds (call 0: none) */
static __thread int64_t dp_r0;
static _Atomic uint64_t dp_calls;

/* Tokens i0 .. i0 + mr - 1 x nv panels of rows from r0: the whole row's sums, then y. */
static inline __attribute__((always_inline)) void dp_tile(const struct dp_args *D, const uint8_t *pairs, int64_t pb,
                                                          int64_t i0, int64_t r0, const int mr, const int nv) {
    __m512 acc[DP_MR][DP_NV];
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[m][v] = _mm512_setzero_ps();
    const int64_t k = D->k, full = k / 2;
    const uint16_t *x = D->x + i0 * k;
    for (int64_t p = 0; p < full; p++) {
        __m512bh w[DP_NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) w[v] = (__m512bh)_mm512_loadu_si512((const void *)(pairs + v * pb + p * 64));
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(load32(x + m * k + 2 * p));
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], w[v], xb);
        }
    }
    if (k & 1) { /* the last channel alone: its pair's second activation is zero */
        __m512bh w[DP_NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) w[v] = (__m512bh)_mm512_loadu_si512((const void *)(pairs + v * pb + full * 64));
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int32_t)x[m * k + k - 1]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], w[v], xb);
        }
    }
    const int64_t out = D->W->out;
    for (int m = 0; m < mr; m++)
        for (int v = 0; v < nv; v++)
            _mm256_storeu_si256((__m256i *)(D->y + (i0 + m) * out + r0 + v * PANEL),
                                f32_to_bf16_x16(_mm512_castps_si512(acc[m][v])));
}

/* Tokens [i0, i1) against nv panels of rows from r0: tiles of DP_MR tokens, the rest in tiles of 2
 * and 1 (each size a compiled copy). */
static inline __attribute__((always_inline)) void dp_tokens(const struct dp_args *D, const uint8_t *pairs, int64_t pb,
                                                            int64_t i0, int64_t i1, int64_t r0, const int nv) {
    for (int64_t i = i0; i < i1;) {
        const int64_t left = i1 - i;
        if (left >= DP_MR) dp_tile(D, pairs, pb, i, r0, DP_MR, nv), i += DP_MR;
        else if (left >= 2) dp_tile(D, pairs, pb, i, r0, 2, nv), i += 2;
        else dp_tile(D, pairs, pb, i, r0, 1, nv), i += 1;
    }
}

/* One work item: DP_NV panels of rows (fewer at the end) x one chunk of tokens. Items run block of
 * rows by block, so a thread that takes the next chunk of the same rows finds them unpacked. */
static void dp_item(const void *ctx, int64_t item) {
    struct dp_args *D = (struct dp_args *)ctx; /* only `failed` is written, atomically */
    const struct a16_weight *W = D->W;
    const int64_t r0 = item / D->nch * DP_NV * PANEL, pb = W->kp / 2 * 64;
    const int64_t i0 = item % D->nch * D->chunk, i1 = i0 + D->chunk < D->t ? i0 + D->chunk : D->t;
    const int nv = (W->out - r0) / PANEL < DP_NV ? (int)((W->out - r0) / PANEL) : DP_NV;
    if (DP_NV * pb > dp_cap) dp_call = 0; /* a new buffer holds no rows */
    uint8_t *pairs = grow_buffer(&dp_buf, &dp_cap, DP_NV * pb);
    if (!pairs) {
        atomic_store(&D->failed, 1);
        return;
    }
    if (dp_call != D->call || dp_r0 != r0) {
        for (int v = 0; v < nv; v++) bf16_fill(pairs + v * pb, W, r0 + v * PANEL);
        dp_call = D->call, dp_r0 = r0;
    }
    if (nv == DP_NV)
        dp_tokens(D, pairs, pb, i0, i1, r0, DP_NV);
    else /* the last block of a row count that is not a multiple of DP_NV panels: one panel at a time */
        for (int v = 0; v < nv; v++) dp_tokens(D, pairs + v * pb, pb, i0, i1, r0 + v * PANEL, 1);
}

/* Blocks of rows per thread below which a call's tokens are split into chunks of at least
 * DP_MIN_CHUNK, so that every thread has work (576 rows are 9 blocks: on 2 threads one takes 5
 * while the other waits); each chunk of a block another thread takes unpacks its rows again. */
#define DP_ITEMS_PER_THREAD 8
#define DP_MIN_CHUNK 96

/* One call: x [t, k] bfloat16 -> y [t, out] bfloat16. 0 if it ran, -1 out of memory. */
static int a16_dpbf16_run(const struct a16_weight *W, int64_t k, const uint16_t *x, int64_t t, uint16_t *y,
                          int threads) {
    const int64_t blocks = (W->out + DP_NV * PANEL - 1) / (DP_NV * PANEL), want = DP_ITEMS_PER_THREAD * (threads > 1 ? threads : 1);
    int64_t nch = blocks >= want ? 1 : (want + blocks - 1) / blocks;
    if (nch > t / DP_MIN_CHUNK) nch = t / DP_MIN_CHUNK > 1 ? t / DP_MIN_CHUNK : 1;
    int64_t chunk = ((t + nch - 1) / nch + DP_MR - 1) / DP_MR * DP_MR; /* whole tiles */
    nch = (t + chunk - 1) / chunk;
    struct dp_args D = {W, t, k, chunk, nch, atomic_fetch_add(&dp_calls, 1) + 1, x, y, 0};
    pool_run(dp_item, &D, blocks * nch, threads);
    return atomic_load(&D.failed) ? -1 : 0;
}
#else
#define A16_DPBF16 0
#endif
#endif
