/* AVX-512 steps of the float32 rows (included by qr_avx2.h on AVX-512 F/BW/VL builds): the integer
 * codes of a row (encode_row: the channel options' encode, the two-shot reduce, float32 input),
 * INT4 rows decoded to float32 and float32 rows stored as bf16 (decode_row / store_bf16: the
 * channel options' merge where the build has no AVX512_BF16, float32 and two-shot paths; with it,
 * decoded sums take ch512_store16 in qr_channels_avx512.h). The bf16 rows of the plain codecs keep
 * qr_avx2.h's fused paths, which these did not beat (measured). Same bits as the AVX2 and
 * portable code (tests compare the builds and the torch reference).
 *
 * Why: the AVX2 codes spend one fp32 divide per value, and a divider that runs 16 lanes at the
 * same rate per lane as 8 (Intel's: a 512-bit divide takes twice a 256-bit one, by public
 * instruction tables) bounds them; a product by the block's reciprocal needs no divider (the
 * divide is kept where the two could differ, below), and 512-bit vectors halve the rest. Where
 * the divider keeps up (AMD Zen 4: INT4 codes of a row 262 against 312 ns, measured), the
 * reciprocal's four extra operations per vector cost more than they save: qr_set_divide_codes(1)
 * (lowbit.comm.codecs.native sets it per CPU vendor) divides. The same bits either way. */

#define QR_SIMD512 1

/* The 32 codes (code + bias, 0 .. 2^bits - 1) of one block as int32, from the block's two vectors
 * and scale s: rint(x / s) as the divide gives it, clamped to [qmin, qmax], plus bias.
 * The divide's integer from the product y = x * r with r = fl(1 / s). Exact:
 * |y - fl(x / s)| <= 3.0001 * 2^-24 * |x / s|, and a finite block's |x / s| <= |qmin| * (1 + 2^-23)
 * <= 128.001 (its fp16 scale is rounded away from zero), so the two differ by less than 2^-15;
 * where y is farther than that from every half-integer (|y - rint(y)| < 0.5 - 2^-15), fl(x / s)
 * lies on the same side of it and rounds to the same integer. Otherwise (about 2^-14 of all
 * values, and a NaN scale) the block's 32 values are divided. The clamp is in float (NaN -> qmin,
 * as max_ps/min_ps give it in AVX2). */
static inline void simd512_int_codes32(__m512 f0, __m512 f1, float s, int qmin, int qmax, int bias, __m512i *c0,
                                       __m512i *c1) {
    const __m512 sv = _mm512_set1_ps(s);
    __m512 q0, q1;
    if (qr_divide_codes) { /* the divide alone: faster where the divider is (AMD Zen 4, measured) */
        q0 = _mm512_roundscale_ps(_mm512_div_ps(f0, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q1 = _mm512_roundscale_ps(_mm512_div_ps(f1, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
        const __m512 lim = _mm512_set1_ps(0.5f - 0x1p-15f), rv = _mm512_set1_ps(1.0f / s);
        __m512 y0 = _mm512_mul_ps(f0, rv), y1 = _mm512_mul_ps(f1, rv);
        q0 = _mm512_roundscale_ps(y0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q1 = _mm512_roundscale_ps(y1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __mmask16 ok0 = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y0, q0)), lim, _CMP_LT_OQ);
        __mmask16 ok1 = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y1, q1)), lim, _CMP_LT_OQ);
        if ((ok0 & ok1) != 0xFFFF) { /* near a half-integer (or NaN): the divide decides */
            q0 = _mm512_roundscale_ps(_mm512_div_ps(f0, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q1 = _mm512_roundscale_ps(_mm512_div_ps(f1, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        }
    }
    const __m512 lo = _mm512_set1_ps((float)qmin), hi = _mm512_set1_ps((float)qmax);
    const __m512i bv = _mm512_set1_epi32(bias);
    *c0 = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(q0, lo), hi)), bv);
    *c1 = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(q1, lo), hi)), bv);
}

/* The same 32 codes as bytes in order. */
static inline void simd512_int_codes(__m512 f0, __m512 f1, float s, int qmin, int qmax, int bias, uint8_t *c) {
    __m512i c0, c1;
    simd512_int_codes32(f0, f1, s, qmin, qmax, bias, &c0, &c1);
    _mm_storeu_si128((__m128i *)c, _mm512_cvtepi32_epi8(c0));
    _mm_storeu_si128((__m128i *)(c + 16), _mm512_cvtepi32_epi8(c1));
}

/* The 32 codes of 4 bits packed two per byte, the first in the low nibble (the plane layout of
 * pack_planes): 16 bytes. */
static inline void simd512_int4_nibbles(__m512 f0, __m512 f1, float s, uint8_t *out) {
    __m512i c0, c1;
    simd512_int_codes32(f0, f1, s, -8, 7, 8, &c0, &c1);
    /* per 64-bit lane (c, c'): c | c' << 4 in its low byte */
    c0 = _mm512_or_si512(c0, _mm512_srli_epi64(c0, 28));
    c1 = _mm512_or_si512(c1, _mm512_srli_epi64(c1, 28));
    _mm_storel_epi64((__m128i *)out, _mm512_cvtepi64_epi8(c0));
    _mm_storel_epi64((__m128i *)(out + 8), _mm512_cvtepi64_epi8(c1));
}

/* 8 bytes of 4-bit codes (two per byte, the first in the low nibble) -> their 16 codes - 8 as
 * float32, in order. */
static inline __m512 simd512_int4_codes16(const uint8_t *p) {
    const __m512i m = _mm512_set1_epi64(0x0000000F0000000Fll), bias = _mm512_set1_epi32(8);
    __m512i b = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)p)); /* byte b -> dwords (b & 15, b >> 4) */
    __m512i c = _mm512_and_si512(_mm512_or_si512(b, _mm512_slli_epi64(b, 28)), m);
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(c, bias));
}

/* Their 16 values (code - 8) * s, the same operations as simd_block_decode. */
static inline __m512 simd512_int4_decode16(const uint8_t *p, __m512 sv) {
    return _mm512_mul_ps(simd512_int4_codes16(p), sv);
}

/* One block's 16 bytes -> its 32 values. */
static inline void simd512_int4_decode(const uint8_t *p, float s, float *v) {
    const __m512 sv = _mm512_set1_ps(s);
    _mm512_storeu_ps(v, simd512_int4_decode16(p, sv));
    _mm512_storeu_ps(v + 16, simd512_int4_decode16(p + 8, sv));
}

/* float -> bf16 bits, round to nearest even, NaN -> 0xFFFF (as to_bf16); 16 values a step. */
static inline __m256i simd512_bf16_bits(__m512 f) {
    const __m512i one = _mm512_set1_epi32(1), r = _mm512_set1_epi32(0x7FFF), nan = _mm512_set1_epi32(0xFFFF);
    __m512i b = _mm512_castps_si512(f);
    __m512i t = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, r), _mm512_and_si512(_mm512_srli_epi32(b, 16), one)), 16);
    t = _mm512_mask_mov_epi32(t, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), nan);
    return _mm512_cvtepi32_epi16(t);
}

static inline void simd512_to_bf16(const float *v, uint16_t *o, int64_t n) {
    for (int64_t i = 0; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(o + i), simd512_bf16_bits(_mm512_loadu_ps(v + i)));
}
