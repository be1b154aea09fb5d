/* AVX2 + F16C versions of the per-row steps of qr_codec.c, used when the compiler targets them
 * (-march=native on a machine that has them). Every step does the same IEEE operations as the
 * portable code (fp32 divide, round half to even, fp16 round to nearest even), so both builds
 * write the same bits; tests compare the two builds and the torch reference.
 *
 * Why: the portable code spends most of its time in the per-block scalar chain absmax -> argmax
 * -> divide -> fp16 round -> compare; here the 64 scales of a row are computed 8 at a time and
 * the first index of the block maximum comes from a movemask instead of a second pass. */
#include <immintrin.h>

#define QR_SIMD 1

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "qr_avx512.h"
#endif

/* Signed absmax (the first element of largest magnitude, as argmax picks) and the magnitude
 * bits of each block of a row; magnitude bits >= 0x7F800000 mean NaN/Inf in the block. */
static inline void simd_row_absmax(const float *buf, float *amax, int32_t *mbits) {
    const __m256i am = _mm256_set1_epi32(0x7FFFFFFF);
    for (int b = 0; b < NBLK; b++) {
        const float *x = buf + b * BLK;
        __m256i a0 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)x), am);
        __m256i a1 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 8)), am);
        __m256i a2 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 16)), am);
        __m256i a3 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + 24)), am);
        /* magnitudes are non-negative int32: the signed max orders them like the floats */
        __m256i m = _mm256_max_epi32(_mm256_max_epi32(a0, a1), _mm256_max_epi32(a2, a3));
        m = _mm256_max_epi32(m, _mm256_permute2x128_si256(m, m, 1));
        m = _mm256_max_epi32(m, _mm256_shuffle_epi32(m, 0x4E));
        m = _mm256_max_epi32(m, _mm256_shuffle_epi32(m, 0xB1));
        uint32_t mask = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a0, m)))
                        | (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a1, m))) << 8
                        | (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a2, m))) << 16
                        | (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a3, m))) << 24;
        amax[b] = x[__builtin_ctz(mask)];
        mbits[b] = _mm256_cvtsi256_si32(m);
    }
}

/* fp16 scale bits of the 64 blocks of a row (written to ``scales``), their float values and a
 * bad flag (-1: non-finite block or scale beyond fp16; scale NaN). kind 0: integer, 1: FP4. */
/* fp16 scale bits of 8 blocks from their signed absmax a and non-finite mask (written to
 * ``scales``), their float values and a bad flag (-1: non-finite block or scale beyond fp16;
 * scale NaN). kind 0: integer, 1: FP4. */
static inline void simd_scales8(int kind, int qmin, __m256 a, __m256i nonfinite, uint16_t *scales, float *s, int16_t *bad) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m128i h7fff = _mm_set1_epi16(0x7FFF), hinf = _mm_set1_epi16(0x7C00);
    const __m128i hone = _mm_set1_epi16((short)HALF_ONE), hnan = _mm_set1_epi16((short)HALF_NAN);
    __m256 s32 = kind == 0 ? _mm256_div_ps(a, _mm256_set1_ps((float)qmin))
                           : _mm256_div_ps(_mm256_and_ps(a, absmask), _mm256_set1_ps(6.0f));
    __m128i h = _mm256_cvtps_ph(s32, _MM_FROUND_TO_NEAREST_INT);
    if (kind == 0) { /* fp16 rounding shrank the scale: one step away from zero */
        __m256 back = _mm256_cvtph_ps(h);
        __m256i shrunk = _mm256_castps_si256(
            _mm256_cmp_ps(_mm256_and_ps(back, absmask), _mm256_and_ps(s32, absmask), _CMP_LT_OQ));
        h = _mm_sub_epi16(h, _mm_packs_epi32(_mm256_castsi256_si128(shrunk), _mm256_extracti128_si256(shrunk, 1)));
    }
    __m128i habs = _mm_and_si128(h, h7fff);
    __m128i b16 = _mm_or_si128(_mm_packs_epi32(_mm256_castsi256_si128(nonfinite), _mm256_extracti128_si256(nonfinite, 1)),
                               _mm_cmpeq_epi16(habs, hinf));
    h = _mm_blendv_epi8(h, hone, _mm_cmpeq_epi16(habs, _mm_setzero_si128()));
    h = _mm_blendv_epi8(h, hnan, b16);
    _mm_storeu_si128((__m128i *)scales, h);
    _mm256_storeu_ps(s, _mm256_cvtph_ps(h));
    _mm_storeu_si128((__m128i *)bad, b16);
}

/* The 64 blocks of a row, 8 at a time (see simd_scales8). */
static inline void simd_row_scales(int kind, int qmin, const float *amax, const int32_t *mbits,
                                   uint16_t *scales, float *s, int16_t *bad) {
    for (int k = 0; k < NBLK; k += 8) {
        __m256i nonfinite = _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(mbits + k)),
                                               _mm256_set1_epi32(0x7F7FFFFF));
        simd_scales8(kind, qmin, _mm256_loadu_ps(amax + k), nonfinite, scales + k, s + k, bad + k);
    }
}

/* 4 vectors of int32 codes 0..255 -> 32 bytes in order. */
static inline void simd_store_codes(__m256i q0, __m256i q1, __m256i q2, __m256i q3, uint8_t *c) {
    __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)c, b);
}

static inline __m256i simd_int_code(__m256 x, __m256 sv, __m256 lo, __m256 hi, __m256 bias) {
    __m256 q = _mm256_round_ps(_mm256_div_ps(x, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_add_ps(_mm256_min_ps(_mm256_max_ps(q, lo), hi), bias); /* integral: clamp in float is exact */
    return _mm256_cvttps_epi32(q);
}

/* E2M1 index of |v| by rounding on the grid's own spacing: rint(2|v|) below 2 (steps of 0.5),
 * 2 + rint(|v|) in [2, 4), 4 + rint(|v| / 2) from 4 on, capped at 7 (6.0). The scalings are
 * exact and rint rounds half to even, so the ties land where the portable compare chain puts
 * them (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0).
 * NaN (a bad block) gives index 0, like the compares. */
static inline __m256i simd_fp4_code(__m256 x, __m256 sv) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 v = _mm256_div_ps(x, sv), a = _mm256_and_ps(v, absmask);
    __m256 lt2 = _mm256_cmp_ps(a, _mm256_set1_ps(2.0f), _CMP_LT_OQ), lt4 = _mm256_cmp_ps(a, _mm256_set1_ps(4.0f), _CMP_LT_OQ);
    __m256 m = _mm256_blendv_ps(_mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f), lt4), _mm256_set1_ps(2.0f), lt2);
    __m256 r = _mm256_round_ps(_mm256_mul_ps(a, m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(r, _mm256_set1_ps(8.0f)); /* only the last range goes past 4: keeps cvtt in range */
    /* offset 4 + 2 lt2 + 2 lt4 (masks are -1): 0, 2 or 4 */
    __m256i off = _mm256_add_epi32(_mm256_set1_epi32(4),
                                   _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(lt2), _mm256_castps_si256(lt4)), 1));
    __m256i idx = _mm256_min_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(r), off), _mm256_set1_epi32(7));
    idx = _mm256_and_si256(idx, _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_ORD_Q))); /* NaN: 0 */
    __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
    return _mm256_or_si256(idx, _mm256_and_si256(neg, _mm256_set1_epi32(8)));
}

/* Codes of one finite block with scale s. */
static inline void simd_block_codes(int kind, int qmin, int qmax, int bias, const float *x, float s, uint8_t *c) {
#ifdef QR_SIMD512
    if (kind == 0) {
        simd512_int_codes(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16), s, qmin, qmax, bias, c);
        return;
    }
#endif
    const __m256 sv = _mm256_set1_ps(s);
    __m256i q[4];
    if (kind == 0) {
        const __m256 lo = _mm256_set1_ps((float)qmin), hi = _mm256_set1_ps((float)qmax), bv = _mm256_set1_ps((float)bias);
        for (int i = 0; i < 4; i++) q[i] = simd_int_code(_mm256_loadu_ps(x + 8 * i), sv, lo, hi, bv);
    } else {
        for (int i = 0; i < 4; i++) q[i] = simd_fp4_code(_mm256_loadu_ps(x + 8 * i), sv);
    }
    simd_store_codes(q[0], q[1], q[2], q[3], c);
}

/* bf16 input (the all-reduce's usual dtype) straight from the caller's row: the block maxima,
 * scales, codes and, for 4-bit codes, the packed bytes, without widening the row to fp32 first.
 * A bf16 value is the top half of its fp32, so its magnitude bits order like the fp32 ones. */

/* Per 128-bit lane: the max of each of 8 vectors of 16-bit lanes, in one vector (lane i: v[i]).
 * A transpose-and-max tree: 23 instructions for 8 blocks instead of a shuffle chain per block. */
#define QR_HMAX8(name, MAX)                                                                       \
    static inline __m128i name(const __m256i *v) {                                                \
        __m256i r[4], t[2];                                                                       \
        for (int i = 0; i < 4; i++)                                                               \
            r[i] = MAX(_mm256_unpacklo_epi16(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_epi16(v[2 * i], v[2 * i + 1])); \
        for (int i = 0; i < 2; i++)                                                               \
            t[i] = MAX(_mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]), _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1])); \
        __m256i u = MAX(_mm256_unpacklo_epi64(t[0], t[1]), _mm256_unpackhi_epi64(t[0], t[1]));   \
        return MAX##_128(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));              \
    }
#define qr_max_epu16 _mm256_max_epu16
#define qr_max_epu16_128 _mm_max_epu16
#define qr_max_epi16 _mm256_max_epi16
#define qr_max_epi16_128 _mm_max_epi16
QR_HMAX8(simd_hmax8_epu16, qr_max_epu16)
QR_HMAX8(simd_hmax8_epi16, qr_max_epi16)
#undef QR_HMAX8

/* Signed absmax (bf16 bits) of 8 blocks of 32 bf16 values. No argmax: as unsigned, the largest
 * value is the negative one of largest magnitude (if any), as signed the positive one (if any);
 * the larger magnitude of the two wins, and only an exact +-tie needs the first index. */
static inline __m128i simd_absmax8_bf16(const uint16_t *x) {
    __m256i u[8], g[8];
    for (int j = 0; j < 8; j++) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + BLK * j));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + BLK * j + 16));
        u[j] = _mm256_max_epu16(x0, x1);
        g[j] = _mm256_max_epi16(x0, x1);
    }
    __m128i um = simd_hmax8_epu16(u), gm = simd_hmax8_epi16(g); /* gm: signed max */
    __m128i umag = _mm_and_si128(um, _mm_set1_epi16(0x7FFF));
    /* um == gm: one sign only, um is it. Else um = -N, gm = +P: P > N picks gm, N > P um. */
    __m128i amax = _mm_blendv_epi8(um, gm, _mm_cmpgt_epi16(gm, umag));
    __m128i tie = _mm_andnot_si128(_mm_cmpeq_epi16(um, gm), _mm_cmpeq_epi16(gm, umag));
    uint32_t tm = (uint32_t)_mm_movemask_epi8(tie) & 0x5555u;
    if (tm) { /* +m and -m both in a block: the first one decides, like argmax */
        uint16_t a[8];
        _mm_storeu_si128((__m128i *)a, amax);
        for (; tm; tm &= tm - 1) {
            int j = __builtin_ctz(tm) / 2;
            const uint16_t *b = x + BLK * j;
            int i = 0;
            while ((b[i] & 0x7FFF) != (a[j] & 0x7FFF)) i++;
            a[j] = b[i];
        }
        amax = _mm_loadu_si128((const __m128i *)a);
    }
    return amax;
}

/* Codes of one block of bf16 values with scale vector sv, as bytes in the order of
 * packus(packs(..)) of the widened halves: lane 0 codes 0-7, 16-23, lane 1 codes 8-15, 24-31.
 * A bad block has s = NaN, which gives code 0 everywhere (max/min return the bound for NaN,
 * the FP4 compares are false), the zeros the portable code writes. */
static inline __m256i simd_block_bytes_bf16(int kind, const uint16_t *x, __m256 sv, __m256 lo, __m256 hi, __m256 bv) {
    const __m256i z = _mm256_setzero_si256();
    __m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = _mm256_loadu_si256((const __m256i *)(x + 16));
    __m256 f[4] = {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x0)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x0)),
                   _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x1)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x1))};
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = kind == 0 ? simd_int_code(f[i], sv, lo, hi, bv) : simd_fp4_code(f[i], sv);
    /* unpack{lo,hi} then packs undo each other per lane: codes of x0 and of x1 come back in order */
    return _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
}

/* One full row of bf16 input: scales into orow + code_bytes; returns 1 when the codes are
 * packed into orow already (4-bit codes), 0 when ``codes`` holds them in order for pack_planes,
 * -1 when a block needs an extended scale (nothing usable written: encode the row generally). */
static inline int simd_encode_row_bf16(const uint16_t *x, int kind, int bits, uint8_t *orow, int64_t code_bytes,
                                       uint8_t *codes) {
    const int qmin = -(1 << (bits - 1)), nib = kind == 1 || bits == 4;
    const __m256 lo = _mm256_set1_ps((float)qmin), hi = _mm256_set1_ps((float)((1 << (bits - 1)) - 1));
    const __m256 bv = _mm256_set1_ps((float)(1 << (bits - 1)));
    const __m256i nib_mul = _mm256_set1_epi16(0x1001), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    uint16_t *scales = (uint16_t *)(orow + code_bytes);
    float s[8];
    int16_t bad[8];
    for (int k = 0; k < NBLK; k += 8) { /* 8 blocks (512 bytes of input) at a time, still in L1 */
        const uint16_t *xk = x + k * BLK;
        __m128i amax = simd_absmax8_bf16(xk);
        __m256i a32 = _mm256_slli_epi32(_mm256_cvtepu16_epi32(amax), 16);
        __m256i nonfinite = _mm256_cvtepi16_epi32(
            _mm_cmpgt_epi16(_mm_and_si128(amax, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x7F7F)));
        simd_scales8(kind, qmin, _mm256_castsi256_ps(a32), nonfinite, scales + k, s, bad);
        __m128i nf16 = _mm_packs_epi32(_mm256_castsi256_si128(nonfinite), _mm256_extracti128_si256(nonfinite, 1));
        if (_mm_movemask_epi8(_mm_andnot_si128(nf16, _mm_loadu_si128((const __m128i *)bad))))
            return -1; /* a finite block beyond the fp16 scale range: the caller's general path */
        if (nib) { /* two blocks -> 32 bytes: code pairs c + 16 c' (maddubs), then back in order */
            for (int j = 0; j < 8; j += 2) {
                __m256i b0 = simd_block_bytes_bf16(kind, xk + BLK * j, _mm256_set1_ps(s[j]), lo, hi, bv);
                __m256i b1 = simd_block_bytes_bf16(kind, xk + BLK * (j + 1), _mm256_set1_ps(s[j + 1]), lo, hi, bv);
                __m256i p = _mm256_packus_epi16(_mm256_maddubs_epi16(b0, nib_mul), _mm256_maddubs_epi16(b1, nib_mul));
                _mm256_storeu_si256((__m256i *)(orow + (k + j) * BLK / 2), _mm256_permutevar8x32_epi32(p, order));
            }
        } else {
            for (int j = 0; j < 8; j++) {
                __m256i b = simd_block_bytes_bf16(kind, xk + BLK * j, _mm256_set1_ps(s[j]), lo, hi, bv);
                _mm256_storeu_si256((__m256i *)(codes + (k + j) * BLK), _mm256_permute4x64_epi64(b, 0xD8));
            }
        }
    }
    return nib;
}

/* Values of one block: integer ((code - bias) * s) or E2M1 (table[code] * s). */
static inline void simd_block_decode(int kind, float bias, const uint8_t *c, float s, float *v) {
    const __m256 sv = _mm256_set1_ps(s);
    if (kind == 0) {
        const __m256 bv = _mm256_set1_ps(bias);
        for (int i = 0; i < 4; i++) {
            __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + 8 * i))));
            _mm256_storeu_ps(v + 8 * i, _mm256_mul_ps(_mm256_sub_ps(f, bv), sv));
        }
    } else {
        const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
        for (int i = 0; i < 4; i++) {
            __m256i ci = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + 8 * i)));
            __m256 m = _mm256_permutevar8x32_ps(mag, ci); /* uses the low 3 bits */
            __m256i sign = _mm256_slli_epi32(_mm256_and_si256(ci, _mm256_set1_epi32(8)), 28);
            m = _mm256_xor_ps(m, _mm256_castsi256_ps(sign));
            _mm256_storeu_ps(v + 8 * i, _mm256_mul_ps(m, sv));
        }
    }
}

/* float -> bf16 bits in the low half of each 32-bit lane, round to nearest even; no NaN check. */
static inline __m256i simd_bf16_rne(__m256 f) {
    __m256i b = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb), 16);
}

/* One full wire row -> 2048 bf16 values, the same bits as decode_row + to_bf16. ``codes``: the
 * codes in order (unpacked planes; INT8: the row itself), unused for 4-bit codes, which come
 * straight from the row's nibbles. Codes of at most 4 bits: a block has at most 16 distinct
 * values, so its 16 bf16 results are computed once and picked with pshufb (low and high bytes). */
static inline void simd_decode_row_bf16(const uint8_t *row, int kind, int bits, int64_t code_bytes,
                                        const uint8_t *codes, uint16_t *o) {
    const int nib = kind == 1 || bits == 4;
    const float bias = (float)(1 << (bits - 1));
    const uint16_t *scales = (const uint16_t *)(row + code_bytes);
    if (nib || bits == 3) {
        __m256 cv0, cv1; /* the value of each code, before the scale */
        if (kind == 0) {
            cv0 = _mm256_sub_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps(bias));
            cv1 = _mm256_sub_ps(_mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15), _mm256_set1_ps(bias));
        } else {
            cv0 = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
            cv1 = _mm256_setr_ps(-0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
        }
        const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                               0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), m4 = _mm256_set1_epi8(0x0F);
        for (int b = 0; b < NBLK; b++) {
            __m256 sv = _mm256_set1_ps(scale_value(scales[b]));
            /* 16 results as words, in order after packus + the dword permute: low bytes then high bytes */
            __m256i w = _mm256_packus_epi32(simd_bf16_rne(_mm256_mul_ps(cv0, sv)), simd_bf16_rne(_mm256_mul_ps(cv1, sv)));
            __m256i t = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(w, split), order);
            t = _mm256_or_si256(t, _mm256_castps_si256(_mm256_cmp_ps(sv, sv, _CMP_UNORD_Q))); /* NaN scale: 0xFFFF */
            __m256i tlo = _mm256_permute2x128_si256(t, t, 0x00), thi = _mm256_permute2x128_si256(t, t, 0x11);
            __m256i c;
            if (nib) { /* byte k -> words (k & 15, k >> 4): codes 2i, 2i+1 */
                __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + b * BLK / 2)));
                c = _mm256_and_si256(_mm256_or_si256(x, _mm256_slli_epi16(x, 4)), m4);
            } else {
                c = _mm256_loadu_si256((const __m256i *)(codes + b * BLK));
            }
            __m256i lo = _mm256_shuffle_epi8(tlo, c), hi = _mm256_shuffle_epi8(thi, c);
            __m256i v0 = _mm256_unpacklo_epi8(lo, hi), v1 = _mm256_unpackhi_epi8(lo, hi); /* 0-7|16-23, 8-15|24-31 */
            _mm256_storeu_si256((__m256i *)(o + b * BLK), _mm256_permute2x128_si256(v0, v1, 0x20));
            _mm256_storeu_si256((__m256i *)(o + b * BLK + 16), _mm256_permute2x128_si256(v0, v1, 0x31));
        }
        return;
    }
    const __m256i ibias = _mm256_set1_epi32(1 << (bits - 1)); /* INT6, INT8: (code - bias) * s per value */
    for (int b = 0; b < NBLK; b++) {
        __m256 sv = _mm256_set1_ps(scale_value(scales[b]));
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(sv, sv, _CMP_UNORD_Q));
        for (int i = 0; i < BLK; i += 16) {
            __m256i w[2];
            for (int k = 0; k < 2; k++) {
                __m256i ci = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + b * BLK + i + 8 * k)));
                __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ci, ibias)), sv);
                w[k] = _mm256_or_si256(simd_bf16_rne(f), _mm256_srli_epi32(nan, 16));
            }
            _mm256_storeu_si256((__m256i *)(o + b * BLK + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(w[0], w[1]), 0xD8));
        }
    }
}

/* float -> bf16 bits, round to nearest even, NaN -> 0xFFFF (as to_bf16). n: multiple of 8. */
static inline void simd_to_bf16(const float *v, uint16_t *o, int64_t n) {
    const __m256i one = _mm256_set1_epi32(1), r = _mm256_set1_epi32(0x7FFF);
    for (int64_t i = 0; i + 16 <= n; i += 16) {
        __m256i w[2];
        for (int k = 0; k < 2; k++) {
            __m256 f = _mm256_loadu_ps(v + i + 8 * k);
            __m256i b = _mm256_castps_si256(f);
            __m256i t = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, r), _mm256_and_si256(_mm256_srli_epi32(b, 16), one)), 16);
            __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
            w[k] = _mm256_or_si256(t, _mm256_and_si256(isnan, _mm256_set1_epi32(0xFFFF)));
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(w[0], w[1]), 0xD8);
        _mm256_storeu_si256((__m256i *)(o + i), p);
    }
}

/* float -> fp16, round to nearest even (the same instruction the _Float16 cast compiles to). */
static inline void simd_to_f16(const float *v, uint16_t *o, int64_t n) {
    for (int64_t i = 0; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT));
}

/* One bit plane of a row: bits [shift, shift + w) of every code, 8 / w codes per byte, the first
 * code in the lowest bits (the layout of lowbit.formats.pack). 16 codes per step. */
static inline void simd_pack_plane(const uint8_t *codes, int shift, int w, uint8_t *out) {
    const __m128i sh = _mm_cvtsi32_si128(shift);
    const __m128i mask = _mm_set1_epi8((char)((1 << w) - 1));
    if (w == 4) { /* 64 codes -> 32 bytes: c + 16 c' per code pair (vpmaddubsw, at most 255), packed */
        const __m256i m4 = _mm256_set1_epi8(0x0F), pair = _mm256_set1_epi16(0x1001);
        for (int i = 0; i < ROW; i += 64) {
            __m256i a = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(codes + i)), sh), m4);
            __m256i b = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(codes + i + 32)), sh), m4);
            __m256i p = _mm256_packus_epi16(_mm256_maddubs_epi16(a, pair), _mm256_maddubs_epi16(b, pair));
            _mm256_storeu_si256((__m256i *)(out + i / 2), _mm256_permute4x64_epi64(p, 0xD8)); /* lanes back in order */
        }
    } else if (w == 2) { /* 64 codes -> 16 bytes: v0 + 4 v1 (maddubs), then + 16 (v2 + 4 v3) (madd) */
        const __m128i m1 = _mm_set1_epi16(0x0401), m2 = _mm_set1_epi32(0x00100001);
        for (int i = 0; i < ROW; i += 64) {
            __m128i q[4];
            for (int k = 0; k < 4; k++) {
                __m128i v = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(codes + i + 16 * k)), sh), mask);
                q[k] = _mm_madd_epi16(_mm_maddubs_epi16(v, m1), m2);
            }
            _mm_storeu_si128((__m128i *)(out + i / 4), _mm_packus_epi16(_mm_packs_epi32(q[0], q[1]), _mm_packs_epi32(q[2], q[3])));
        }
    } else { /* w == 1: the plane bit moved to the top of each byte; movemask packs 32 codes -> 4 bytes */
        const __m256i up = _mm256_castsi128_si256(_mm_cvtsi32_si128(7 - shift));
        for (int i = 0; i < ROW; i += 32) {
            __m256i v = _mm256_sll_epi16(_mm256_loadu_si256((const __m256i *)(codes + i)), _mm256_castsi256_si128(up));
            uint32_t bits = (uint32_t)_mm256_movemask_epi8(v);
            memcpy(out + i / 8, &bits, 4);
        }
    }
}

/* Inverse of simd_pack_plane: codes |= plane << shift (first: codes = plane << shift). */
static inline void simd_unpack_plane(const uint8_t *in, int shift, int w, uint8_t *codes, int first) {
    const __m128i sh = _mm_cvtsi32_si128(shift);
#define QR_PUT(p, v) do { __m128i v_ = _mm_sll_epi16((v), sh); /* codes < 2^w: no bits cross bytes */ \
        if (!first) v_ = _mm_or_si128(v_, _mm_loadu_si128((const __m128i *)(p))); \
        _mm_storeu_si128((__m128i *)(p), v_); } while (0)
    if (w == 4) {
        const __m128i m = _mm_set1_epi8(0x0F);
        for (int i = 0; i < ROW / 2; i += 16) {
            __m128i b = _mm_loadu_si128((const __m128i *)(in + i));
            __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
            QR_PUT(codes + 2 * i, _mm_unpacklo_epi8(lo, hi));
            QR_PUT(codes + 2 * i + 16, _mm_unpackhi_epi8(lo, hi));
        }
    } else if (w == 2) {
        const __m128i m = _mm_set1_epi8(0x03);
        for (int i = 0; i < ROW / 4; i += 16) {
            __m128i b = _mm_loadu_si128((const __m128i *)(in + i));
            __m128i a0 = _mm_and_si128(b, m), a1 = _mm_and_si128(_mm_srli_epi16(b, 2), m);
            __m128i a2 = _mm_and_si128(_mm_srli_epi16(b, 4), m), a3 = _mm_and_si128(_mm_srli_epi16(b, 6), m);
            __m128i t0 = _mm_unpacklo_epi8(a0, a1), t1 = _mm_unpacklo_epi8(a2, a3);
            __m128i t2 = _mm_unpackhi_epi8(a0, a1), t3 = _mm_unpackhi_epi8(a2, a3);
            uint8_t *o = codes + 4 * i;
            QR_PUT(o, _mm_unpacklo_epi16(t0, t1));
            QR_PUT(o + 16, _mm_unpackhi_epi16(t0, t1));
            QR_PUT(o + 32, _mm_unpacklo_epi16(t2, t3));
            QR_PUT(o + 48, _mm_unpackhi_epi16(t2, t3));
        }
    } else { /* w == 1: each byte spread over 8 codes, bit j -> code j */
        const __m128i sel = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, (char)128, 1, 2, 4, 8, 16, 32, 64, (char)128);
        const __m128i one = _mm_set1_epi8(1);
        for (int i = 0; i < ROW / 8; i += 2) {
            uint16_t two;
            memcpy(&two, in + i, 2);
            __m128i b = _mm_shuffle_epi8(_mm_cvtsi32_si128(two), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
            QR_PUT(codes + 8 * i, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(b, sel), sel), one));
        }
    }
#undef QR_PUT
}
