/* How fast this CPU's AMX-INT8 tiles multiply, alone and as lowbit's int8 kernels use them (one core).
 *
 *     gcc -O2 -mamx-tile -mamx-int8 -mamx-bf16 scripts/amx_tile_rates.c -o /tmp/amx_tile_rates && /tmp/amx_tile_rates
 *
 * Prints ns per TDPBSSD (16 tokens x 16 rows x 64 channels: 16384 multiply-adds): back to back on
 * tiles already loaded; with each step's A and B tiles loaded from L1 (2 x 2 blocking: 4 loads per
 * 4 products, as csrc/amx_tiles.h); and with the 4 int32 tiles stored every S steps, as a kernel with
 * groups of 64 * S channels must store them for its per-group float rescale (W4A4's groups of 128:
 * S = 2). Also the two other orders tried (A and B double-buffered over 2 int32 tiles; loads
 * interleaved with the products); and bf16 products as a bf16 linear runs them. The int8 numbers are
 * the least the kernels' product phase can cost. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static uint8_t A[32][1024] __attribute__((aligned(64))), B[32][1024] __attribute__((aligned(64)));
static int32_t C[2][4][256] __attribute__((aligned(64)));

int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { /* ARCH_REQ_XCOMP_PERM, XTILEDATA */
        puts("the OS grants no AMX tile state here");
        return 1;
    }
    struct {
        uint8_t palette, start, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
    memset(A, 1, sizeof A), memset(B, 1, sizeof B);
    const long reps = 200000;

    double t0 = now();
    for (long r = 0; r < reps * 4; r++) {
        _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 5, 6); _tile_dpbssd(2, 4, 7); _tile_dpbssd(3, 5, 7);
    }
    printf("products only, tiles loaded: %.2f ns per product\n", (now() - t0) / (reps * 16.0) * 1e9);

    for (int steps = 1; steps <= 8; steps *= 2) {
        t0 = now();
        for (long r = 0; r < reps; r++) {
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int k = 0; k < steps; k++) {
                _tile_loadd(4, A[2 * k], 64); _tile_loadd(5, A[2 * k + 1], 64); _tile_loadd(6, B[2 * k], 64);
                _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 5, 6);
                _tile_loadd(7, B[2 * k + 1], 64);
                _tile_dpbssd(2, 4, 7); _tile_dpbssd(3, 5, 7);
            }
            int32_t(*c)[256] = C[r & 1];
            _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64); _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64);
        }
        printf("2 x 2 blocking, loads from L1, stored every %d steps: %.2f ns per product\n", steps,
               (now() - t0) / (reps * 4.0 * steps) * 1e9);
    }
    for (int steps = 2; steps <= 8; steps *= 2) {
        t0 = now();
        for (long r = 0; r < reps * 2; r++) {
            _tile_zero(0); _tile_zero(1);
            for (int k = 0; k < steps; k += 2) {
                _tile_loadd(2, A[2 * k], 64); _tile_loadd(4, B[2 * k], 64); _tile_loadd(5, B[2 * k + 1], 64);
                _tile_dpbssd(0, 2, 4); _tile_dpbssd(1, 2, 5);
                _tile_loadd(3, A[2 * k + 2], 64); _tile_loadd(6, B[2 * k + 2], 64); _tile_loadd(7, B[2 * k + 3], 64);
                _tile_dpbssd(0, 3, 6); _tile_dpbssd(1, 3, 7);
            }
            int32_t(*c)[256] = C[r & 1];
            _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
        }
        printf("2 int32 tiles, A and B double-buffered, stored every %d steps: %.2f ns per product\n", steps,
               (now() - t0) / (reps * 4.0 * steps) * 1e9);
    }
    for (int steps = 2; steps <= 8; steps *= 2) {
        t0 = now();
        for (long r = 0; r < reps; r++) {
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            _tile_loadd(4, A[0], 64); _tile_loadd(6, B[0], 64);
            for (int k = 0; k < steps; k++) {
                _tile_loadd(5, A[2 * k + 1], 64);
                _tile_dpbssd(0, 4, 6);
                _tile_loadd(7, B[2 * k + 1], 64);
                _tile_dpbssd(1, 5, 6); _tile_dpbssd(2, 4, 7);
                if (k + 1 < steps) _tile_loadd(4, A[2 * k + 2], 64);
                _tile_dpbssd(3, 5, 7);
                if (k + 1 < steps) _tile_loadd(6, B[2 * k + 2], 64);
            }
            int32_t(*c)[256] = C[r & 1];
            _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64); _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64);
        }
        printf("2 x 2 blocking, loads between the products, stored every %d steps: %.2f ns per product\n", steps,
               (now() - t0) / (reps * 4.0 * steps) * 1e9);
    }
    /* what bf16 linears get (oneDNN's AMX-BF16): half the multiply-adds per product (16 x 16 x 32),
     * long accumulation chains (no groups) */
    for (int steps = 8; steps <= 16; steps *= 2) {
        t0 = now();
        for (long r = 0; r < reps; r++) {
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int k = 0; k < steps; k++) {
                _tile_loadd(4, A[k % 16], 64); _tile_loadd(5, A[16 + k % 16], 64); _tile_loadd(6, B[k % 16], 64);
                _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 5, 6);
                _tile_loadd(7, B[16 + k % 16], 64);
                _tile_dpbf16ps(2, 4, 7); _tile_dpbf16ps(3, 5, 7);
            }
            int32_t(*c)[256] = C[r & 1];
            _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64); _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64);
        }
        printf("bf16 (TDPBF16PS, 8192 multiply-adds), 2 x 2 blocking, stored every %d steps: %.2f ns per product\n",
               steps, (now() - t0) / (reps * 4.0 * steps) * 1e9);
    }
    _tile_release();
    return 0;
}
