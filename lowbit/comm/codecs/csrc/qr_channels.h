/* Outlier channels and the block Hadamard around the codecs (see ../../channels.py), one pass each
 * way over a [tokens, hidden] message, in chunks of ROW values kept in L1:
 *   qr_split: the input (f32/bf16/f16) -> its outlier channels (raw, in the input dtype) and the
 *             rest as float32 with those channels zeroed and, block > 0, H/sqrt(B) per block;
 *   qr_merge: the float32 rest -> H/sqrt(B) per block, the float32 outlier sums put back, one cast
 *             to the output dtype (f32/bf16/f16, round to nearest even, overflow to inf).
 * The butterfly is lowbit.formats.hadamard.fast_transform's (stages h = 1, 2, 4, ..., a + b and
 * a - b, then one multiply by the float32 scale): the same bits as the torch path (tested).
 * chans: the nch outlier channels, sorted, distinct, in [0, hidden). */

/* One stage of the butterfly with a constant span H (the compiler vectorizes it). */
#define QR_STAGE(x, B, H)                                                                          \
    for (int i_ = 0; i_ < (B); i_ += 2 * (H))                                                      \
        for (int j_ = i_; j_ < i_ + (H); j_++) {                                                   \
            float a_ = (x)[j_], c_ = (x)[j_ + (H)];                                                \
            (x)[j_] = a_ + c_;                                                                     \
            (x)[j_ + (H)] = a_ - c_;                                                               \
        }

#if defined(__AVX512F__) && !defined(QR_NO_SIMD)
#include <immintrin.h>
/* Stages of span 1, 2, 4 and 8 inside one vector of 16 values: butterfly_simd.h (shared with the
 * kernels' online Hadamard). */
#include "../../../native/csrc/butterfly_simd.h"

/* One block of 64 values in four vectors r, in place: butterfly_in16 per vector, the spans 16 and 32
 * between whole vectors, then the scale sv. */
static inline void fwht64_regs(__m512 *r, __m512 sv) {
    __m512 t;
    for (int i = 0; i < 4; i++) r[i] = butterfly_in16(r[i]);
    t = r[0], r[0] = _mm512_add_ps(t, r[1]), r[1] = _mm512_sub_ps(t, r[1]);
    t = r[2], r[2] = _mm512_add_ps(t, r[3]), r[3] = _mm512_sub_ps(t, r[3]);
    t = r[0], r[0] = _mm512_add_ps(t, r[2]), r[2] = _mm512_sub_ps(t, r[2]);
    t = r[1], r[1] = _mm512_add_ps(t, r[3]), r[3] = _mm512_sub_ps(t, r[3]);
    for (int i = 0; i < 4; i++) r[i] = _mm512_mul_ps(r[i], sv);
}

/* Blocks of 32 or 64 values in registers (64: fwht64_regs), each value + 0 first where plus0 (see
 * fwht_blocks). 0 if the block is another size (the scalar loop runs). */
static int fwht_blocks_simd(float *v, int64_t m, int block, float scale, int plus0) {
    if (block != 32 && block != 64) return 0;
    const __m512 sv = _mm512_set1_ps(scale), z = _mm512_setzero_ps();
#define QR_LOAD16(p) (plus0 ? _mm512_add_ps(_mm512_loadu_ps(p), z) : _mm512_loadu_ps(p))
    for (int64_t b = 0; b + block <= m; b += block) {
        float *x = v + b;
        if (block == 64) {
            __m512 r[4];
            for (int i = 0; i < 4; i++) r[i] = QR_LOAD16(x + 16 * i);
            fwht64_regs(r, sv);
            for (int i = 0; i < 4; i++) _mm512_storeu_ps(x + 16 * i, r[i]);
            continue;
        }
        __m512 r0 = butterfly_in16(QR_LOAD16(x)), r1 = butterfly_in16(QR_LOAD16(x + 16)), t;
        t = r0, r0 = _mm512_add_ps(t, r1), r1 = _mm512_sub_ps(t, r1);
        _mm512_storeu_ps(x, _mm512_mul_ps(r0, sv));
        _mm512_storeu_ps(x + 16, _mm512_mul_ps(r1, sv));
    }
#undef QR_LOAD16
    return 1;
}
#elif defined(__AVX2__) && !defined(QR_NO_SIMD)
#include <immintrin.h>
#include "../../../native/csrc/butterfly_simd.h"

/* The same on AVX2: butterfly_in8 per vector of 8, then the spans 8, 16 and 32 between vectors. */
static int fwht_blocks_simd(float *v, int64_t m, int block, float scale, int plus0) {
    if (block != 32 && block != 64) return 0;
    const __m256 sv = _mm256_set1_ps(scale), z = _mm256_setzero_ps();
    const int nv = block / 8;
    for (int64_t b = 0; b + block <= m; b += block) {
        float *x = v + b;
        __m256 r[8], t;
        for (int i = 0; i < nv; i++) {
            __m256 l = _mm256_loadu_ps(x + 8 * i);
            r[i] = butterfly_in8(plus0 ? _mm256_add_ps(l, z) : l);
        }
        for (int h = 1; h < nv; h *= 2) /* span 8 h: vectors i and i + h */
            for (int i = 0; i < nv; i += 2 * h)
                for (int j = i; j < i + h; j++) t = r[j], r[j] = _mm256_add_ps(t, r[j + h]), r[j + h] = _mm256_sub_ps(t, r[j + h]);
        for (int i = 0; i < nv; i++) _mm256_storeu_ps(x + 8 * i, _mm256_mul_ps(r[i], sv));
    }
    return 1;
}
#else
static int fwht_blocks_simd(float *v, int64_t m, int block, float scale, int plus0) {
    (void)v, (void)m, (void)block, (void)scale, (void)plus0;
    return 0;
}
#endif

/* The block Hadamard of m values in place. plus0: every value + 0 first, which turns -0 into +0
 * and changes nothing else: the merge's rule (ChannelPlan.merge_torch), so a decoded zero is +0
 * whichever sign its block's scale had, and the integer stages of qr_channels_avx512.h give the
 * same bits. The encode keeps its input's zeros (its codes do not see their sign). */
static void fwht_blocks(float *v, int64_t m, int block, float scale, int plus0) {
    if (fwht_blocks_simd(v, m, block, scale, plus0)) return;
    for (int64_t b = 0; b + block <= m; b += block) {
        float *x = v + b;
        if (plus0)
            for (int i = 0; i < block; i++) x[i] += 0.0f;
        if (block == 64) {
            QR_STAGE(x, 64, 1) QR_STAGE(x, 64, 2) QR_STAGE(x, 64, 4) QR_STAGE(x, 64, 8) QR_STAGE(x, 64, 16)
            QR_STAGE(x, 64, 32)
        } else if (block == 32) {
            QR_STAGE(x, 32, 1) QR_STAGE(x, 32, 2) QR_STAGE(x, 32, 4) QR_STAGE(x, 32, 8) QR_STAGE(x, 32, 16)
        } else {
            for (int h = 1; h < block; h *= 2) QR_STAGE(x, block, h)
        }
        for (int i = 0; i < block; i++) x[i] *= scale;
    }
}

/* out[p] = v in out_type (0 float32, 1 bf16, 2 f16): merge_row's cast of one value. */
static inline void cast_one(float v, void *out, int out_type, int64_t p) {
    if (out_type == 0)
        ((float *)out)[p] = v;
    else if (out_type == 1)
        ((uint16_t *)out)[p] = to_bf16(v);
    else /* as the plain decode: a sum within the codec's rounding of F16_MAX stays finite */
        ((_Float16 *)out)[p] = (_Float16)((fabsf(v) > F16_MAX && fabsf(v) < 65536.0f) ? copysignf(F16_MAX, v) : v);
}

/* The outlier sums of the row's m values from start on, cast into out over their channels. */
__attribute__((unused)) static void put_channels(int64_t start, int64_t m, int64_t hidden, const int64_t *chans, int64_t nch,
                         const float *osum, void *out, int out_type) {
    for (int64_t tok = start / hidden; nch && tok * hidden < start + m; tok++)
        for (int64_t k = 0; k < nch; k++) {
            int64_t p = tok * hidden + chans[k];
            if (p >= start && p < start + m) cast_one(osum[tok * nch + k], out, out_type, p);
        }
}

#ifdef QR_SIMD512
#include "qr_channels_avx512.h"
#endif

static int channels_ok(int64_t n, int64_t hidden, int64_t nch, int block) {
    return hidden > 0 && n >= 0 && n % hidden == 0 && nch >= 0 && nch < hidden
           && (block == 0 || ((block & (block - 1)) == 0 && block <= 64 && ROW % block == 0 && hidden % block == 0));
}

/* The outlier channels among the m values from start on: copied raw (es bytes each) from the input
 * src into outl, and zeroed in buf, the row's copy (elements of bes bytes: 4 float32, 2 bf16). */
static void take_channels(const uint8_t *src, size_t es, int64_t start, int64_t m, int64_t hidden,
                          const int64_t *chans, int64_t nch, void *outl, void *buf, size_t bes) {
    for (int64_t tok = start / hidden; nch && m && tok * hidden < start + m; tok++)
        for (int64_t k = 0; k < nch; k++) {
            int64_t p = tok * hidden + chans[k], o = tok * nch + k;
            if (p < start || p >= start + m) continue;
            if (es == 4) /* typed copies: a memcpy of a variable size is a library call per channel */
                ((uint32_t *)outl)[o] = ((const uint32_t *)src)[p];
            else
                ((uint16_t *)outl)[o] = ((const uint16_t *)src)[p];
            if (bes == 4)
                ((float *)buf)[p - start] = 0.0f;
            else
                ((uint16_t *)buf)[p - start] = 0;
        }
}

/* Returns 0, or -1 (nothing written) for a size or layout that is not ours. outl: [n / hidden, nch]
 * values of the input's element size; rest: n floats. */
int qr_split(const void *in, int in_type, int64_t n, int64_t hidden, const int64_t *chans, int64_t nch, int block,
             float scale, void *outl, float *rest) {
    float buf[ROW];
    if (!channels_ok(n, hidden, nch, block) || in_type < 0 || in_type > 2) return -1;
    size_t es = in_type == 0 ? 4 : 2;
    const uint8_t *src = (const uint8_t *)in;
    for (int64_t start = 0; start < n; start += ROW) {
        int64_t m = n - start < ROW ? n - start : ROW;
        load_row(in, in_type, start, n, buf);
        take_channels(src, es, start, m, hidden, chans, nch, outl, buf, sizeof(float));
        if (block) fwht_blocks(buf, m, block, scale, 0);
        memcpy(rest + start, buf, (size_t)m * sizeof(float));
    }
    return 0;
}

/* qr_merge's steps on one row of m values in L1 (buf, the values from start on): the block
 * Hadamard, the outlier sums put back, one cast into out. coded: buf holds decoded sums of a
 * quantized wire, never subnormal (see ch512_store16), which may take AVX512_BF16's cast; the
 * outlier sums (which may be) are then cast alone over their channels, the same bits. A NaN's
 * sign and payload in float32 / float16 output are not specified: where +NaN and the -NaN of
 * inf - inf meet in a block, the butterfly keeps whichever operand its instruction names first
 * (builds and torch differ). The encoder's wires never produce that mix: a NaN input poisons its
 * whole block with the default NaN. bf16 output writes every NaN as 0xFFFF. plus0_done: buf's
 * zeros are +0 already (ch512_decode_sum_row_int4), so the Hadamard skips its + 0. */
static void merge_row(float *buf, int64_t start, int64_t m, int64_t hidden, const int64_t *chans, int64_t nch,
                      int block, float scale, const float *osum, void *out, int out_type, int coded, int plus0_done) {
    if (block) fwht_blocks(buf, m, block, scale, !plus0_done);
#if defined(QR_SIMD512) && defined(__AVX512BF16__)
    /* the proof needs the Hadamard's scale to keep 2^-25 normal: ChannelPlan's 1/sqrt(B) does */
    if (coded && out_type == 1 && (!block || fabsf(scale) >= 0x1p-101f)) {
        const int64_t m16 = m - m % 16;
        for (int64_t i = 0; i < m16; i += 16) ch512_store16(_mm512_loadu_ps(buf + i), out, 1, start + i);
        for (int64_t i = m16; i < m; i++) cast_one(buf[i], out, 1, start + i);
        put_channels(start, m, hidden, chans, nch, osum, out, out_type);
        return;
    }
#else
    (void)coded;
#endif
    for (int64_t tok = start / hidden; nch && tok * hidden < start + m; tok++)
        for (int64_t k = 0; k < nch; k++) {
            int64_t p = tok * hidden + chans[k];
            if (p >= start && p < start + m) buf[p - start] = osum[tok * nch + k];
        }
    if (out_type == 0)
        memcpy((float *)out + start, buf, (size_t)m * sizeof(float));
    else if (out_type == 1)
        store_bf16(buf, (uint16_t *)out + start, m);
    else
        for (int64_t i = 0; i < m; i++) cast_one(buf[i], out, 2, start + i);
}

int qr_merge(const float *rest, int64_t n, int64_t hidden, const int64_t *chans, int64_t nch, int block, float scale,
             const float *osum, void *out, int out_type) {
    float buf[ROW];
    if (!channels_ok(n, hidden, nch, block) || out_type < 0 || out_type > 2 || (nch && !osum)) return -1;
    for (int64_t start = 0; start < n; start += ROW) {
        int64_t m = n - start < ROW ? n - start : ROW;
        memcpy(buf, rest + start, (size_t)m * sizeof(float));
        merge_row(buf, start, m, hidden, chans, nch, block, scale, osum, out, out_type, 0, 0);
    }
    return 0;
}

/* The one-shot all-reduce's local step with a channel plan, fused per row: the nw wires' rows
 * decoded and added in float32 in list order (the additions of qr_decode, then qr_decode with
 * accumulate for each next wire), then qr_merge's steps, without a float32 message in memory.
 * The n values are whole tokens; wire_bytes[j]: wire j's size. Returns 0, or -1 (nothing
 * written) for a size or layout that is not ours. */
int qr_decode_merge(const uint8_t *const *wires, int nw, int64_t rows, int kind, int bits, int64_t row_bytes,
                    int64_t code_bytes, const int64_t *wire_bytes, int64_t n, int64_t hidden, const int64_t *chans,
                    int64_t nch, int block, float scale, const float *osum, void *out, int out_type) {
    float acc[ROW], vals[ROW];
    if (nw < 1 || !layout_ok(kind, bits, row_bytes, code_bytes) || !channels_ok(n, hidden, nch, block)
        || out_type < 0 || out_type > 2 || (nch && !osum) || rows > INT64_MAX / ROW || n > rows * ROW)
        return -1;
    for (int j = 0; j < nw; j++)
        if (!fits(rows, row_bytes, wire_bytes[j])) return -1;
#ifdef QR_SIMD512
    int pow2_exp;
    const int pow2_scale = frexpf(scale, &pow2_exp) == 0.5f && scale >= 0x1p-101f && scale <= 1.0f; /* 1/sqrt(64) */
#endif
    for (int64_t start = 0; start < n; start += ROW) {
        int64_t m = n - start < ROW ? n - start : ROW, off = start / ROW * row_bytes;
#ifdef QR_SIMD512
        if (kind == 0 && bits == 4 && !block && m == ROW) { /* the whole row in one pass */
            ch512_decode_merge_row_int4(wires, nw, off, code_bytes, start, hidden, chans, nch, osum, out, out_type);
            continue;
        }
        if (kind == 0 && bits == 4 && nw == 1 && block == 64 && m == ROW && pow2_scale) {
            ch512_decode_h64_row_int4(wires[0] + off, code_bytes, scale, start, hidden, chans, nch, osum, out,
                                      out_type); /* one wire: the integer stages */
            continue;
        }
        if (kind == 0 && bits == 4 && nw > 1 && m == ROW) { /* several wires summed in registers */
            ch512_decode_sum_row_int4(wires, nw, off, code_bytes, acc, block != 0); /* + 0 for the Hadamard */
            merge_row(acc, start, m, hidden, chans, nch, block, scale, osum, out, out_type, 1, block != 0);
            continue;
        }
#endif
        decode_row(wires[0] + off, kind, bits, code_bytes, acc, m);
        for (int j = 1; j < nw; j++) {
            decode_row(wires[j] + off, kind, bits, code_bytes, vals, m);
            for (int64_t i = 0; i < m; i++) acc[i] += vals[i];
        }
        merge_row(acc, start, m, hidden, chans, nch, block, scale, osum, out, out_type, kind <= 1, 0);
    }
    return 0;
}

/* qr_split and qr_encode fused for a quantized kind (0 int, 1 FP4): per 2048-value row, the
 * outlier channels out (raw into outl) and zeroed, the block Hadamard, then the codec, all in L1;
 * the same bytes as qr_split then qr_encode of the float32 rest (tested). bf16 input without the
 * Hadamard (`+oN` alone) stays bf16: the channels are zeroed in a bf16 copy of the row, which the
 * plain codec's fused bf16 step encodes (its values are the float32 row's, so the same bytes). */
int qr_encode_split(const void *in, int in_type, int64_t n, int64_t hidden, const int64_t *chans, int64_t nch,
                    int block, float scale, void *outl, int64_t rows, int kind, int bits, uint8_t *out,
                    int64_t row_bytes, int64_t code_bytes, int64_t out_bytes) {
    float buf[ROW];
    if (!channels_ok(n, hidden, nch, block) || in_type < 0 || in_type > 2 || kind > 1
        || !layout_ok(kind, bits, row_bytes, code_bytes) || !fits(rows, row_bytes, out_bytes)
        || rows > INT64_MAX / ROW || rows * ROW < n)
        return -1;
    size_t es = in_type == 0 ? 4 : 2;
    const uint8_t *src = (const uint8_t *)in;
    for (int64_t r = 0; r < rows; r++) {
        int64_t start = r * ROW, m = n - start < ROW ? (n - start > 0 ? n - start : 0) : ROW;
        uint8_t *orow = out + r * row_bytes;
#ifdef QR_SIMD
        if (in_type == 1 && !block) { /* raw bf16 values into the codec: the plain codec's bf16 row step */
            uint16_t b16[ROW];
            uint8_t codes[ROW];
            memcpy(b16, (const uint16_t *)in + start, (size_t)m * 2);
            memset(b16 + m, 0, (size_t)(ROW - m) * 2);
            take_channels(src, es, start, m, hidden, chans, nch, outl, b16, 2);
            int done = simd_encode_row_bf16(b16, kind, bits, orow, code_bytes, codes);
            if (done == 0) pack_planes(codes, bits, orow);
            if (done >= 0) continue;
            load_row(b16, 1, 0, ROW, buf); /* a block needs the extended scale: the general path */
            encode_row(buf, kind, bits, orow, code_bytes);
            continue;
        }
#endif
        load_row(in, in_type, start, n, buf);
        take_channels(src, es, start, m, hidden, chans, nch, outl, buf, sizeof(float));
        if (block) fwht_blocks(buf, ROW, block, scale, 0); /* the zero padding transforms to zeros */
        encode_row(buf, kind, bits, orow, code_bytes);
    }
    return 0;
}
