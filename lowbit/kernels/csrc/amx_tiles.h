/* Shared by the AMX-INT8 paths of the batched kernels (i8_amx.h, a16_amx.h): the OS permission, the
 * tile shapes, the weight panels laid out as B tiles and the tile products. Defines AMX_TILES (1
 * where the build has AVX-512 BW + AMX-INT8), and with it the rest.
 *
 * Tiles: A [16 tokens][64 channels] of int8 or uint8 activation codes; B [16 rows of 4 channels]
 * [16 rows x 4 bytes] of unsigned weight codes, which is exactly 16 of the panels' 64-byte vectors
 * (panel_simd.h); C [16 tokens][16 rows] int32. Each group of channels is laid out on whole
 * 64-channel steps (gs channels, zero padded in activations and weights alike), so a padded channel
 * adds 0 and every product stays the exact integer of the vector and portable loops. */
#ifndef LOWBIT_AMX_TILES_H
#define LOWBIT_AMX_TILES_H
#include "panel_simd.h"
#if PANEL_SIMD == 512 && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_TILES 1
#define AK 64 /* channels per tile step */
#ifndef AMX_ROWS
#define AMX_ROWS 64 /* rows per work item: A read once from memory per 64 rows, then from L1 */
#endif

static int amx_state = -1; /* -1: not asked yet; 0: the OS refused tile data; 1: granted */
static int amx_ready(void) {
    if (amx_state < 0) /* Linux hands out AMX tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA) */
        amx_state = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return amx_state;
}

/* Every tile 16 x 64 bytes: 0-3 C, 4-5 A (two halves of 32 tokens), 6-7 B (two panels of 16 rows). */
static void amx_config(void) {
    struct {
        uint8_t palette, start, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = 16;
    _tile_loadconfig(&c);
}

/* 16 rows' B vectors from panel rows r0.. into dst over the padded layout (group g at g * gs):
 * INT8 panels copied, 4-bit ones unpacked (low nibbles: channels 0-3 of 8, then high: 4-7). With
 * `sign`, the codes minus their zero point (8 for 4 bits, 128 for 8) as signed bytes, for TDPBSSD:
 * the tile then holds sum((u - z) * x) itself, the same int32, with no z * sum(x) to subtract. */
static void amx_fill(uint8_t *dst, const uint8_t *w, int nibbles, int64_t kp, int64_t r0, int64_t group, int64_t ng,
                     int64_t gs, int sign) {
    const __m512i z4 = _mm512_set1_epi8(sign ? 8 : 0), z8 = _mm512_set1_epi8(sign ? (char)0x80 : 0);
    for (int64_t g = 0; g < ng; g++) {
        int64_t a = g * group, b = a + group < kp ? a + group : kp;
        uint8_t *d = dst + g * gs * PANEL;
        if (nibbles)
            for (int64_t k = a; k < b; k += 8, d += 128) {
                vi_t raw = VLOAD(w + panel_at(r0, k, kp, 1));
                _mm512_storeu_si512((void *)d, _mm512_sub_epi8(VMASK4(raw), z4));
                _mm512_storeu_si512((void *)(d + 64), _mm512_sub_epi8(VSHR4(raw), z4));
            }
        else
            for (int64_t k = a; k < b; k += 4, d += 64)
                _mm512_storeu_si512((void *)d, _mm512_xor_si512(VLOAD(w + panel_at(r0, k, kp, 0)), z8));
        memset(d, 0, (size_t)(dst + (g + 1) * gs * PANEL - d));
    }
}

/* The A operand of 32 tokens: the tile of tokens 0-15 (lo) and 16-31 (hi) for the tile step at channel
 * c lies at lo/hi + (c / AK) * step, its 16 rows `stride` bytes apart. The kernels pack their codes
 * (amx_packed_at: step 1024, stride AK), so each tile load reads 1 KB of consecutive memory; read
 * in place from rows of w bytes, the 16 rows of a tile would share one L1 set whenever w is a
 * multiple of 4096 (measured: W8A8 on 4096² 1.12x faster packed, AMX Xeon, 8-512 tokens). */
struct amx_a {
    const uint8_t *lo, *hi;
    int64_t step, stride;
};

/* Packed tiles of codes [tp / 16][w / AK][16 tokens][AK channels] (w a multiple of AK): where
 * token i's padded channel c goes, and the operand of the 32 tokens whose first row is x. */
static inline int64_t amx_packed_at(int64_t i, int64_t c, int64_t w) {
    return (i / 16) * 16 * w + c / AK * 1024 + (i % 16) * AK + c % AK;
}
static inline struct amx_a amx_a_packed(const void *x, int64_t w) {
    const struct amx_a a = {x, (const uint8_t *)x + 16 * w, 1024, AK};
    return a;
}

/* int32 tiles C[token half][row panel] of 32 tokens (a) x nv panels (b) over channels [c0, c1) of
 * the padded layout, added to the tiles in cin (NULL: from 0), stored to cout. The A tiles hold
 * signed codes (TDPBSUD) or, with unsigned_x 1, unsigned ones (TDPBUUD), against unsigned
 * weights; unsigned_x 2: signed codes against signed weights (TDPBSSD; amx_fill's `sign`). */
static inline __attribute__((always_inline)) void amx_products(const struct amx_a a, const uint8_t *const *b,
                                                               int nv, int64_t c0, int64_t c1,
                                                               int32_t (*cin)[2][256], int32_t (*cout)[2][256],
                                                               const int unsigned_x) {
    if (cin) {
        _tile_loadd(0, cin[0][0], 64);
        _tile_loadd(1, cin[1][0], 64);
        if (nv == 2) {
            _tile_loadd(2, cin[0][1], 64);
            _tile_loadd(3, cin[1][1], 64);
        }
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t c = c0; c < c1; c += AK) {
        _tile_loadd(4, a.lo + c / AK * a.step, a.stride);
        _tile_loadd(5, a.hi + c / AK * a.step, a.stride);
        _tile_loadd(6, b[0] + c * PANEL, 64);
        if (unsigned_x == 2) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 5, 6);
        } else if (unsigned_x) {
            _tile_dpbuud(0, 4, 6);
            _tile_dpbuud(1, 5, 6);
        } else {
            _tile_dpbsud(0, 4, 6);
            _tile_dpbsud(1, 5, 6);
        }
        if (nv == 2) {
            _tile_loadd(7, b[1] + c * PANEL, 64);
            if (unsigned_x == 2) {
                _tile_dpbssd(2, 4, 7);
                _tile_dpbssd(3, 5, 7);
            } else if (unsigned_x) {
                _tile_dpbuud(2, 4, 7);
                _tile_dpbuud(3, 5, 7);
            } else {
                _tile_dpbsud(2, 4, 7);
                _tile_dpbsud(3, 5, 7);
            }
        }
    }
    _tile_stored(0, cout[0][0], 64);
    _tile_stored(1, cout[1][0], 64);
    if (nv == 2) {
        _tile_stored(2, cout[0][1], 64);
        _tile_stored(3, cout[1][1], 64);
    }
}

/* Per-thread memory of the AMX work items (unpacked panels, kept tiles, float sums), kept between
 * calls (grow_buffer, panel_simd.h); NULL if it cannot be had. */
static __thread uint8_t *amx_buf;
static __thread int64_t amx_cap;
static uint8_t *amx_memory(int64_t need) { return grow_buffer(&amx_buf, &amx_cap, need); }

/* The calling thread's buffer for one call's packed activations, kept between calls up to
 * AMX_ACT_KEEP bytes (a fresh allocation of that size is an mmap, whose pages fault in on every
 * call: a tenth of a 512-token A16 call); larger calls get their own, which amx_act_release frees.
 * Not amx_memory's: the calling thread also runs work items. NULL if it cannot be had. */
#define AMX_ACT_KEEP ((int64_t)8 << 20)
static __thread uint8_t *amx_act_buf;
static __thread int64_t amx_act_cap;
static uint8_t *amx_act_memory(int64_t need) {
    if (need > AMX_ACT_KEEP) return aligned_alloc(64, (size_t)(need + 63) / 64 * 64);
    return grow_buffer(&amx_act_buf, &amx_act_cap, need);
}
static void amx_act_release(uint8_t *p) {
    if (p != amx_act_buf) free(p);
}

/* One 64-byte row of a packed tile: the n (0..64) bytes at src, zero after them. */
static inline void amx_pack_row(void *dst, const void *src, int64_t n) {
    const __mmask64 m = n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
    _mm512_storeu_si512(dst, _mm512_maskz_loadu_epi8(m, src));
}
#else
#define AMX_TILES 0
#endif
#endif
