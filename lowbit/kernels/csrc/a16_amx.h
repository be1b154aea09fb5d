/* AMX-INT8 tiles for the batched W4A16 / W8A16 kernel (included by a16_gemm.c after its vector
 * tiles, whose a16_args and a16_item it uses). Defines A16_AMX (1 where the build has AMX-INT8), and
 * then a16_amx_run().
 *
 * The activations are int16 codes and AMX multiplies bytes, so each code is split exactly:
 * x = 256 * hi + lo with hi = x >> 8 signed (-128..127) and lo = x & 255 unsigned. The weight codes
 * u are unsigned, so per (token, row, group) sum(u * hi) comes from TDPBSUD and sum(u * lo) from
 * TDPBUUD, each exact (|u * hi| <= 255 * 128 over at most 2^16 channels), and
 * P = 256 * sum(u * hi) + sum(u * lo) - z * sum(x) is formed in wrapping int32 lanes: the vector
 * tiles' and the GEMVs' integer, then the same float steps in group order. So the same bits
 * (tested). Twice W8A8's tile products and int32 tiles to read back per group: 1.2-1.8x the vector
 * tiles from 8 tokens on (4096²), yet below the CPU's own bf16 tiles (oneDNN) from about 24 tokens,
 * where each group's tiles, stored and rescaled, cost more than the products. */
#ifndef LOWBIT_A16_AMX_H
#define LOWBIT_A16_AMX_H
#include "amx_tiles.h"
#if AMX_TILES
#define A16_AMX 1
#ifdef AMX_MIN_TOKENS /* -DAMX_MIN_TOKENS=N: measure another threshold */
#define A16_AMX_MIN_T AMX_MIN_TOKENS
#else
/* measured on 4096² (AMX Xeon, kernel alone, interleaved medians, bf16 in): from 8 tokens the tiles
 * win (W4A16 1.9 against 2.2-2.3 ms, W8A16 1.3 against 1.5), at 4 the vector tiles (0.9 against
 * 1.5 ms for W4A16) */
#define A16_AMX_MIN_T 8
#endif

struct a16_amx_args {
    const struct a16_args *A;
    int64_t gs, kpa, tp;     /* channels per padded group; padded width; tokens padded to 32 */
    const int8_t *xh;        /* high bytes of the codes, signed, packed tiles of width kpa */
    const uint8_t *xl;       /* low bytes, unsigned, the same layout */
    int direct;              /* INT8 panels whose groups are whole tile steps: read in place */
};

static void a16_amx_item(const void *ctx, int64_t item) {
    const struct a16_amx_args *M = ctx;
    const struct a16_args *A = M->A;
    const int64_t r0 = item * AMX_ROWS, ng = A->ng, kpa = M->kpa;
    const int np = (A->out - r0) / PANEL < AMX_ROWS / PANEL ? (int)((A->out - r0) / PANEL) : AMX_ROWS / PANEL;
    const int64_t nb = M->direct ? 0 : np * kpa * PANEL, fbytes = 32 * AMX_ROWS * 4;
    uint8_t *buf = amx_memory(nb + fbytes + 64); /* per thread: unpacked B panels, 32 tokens' float sums */
    if (!buf) { /* no memory: the vector tiles over the same rows, the same bits */
        for (int64_t it = r0 / A16_ROWS_PER_ITEM; it * A16_ROWS_PER_ITEM < r0 + np * PANEL; it++) a16_item(A, it);
        return;
    }
    float *fs = (float *)(buf + nb); /* [32 tokens][AMX_ROWS] */
    const uint8_t *bw[AMX_ROWS / PANEL];
    for (int p = 0; p < np; p++) {
        if (M->direct)
            bw[p] = A->w + panel_at(r0 + p * PANEL, 0, A->kp, 0);
        else
            amx_fill(buf + p * kpa * PANEL, A->w, A->nibbles, A->kp, r0 + p * PANEL, A->group, ng, M->gs, 0),
                bw[p] = buf + p * kpa * PANEL;
    }
    amx_config();
    int32_t ch[2][2][256] __attribute__((aligned(64))), cl[2][2][256] __attribute__((aligned(64)));
    for (int64_t i0 = 0; i0 < A->t; i0 += 32) { /* one tile of 32 tokens: its float sums stay in L1 */
        const int mr = A->t - i0 < 32 ? (int)(A->t - i0) : 32;
        memset(fs, 0, (size_t)fbytes);
        for (int64_t g = 0; g < ng; g++) {
            const int64_t len = (g + 1) * A->group < A->kp ? A->group : A->kp - g * A->group;
            const int64_t c0 = g * M->gs, c1 = c0 + (len + AK - 1) / AK * AK;
            for (int pr = 0; pr < (np + 1) / 2; pr++) {
                const int nv = np - 2 * pr < 2 ? np - 2 * pr : 2;
                amx_products(amx_a_packed(M->xh + i0 * kpa, kpa), bw + 2 * pr, nv, c0, c1, NULL, ch, 0);
                amx_products(amx_a_packed(M->xl + i0 * kpa, kpa), bw + 2 * pr, nv, c0, c1, NULL, cl, 1);
                for (int v = 0; v < nv; v++) {
                    const int64_t r = r0 + (2 * pr + v) * PANEL, q = ((r / PANEL) * ng + g) * PANEL;
                    const vf_t swv = FLOAD(A->sw + q);
                    const vi_t zv = VLOAD32(A->zw + q);
                    for (int m = 0; m < mr; m++) {
                        const int64_t s = (i0 + m) * ng + g;
                        vi_t p = VADD32(_mm512_slli_epi32(VLOAD32(ch[m / 16][v] + (m % 16) * 16), 8),
                                        VLOAD32(cl[m / 16][v] + (m % 16) * 16));
                        p = VSUB32(p, VMUL32(zv, VSET32(A->xs[s])));
                        float *f = fs + m * AMX_ROWS + (2 * pr + v) * PANEL;
                        FSTORE(f, FMA(FCVT(p), FMUL(swv, FSET(A->sx[s])), FLOAD(f)));
                    }
                }
            }
        }
        for (int m = 0; m < mr; m++)
            memcpy(A->y + (i0 + m) * A->out + r0, fs + m * AMX_ROWS, (size_t)np * PANEL * sizeof(float));
    }
    _tile_release();
}

/* x [t, kp] int16 -> xh, xl: packed A tiles (amx_packed_at) of width ng * gs, each group on whole
 * tile steps, zero padded (tokens t.. zero too); one item per 32 tokens of tp. */
struct a16_split_job {
    const int16_t *x;
    int64_t t, kp, group, ng, gs;
    int8_t *xh;
    uint8_t *xl;
};

static void a16_split_item(const void *ctx, int64_t item) {
    const struct a16_split_job *J = ctx;
    const int64_t w = J->ng * J->gs;
    memset(J->xh + item * 32 * w, 0, (size_t)(32 * w));
    memset(J->xl + item * 32 * w, 0, (size_t)(32 * w));
    for (int64_t i = item * 32; i < J->t && i < item * 32 + 32; i++)
        for (int64_t g = 0; g < J->ng; g++) {
            const int64_t a = g * J->group, b = a + J->group < J->kp ? a + J->group : J->kp;
            const int16_t *src = J->x + i * J->kp + a;
            int64_t k = 0;
            for (; k + 32 <= b - a; k += 32) { /* 32 channels never straddle a tile step */
                const int64_t at = amx_packed_at(i, g * J->gs + k, w);
                __m512i v = _mm512_loadu_si512((const void *)(src + k));
                _mm256_storeu_si256((__m256i *)(J->xh + at), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
                _mm256_storeu_si256((__m256i *)(J->xl + at), _mm512_cvtepi16_epi8(v));
            }
            for (; k < b - a; k++) {
                const int64_t at = amx_packed_at(i, g * J->gs + k, w);
                J->xh[at] = (int8_t)(src[k] >> 8), J->xl[at] = (uint8_t)src[k];
            }
        }
}

/* Runs the call on AMX tiles; 0 if it did, 1 if it could not (no tile permission, no memory). */
static int a16_amx_run(const struct a16_args *A, int threads) {
    if (!amx_ready()) return 1;
    struct a16_amx_args M = {A, (A->group + AK - 1) / AK * AK, 0, (A->t + 31) / 32 * 32, NULL, NULL, 0};
    M.kpa = A->ng * M.gs;
    M.direct = !A->nibbles && M.gs == A->group && A->kp % AK == 0;
    int8_t *xh = (int8_t *)amx_act_memory(2 * M.tp * M.kpa + 64);
    if (!xh) return 1;
    struct a16_split_job S = {A->x, A->t, A->kp, A->group, A->ng, M.gs, xh, (uint8_t *)xh + M.tp * M.kpa};
    pool_run(a16_split_item, &S, M.tp / 32, threads);
    M.xh = S.xh, M.xl = S.xl;
    pool_run(a16_amx_item, &M, (A->out + AMX_ROWS - 1) / AMX_ROWS, threads);
    amx_act_release((uint8_t *)xh);
    return 0;
}
#else
#define A16_AMX 0
#endif
#endif
