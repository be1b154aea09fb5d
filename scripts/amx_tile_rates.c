/* How fast this CPU's AMX tiles multiply, alone and as lowbit's int8 kernels use them (one core).
 *
 *     gcc -O2 -mavx512f -mavx512bw -mavx512vl -mamx-tile -mamx-int8 -mamx-bf16 -pthread \
 *         scripts/amx_tile_rates.c -o /tmp/amx_tile_rates && /tmp/amx_tile_rates
 *
 * Prints ns per int8 tile product (16 tokens x 16 rows x 64 channels: 16384 multiply-adds): back
 * to back on tiles already loaded; through the kernels' own amx_products (csrc/amx_tiles.h: 2 x 2
 * blocking, 4 tile loads from L1 per 4 products) with the int32 tiles stored every S steps, as a
 * kernel with groups of 64 * S channels must store them for its per-group float rescale (W4A4's
 * groups of 128: S = 2); the two other orders tried (A and B double-buffered over 2 int32 tiles;
 * loads between the products); and bf16 tile products (8192 multiply-adds) as a bf16 linear runs
 * them. The int8 numbers are the least the kernels' product phase can cost. */
#include <stdio.h>
#include <time.h>

#include "../lowbit/kernels/csrc/amx_tiles.h"

#if !AMX_TILES
#error "build with AVX-512 BW and AMX-INT8 (the command above)"
#endif

static uint8_t A[32][1024] __attribute__((aligned(64))), B[32][1024] __attribute__((aligned(64)));
static int32_t C[2][2][2][256] __attribute__((aligned(64)));

/* One group of `steps` tile steps (64 channels each) for 32 tokens x 32 rows, its int32 tiles stored. */
typedef void (*group_fn)(int steps, int32_t (*c)[2][256]);

static void kernels_order(int steps, int32_t (*c)[2][256]) {
    const uint8_t *b[2] = {B[0], B[16]};
    amx_products(amx_a_packed(A[0], 16 * AK), b, 2, 0, (int64_t)steps * AK, NULL, c, 0);
}

static void double_buffered(int steps, int32_t (*c)[2][256]) { /* 2 int32 tiles: tokens 0-15, both panels */
    _tile_zero(0);
    _tile_zero(1);
    for (int k = 0; k < steps; k += 2) {
        _tile_loadd(2, A[k], 64);
        _tile_loadd(4, B[k], 64);
        _tile_loadd(5, B[16 + k], 64);
        _tile_dpbssd(0, 2, 4);
        _tile_dpbssd(1, 2, 5);
        _tile_loadd(3, A[k + 1], 64);
        _tile_loadd(6, B[k + 1], 64);
        _tile_loadd(7, B[17 + k], 64);
        _tile_dpbssd(0, 3, 6);
        _tile_dpbssd(1, 3, 7);
    }
    _tile_stored(0, c[0][0], 64);
    _tile_stored(1, c[0][1], 64);
}

static void loads_between(int steps, int32_t (*c)[2][256]) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, A[0], 64);
    _tile_loadd(6, B[0], 64);
    for (int k = 0; k < steps; k++) {
        _tile_loadd(5, A[16 + k], 64);
        _tile_dpbssd(0, 4, 6);
        _tile_loadd(7, B[16 + k], 64);
        _tile_dpbssd(1, 5, 6);
        _tile_dpbssd(2, 4, 7);
        if (k + 1 < steps) _tile_loadd(4, A[k + 1], 64);
        _tile_dpbssd(3, 5, 7);
        if (k + 1 < steps) _tile_loadd(6, B[k + 1], 64);
    }
    _tile_stored(0, c[0][0], 64);
    _tile_stored(1, c[1][0], 64);
    _tile_stored(2, c[0][1], 64);
    _tile_stored(3, c[1][1], 64);
}

static void bf16_products(int steps, int32_t (*c)[2][256]) { /* 2 x 2, fp32 tiles; bit patterns of 1s */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < steps; k++) {
        _tile_loadd(4, A[k], 64);
        _tile_loadd(5, A[16 + k], 64);
        _tile_loadd(6, B[k], 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        _tile_loadd(7, B[16 + k], 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c[0][0], 64);
    _tile_stored(1, c[1][0], 64);
    _tile_stored(2, c[0][1], 64);
    _tile_stored(3, c[1][1], 64);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* ns per tile product of fn's groups (4 products a step for 32 x 32; double_buffered makes 2). */
static double ns_per_product(group_fn fn, int steps, int per_step) {
    const long reps = 400000 / steps;
    for (long r = 0; r < 1000; r++) fn(steps, C[r & 1]);
    const double t0 = seconds();
    for (long r = 0; r < reps; r++) fn(steps, C[r & 1]);
    return (seconds() - t0) / ((double)reps * steps * per_step) * 1e9;
}

int main(void) {
    if (!amx_ready()) {
        puts("the OS grants no AMX tile state here");
        return 1;
    }
    amx_config();
    memset(A, 1, sizeof A);
    memset(B, 1, sizeof B);
    const long reps = 800000;
    const double t0 = seconds();
    for (long r = 0; r < reps; r++) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 5, 6);
        _tile_dpbssd(2, 4, 7);
        _tile_dpbssd(3, 5, 7);
    }
    printf("int8 products only, tiles loaded: %.2f ns per product\n", (seconds() - t0) / (reps * 4.0) * 1e9);
    const struct {
        const char *name;
        group_fn fn;
        int per_step;
    } runs[] = {{"int8, the kernels' amx_products", kernels_order, 4},
                {"int8, A and B double-buffered", double_buffered, 2},
                {"int8, loads between the products", loads_between, 4},
                {"bf16 (8192 multiply-adds a product)", bf16_products, 4}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        for (int steps = 2; steps <= 8; steps *= 2)
            printf("%s, int32 tiles stored every %d steps: %.2f ns per product\n", runs[i].name, steps,
                   ns_per_product(runs[i].fn, steps, runs[i].per_step));
    _tile_release();
    return 0;
}
