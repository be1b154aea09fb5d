/* lowbit's packed KV cache (lowbit.nn.kv_cache.PackedKV) in C: its rows quantized (kv_quant_rows),
 * a decode step's attention read straight from the codes (attn_decode_packed), and a whole decode
 * step in one call (kv_decode_step: the new rows rotated, quantized and written, the query rotated
 * in, the output rotated back). float32 math; the bits of the torch steps they replace (tested). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "../../native/csrc/half.h"
#include "work_pool.h"
#include "attention_common.h"
#include "hadamard_block.h" /* butterfly(): the heads' Hadamard */

/* One side of a packed cache (lowbit.nn.kv_cache.PackedKV) for one (batch, kv head): rows of g
 * codes of `bits` (4: two a byte, low nibble first; 8: one a byte), each row with an fp16 scale and
 * a uint8 zero point; value = (u - z) * s. Symmetric caches store codes + 2^(bits-1) and no zero
 * points (zero NULL: z = 2^(bits-1)). A token's D values are D / g consecutive rows. */
struct packed_side {
    const uint8_t *codes;
    const uint16_t *scale;
    const uint8_t *zero;
    int64_t cb, ch, sb, sh, zb, zh; /* strides of batch and head: bytes of codes, elements of scale / zero */
};

static inline int packed_code(const uint8_t *row, int bits, int64_t j) {
    return bits == 8 ? row[j] : (row[j >> 1] >> ((j & 1) * 4)) & 15;
}

/* Where value j of a row of g sits in the order the SIMD loops read a split 4-bit row: its even
 * values first, then its odd ones (split 0: j itself). */
static inline int64_t split_slot(int64_t j, int64_t g, int split) { return split ? (j & 1) * (g / 2) + j / 2 : j; }

struct attn_packed_args {
    const float *q;
    struct packed_side k, v;
    int bits;
    int64_t g, Hq, Hkv, L, D, groups;
    float scale;
    float *out;
    _Atomic int failed;
};

#if DECODE_SIMD
/* 8 codes of a row as floats: 4-bit rows give the low nibbles of 8 bytes (even values) in *e and
 * the high ones (odd values) in *o; 8-bit rows 8 values in *e. */
static inline void codes8(const uint8_t *p, int bits, __m256 *e, __m256 *o) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    if (bits == 8) {
        *e = _mm256_cvtepi32_ps(b);
        return;
    }
    *e = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *o = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
#endif

/* A row of g codes as floats, in the order the dot products read it: with SIMD a 4-bit row's
 * even values then its odd ones, else in place; minus z (the exact integer codes minus the zero
 * point, as every head of the group then uses them). */
static inline void row_floats(const uint8_t *row, int bits, int64_t g, float z, int simd, float *f) {
#if DECODE_SIMD
    if (simd) {
        const __m256 zv = _mm256_set1_ps(z);
        __m256 e, o;
        for (int64_t i = 0; i < g * bits / 8; i += 8) {
            codes8(row + i, bits, &e, &o);
            _mm256_storeu_ps(f + i, _mm256_sub_ps(e, zv));
            if (bits == 4) _mm256_storeu_ps(f + g / 2 + i, _mm256_sub_ps(o, zv));
        }
        return;
    }
#endif
    (void)simd;
    for (int64_t j = 0; j < g; j++) f[j] = (float)packed_code(row, bits, j) - z;
}

/* Σ_j q[j] · f[j] over a row's floats (row_floats with z = 0; both in the row's order). simd: the
 * even and odd halves of a split 4-bit row in two sums, 8 values a step. */
static inline float row_dot(const float *f, int bits, int64_t g, const float *q, int simd) {
#if DECODE_SIMD
    if (simd) {
        const int64_t rb = g * bits / 8;
        __m256 d0 = _mm256_setzero_ps(), d1 = d0;
        for (int64_t i = 0; i < rb; i += 8) {
            d0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(f + i), d0);
            if (bits == 4) d1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + g / 2 + i), _mm256_loadu_ps(f + g / 2 + i), d1);
        }
        return hsum8(_mm256_add_ps(d0, d1));
    }
#endif
    (void)simd;
    float dot = 0.f;
    for (int64_t j = 0; j < g; j++) dot += q[j] * f[j];
    return dot;
}

/* acc[j] += w · f[j] (f: row_floats with the row's zero point), in the same order as row_dot. */
static inline void row_acc(const float *f, int64_t g, float w, float *acc, int simd) {
#if DECODE_SIMD
    if (simd) {
        const __m256 wv = _mm256_set1_ps(w);
        for (int64_t i = 0; i < g; i += 8)
            _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(f + i), _mm256_loadu_ps(acc + i)));
        return;
    }
#endif
    (void)simd;
    for (int64_t j = 0; j < g; j++) acc[j] += w * f[j];
}

#define ROWS 4 /* rows a SIMD step takes at once: q and the sums loaded once for all of them */

#if DECODE_SIMD
/* row_dot of ROWS rows (f: ROWS rows of g floats, g apart) against one q: each row's two sums and
 * its final add exactly as row_dot's, so the same bits; q is read once for the ROWS rows. */
static inline void rows_dot(const float *f, int bits, int64_t g, const float *q, float *out) {
    const int64_t rb = g * bits / 8;
    __m256 d0[ROWS], d1[ROWS];
    for (int k = 0; k < ROWS; k++) d0[k] = d1[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < rb; i += 8) {
        const __m256 qe = _mm256_loadu_ps(q + i);
        for (int k = 0; k < ROWS; k++) d0[k] = _mm256_fmadd_ps(qe, _mm256_loadu_ps(f + k * g + i), d0[k]);
        if (bits == 4) {
            const __m256 qo = _mm256_loadu_ps(q + g / 2 + i);
            for (int k = 0; k < ROWS; k++) d1[k] = _mm256_fmadd_ps(qo, _mm256_loadu_ps(f + k * g + g / 2 + i), d1[k]);
        }
    }
    for (int k = 0; k < ROWS; k++) out[k] = hsum8(_mm256_add_ps(d0[k], d1[k]));
}

/* row_acc of ROWS rows in their order (acc += w[0]·f[0], then w[1]·f[1], ...: each value's chain
 * of multiply-adds as ROWS calls of row_acc), acc loaded and stored once. */
static inline void rows_acc(const float *f, int64_t g, const float *w, float *acc) {
    __m256 wv[ROWS];
    for (int k = 0; k < ROWS; k++) wv[k] = _mm256_set1_ps(w[k]);
    for (int64_t i = 0; i < g; i += 8) {
        __m256 t = _mm256_loadu_ps(acc + i);
        for (int k = 0; k < ROWS; k++) t = _mm256_fmadd_ps(wv[k], _mm256_loadu_ps(f + k * g + i), t);
        _mm256_storeu_ps(acc + i, t);
    }
}
#endif

#define MAX_GROUPS 8

/* G query heads of batch b that read kv head h (G rows of D floats at q) against its
 * cached rows: scores from the codes (per row the scale times (q . u - z * sum q) over the row's
 * dims), softmax as attend_group, then the values' rows weighted into float32 sums written to o
 * (groups x D). Nothing is dequantized; each row's codes are widened once for all the group's
 * heads, each head's sums in the order of one head alone. With SIMD (4-bit rows of a multiple of
 * 16 values, 8-bit of 8) a 4-bit row is read as its even values then its odd ones, so q and the
 * sums are kept in that order and put back at the end. G <= MAX_GROUPS heads (callers take a
 * larger group in parts); scores: scratch of G x L floats. */
static void attend_packed_heads(const struct attn_packed_args *a, int64_t b, int64_t h, int64_t G, const float *q,
                                float *o, float *scores) {
    const int64_t L = a->L, D = a->D, g = a->g, per = D / g;
    const int64_t rb = g * a->bits / 8; /* bytes of a row */
    const int simd = DECODE_SIMD && (a->bits == 4 ? g % 16 == 0 : g % 8 == 0), split = simd && a->bits == 4;
    const int zsym = 1 << (a->bits - 1);
    const uint8_t *kc = a->k.codes + b * a->k.cb + h * a->k.ch, *vc = a->v.codes + b * a->v.cb + h * a->v.ch;
    const uint16_t *ks = a->k.scale + b * a->k.sb + h * a->k.sh, *vs = a->v.scale + b * a->v.sb + h * a->v.sh;
    const uint8_t *kz = a->k.zero ? a->k.zero + b * a->k.zb + h * a->k.zh : NULL;
    const uint8_t *vz = a->v.zero ? a->v.zero + b * a->v.zb + h * a->v.zh : NULL;
    float qs[MAX_GROUPS][256], qsum[MAX_GROUPS][256], f[256]; /* q (and the sums) in the rows' value order */
    for (int64_t gi = 0; gi < G; gi++)
        for (int64_t c = 0; c < per; c++) {
            const float *qc = q + gi * D + c * g;
            float t = 0.f;
            for (int64_t j = 0; j < g; j++) t += qc[j];
            qsum[gi][c] = t;
            for (int64_t j = 0; j < g; j++) qs[gi][c * g + split_slot(j, g, split)] = qc[j];
        }
    int64_t l = 0;
#if DECODE_SIMD
    float fr[ROWS * 256]; /* ROWS rows' floats */
    for (; simd && l + ROWS <= L; l += ROWS) { /* the loop below, ROWS positions at once */
        float sc[MAX_GROUPS][ROWS] = {{0.f}}, dots[ROWS], z[ROWS], rs[ROWS];
        for (int64_t c = 0; c < per; c++) {
            for (int k = 0; k < ROWS; k++) {
                const int64_t r = (l + k) * per + c;
                z[k] = kz ? (float)kz[r] : (float)zsym, rs[k] = (float)h_from(ks[r]);
                row_floats(kc + r * rb, a->bits, g, 0.f, simd, fr + k * g);
            }
            for (int64_t gi = 0; gi < G; gi++) {
                rows_dot(fr, a->bits, g, qs[gi] + c * g, dots);
                for (int k = 0; k < ROWS; k++) sc[gi][k] += rs[k] * (dots[k] - z[k] * qsum[gi][c]);
            }
        }
        for (int64_t gi = 0; gi < G; gi++)
            for (int k = 0; k < ROWS; k++) scores[gi * L + l + k] = sc[gi][k] * a->scale;
    }
#endif
    for (; l < L; l++) {
        float sc[MAX_GROUPS] = {0.f};
        for (int64_t c = 0; c < per; c++) {
            const int64_t r = l * per + c;
            const float z = kz ? (float)kz[r] : (float)zsym, rs = (float)h_from(ks[r]);
            row_floats(kc + r * rb, a->bits, g, 0.f, simd, f);
            for (int64_t gi = 0; gi < G; gi++)
                sc[gi] += rs * (row_dot(f, a->bits, g, qs[gi] + c * g, simd) - z * qsum[gi][c]);
        }
        for (int64_t gi = 0; gi < G; gi++) scores[gi * L + l] = sc[gi] * a->scale;
    }
    float sums[MAX_GROUPS];
    for (int64_t gi = 0; gi < G; gi++) {
        sums[gi] = softmax_weights(scores + gi * L, L);
        for (int64_t d = 0; d < D; d++) o[gi * D + d] = 0.f;
    }
    l = 0;
#if DECODE_SIMD
    for (; simd && l + ROWS <= L; l += ROWS) /* the loop below, ROWS positions at once */
        for (int64_t c = 0; c < per; c++) {
            float rs[ROWS], w[ROWS];
            for (int k = 0; k < ROWS; k++) {
                const int64_t r = (l + k) * per + c;
                rs[k] = (float)h_from(vs[r]);
                row_floats(vc + r * rb, a->bits, g, vz ? (float)vz[r] : (float)zsym, simd, fr + k * g);
            }
            for (int64_t gi = 0; gi < G; gi++) {
                if (sums[gi] != sums[gi]) continue;
                for (int k = 0; k < ROWS; k++) w[k] = scores[gi * L + l + k] * rs[k];
                rows_acc(fr, g, w, o + gi * D + c * g);
            }
        }
#endif
    for (; l < L; l++)
        for (int64_t c = 0; c < per; c++) {
            const int64_t r = l * per + c;
            const float rs = (float)h_from(vs[r]);
            row_floats(vc + r * rb, a->bits, g, vz ? (float)vz[r] : (float)zsym, simd, f);
            for (int64_t gi = 0; gi < G; gi++)
                if (sums[gi] == sums[gi]) row_acc(f, g, scores[gi * L + l] * rs, o + gi * D + c * g, simd);
        }
    for (int64_t gi = 0; gi < G; gi++) {
        float *og = o + gi * D, acc[256];
        if (sums[gi] != sums[gi]) {
            for (int64_t d = 0; d < D; d++) og[d] = NAN;
            continue;
        }
        const float inv = 1.0f / sums[gi];
        for (int64_t d = 0; d < D; d++) acc[d] = og[d];
        for (int64_t c = 0; c < per; c++)
            for (int64_t j = 0; j < g; j++) og[c * g + j] = acc[c * g + split_slot(j, g, split)] * inv;
    }
}

/* Query heads h * groups .. of batch b over kv head h (one work item). */
static void attn_packed_item(const void *ctx, int64_t it) {
    const struct attn_packed_args *a = ctx;
    const int64_t b = it / a->Hkv, h = it % a->Hkv;
    float *scores = malloc((size_t)(a->L * MAX_GROUPS) * sizeof(float));
    if (!scores) {
        atomic_store((_Atomic int *)&a->failed, 1);
        return;
    }
    for (int64_t g0 = 0; g0 < a->groups; g0 += MAX_GROUPS) {
        const int64_t q0 = (b * a->Hq + h * a->groups + g0) * a->D;
        const int64_t G = a->groups - g0 < MAX_GROUPS ? a->groups - g0 : MAX_GROUPS;
        attend_packed_heads(a, b, h, G, a->q + q0, a->out + q0, scores);
    }
    free(scores);
}

/* Attention of one new query per (batch, query head) over a packed KV cache of L positions, no
 * mask, grouped-query heads (query head h reads kv head h / (Hq / Hkv)): q float32 [B, Hq, D]
 * contiguous (in the cache's own domain: rotated by the caller where the cache is), out float32
 * [B, Hq, D] the same. Returns 1 when out of memory (the caller raises), 2 on arguments it does
 * not take (bits other than 4 and 8, a head dim over 256, g not dividing D or odd at 4 bits). */
int attn_decode_packed(const float *q, const uint8_t *kc, const uint16_t *ks, const uint8_t *kz, int64_t kcb,
                       int64_t kch, int64_t ksb, int64_t ksh, int64_t kzb, int64_t kzh, const uint8_t *vc,
                       const uint16_t *vs, const uint8_t *vz, int64_t vcb, int64_t vch, int64_t vsb, int64_t vsh,
                       int64_t vzb, int64_t vzh, int bits, int64_t g, int64_t B, int64_t Hq, int64_t Hkv, int64_t L,
                       int64_t D, float scale, float *out, int threads) {
    if ((bits != 4 && bits != 8) || D > 256 || D <= 0 || g <= 0 || D % g || (bits == 4 && g % 2) || Hkv <= 0 ||
        Hq % Hkv)
        return 2;
    struct attn_packed_args a = {q, {kc, ks, kz, kcb, kch, ksb, ksh, kzb, kzh}, {vc, vs, vz, vcb, vch, vsb, vsh, vzb, vzh},
                                 bits, g, Hq, Hkv, L, D, Hq / Hkv, scale, out, 0};
    const int64_t items = B * Hkv;
    pool_run(attn_packed_item, &a, items, items * L * D >= 65536 ? threads : 1);
    return atomic_load(&a.failed);
}

/* A packed KV cache's new rows (lowbit.nn.kv_cache.PackedKV.append, asymmetric): each row of g
 * float32 values gets lowbit.formats' asymmetric per-row parameters, exactly as choose_qparams and
 * quantize compute them: lo = min(row, 0), hi = max(row, 0), scale = (hi - lo) / (2^bits - 1)
 * stored as fp16 never smaller in magnitude (one step up where the rounding shrank it), 0 -> 1,
 * zero point = rint(-lo / scale) in [0, 2^bits - 1], code = clamp(rint(x / scale) + zero point),
 * rint to nearest even, IEEE divisions; codes packed as PackedKV stores them (4 bits: two a byte,
 * low nibble first; 8: one a byte). Returns 0; 2 for bits other than 4 and 8 or an odd g at 4 bits;
 * 3 when a row holds NaN or Inf, 4 when a scale overflows fp16 (nothing useful written: the caller
 * takes the generic path, which says why). quant_row does one row, kv_quant_rows many. */
static int quant_row(const float *v, int64_t g, int bits, uint8_t *out, uint16_t *scale, uint8_t *zero) {
    const float qmax = (float)((1 << bits) - 1);
    float lo = 0.f, hi = 0.f;
    for (int64_t j = 0; j < g; j++) {
        if (!isfinite(v[j])) return 3;
        lo = v[j] < lo ? v[j] : lo;
        hi = v[j] > hi ? v[j] : hi;
    }
    const float s32 = (hi - lo) / qmax;
    uint16_t h = h_bits((_Float16)s32);
    if (fabsf((float)h_from(h)) < fabsf(s32)) h++; /* never shrink: the next half up (s32 >= 0) */
    if ((h & 0x7c00) == 0x7c00) return 4;
    if ((h & 0x7fff) == 0) h = 0x3c00; /* an all-zero row: scale 1 */
    const float s = (float)h_from(h);
    float zp = rintf(-lo / s);
    zp = zp < 0.f ? 0.f : zp > qmax ? qmax : zp;
    *scale = h, *zero = (uint8_t)zp;
    if (bits == 4) memset(out, 0, (size_t)(g / 2));
    for (int64_t j = 0; j < g; j++) {
        float q = rintf(v[j] / s) + zp;
        q = q < 0.f ? 0.f : q > qmax ? qmax : q;
        if (bits == 8)
            out[j] = (uint8_t)q;
        else
            out[j >> 1] |= (uint8_t)((uint8_t)q << ((j & 1) * 4));
    }
    return 0;
}

int kv_quant_rows(const float *x, int64_t rows, int64_t g, int bits, uint8_t *codes, uint16_t *scale, uint8_t *zero) {
    if ((bits != 4 && bits != 8) || g <= 0 || (bits == 4 && g % 2)) return 2;
    const int64_t rb = g * bits / 8;
    for (int64_t r = 0; r < rows; r++) {
        const int rc = quant_row(x + r * g, g, bits, codes + r * rb, scale + r, zero + r);
        if (rc) return rc;
    }
    return 0;
}

static inline void load_row(const void *src, int bf16, int64_t n, float *x) {
    for (int64_t j = 0; j < n; j++) x[j] = bf16 ? bf16_to_f32(((const uint16_t *)src)[j]) : ((const float *)src)[j];
}

/* One new position of one (batch, head): its D values at src widened into v, rotated when asked,
 * quantized group by group into rows pos * D/g .. of that head's codes, scales and zero points.
 * Returns quant_row's code (0, or 3 / 4 for the caller's generic path). */
static int quantize_position(const void *src, int bf16, int64_t D, int64_t g, int bits, int rotate, float rscale,
                             int64_t pos, uint8_t *codes, uint16_t *scale, uint8_t *zero, float *v) {
    const int64_t per = D / g, rb = g * bits / 8;
    load_row(src, bf16, D, v);
    if (rotate) butterfly(v, D, rscale);
    for (int64_t c = 0; c < per; c++) {
        const int64_t r = pos * per + c;
        const int rc = quant_row(v + c * g, g, bits, codes + r * rb, scale + r, zero + r);
        if (rc) return rc;
    }
    return 0;
}

struct decode_step_args {
    struct attn_packed_args at; /* over the cache's first L = n + 1 positions */
    const void *q, *k, *v;
    int64_t qb, qh, kb, kh, vb, vh; /* strides in elements of batch and head */
    int bf16, rotate;
    float rscale;
    int64_t n;      /* positions stored before this step: the new one is written at n */
    void *out;      /* [B, Hq, D] in the inputs' dtype */
};

/* One (batch, kv head): its new key and value rows (rotated when asked) quantized into position n,
 * then its query heads (rotated in) attended over positions 0 .. n and their outputs rotated back. */
static void decode_step_item(const void *ctx, int64_t it) {
    const struct decode_step_args *s = ctx;
    const struct attn_packed_args *a = &s->at;
    const int64_t b = it / a->Hkv, h = it % a->Hkv, D = a->D;
    const int64_t es = s->bf16 ? 2 : 4;
    float x[256];
    const struct packed_side *sides[2] = {&a->k, &a->v};
    const void *src[2] = {(const char *)s->k + (b * s->kb + h * s->kh) * es, (const char *)s->v + (b * s->vb + h * s->vh) * es};
    for (int side = 0; side < 2; side++) {
        const struct packed_side *p = sides[side];
        const int rc = quantize_position(src[side], s->bf16, D, a->g, a->bits, s->rotate, s->rscale, s->n,
                                         (uint8_t *)p->codes + b * p->cb + h * p->ch, (uint16_t *)p->scale + b * p->sb + h * p->sh,
                                         (uint8_t *)p->zero + b * p->zb + h * p->zh, x);
        if (rc) {
            atomic_store((_Atomic int *)&a->failed, rc);
            return;
        }
    }
    float *scores = malloc((size_t)(a->L * MAX_GROUPS) * sizeof(float)), xq[MAX_GROUPS * 256], o[MAX_GROUPS * 256];
    if (!scores) {
        atomic_store((_Atomic int *)&a->failed, 1);
        return;
    }
    for (int64_t g0 = 0; g0 < a->groups; g0 += MAX_GROUPS) {
        const int64_t G = a->groups - g0 < MAX_GROUPS ? a->groups - g0 : MAX_GROUPS, qh0 = h * a->groups + g0;
        for (int64_t gi = 0; gi < G; gi++) {
            load_row((const char *)s->q + (b * s->qb + (qh0 + gi) * s->qh) * es, s->bf16, D, xq + gi * D);
            if (s->rotate) butterfly(xq + gi * D, D, s->rscale);
        }
        attend_packed_heads(a, b, h, G, xq, o, scores);
        for (int64_t gi = 0; gi < G; gi++) {
            if (s->rotate) butterfly(o + gi * D, D, s->rscale);
            char *y = (char *)s->out + (b * a->Hq + qh0 + gi) * D * es;
            for (int64_t d = 0; d < D; d++) store_at(y, s->bf16, d, o[gi * D + d]);
        }
    }
    free(scores);
}

/* A whole decode step of PackedKVLayer.attend_one (asymmetric cache, a power-of-two head dim where
 * rotated) in one call: q [B, Hq, D] and the new k, v [B, Hkv, D] (float32 or bfloat16, all one
 * dtype, unit stride within a head), the cache's contiguous buffers [B, Hkv, cap rows] (codes
 * cap x g*bits/8 bytes a head, fp16 scales, uint8 zero points), n positions already stored. Each
 * (batch, kv head) writes its own new rows and then reads them, so items are independent. The
 * same bits as kv_quant_rows, attn_decode_packed and fast_transform called one after another.
 * Returns 0; 1 out of memory; 2 arguments it does not take; 3 a NaN or Inf in the new keys or
 * values; 4 a scale beyond fp16 (3 and 4: the caller's generic path says why). */
int kv_decode_step(const void *q, int64_t qb, int64_t qh, const void *k, int64_t kb, int64_t kh, const void *v,
                   int64_t vb, int64_t vh, int bf16, uint8_t *kc, uint16_t *ks, uint8_t *kz, uint8_t *vc,
                   uint16_t *vs, uint8_t *vz, int64_t cap, int64_t n, int bits, int64_t g, int64_t B, int64_t Hq,
                   int64_t Hkv, int64_t D, int rotate, float rscale, float scale, void *out, int threads) {
    if ((bits != 4 && bits != 8) || D > 256 || D <= 0 || g <= 0 || D % g || (bits == 4 && g % 2) || Hkv <= 0 ||
        Hq % Hkv || n < 0 || (n + 1) * (D / g) > cap || (rotate && (D & (D - 1))))
        return 2;
    const int64_t rows = cap, rb = g * bits / 8;
    struct decode_step_args s = {
        {NULL, {kc, ks, kz, Hkv * rows * rb, rows * rb, Hkv * rows, rows, Hkv * rows, rows},
         {vc, vs, vz, Hkv * rows * rb, rows * rb, Hkv * rows, rows, Hkv * rows, rows}, bits, g, Hq, Hkv, n + 1, D,
         Hq / Hkv, scale, NULL, 0},
        q, k, v, qb, qh, kb, kh, vb, vh, bf16, rotate, rscale, n, out};
    const int64_t items = B * Hkv;
    pool_run(decode_step_item, &s, items, items * (n + 1) * D >= 65536 ? threads : 1);
    return atomic_load(&s.at.failed);
}

#define READ_CHUNK 64 /* positions a work item writes and reads back */

struct append_read_args {
    const void *x;
    int64_t xb, xh, xt; /* the new states' strides of batch, head and position, in elements */
    int x_bf16;
    uint8_t *codes;
    uint16_t *scale;
    uint8_t *zero;
    int64_t cap, n, t, bits, g, H, D, chunks;
    int rotate;
    float rscale;
    void *out; /* [B, H, n + t, D] */
    int out_bf16;
    _Atomic int failed;
};

/* Positions chunk * READ_CHUNK .. of one (batch, head): a new position's row loaded, rotated and
 * quantized into its slot first; then every position's codes dequantized, (q - z) * scale, rotated
 * back and stored in the output's dtype: PackedKV.append then PackedKV.dequantize. */
static void append_read_item(const void *ctx, int64_t it) {
    const struct append_read_args *a = ctx;
    const int64_t bh = it / a->chunks, b = bh / a->H, h = bh % a->H, D = a->D, g = a->g, per = D / g;
    const int64_t rb = g * a->bits / 8, es = a->x_bf16 ? 2 : 4, total = a->n + a->t;
    const int64_t p0 = (it % a->chunks) * READ_CHUNK, p1 = p0 + READ_CHUNK < total ? p0 + READ_CHUNK : total;
    uint8_t *codes = a->codes + bh * a->cap * rb;
    uint16_t *scale = a->scale + bh * a->cap;
    uint8_t *zero = a->zero + bh * a->cap;
    float v[256];
    for (int64_t p = p0; p < p1; p++) {
        if (p >= a->n) {
            const int rc = quantize_position((const char *)a->x + (b * a->xb + h * a->xh + (p - a->n) * a->xt) * es,
                                             a->x_bf16, D, g, (int)a->bits, a->rotate, a->rscale, p, codes, scale, zero, v);
            if (rc) {
                atomic_store((_Atomic int *)&a->failed, rc);
                return;
            }
        }
        for (int64_t c = 0; c < per; c++) {
            const int64_t r = p * per + c;
            const float z = (float)zero[r], s = (float)h_from(scale[r]);
            for (int64_t j = 0; j < g; j++) v[c * g + j] = ((float)packed_code(codes + r * rb, (int)a->bits, j) - z) * s;
        }
        if (a->rotate) butterfly(v, D, a->rscale);
        void *y = (char *)a->out + (bh * total + p) * D * (a->out_bf16 ? 2 : 4);
        for (int64_t d = 0; d < D; d++) store_at(y, a->out_bf16, d, v[d]);
    }
}

/* PackedKVLayer.update's two steps for one side of an asymmetric cache in one call: the t new
 * positions of x [B, H, t, D] (float32 or bfloat16, unit stride within a head) rotated (rotate:
 * by the butterfly, D a power of two), quantized into positions n .. n + t - 1 of the contiguous
 * buffers [B, H, cap rows], then all n + t positions dequantized into out [B, H, n + t, D]
 * (float32 or bfloat16), rotated back. The bits of kv_quant_rows, fast_transform and lowbit's
 * dequantize (tested). Returns 0; 2 arguments it does not take; 3 a NaN or Inf in x; 4 a scale
 * beyond fp16 (the caller's generic path says why). */
int kv_append_read(const void *x, int64_t xb, int64_t xh, int64_t xt, int x_bf16, uint8_t *codes, uint16_t *scale,
                   uint8_t *zero, int64_t cap, int64_t n, int64_t t, int bits, int64_t g, int64_t B, int64_t H,
                   int64_t D, int rotate, float rscale, void *out, int out_bf16, int threads) {
    if ((bits != 4 && bits != 8) || D > 256 || D <= 0 || g <= 0 || D % g || (bits == 4 && g % 2) || B < 0 || H <= 0 ||
        n < 0 || t < 0 || (n + t) * (D / g) > cap || (rotate && (D & (D - 1))))
        return 2;
    const int64_t chunks = (n + t + READ_CHUNK - 1) / READ_CHUNK, items = B * H * chunks;
    struct append_read_args a = {x, xb, xh, xt, x_bf16, codes, scale, zero, cap, n, t, bits, g, H, D, chunks ? chunks : 1,
                                 rotate, rscale, out, out_bf16, 0};
    if (items) pool_run(append_read_item, &a, items, items * READ_CHUNK * D >= 65536 ? threads : 1);
    return atomic_load(&a.failed);
}
