/* AMX-INT8 tiles for the batched W8A8 / W4A4 kernel (included by i8_gemm.c after its vector tiles,
 * whose i8_args, panels and i8_item it uses). Defines I8_AMX (1 where the build has AMX-INT8), and
 * then amx_ready() and the call's steps amx_begin(), amx_rows_jobs() and amx_finish(). */
#ifndef LOWBIT_I8_AMX_H
#define LOWBIT_I8_AMX_H
#include "amx_tiles.h"
#if AMX_TILES
/* AMX-INT8 (from 8 or 20 tokens, AMX_MIN_T): the same exact int32 per (token, row, group), from the
 * tiles of amx_tiles.h: the activation codes signed, INT8 panels read in place where each group is
 * whole tile steps (unsigned: TDPBSUD, then z * sum(x) subtracted), the others (4-bit, outliers)
 * unpacked into a per-thread buffer as signed u - z (TDPBSSD: nothing to subtract). Per group the 2 x 2 int32
 * tiles (32 tokens x 32 rows) are stored and rescaled with the float steps of tile() above, in the
 * same order: the same bits. No sum can overflow int32 at these widths (|u x| <= 255 * 128 over at
 * most 2^16 channels per group). */
#define I8_AMX 1
#ifdef AMX_MIN_TOKENS /* -DAMX_MIN_TOKENS=N: measure another threshold */
#define AMX_MIN_T(nibbles) AMX_MIN_TOKENS
#else
/* fewer tokens leave the A tiles mostly empty, and 4-bit panels must be unpacked first: measured on
 * 4096² (AMX Xeon, kernel alone, interleaved medians), W8A8's tiles win from 8 tokens (1.5 against
 * 3.5 ms at 24). W4A4's won from 48 when first measured; with the packed A tiles and the kept
 * buffers (later stops) they win from 20 on the default model's four shapes and 4096² (2 threads,
 * bf16 in and out, medians of 200, two runs; 32 tokens: 0.047-0.125 ms against 0.060-0.193, 4096²
 * 1.00 against 1.50; at 16 tokens the two split the shapes), hence 20: a decode step of 32
 * sequences is a 32-token call. */
#define AMX_MIN_T(nibbles) ((nibbles) ? 20 : 8)
#endif

struct amx_args {
    const struct i8_args *A;
    int64_t gs, kpa, kpoa, tp; /* channels per padded group; padded widths (normal, outliers); tokens padded to 32 */
    const int8_t *xa, *xoa;    /* packed A tiles (amx_packed_at) of widths kpa, kpoa */
    int direct;                /* INT8 panels whose groups are whole tile steps: read in place */
};

#ifndef AMX_SB
#define AMX_SB 1 /* token tiles (of 32) per block: their float sums (8 KB) stay in L1; measured best of 1-8 */
#endif
#ifndef AMX_KB
#define AMX_KB 512 /* channels per cache block (measured best of 128-1024 at 64 and 512 tokens on 4096²) */
#endif

/* Two consecutive groups g, g + 1 of 32 tokens (i0..) x nv panels from row r, their int32 tiles in
 * c0 and c1, added to the float sums at f (row stride AMX_ROWS) with the float steps of tile()
 * above in group order: fma(P_g, sw * sx, f), then fma(P_g+1, ..., that), one pass over the sums
 * for both groups, a token's two scales read once for its panels. Signed weights (filled panels):
 * the tile is the product; INT8 panels read in place (`direct`) subtract z * sum(x). */
static inline __attribute__((always_inline)) void amx_rescale_two(const struct i8_args *A, float *f,
                                                                  int32_t (*c0)[2][256], int32_t (*c1)[2][256],
                                                                  int64_t i0, int mr, int nv, int64_t r, int64_t g,
                                                                  int direct) {
    const int64_t ng = A->ng;
    vf_t s0[2], s1[2];
    for (int v = 0; v < nv; v++) {
        const float *sw = A->sw + (((r + v * PANEL) / PANEL) * ng + g) * PANEL;
        s0[v] = FLOAD(sw), s1[v] = FLOAD(sw + PANEL);
    }
    for (int m = 0; m < mr; m++, f += AMX_ROWS) {
        const int64_t q = (i0 + m) * ng + g;
        const vf_t x0 = FSET(A->sx[q]), x1 = FSET(A->sx[q + 1]);
        for (int v = 0; v < nv; v++) {
            vi_t p0 = VLOAD32(c0[m / 16][v] + (m % 16) * 16), p1 = VLOAD32(c1[m / 16][v] + (m % 16) * 16);
            if (direct) p0 = VSUB32(p0, VSET32(A->zx[q])), p1 = VSUB32(p1, VSET32(A->zx[q + 1]));
            const vf_t a = FMA(FCVT(p0), FMUL(s0[v], x0), g ? FLOAD(f + v * PANEL) : FZERO());
            FSTORE(f + v * PANEL, FMA(FCVT(p1), FMUL(s1[v], x1), a));
        }
    }
}

static void amx_item(const void *ctx, int64_t item) {
    const struct amx_args *M = ctx;
    const struct i8_args *A = M->A;
    const int64_t r0 = item * AMX_ROWS, ng = A->ng, ns = M->tp / 32;
    const int np = (A->out - r0) / PANEL < AMX_ROWS / PANEL ? (int)((A->out - r0) / PANEL) : AMX_ROWS / PANEL;
    const int npair = (np + 1) / 2;
    const int64_t nb = M->direct ? 0 : np * M->kpa * PANEL, ob = A->wo ? np * M->kpoa * PANEL : 0;
    const int64_t cbytes = AMX_SB * npair * 4 * 1024, fbytes = AMX_SB * 32 * AMX_ROWS * 4;
    /* per thread: unpacked B panels; for one block of token tiles, the int32 tiles kept across K
     * blocks and the float sums */
    uint8_t *amx_buf = amx_memory(nb + ob + cbytes + fbytes + 64);
    if (!amx_buf) { /* no memory for the tiles' buffers: the vector tiles over the same rows, the same bits */
        for (int64_t it = r0 / I8_ROWS_PER_ITEM; it * I8_ROWS_PER_ITEM < r0 + np * PANEL; it++) i8_item(A, it);
        return;
    }
    int32_t(*cbuf)[2][2][256] = (void *)(amx_buf + nb + ob); /* [AMX_SB * npair] */
    float *fs = (float *)(amx_buf + nb + ob + cbytes);     /* [AMX_SB * 32][AMX_ROWS] */
    const uint8_t *bn[AMX_ROWS / PANEL], *bo[AMX_ROWS / PANEL];
    for (int p = 0; p < np; p++) {
        if (M->direct)
            bn[p] = A->w + panel_at(r0 + p * PANEL, 0, A->kp, 0);
        else
            amx_fill(amx_buf + p * M->kpa * PANEL, A->w, A->nibbles, A->kp, r0 + p * PANEL, A->group, ng, M->gs, 1),
                bn[p] = amx_buf + p * M->kpa * PANEL;
        if (A->wo)
            amx_fill(amx_buf + nb + p * M->kpoa * PANEL, A->wo, 0, A->kpo, r0 + p * PANEL, A->kpo, 1, M->kpoa, 1),
                bo[p] = amx_buf + nb + p * M->kpoa * PANEL;
    }
    amx_config();
    int32_t cb[2][2][256] __attribute__((aligned(64))), cb2[2][2][256] __attribute__((aligned(64)));
    for (int64_t s0 = 0; s0 < ns; s0 += AMX_SB) { /* a block of token tiles: its float sums stay in L1 */
        if (!ng || (A->group < A->kp ? A->group : A->kp) <= 0) /* else group 0's rescale writes every sum read */
            memset(fs, 0, (size_t)fbytes);
        for (int64_t g = 0; g <= ng; g++) { /* g == ng: the INT8 outliers, one group */
            if (g == ng && !A->wo) break;
            const int out = g == ng;
            const int64_t len = out ? A->kpo : ((g + 1) * A->group < A->kp ? A->group : A->kp - g * A->group);
            const int64_t c0 = out ? 0 : g * M->gs, c1 = c0 + (len + AK - 1) / AK * AK, xs = out ? M->kpoa : M->kpa;
            const int8_t *x = out ? M->xoa : M->xa;
            const uint8_t *const *b = out ? bo : bn;
            /* cache blocks of about AMX_KB channels, never one short tail: a 576-wide group in one
             * block of 576, not 512 + 64 (W8A8 on the default model's 576-wide shapes up to 1.05x faster) */
            const int64_t nkb = (c1 - c0) / AMX_KB > 1 ? (c1 - c0) / AMX_KB : 1;
            const int64_t kbs = ((c1 - c0) / nkb + AK - 1) / AK * AK;
            const int kind = out || !M->direct ? 2 : 0; /* filled panels are signed (amx_fill) */
            /* Two groups that are one cache block each (W4A4's groups of 128) share one pass over the
             * float sums: their rescale, a store and reload of every int32 tile and one multiply-add per
             * value, cost about as much as their products (scripts/amx_tile_rates.c, README). */
            const int64_t len1 = g + 1 < ng ? ((g + 2) * A->group < A->kp ? A->group : A->kp - (g + 1) * A->group) : 0;
            const int64_t d0 = c0 + M->gs, d1 = d0 + (len1 + AK - 1) / AK * AK;
            if (!out && g + 1 < ng && c1 - c0 <= AMX_KB && d1 - d0 <= AMX_KB && len1 > 0) {
                for (int64_t si = s0; si < ns && si < s0 + AMX_SB; si++)
                    for (int pr = 0; pr < npair; pr++) {
                        const int nv = np - 2 * pr < 2 ? np - 2 * pr : 2;
                        const struct amx_a a = amx_a_packed(x + si * 32 * xs, xs);
                        amx_products(a, b + 2 * pr, nv, c0, c1, NULL, cb, kind);
                        amx_products(a, b + 2 * pr, nv, d0, d1, NULL, cb2, kind);
                        const int64_t i0 = si * 32;
                        const int mr = A->t - i0 < 32 ? (int)(A->t - i0) : 32;
                        amx_rescale_two(A, fs + (i0 - s0 * 32) * AMX_ROWS + 2 * pr * PANEL, cb, cb2, i0, mr, nv,
                                        r0 + 2 * pr * PANEL, g, M->direct);
                    }
                g++; /* and the loop's: two groups done */
                continue;
            }
            for (int64_t kb = c0; kb < c1; kb += kbs) {
                const int64_t ke = kb + kbs < c1 ? kb + kbs : c1;
                for (int64_t si = s0; si < ns && si < s0 + AMX_SB; si++)
                    for (int pr = 0; pr < npair; pr++) {
                        const int nv = np - 2 * pr < 2 ? np - 2 * pr : 2;
                        int32_t(*keep)[2][256] = cbuf[(si - s0) * npair + pr];
                        amx_products(amx_a_packed(x + si * 32 * xs, xs), b + 2 * pr, nv, kb, ke, kb == c0 ? NULL : keep,
                                     ke == c1 ? cb : keep, kind);
                        if (ke != c1) continue;
                        const int64_t i0 = si * 32;
                        const int mr = A->t - i0 < 32 ? (int)(A->t - i0) : 32;
                        /* one group: panels outer, tokens inner (amx_rescale_two's order, tokens outer,
                         * was 3 % slower here for W8A8 on 576 x 3072 at 2048 tokens, three A/B rounds) */
                        for (int v = 0; v < nv; v++) {
                            const int64_t r = r0 + (2 * pr + v) * PANEL;
                            vf_t swv = out ? FLOAD(A->swo + r) : FLOAD(A->sw + ((r / PANEL) * ng + g) * PANEL);
                            for (int m = 0; m < mr; m++) {
                                float *f = fs + (i0 - s0 * 32 + m) * AMX_ROWS + (2 * pr + v) * PANEL;
                                if (out) { /* filled, signed: the tile is the product */
                                    vi_t p = VLOAD32(cb[m / 16][v] + (m % 16) * 16);
                                    FSTORE(f, FADD(FLOAD(f), FMA(FCVT(p), FMUL(swv, FSET(A->sxo[i0 + m])), FZERO())));
                                } else {
                                    int64_t q = (i0 + m) * ng + g;
                                    vi_t p = VLOAD32(cb[m / 16][v] + (m % 16) * 16);
                                    if (M->direct) p = VSUB32(p, VSET32(A->zx[q])); /* unsigned INT8 read in place */
                                    FSTORE(f, FMA(FCVT(p), FMUL(swv, FSET(A->sx[q])), g ? FLOAD(f) : FZERO()));
                                }
                            }
                        }
                    }
            }
        }
        for (int64_t i = s0 * 32; i < A->t && i < (s0 + AMX_SB) * 32; i++)
            out_row(A, i, r0, fs + (i - s0 * 32) * AMX_ROWS, np * PANEL);
    }
    _tile_release();
}

/* x [t, kp] -> xa, packed A tiles: [tp / 16][w / 64][16 tokens][64 channels] with w = ng * gs,
 * each group on whole tile steps, zero padded (tokens t.. zero too; every byte written, no clearing
 * pass); one item per 32 tokens of tp.
 * Every tile load then reads 1 KB of consecutive memory instead of 16 rows w bytes apart (with w a
 * multiple of 4096 those rows share one L1 set). */
struct rows_job {
    const int8_t *x;
    int64_t t, kp, group, ng, gs;
    int8_t *xa;
};

static void amx_rows_item(const void *ctx, int64_t item) {
    const struct rows_job *J = ctx;
    const int64_t w = J->ng * J->gs;
    for (int64_t i = item * 32; i < item * 32 + 32; i++)
        for (int64_t g = 0; g < J->ng; g++) {
            const int64_t a = g * J->group, b = a + J->group < J->kp ? a + J->group : J->kp;
            for (int64_t c = 0; c < J->gs; c += AK) /* each tile row of the group: its codes, zero after */
                amx_pack_row(J->xa + amx_packed_at(i, g * J->gs + c, w), J->x + i * J->kp + a + c,
                             i < J->t && a + c < b ? (b - a - c < AK ? b - a - c : AK) : 0);
        }
}

/* The tiles' arguments for call A and its packed activation buffer (M->xa, M->xoa); 0, or 1 if the
 * tiles cannot run (no tile permission, no memory). */
static int amx_begin(const struct i8_args *A, struct amx_args *M) {
    if (!amx_ready()) return 1;
    *M = (struct amx_args){A, (A->group + AK - 1) / AK * AK, 0, A->wo ? (A->kpo + AK - 1) / AK * AK : 0,
                           (A->t + 31) / 32 * 32, NULL, NULL, 0};
    M->kpa = A->ng * M->gs;
    M->direct = !A->nibbles && M->gs == A->group && A->kp % AK == 0;
    int8_t *xa = (int8_t *)amx_act_memory(M->tp * (M->kpa + M->kpoa) + 64);
    if (!xa) return 1;
    M->xa = xa, M->xoa = xa + M->tp * M->kpa;
    return 0;
}

/* The packing jobs of call M (normal channels; outliers where A->wo): item i packs tokens 32 i .. + 31. */
static void amx_rows_jobs(const struct amx_args *M, struct rows_job *R, struct rows_job *O) {
    const struct i8_args *A = M->A;
    *R = (struct rows_job){A->x, A->t, A->kp, A->group, A->ng, M->gs, (int8_t *)M->xa};
    *O = (struct rows_job){A->xo, A->t, A->kpo, A->kpo, 1, M->kpoa, (int8_t *)M->xoa};
}

/* The products of call M, its activations packed; then its buffer goes back. */
static void amx_finish(const struct amx_args *M, int threads) {
    pool_run(amx_item, M, (M->A->out + AMX_ROWS - 1) / AMX_ROWS, threads);
    amx_act_release((uint8_t *)M->xa);
}
#else
#define I8_AMX 0
#endif
#endif
