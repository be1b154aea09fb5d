/* Shared by the native GEMV kernels: output rows in blocks of 4, handed out in work items of 16
 * blocks (64 rows: small enough to balance two cores on the default model's 192-row layers) to the
 * work pool's threads (work_pool.h). Rows never split, so the result is the same bits for any
 * thread count. */
#ifndef LOWBIT_ROW_BLOCKS_H
#define LOWBIT_ROW_BLOCKS_H
#include <stdint.h>

#include "work_pool.h"
#if defined(__AVX2__)
#include <immintrin.h>
/* acc + the pairwise int16 products of a and b, summed in int32 lanes: one VNNI instruction
 * (vpdpwssd, non-saturating) where the build has it, else vpmaddwd + vpaddd; the same integers. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define MADD_ACC(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#elif defined(__AVXVNNI__)
#define MADD_ACC(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#else
#define MADD_ACC(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))
#endif
/* The 4 lane sums of 4 int32 vectors: [sum(a0), sum(a1), sum(a2), sum(a3)] (exact). */
static inline __m128i hsum4x8(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
#endif

typedef void (*row_blocks_fn)(const void *ctx, int64_t b0, int64_t b1);

struct row_blocks {
    row_blocks_fn fn;
    const void *ctx;
    int64_t nblocks;
};

#define ROW_BLOCKS_PER_ITEM 16

static void row_blocks_item(const void *ctx, int64_t it) {
    const struct row_blocks *r = ctx;
    int64_t b0 = it * ROW_BLOCKS_PER_ITEM, b1 = b0 + ROW_BLOCKS_PER_ITEM;
    r->fn(r->ctx, b0, b1 < r->nblocks ? b1 : r->nblocks);
}

static void for_row_blocks(int64_t out, int threads, row_blocks_fn fn, const void *ctx) {
    const struct row_blocks r = {fn, ctx, out / 4};
    pool_run(row_blocks_item, &r, (r.nblocks + ROW_BLOCKS_PER_ITEM - 1) / ROW_BLOCKS_PER_ITEM, threads);
}
#endif
