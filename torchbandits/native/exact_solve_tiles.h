/* The forward substitution's packing and register tiles of exact_step.c (included there, before
 * solve_factor): panel widths, the packing of K_SC, the factor's rows, and the MR x w tiles and
 * panel sums at AVX-512, AVX2 or plain-double width. Needs <math.h>, <stdint.h> and, with AVX,
 * <immintrin.h> (exact_step.c includes them first). */
#ifndef TB_EXACT_SOLVE_TILES_H
#define TB_EXACT_SOLVE_TILES_H

/* ---- The forward substitution V = L^{-1} K_SC, V_i = (K_i - sum_{k<i} L_ik V_k) / L_ii ----
 *
 * Packed and blocked as a matrix product (the bulk of the n^2 A / 2 multiply-adds is the update
 * K_I - L_{I,<i0} V_{<i0} of a block I of MR rows by the rows already solved):
 *   - the columns are cut into panels of NR = 3 vectors (12 columns with AVX2, 24 with AVX-512;
 *     the last ones 1, 2 or 3 vectors wide, the candidates padded with zero columns up to a
 *     multiple of a vector), the rows padded to npad, a
 *     multiple of MR = 4, with zero rows of L (and 1 / L_ii = 0: zero rows of V);
 *   - K_SC is packed panel by panel, each panel [npad, w] contiguous (kp; shared by the factors);
 *   - a panel is solved block after block into vp [npad, w] (contiguous, so the rows V_k that a
 *     block reads are one stream from the L1/L2 cache; L is read in place, MR streams along its
 *     rows i0 .. i0 + MR - 1: packing it cost more than it saved): the tile MR x w keeps its
 *     MR w / LANES accumulators in registers (4 x 3 vectors: twelve registers), each k costs
 *     w / LANES loads of V_k, MR broadcasts of L_{., k} and MR w / LANES fused multiply-adds
 *     (AVX-512: each V_ic still the same multiply-adds in the same order as with AVX2 or
 *     plain doubles, so the same bits, at twice the rate: 120-125 against 60-65 GFLOP/s on a
 *     Zen 5 core at n = 100-200);
 *     then the MR x MR triangle inside the block, in registers, row after row:
 *     acc_b -= sum_{p<b} L_{i0+b, i0+p} V_{i0+p} and V_{i0+b} = acc_b * (1 / L_{i0+b, i0+b});
 *   - a solved panel is written into V [n, A] (row-major) with mu = z^T V and colsum(V (.) V)
 *     of its columns, accumulated in the order of the rows.
 * Without AVX and FMA the same loops run on plain doubles (fma() for every multiply-add). */
#define MR 4
#if defined(__AVX512F__) && defined(__FMA__)
#define LANES 8 /* AVX-512: 8 doubles a vector (twice the multiply-adds a cycle of AVX2) */
#else
#define LANES 4
#endif
#define NR (3 * LANES)
/* The tiles of a solve's first panel prefetch the factor's rows two blocks ahead (lrow holds
 * npad + PF_ROWS addresses, the last ones the zero row). */
#define PF_ROWS (2 * MR)

/* The width of the panel that starts at column j0: NR (3 vectors), or the rest rounded up to a
 * vector; a rest of more than 3 and at most 4 vectors is cut 2 + 2 rather than 3 + 1 (a
 * one-vector tile keeps four accumulators, too few to fill the two FMA pipes: half the rate; a
 * two-vector tile keeps eight; A = 100 with AVX-512: 24 + 24 + 24 + 16 + 16, four columns of
 * padding). The columns are solved independently, each by the same operations in the same order
 * whatever the panel or the vector width, so the cut changes no number. */
static inline long panel_width(long A, long j0) {
    long rest = A - j0;
    return rest > NR && rest <= NR + LANES ? 2 * LANES
           : rest >= NR                    ? NR
                                           : (rest + LANES - 1) / LANES * LANES;
}

/* The columns of all panels of A candidates (A rounded up by the panels' padding). */
static inline long padded_columns(long A) {
    long total = 0;
    for (long j0 = 0, w; j0 < A; j0 += w) w = panel_width(A, j0), total += w;
    return total;
}

/* Pack K [n, A] (row-major) into the panels of kp (zero padding). */
static void pack_k(long n, long npad, long A, const double *kq, double *kp) {
    for (long j0 = 0, w; j0 < A; j0 += w) {
        w = panel_width(A, j0);
        long c = A - j0 < w ? A - j0 : w;
        double *panel = kp + npad * j0;
        for (long i = 0; i < npad; ++i) {
            long c0 = i < n ? c : 0;
            for (long q = 0; q < c0; ++q) panel[i * w + q] = kq[i * A + j0 + q];
            for (long q = c0; q < w; ++q) panel[i * w + q] = 0.0;
        }
    }
}

/* The addresses of the factor's rows, lrow [npad + PF_ROWS] (the padding rows and the
 * prefetch's rows past the end: zeros [npad]), and 1 / L_ii, inv [npad] (0 for the padding
 * rows). */
static void factor_rows(long n, long npad, const double *head, long n0, const double *tail,
                        long width, const double *zeros, const double **lrow, double *inv) {
    for (long i = 0; i < npad; ++i) {
        lrow[i] = i < n ? factor_row(head, n0, tail, width, i) : zeros;
        inv[i] = i < n ? lrow[i][i] : 0.0;
    }
    for (long i = 0; i < n; ++i) inv[i] = 1.0 / inv[i]; /* vectorised */
    for (long i = npad; i < npad + PF_ROWS; ++i) lrow[i] = zeros;
}

#if defined(__AVX__) && defined(__FMA__)
/* The vector type of the tiles (LANES doubles) and its operations: AVX-512 or AVX2. Each entry
 * is made by the same operations in the same order at either width (the same bits). */
#if LANES == 8
typedef __m512d vec;
#define VLOAD _mm512_loadu_pd
#define VSTORE _mm512_storeu_pd
#define VSET1(p) _mm512_set1_pd(*(p))
#define VFNMADD _mm512_fnmadd_pd
#define VMUL _mm512_mul_pd
#define VADD _mm512_add_pd
#define VZERO _mm512_setzero_pd
#define VREG "+v"
#else
typedef __m256d vec;
#define VLOAD _mm256_loadu_pd
#define VSTORE _mm256_storeu_pd
#define VSET1(p) _mm256_broadcast_sd(p)
#define VFNMADD _mm256_fnmadd_pd
#define VMUL _mm256_mul_pd
#define VADD _mm256_add_pd
#define VZERO _mm256_setzero_pd
#define VREG "+x"
#endif

/* Solve the block of rows i0 .. i0 + MR - 1 of a panel of w = LANES nv columns (nv = 1, 2, 3: a
 * constant after inlining into solve_tile_1/2/3); pf: prefetch the rows two blocks ahead (a
 * constant after inlining: the first panel of a solve only, see PREFETCH_ROWS). The accumulators are named variables a<b><q>
 * (row b, vector q), not an array: GCC keeps an array of twelve vectors in memory and stores
 * it at every k (a third of the rate). The vectors q >= nv are never used (dead code after
 * inlining). */
#define ROW_K(b) /* acc_b -= L_{i0+b, k} V_k */                                                 \
    do {                                                                                        \
        vec l = VSET1(l##b + k);                                                                \
        a##b##0 = VFNMADD(l, x0, a##b##0);                                                      \
        if (nv > 1) a##b##1 = VFNMADD(l, x1, a##b##1);                                          \
        if (nv > 2) a##b##2 = VFNMADD(l, x2, a##b##2);                                          \
    } while (0)
#define TRI_UPD(b, p) /* acc_b -= L_{i0+b, i0+p} V_{i0+p} (V_{i0+p} = acc_p, solved) */         \
    do {                                                                                        \
        vec l = VSET1(l##b + i0 + (p));                                                         \
        a##b##0 = VFNMADD(l, a##p##0, a##b##0);                                                 \
        if (nv > 1) a##b##1 = VFNMADD(l, a##p##1, a##b##1);                                     \
        if (nv > 2) a##b##2 = VFNMADD(l, a##p##2, a##b##2);                                     \
    } while (0)
#define TRI_ROW(b) /* V_{i0+b} = acc_b * (1 / L_{i0+b, i0+b}) */                                \
    do {                                                                                        \
        vec s = VSET1(inv + i0 + (b));                                                          \
        double *out = vp + (i0 + (b)) * w;                                                      \
        a##b##0 = VMUL(a##b##0, s);                                                             \
        VSTORE(out, a##b##0);                                                                   \
        if (nv > 1) a##b##1 = VMUL(a##b##1, s), VSTORE(out + LANES, a##b##1);                   \
        if (nv > 2) a##b##2 = VMUL(a##b##2, s), VSTORE(out + 2 * LANES, a##b##2);               \
    } while (0)
#define LOAD(b, q) (nv > (q) ? VLOAD(kp + (i0 + (b)) * w + LANES * (q)) : VZERO())
/* One cache line (8 doubles) of each row of the block PF_ROWS / MR blocks ahead, at column k: by
 * the time that block runs, the factor's rows it reads (columns < its i0) are in the cache. In a
 * batched step the runs' factors evict each other between two steps, so the first panel of a
 * solve (a member solved on a few columns, the one-column append, the first of a scoring's
 * panels) reads its factor from memory, in rows of at most n doubles: too short for the
 * hardware's stream prefetch to ramp up. With it, a 16-column solve at n = 200 out of memory
 * runs 2.2x faster on a Zen 5 core (benchmarks/exact_solve_rates.py, cold columns); the later
 * panels find the factor in the cache, where the prefetches would only cost issue slots (3-5 %
 * at n = 400-1000). A prefetch changes no number. */
#define PREFETCH_ROWS(k)                                                                        \
    do {                                                                                        \
        __builtin_prefetch(f0 + (k), 0, 3);                                                     \
        __builtin_prefetch(f1 + (k), 0, 3);                                                     \
        __builtin_prefetch(f2 + (k), 0, 3);                                                     \
        __builtin_prefetch(f3 + (k), 0, 3);                                                     \
    } while (0)

static inline __attribute__((always_inline)) void solve_tile(const double *const *lrow,
                                                             const double *inv, long i0,
                                                             const double *kp, double *vp,
                                                             const int nv, const int pf) {
    const long w = LANES * nv;
    vec a00 = LOAD(0, 0), a01 = LOAD(0, 1), a02 = LOAD(0, 2);
    vec a10 = LOAD(1, 0), a11 = LOAD(1, 1), a12 = LOAD(1, 2);
    vec a20 = LOAD(2, 0), a21 = LOAD(2, 1), a22 = LOAD(2, 2);
    vec a30 = LOAD(3, 0), a31 = LOAD(3, 1), a32 = LOAD(3, 2);
    const double *l0 = lrow[0], *l1 = lrow[1], *l2 = lrow[2], *l3 = lrow[3], *vk = vp;
    const double *f0 = lrow[PF_ROWS], *f1 = lrow[PF_ROWS + 1], *f2 = lrow[PF_ROWS + 2],
                 *f3 = lrow[PF_ROWS + 3];
    for (long k = 0; k < i0; ++k, vk += w) { /* the rows already solved */
        if (pf && (k & 7) == 0) PREFETCH_ROWS(k);
        vec x0 = VLOAD(vk);
        vec x1 = nv > 1 ? VLOAD(vk + LANES) : x0;
        vec x2 = nv > 2 ? VLOAD(vk + 2 * LANES) : x0;
        /* V_k in registers: else GCC reloads it as a memory operand of each of the MR FMAs
         * (16 loads per 12 FMAs: half the rate; with this empty asm the loop runs at the
         * core's peak, two FMAs per cycle, when the panel is in L1) */
        __asm__("" : VREG(x0), VREG(x1), VREG(x2));
        ROW_K(0);
        ROW_K(1);
        ROW_K(2);
        ROW_K(3);
    }
    /* the triangle inside the block, row after row */
    TRI_ROW(0);
    TRI_UPD(1, 0);
    TRI_ROW(1);
    TRI_UPD(2, 0);
    TRI_UPD(2, 1);
    TRI_ROW(2);
    TRI_UPD(3, 0);
    TRI_UPD(3, 1);
    TRI_UPD(3, 2);
    TRI_ROW(3);
}
#undef ROW_K
#undef TRI_UPD
#undef TRI_ROW
#undef LOAD
#undef PREFETCH_ROWS

/* Rows i0 .. i0 + 7 of a one-vector panel (w = LANES): eight rows' accumulators, where the 4 x 1
 * tile keeps four, too few to fill the two FMA pipes (half the rate). Each entry by the same
 * multiply-adds in the same order as in the 4-row tiles: the rows k < i0 (V_k from vp), then the
 * block's triangle row after row (V_{i0+p} from the registers: the same values), then the
 * multiplication by 1 / L_ii. pf: prefetch the factor's rows one block ahead (lrow holds PF_ROWS
 * = 8 addresses past the padded rows). */
#define ROW8_K(b) (a##b = VFNMADD(VSET1(l##b + k), x, a##b))
#define TRI8_UPD(b, p) (a##b = VFNMADD(VSET1(l##b + i0 + (p)), a##p, a##b))
#define TRI8_ROW(b)                                                                             \
    (a##b = VMUL(a##b, VSET1(inv + i0 + (b))), VSTORE(vp + (i0 + (b)) * LANES, a##b))
static void solve_tile_8x1(const double *const *lrow, const double *inv, long i0, const double *kp,
                           double *vp, int pf) {
    vec a0 = VLOAD(kp + (i0 + 0) * LANES), a1 = VLOAD(kp + (i0 + 1) * LANES);
    vec a2 = VLOAD(kp + (i0 + 2) * LANES), a3 = VLOAD(kp + (i0 + 3) * LANES);
    vec a4 = VLOAD(kp + (i0 + 4) * LANES), a5 = VLOAD(kp + (i0 + 5) * LANES);
    vec a6 = VLOAD(kp + (i0 + 6) * LANES), a7 = VLOAD(kp + (i0 + 7) * LANES);
    const double *l0 = lrow[0], *l1 = lrow[1], *l2 = lrow[2], *l3 = lrow[3];
    const double *l4 = lrow[4], *l5 = lrow[5], *l6 = lrow[6], *l7 = lrow[7], *vk = vp;
    for (long k = 0; k < i0; ++k, vk += LANES) {
        if (pf && (k & 7) == 0)
            for (int b = 8; b < 16; ++b) __builtin_prefetch(lrow[b] + k, 0, 3);
        vec x = VLOAD(vk);
        __asm__("" : VREG(x)); /* (V_k in a register, as in solve_tile) */
        ROW8_K(0);
        ROW8_K(1);
        ROW8_K(2);
        ROW8_K(3);
        ROW8_K(4);
        ROW8_K(5);
        ROW8_K(6);
        ROW8_K(7);
    }
    TRI8_ROW(0);
    TRI8_UPD(1, 0);
    TRI8_ROW(1);
    TRI8_UPD(2, 0), TRI8_UPD(2, 1);
    TRI8_ROW(2);
    TRI8_UPD(3, 0), TRI8_UPD(3, 1), TRI8_UPD(3, 2);
    TRI8_ROW(3);
    TRI8_UPD(4, 0), TRI8_UPD(4, 1), TRI8_UPD(4, 2), TRI8_UPD(4, 3);
    TRI8_ROW(4);
    TRI8_UPD(5, 0), TRI8_UPD(5, 1), TRI8_UPD(5, 2), TRI8_UPD(5, 3), TRI8_UPD(5, 4);
    TRI8_ROW(5);
    TRI8_UPD(6, 0), TRI8_UPD(6, 1), TRI8_UPD(6, 2), TRI8_UPD(6, 3), TRI8_UPD(6, 4);
    TRI8_UPD(6, 5);
    TRI8_ROW(6);
    TRI8_UPD(7, 0), TRI8_UPD(7, 1), TRI8_UPD(7, 2), TRI8_UPD(7, 3), TRI8_UPD(7, 4);
    TRI8_UPD(7, 5), TRI8_UPD(7, 6);
    TRI8_ROW(7);
}
#undef ROW8_K
#undef TRI8_UPD
#undef TRI8_ROW

/* The sums of a solved panel of w = LANES nv columns (nv = 1, 2, 3, a constant after inlining):
 * mu = sum_i z_i V_i and colsum(V (.) V), accumulated in the order of the rows with a product
 * then a sum (the scalar loop's operations: the build does not contract them), in registers
 * (an array of accumulators is kept in memory by GCC: a load and a store per row); V_i copied
 * into v's row i (v [n, A] at the panel's first column, NULL: none). */
static inline __attribute__((always_inline)) void panel_sums(long n, long A, const double *vp,
                                                             const double *z, double *v,
                                                             double *mu, double *sumsq,
                                                             const int nv) {
    const long w = LANES * nv;
    vec m0 = VZERO(), m1 = m0, m2 = m0, s0 = m0, s1 = m0, s2 = m0;
    for (long i = 0; i < n; ++i) {
        const double *vi = vp + i * w;
        vec zi = VSET1(z + i);
        vec x0 = VLOAD(vi);
        m0 = VADD(m0, VMUL(zi, x0));
        s0 = VADD(s0, VMUL(x0, x0));
        if (v) VSTORE(v + i * A, x0);
        if (nv > 1) {
            vec x1 = VLOAD(vi + LANES);
            m1 = VADD(m1, VMUL(zi, x1));
            s1 = VADD(s1, VMUL(x1, x1));
            if (v) VSTORE(v + i * A + LANES, x1);
        }
        if (nv > 2) {
            vec x2 = VLOAD(vi + 2 * LANES);
            m2 = VADD(m2, VMUL(zi, x2));
            s2 = VADD(s2, VMUL(x2, x2));
            if (v) VSTORE(v + i * A + 2 * LANES, x2);
        }
    }
    VSTORE(mu, m0);
    VSTORE(sumsq, s0);
    if (nv > 1) VSTORE(mu + LANES, m1), VSTORE(sumsq + LANES, s1);
    if (nv > 2) VSTORE(mu + 2 * LANES, m2), VSTORE(sumsq + 2 * LANES, s2);
}

/* The tile and the sums at 1, 2, 3 vectors, one copy each. */
static void solve_tile_1(const double *const *lrow, const double *inv, long i0,
                         const double *kp, double *vp, int pf) {
    if (pf) solve_tile(lrow, inv, i0, kp, vp, 1, 1);
    else solve_tile(lrow, inv, i0, kp, vp, 1, 0);
}
static void solve_tile_2(const double *const *lrow, const double *inv, long i0,
                         const double *kp, double *vp, int pf) {
    if (pf) solve_tile(lrow, inv, i0, kp, vp, 2, 1);
    else solve_tile(lrow, inv, i0, kp, vp, 2, 0);
}
static void solve_tile_3(const double *const *lrow, const double *inv, long i0,
                         const double *kp, double *vp, int pf) {
    if (pf) solve_tile(lrow, inv, i0, kp, vp, 3, 1);
    else solve_tile(lrow, inv, i0, kp, vp, 3, 0);
}
static void panel_sums_1(long n, long A, const double *vp, const double *z, double *v,
                         double *mu, double *sumsq) {
    panel_sums(n, A, vp, z, v, mu, sumsq, 1);
}
static void panel_sums_2(long n, long A, const double *vp, const double *z, double *v,
                         double *mu, double *sumsq) {
    panel_sums(n, A, vp, z, v, mu, sumsq, 2);
}
static void panel_sums_3(long n, long A, const double *vp, const double *z, double *v,
                         double *mu, double *sumsq) {
    panel_sums(n, A, vp, z, v, mu, sumsq, 3);
}
#else
/* Without AVX and FMA: the same loops on plain doubles (fma() for every multiply-add). */
static void solve_tile(const double *const *lrow, const double *inv, long i0, const double *kp,
                       double *vp, int nv) {
    const long w = LANES * nv;
    double acc[MR][NR];
    for (int b = 0; b < MR; ++b)
        for (long c = 0; c < w; ++c) acc[b][c] = kp[(i0 + b) * w + c];
    for (long k = 0; k < i0; ++k)
        for (int b = 0; b < MR; ++b)
            for (long c = 0; c < w; ++c) acc[b][c] = fma(-lrow[b][k], vp[k * w + c], acc[b][c]);
    for (int b = 0; b < MR; ++b) {
        for (int p = 0; p < b; ++p)
            for (long c = 0; c < w; ++c)
                acc[b][c] = fma(-lrow[b][i0 + p], acc[p][c], acc[b][c]);
        for (long c = 0; c < w; ++c) {
            acc[b][c] *= inv[i0 + b];
            vp[(i0 + b) * w + c] = acc[b][c];
        }
    }
}
#define solve_tile_1(lrow, inv, i0, kp, vp, pf) solve_tile(lrow, inv, i0, kp, vp, 1)
#define solve_tile_8x1(lrow, inv, i0, kp, vp, pf)                                               \
    (solve_tile(lrow, inv, i0, kp, vp, 1), solve_tile((lrow) + 4, inv, (i0) + 4, kp, vp, 1))
#define solve_tile_2(lrow, inv, i0, kp, vp, pf) solve_tile(lrow, inv, i0, kp, vp, 2)
#define solve_tile_3(lrow, inv, i0, kp, vp, pf) solve_tile(lrow, inv, i0, kp, vp, 3)
#endif

#endif /* TB_EXACT_SOLVE_TILES_H */
