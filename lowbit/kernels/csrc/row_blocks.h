/* Shared by the native GEMV kernels: output rows in blocks of 4, handed out in work items of 16
 * blocks (64 rows: small enough to balance two cores on the default model's 192-row layers) over
 * OpenMP threads when the build has them. Rows never split, so the result is the same bits for
 * any thread count. */
#ifndef LOWBIT_ROW_BLOCKS_H
#define LOWBIT_ROW_BLOCKS_H
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
/* The 4 lane sums of 4 int32 vectors: [sum(a0), sum(a1), sum(a2), sum(a3)] (exact). */
static inline __m128i hsum4x8(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
#endif

typedef void (*row_blocks_fn)(const void *ctx, int64_t b0, int64_t b1);

static void for_row_blocks(int64_t out, int threads, row_blocks_fn fn, const void *ctx) {
    const int64_t per_item = 16, nblocks = out / 4, items = (nblocks + per_item - 1) / per_item;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && items > 1)
#endif
    for (int64_t it = 0; it < items; it++) {
        int64_t b0 = it * per_item;
        fn(ctx, b0, b0 + per_item < nblocks ? b0 + per_item : nblocks);
    }
}
#endif
