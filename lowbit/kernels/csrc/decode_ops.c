/* The small per-token operations of a decode step that are not linears: RMSNorm, the rotary
 * embedding and the attention of one new query over the KV cache. In eager PyTorch each is a chain
 * of 8-15 tiny operator calls (and bfloat16 attention is emulated on CPUs without bf16
 * arithmetic), so at batch 1 they cost more than the 4-bit linears. Here each is one call,
 * computed in float32.
 *
 * Every format of a decode benchmark runs through these same ops, so they shift every format's
 * step time alike and never favour one.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "../../native/csrc/half.h"
#include "work_pool.h"
#include "attention_common.h"

/* Rounds v to bfloat16 and back when bf16 (the cast HF makes before multiplying by the weight). */
static inline float round_to(int bf16, float v) { return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

/* y[r] = w * to_x_dtype(x[r] / sqrt(mean(x[r]^2) + eps)), as Llama's RMSNorm: the statistic in
 * float32 (summed in double here, so it is at least as exact), normalised, rounded to x's dtype,
 * then multiplied by the weight in float32 and rounded to y's dtype. With perm (not NULL), output
 * channel j is channel perm[j] of that result (Atom's reorder after a norm): the same values as
 * the norm then a gather, in the pass that writes them.
 * The squares go to 8 double sums (value j into sum j % 8, then added in a fixed order), the same
 * order in every build, so every build gives the same bits; one chain of dependent double adds
 * had made a 576-wide row latency-bound (0.9 ms for 512 rows, the cost of a bf16 linear). Rows are
 * shared out over the work pool in blocks of RMS_ROWS; a row's bits never depend on the thread. */
#define RMS_ROWS 16
struct rms_job {
    const void *x, *w;
    void *y;
    const int64_t *perm;
    int64_t rows, n;
    int x_bf16, w_bf16, y_bf16;
    float eps;
};

static inline float rms_inverse(const void *x, int x_bf16, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    if (x_bf16) {
        const uint16_t *xr = x;
        for (; j + 8 <= n; j += 8)
            for (int l = 0; l < 8; l++) {
                float v = bf16_to_f32(xr[j + l]);
                acc[l] += (double)(v * v);
            }
        for (; j < n; j++) {
            float v = bf16_to_f32(xr[j]);
            acc[j % 8] += (double)(v * v);
        }
    } else {
        const float *xr = x;
        for (; j + 8 <= n; j += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)(xr[j + l] * xr[j + l]);
        for (; j < n; j++) acc[j % 8] += (double)(xr[j] * xr[j]);
    }
    const double ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return (float)(ss / (double)n);
}

/* The output steps of one row, bfloat16 in, weight and out: the same operations as the generic loop. */
static void rms_out_bf16(const uint16_t *restrict x, const uint16_t *restrict w, uint16_t *restrict y, int64_t n,
                         float inv) {
    for (int64_t j = 0; j < n; j++) {
        float h = bf16_to_f32(f32_to_bf16(bf16_to_f32(x[j]) * inv));
        y[j] = f32_to_bf16(bf16_to_f32(w[j]) * h);
    }
}

static void rms_item(const void *ctx, int64_t item) {
    const struct rms_job *J = ctx;
    const int64_t n = J->n, r1 = (item + 1) * RMS_ROWS < J->rows ? (item + 1) * RMS_ROWS : J->rows;
    const size_t xe = J->x_bf16 ? 2 : 4, ye = J->y_bf16 ? 2 : 4;
    const int all_bf16 = J->x_bf16 && J->w_bf16 && J->y_bf16;
    uint16_t *row = all_bf16 && J->perm ? malloc((size_t)n * 2) : NULL; /* a reordered row, before its gather */
    for (int64_t r = item * RMS_ROWS; r < r1; r++) {
        const char *xr = (const char *)J->x + (size_t)(r * n) * xe;
        char *yr = (char *)J->y + (size_t)(r * n) * ye;
        const float inv = 1.0f / sqrtf(rms_inverse(xr, J->x_bf16, n) + J->eps);
        if (all_bf16 && !J->perm) { /* the bf16 model's case, in a loop the compiler vectorises */
            rms_out_bf16((const uint16_t *)xr, J->w, (uint16_t *)yr, n, inv);
        } else if (row) { /* every value as above, then placed: y[j] = row[perm[j]] */
            rms_out_bf16((const uint16_t *)xr, J->w, row, n, inv);
            for (int64_t j = 0; j < n; j++) ((uint16_t *)yr)[j] = row[J->perm[j]];
        } else
            for (int64_t j = 0; j < n; j++) {
                const int64_t c = J->perm ? J->perm[j] : j;
                float h = round_to(J->x_bf16, act_at(xr, J->x_bf16, c) * inv);
                store_at(yr, J->y_bf16, j, act_at(J->w, J->w_bf16, c) * h);
            }
    }
    free(row);
}

int rms_norm(const void *x, int x_bf16, int64_t rows, int64_t n, const void *w, int w_bf16, float eps, void *y,
             int y_bf16, const int64_t *perm, int threads) {
    for (int64_t j = 0; perm && j < n; j++) /* -1, nothing written: an index outside the row */
        if (perm[j] < 0 || perm[j] >= n) return -1;
    const struct rms_job J = {x, w, y, perm, rows, n, x_bf16, w_bf16, y_bf16, eps};
    const int64_t items = (rows + RMS_ROWS - 1) / RMS_ROWS;
    pool_run(rms_item, &J, items, rows * n >= 65536 ? threads : 1);
    return 0;
}

/* Rotary position embedding as Llama's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, with
 * rotate_half(x) = [-x[D/2:], x[:D/2]], every product and the sum rounded to x's dtype as torch
 * rounds them (a bf16 product is exact in float32, so one rounding each), so the same bits.
 * x: [B, H, S, D] with strides (xb, xh, xs) and unit stride in D; cos, sin: [B or 1, S, D]
 * contiguous (cb = 0 when shared by the batch); out: [B, H, S, D] contiguous. D even. */
/* torch rounds x*cos and rot*sin before adding them: no contraction into an FMA */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
void rope(const void *x, int64_t xb, int64_t xh, int64_t xs, const void *cos, const void *sin, int64_t cb, int bf16,
          int64_t B, int64_t H, int64_t S, int64_t D, void *out) {
    const int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++) {
                const int64_t xo = b * xb + h * xh + s * xs, co = b * cb + s * D, oo = ((b * H + h) * S + s) * D;
                if (bf16) {
                    const uint16_t *xr = (const uint16_t *)x + xo, *c = (const uint16_t *)cos + co,
                                   *sn = (const uint16_t *)sin + co;
                    uint16_t *o = (uint16_t *)out + oo;
                    for (int64_t d = 0; d < D; d++) {
                        const float rv = d < half ? -bf16_to_f32(xr[d + half]) : bf16_to_f32(xr[d - half]);
                        const float a = bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[d]) * bf16_to_f32(c[d])));
                        const float r = bf16_to_f32(f32_to_bf16(rv * bf16_to_f32(sn[d])));
                        o[d] = f32_to_bf16(a + r);
                    }
                } else {
                    const float *xr = (const float *)x + xo, *c = (const float *)cos + co, *sn = (const float *)sin + co;
                    float *o = (float *)out + oo;
                    for (int64_t d = 0; d < half; d++) o[d] = xr[d] * c[d] + (-xr[d + half]) * sn[d];
                    for (int64_t d = half; d < D; d++) o[d] = xr[d] * c[d] + xr[d - half] * sn[d];
                }
            }
}
#pragma GCC pop_options

/* One (batch, kv head): its `groups` query heads (rows qh apart in q) against L cached key and
 * value rows (kl / vl apart), head dim D <= 256, unit stride within a row. Softmax in float32 with
 * the maximum subtracted first; scores: scratch of L floats. A NaN or infinite maximum score makes
 * the head's output NaN (torch's softmax gives NaN there too). */
static void attend_group(const void *q, int64_t qh, const void *k, const void *v, int64_t kl, int64_t vl, int bf16,
                         int64_t groups, int64_t L, int64_t D, float scale, float *scores, void *out) {
    const int64_t es = bf16 ? 2 : 4;
    for (int64_t g = 0; g < groups; g++) {
        const char *qg = (const char *)q + g * qh * es;
        float qf[256], acc[256];
        for (int64_t d = 0; d < D; d++) qf[d] = act_at(qg, bf16, d) * scale;
        int64_t l = 0;
#if DECODE_SIMD
        if (D % 8 == 0) /* 4 keys at a time: 4 independent FMA chains instead of one */
            for (; l + 4 <= L; l += 4) {
                const char *k0 = (const char *)k + l * kl * es;
                const int64_t step = kl * es;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t d = 0; d < D; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(qf + d);
                    a0 = _mm256_fmadd_ps(qv, act_load8(k0, bf16, d), a0);
                    a1 = _mm256_fmadd_ps(qv, act_load8(k0 + step, bf16, d), a1);
                    a2 = _mm256_fmadd_ps(qv, act_load8(k0 + 2 * step, bf16, d), a2);
                    a3 = _mm256_fmadd_ps(qv, act_load8(k0 + 3 * step, bf16, d), a3);
                }
                scores[l] = hsum8(a0), scores[l + 1] = hsum8(a1), scores[l + 2] = hsum8(a2), scores[l + 3] = hsum8(a3);
            }
#endif
        for (; l < L; l++) {
            const char *kr = (const char *)k + l * kl * es;
            float s = 0.f;
            for (int64_t d = 0; d < D; d++) s += qf[d] * act_at(kr, bf16, d);
            scores[l] = s;
        }
        const float sum = softmax_weights(scores, L);
        if (sum != sum) {
            for (int64_t d = 0; d < D; d++) store_at(out, bf16, g * D + d, NAN);
            continue;
        }
        int64_t d0 = 0;
#if DECODE_SIMD
        for (; d0 + 32 <= D; d0 += 32) { /* 32 output dims held in registers across all L rows */
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (l = 0; l < L; l++) {
                const __m256 pv = _mm256_set1_ps(scores[l]);
                const char *vr = (const char *)v + l * vl * es;
                a0 = _mm256_fmadd_ps(pv, act_load8(vr, bf16, d0), a0);
                a1 = _mm256_fmadd_ps(pv, act_load8(vr, bf16, d0 + 8), a1);
                a2 = _mm256_fmadd_ps(pv, act_load8(vr, bf16, d0 + 16), a2);
                a3 = _mm256_fmadd_ps(pv, act_load8(vr, bf16, d0 + 24), a3);
            }
            _mm256_storeu_ps(acc + d0, a0), _mm256_storeu_ps(acc + d0 + 8, a1);
            _mm256_storeu_ps(acc + d0 + 16, a2), _mm256_storeu_ps(acc + d0 + 24, a3);
        }
#endif
        for (int64_t d = d0; d < D; d++) acc[d] = 0.f;
        if (d0 < D)
            for (l = 0; l < L; l++) {
                const char *vr = (const char *)v + l * vl * es;
                for (int64_t d = d0; d < D; d++) acc[d] += scores[l] * act_at(vr, bf16, d);
            }
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < D; d++) store_at(out, bf16, g * D + d, acc[d] * inv);
    }
}

struct attn_args {
    const char *q, *k, *v;
    int64_t qb, qh, kb, kh, kl, vb, vh, vl, Hq, Hkv, L, D, groups, es;
    int bf16;
    float scale;
    char *out;
    _Atomic int failed;
};

static void attn_item(const void *ctx, int64_t it) {
    struct attn_args *a = (struct attn_args *)ctx;
    float *scores = malloc((size_t)a->L * sizeof(float));
    if (!scores) {
        atomic_store(&a->failed, 1);
        return;
    }
    const int64_t b = it / a->Hkv, h = it % a->Hkv, es = a->es;
    attend_group(a->q + (b * a->qb + h * a->groups * a->qh) * es, a->qh, a->k + (b * a->kb + h * a->kh) * es,
                 a->v + (b * a->vb + h * a->vh) * es, a->kl, a->vl, a->bf16, a->groups, a->L, a->D, a->scale, scores,
                 a->out + (b * a->Hq + h * a->groups) * a->D * es);
    free(scores);
}

/* Attention of one new query per (batch, query head) over L cached positions with no mask (every
 * cached position is visible to the newest token), grouped-query heads: query head h reads kv head
 * h / (Hq / Hkv). q: [B, Hq, D] (strides qb, qh); k, v: [B, Hkv, L, D] (strides kb, kh, kl / vb,
 * vh, vl); out: [B, Hq, D] contiguous, all in one dtype (bf16 or float32). Returns 1 when out of
 * memory for a work item's scores (its heads are then not written: the caller raises), 2 on a head
 * dim over 256 (nothing written). Work items, one per (batch, kv head), go to the work pool. */
int attn_decode(const void *q, int64_t qb, int64_t qh, const void *k, int64_t kb, int64_t kh, int64_t kl,
                const void *v, int64_t vb, int64_t vh, int64_t vl, int bf16, int64_t B, int64_t Hq, int64_t Hkv,
                int64_t L, int64_t D, float scale, void *out, int threads) {
    if (D > 256 || Hkv <= 0 || Hq % Hkv) return 2;
    struct attn_args a = {q, k, v, qb, qh, kb, kh, kl, vb, vh, vl, Hq, Hkv, L, D, Hq / Hkv, bf16 ? 2 : 4, bf16,
                          scale, out, 0};
    const int64_t items = B * Hkv;
    pool_run(attn_item, &a, items, items * L * D >= 65536 ? threads : 1);
    return atomic_load(&a.failed);
}
