/* A layer's input reorder, row by row: dst[j] = src[perm[j]]. lowbit's permutations (Atom's
 * reorder, lowbit/quantize/outliers.py) keep the normal channels in their order and put the outlier
 * channels last, so perm[0:lead] rises for most of the row. That part is the row with the other
 * channels left out: AVX-512 compresses 16 values a step by a mask (vpcompressd), AVX2 moves 8 by a
 * per-step lane index (vpermd), where a vector gather reads one value a cycle on Zen 4. The rest,
 * perm[lead:], is gathered. Any permutation works (lead is 1 for one that never rises); the same
 * values land in the same places, so the same bits as a plain gather. */
#ifndef LOWBIT_ROW_ORDER_H
#define LOWBIT_ROW_ORDER_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && !defined(PANEL_NO_SIMD)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(PANEL_NO_SIMD)
#define ROW_ORDER_STEP 16 /* 16-bit masked loads and stores: BW and VL */
#elif defined(__AVX2__) && !defined(PANEL_NO_SIMD)
#define ROW_ORDER_STEP 8
#else
#define ROW_ORDER_STEP 0 /* the portable build gathers every value */
#endif

struct row_order {
    const int32_t *perm; /* [n], each in [0, n) */
    int64_t n, lead;     /* perm[0:lead] rises; 0 in the portable build (all gathered) */
    uint16_t *keep;      /* [ceil(n / STEP)]: bit c of step s set when channel STEP * s + c is in perm[0:lead] */
#if ROW_ORDER_STEP == 8
    uint64_t *lanes;     /* [ceil(n / 8)]: byte c = the lane of the step's c-th kept channel */
#endif
};

/* The plan of perm (already checked to lie in [0, n)); 0, or -1 if out of memory. */
static inline int row_order_plan(struct row_order *R, const int32_t *perm, int64_t n) {
    memset(R, 0, sizeof *R);
    R->perm = perm, R->n = n;
#if ROW_ORDER_STEP
    int64_t lead = n > 0;
    while (lead < n && perm[lead] > perm[lead - 1]) lead++;
    const int64_t steps = (n + ROW_ORDER_STEP - 1) / ROW_ORDER_STEP;
    R->keep = calloc((size_t)steps + 1, sizeof(uint16_t));
    if (!R->keep) return -1;
    for (int64_t j = 0; j < lead; j++) R->keep[perm[j] / ROW_ORDER_STEP] |= (uint16_t)(1u << (perm[j] % ROW_ORDER_STEP));
#if ROW_ORDER_STEP == 8
    R->lanes = calloc((size_t)steps + 1, sizeof(uint64_t));
    if (!R->lanes) {
        free(R->keep), R->keep = NULL;
        return -1;
    }
    for (int64_t s = 0; s < steps; s++)
        for (int c = 0, at = 0; c < 8; c++)
            if (R->keep[s] >> c & 1) R->lanes[s] |= (uint64_t)c << (8 * at++);
#endif
    R->lead = lead;
#endif
    return 0;
}

static inline void row_order_free(struct row_order *R) {
    free(R->keep);
#if ROW_ORDER_STEP == 8
    free(R->lanes);
    R->lanes = NULL;
#endif
    R->keep = NULL;
}

/* perm[a:] gathered into dst[a:], elements of 2 (bf16) or 4 bytes. With vector gathers where the
 * build has them: a bf16 element is the low half of the 4 bytes read at its address, so the last
 * element of a row may read 2 bytes past it (past_end: the caller says those exist: the next
 * token's row). */
static inline void gather_from(const void *src, int bf16, int64_t a, int64_t n, const int32_t *perm, int past_end,
                               void *dst) {
    int64_t j = a;
#if defined(__AVX512F__) && !defined(PANEL_NO_SIMD)
    if (bf16 && past_end)
        for (; j + 16 <= n; j += 16)
            _mm256_storeu_si256((__m256i *)((uint16_t *)dst + j),
                                _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(_mm512_loadu_si512(perm + j), src, 2)));
    else if (!bf16)
        for (; j + 16 <= n; j += 16)
            _mm512_storeu_si512((uint32_t *)dst + j, _mm512_i32gather_epi32(_mm512_loadu_si512(perm + j), src, 4));
#elif defined(__AVX2__) && !defined(PANEL_NO_SIMD)
    if (bf16 && past_end) {
        const __m256i low = _mm256_set1_epi32(0xFFFF);
        for (; j + 16 <= n; j += 16) {
            __m256i p = _mm256_and_si256(_mm256_i32gather_epi32(src, _mm256_loadu_si256((const __m256i *)(perm + j)), 2), low);
            __m256i q = _mm256_and_si256(_mm256_i32gather_epi32(src, _mm256_loadu_si256((const __m256i *)(perm + j + 8)), 2), low);
            _mm256_storeu_si256((__m256i *)((uint16_t *)dst + j), _mm256_permute4x64_epi64(_mm256_packus_epi32(p, q), 0xD8));
        }
    } else if (!bf16) {
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_si256((__m256i *)((uint32_t *)dst + j),
                                _mm256_i32gather_epi32(src, _mm256_loadu_si256((const __m256i *)(perm + j)), 4));
    }
#endif
    if (bf16) /* typed copies: a memcpy of a run-time size per value was a call per value (0.6 ns each) */
        for (; j < n; j++) ((uint16_t *)dst)[j] = ((const uint16_t *)src)[perm[j]];
    else
        for (; j < n; j++) ((uint32_t *)dst)[j] = ((const uint32_t *)src)[perm[j]];
}

/* dst[0:lead]: the row's kept channels in order. A step may write up to STEP - 1 values past what it
 * keeps (AVX2 stores whole vectors while they end inside the row); later steps and the gather of
 * perm[lead:] overwrite them, and nothing is written past the row. */
static inline void compress_lead(const void *src, int bf16, const struct row_order *R, void *dst) {
    const int64_t n = R->n;
    int64_t pos = 0;
#if ROW_ORDER_STEP == 16
    for (int64_t s = 0; s < n && pos < R->lead; s += 16) {
        const __mmask16 m = R->keep[s / 16];
        if (!m) continue;
        const __mmask16 in = n - s >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - s)) - 1);
        const int c = __builtin_popcount(m);
        const __mmask16 out = (__mmask16)(c == 16 ? 0xFFFF : (1u << c) - 1);
        if (bf16) {
            __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(in, (const uint16_t *)src + s));
            _mm256_mask_storeu_epi16((uint16_t *)dst + pos, out, _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(m, v)));
        } else {
            __m512 v = _mm512_maskz_loadu_ps(in, (const float *)src + s);
            _mm512_mask_storeu_ps((float *)dst + pos, out, _mm512_maskz_compress_ps(m, v));
        }
        pos += c;
    }
#elif ROW_ORDER_STEP == 8
    int64_t s = 0;
    for (; s + 8 <= n && pos + 8 <= n && pos < R->lead; s += 8) {
        const unsigned m = R->keep[s / 8];
        if (!m) continue;
        const __m256i lanes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(R->lanes + s / 8)));
        if (bf16) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + s)));
            v = _mm256_permutevar8x32_epi32(v, lanes);
            v = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0xD8);
            _mm_storeu_si128((__m128i *)((uint16_t *)dst + pos), _mm256_castsi256_si128(v));
        } else {
            __m256i v = _mm256_loadu_si256((const __m256i *)((const uint32_t *)src + s));
            _mm256_storeu_si256((__m256i *)((uint32_t *)dst + pos), _mm256_permutevar8x32_epi32(v, lanes));
        }
        pos += __builtin_popcount(m);
    }
    for (; s < n && pos < R->lead; s++) /* the row's end: value by value */
        if (R->keep[s / 8] >> (s % 8) & 1) {
            if (bf16)
                ((uint16_t *)dst)[pos++] = ((const uint16_t *)src)[s];
            else
                ((uint32_t *)dst)[pos++] = ((const uint32_t *)src)[s];
        }
#endif
    (void)src, (void)bf16, (void)dst, (void)n, (void)pos;
}

/* One token's row reordered: dst[j] = src[perm[j]] for j in [0, n). */
static inline void order_row(const void *src, int bf16, const struct row_order *R, int past_end, void *dst) {
    compress_lead(src, bf16, R, dst);
    gather_from(src, bf16, R->lead, R->n, R->perm, past_end, dst);
}
#endif
