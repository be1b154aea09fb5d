/* AMX-BF16 tiles for bfloat16 calls of the batched W4A16 / W8A16 kernel (included by a16_gemm.c
 * after a16_dequant.h, whose per-quarter spreading of scales and zero points it uses). Defines
 * A16_AMX_BF16 (1 where the build has AMX-BF16), and then a16_bf16_run().
 *
 * The int16 tiles (a16_amx.h) keep the GEMVs' bits but pay, per group of 64-128 channels, two tile
 * products and a store and rescale of every int32 tile; on many tokens that costs more than the
 * CPU's own bfloat16 matmul. Here each work item unpacks its rows once per call into bfloat16
 * B tiles, w = bf16((u - z) * s) (a16_dequant.h's values: torch's rounding, subnormals aside), in
 * the pair-interleaved order TDPBF16PS reads, and multiplies the caller's bfloat16 activations as
 * they are: float32 sums over the whole row in the tiles, no rescale, one store per 32 tokens x 32
 * rows. The same arithmetic as torch's bfloat16 linear on the unpacked weight (products exact in
 * float32, float32 sums in another order; AMX-BF16 reads subnormal bfloat16 inputs as zero), so
 * within that path's bound: 2^-8 sum|x w| + 2^-126 sum|w| + the output's rounding (tested). */
#ifndef LOWBIT_A16_AMX_BF16_H
#define LOWBIT_A16_AMX_BF16_H
#include "a16_bf16_pairs.h"
#include "amx_tiles.h"
#if AMX_TILES && defined(__AMX_BF16__)
#include <stdatomic.h>
#define A16_AMX_BF16 1
#define BK 32 /* channels per bfloat16 tile step: 16 rows of 64 bytes */

struct bf16_args {
    const struct a16_weight *W;
    int64_t t, tp, steps; /* tokens, padded to 32; tile steps over kp */
    const uint8_t *xa;    /* packed A tiles (amx_packed_at over 2 kp bytes a token) */
    uint16_t *y;          /* [t, out] bfloat16 */
    _Atomic int failed;   /* an item found no memory for its tiles */
};

#ifndef BF16_KB
#define BF16_KB 8 /* tile steps per cache block: the block's B tiles of 64 rows (32 KB) stay in L1 over every token */
#endif
/* Rows of more than BF16_NARROW tile steps (1536 channels) take blocks of BF16_KB_WIDE: fewer
 * stores and reloads of the float32 tiles between blocks, at the price of B tiles that leave L1.
 * Side by side, 2 threads, AMX Xeon, bf16 in and out (the same bits: blocks only split the sums'
 * K order at tile boundaries, stored and reloaded exactly): at 512 tokens 4096² 12.0-13.3 -> 9.6-10.4
 * ms, 11008 -> 4096 39.3 -> 33.9, 2048² 2.60 -> 2.43 (blocks of 64 or 256 in between); 64 tokens
 * unchanged; on 576-wide rows blocks of 8 stay ahead (576 x 3072 at 512: 1.06 against 1.07-1.12). */
#ifndef BF16_KB_WIDE
#define BF16_KB_WIDE 128
#endif
#ifndef BF16_NARROW
#define BF16_NARROW 48
#endif

static void bf16_item(const void *ctx, int64_t item) {
    struct bf16_args *M = (struct bf16_args *)ctx; /* only `failed` is written, atomically */
    const struct a16_weight *W = M->W;
    const int64_t r0 = item * AMX_ROWS, pb = M->steps * 1024, ns = M->tp / 32;
    const int np = (W->out - r0) / PANEL < AMX_ROWS / PANEL ? (int)((W->out - r0) / PANEL) : AMX_ROWS / PANEL;
    const int npair = (np + 1) / 2;
    const int64_t kbs = M->steps > BF16_NARROW ? BF16_KB_WIDE : BF16_KB;
    const int64_t keep_bytes = M->steps > kbs ? ns * npair * 4096 : 0;
    uint8_t *tiles = amx_memory(np * pb + keep_bytes + 64);
    if (!tiles) {
        atomic_store(&M->failed, 1);
        return;
    }
    float(*keep)[4][256] = (void *)(tiles + np * pb); /* [ns * npair]: the float32 tiles between cache blocks */
    for (int p = 0; p < np; p++) bf16_fill(tiles + p * pb, W, r0 + p * PANEL);
    amx_config();
    float cb[2][2][256] __attribute__((aligned(64))); /* [token half][panel][16 tokens x 16 rows] */
    for (int64_t kb = 0; kb < M->steps; kb += kbs) {
        const int64_t ke = kb + kbs < M->steps ? kb + kbs : M->steps;
        for (int64_t s = 0; s < ns; s++) {
            const uint8_t *a0 = M->xa + 2 * s * pb, *a1 = a0 + pb; /* tokens 32 s .. + 15, + 16 .. + 31 */
            for (int pr = 0; pr < npair; pr++) {
                const int nv = np - 2 * pr < 2 ? np - 2 * pr : 2;
                const uint8_t *b0 = tiles + 2 * pr * pb, *b1 = b0 + pb;
                float(*k4)[256] = keep_bytes ? keep[s * npair + pr] : NULL;
                if (kb == 0) {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                } else {
                    _tile_loadd(0, k4[0], 64);
                    _tile_loadd(1, k4[1], 64);
                    _tile_loadd(2, k4[2], 64);
                    _tile_loadd(3, k4[3], 64);
                }
                for (int64_t st = kb; st < ke; st++) {
                    _tile_loadd(4, a0 + st * 1024, 64);
                    _tile_loadd(5, a1 + st * 1024, 64);
                    _tile_loadd(6, b0 + st * 1024, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 5, 6);
                    if (nv == 2) {
                        _tile_loadd(7, b1 + st * 1024, 64);
                        _tile_dpbf16ps(2, 4, 7);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
                if (ke < M->steps) {
                    _tile_stored(0, k4[0], 64);
                    _tile_stored(1, k4[1], 64);
                    _tile_stored(2, k4[2], 64);
                    _tile_stored(3, k4[3], 64);
                    continue;
                }
                _tile_stored(0, cb[0][0], 64);
                _tile_stored(1, cb[1][0], 64);
                if (nv == 2) {
                    _tile_stored(2, cb[0][1], 64);
                    _tile_stored(3, cb[1][1], 64);
                }
                const int mr = M->t - 32 * s < 32 ? (int)(M->t - 32 * s) : 32;
                for (int m = 0; m < mr; m++)
                    for (int v = 0; v < nv; v++)
                        f32_to_bf16_row(M->y + (32 * s + m) * W->out + r0 + (2 * pr + v) * PANEL,
                                        cb[m / 16][v] + m % 16 * 16, PANEL);
            }
        }
    }
    _tile_release();
}

/* x [t, k] bfloat16 -> packed A tiles of 2 kp bytes a token (channels k.. and tokens t.. zero); one
 * item per 32 tokens. */
struct bf16_pack_job {
    const uint16_t *x;
    int64_t t, k, kp;
    uint8_t *xa;
};

static void bf16_pack_item(const void *ctx, int64_t item) {
    const struct bf16_pack_job *J = ctx;
    const int64_t w = 2 * J->kp;
    for (int64_t i = item * 32; i < item * 32 + 32; i++)
        for (int64_t c = 0; c < J->kp; c += BK) /* each tile row: its values, zero after (every byte written) */
            amx_pack_row(J->xa + amx_packed_at(i, 2 * c, w), J->x + i * J->k + c,
                         i < J->t && c < J->k ? 2 * (J->k - c < BK ? J->k - c : BK) : 0);
}

/* One call on the bfloat16 tiles: y [t, out] bfloat16. 0 if it ran, 1 if it could not (no tile
 * permission), -1 out of memory. */
static int a16_bf16_run(const struct a16_weight *W, int64_t k, const uint16_t *x, int64_t t, uint16_t *y, int threads) {
    if (!amx_ready()) return 1;
    struct bf16_args M = {W, t, (t + 31) / 32 * 32, W->kp / BK, NULL, y, 0};
    uint8_t *xa = amx_act_memory(M.tp * 2 * W->kp + 64);
    if (!xa) return -1;
    struct bf16_pack_job P = {x, t, k, W->kp, xa};
    pool_run(bf16_pack_item, &P, M.tp / 32, threads);
    M.xa = xa;
    pool_run(bf16_item, &M, (W->out + AMX_ROWS - 1) / AMX_ROWS, threads);
    amx_act_release(xa);
    return atomic_load(&M.failed) ? -1 : 0;
}
#else
#define A16_AMX_BF16 0
#endif
#endif
