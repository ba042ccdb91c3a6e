/* The single-run step of the exact kernel-ridge posterior (torchbandits.models.ExactKernelRidge)
 * for the stationary kernels of torchbandits.kernel_fast, in two calls: scoring a candidate set
 * and appending the played candidate.
 *
 * Notation (float64, row-major, no pointer kept between calls):
 *   stored points, already scaled by the kernel weights: xs [n, d];
 *   candidates C [A, d] and weights w [d] (or [1]): scaled candidates cs = C * w;
 *   D_ij = |xs_i|^2 - 2 xs_i . cs_j + |cs_j|^2 clamped at 0, u = sqrt(D) and the closed forms
 *     RBF: exp(-D); Matern-1/2: exp(-u); Matern-3/2: (1 + u) / exp(u);
 *     Matern-5/2: (u + D/3 + 1) / exp(u); times the output scale s;
 *   per maintained regulariser r: the lower Cholesky factor L_r of K + a_r I, stored as a
 *     contiguous head [n0, n0] and a tail of rows [m, width] that hold full rows of L_r
 *     (torchbandits.linalg.GrowingCholesky), and z_r = L_r^{-1} y [n].
 *
 * Scoring (the Cholesky form of the posterior, Flynn & Reeb 2024, App. E.2):
 *   V_r = L_r^{-1} K_SC [n, A], mu_r = z_r^T V_r, colsum(V_r^2), var_r = max(k_CC - colsum, 0)
 * i.e. the GP posterior mean and variance mu_a(x) = k_S(x)^T (K + aI)^{-1} y and
 * rho_a^2(x) = k(x, x) - k_S(x)^T (K + aI)^{-1} k_S(x) of Flynn & Reeb 2024, Eq. (14)'s pieces.
 *
 * Appending candidate j: the new row of L_r is V_r[:, j] (L_r^{-1} k_S(x_j)), its pivot
 * d_r = sqrt(k(x_j, x_j) + a_r - colsum(V_r^2)_j), and z_r gains (y - mu_r[j]) / d_r.
 *
 * Included: exact_solve_tiles.h (the solve's packing and tiles), exact_prune.h (the pruned select
 * of every closed-form bound, one term or DMM's grid; its keys in exact_prune_keys.h) and
 * exact_fused_step.h (the fused single-run step: one call per select and per append on a table
 * of the model's state).
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

enum { RBF = 0, MATERN12 = 1, MATERN32 = 2, MATERN52 = 3 };

/* exp(x), inlined into loops that the compiler vectorises (libm's exp is one call per element).
 * Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2; exp(r) by its Taylor polynomial of degree 13
 * (truncation below 1e-17 relative) in Horner's form with fused multiply-adds; times 2^k built
 * in the exponent bits. Within a few units in the last place of libm for x in [-708, 709];
 * outside (overflow, subnormal results, NaN) garbage: the callers redo those with libm's exp. */
static inline double exp_core(double xv) {
    const double log2e = 1.4426950408889634, shift = 6755399441055744.0; /* 1.5 * 2^52 */
    const double ln2hi = 6.93147180369123816490e-01, ln2lo = 1.90821492927058770002e-10;
    double kd = fma(xv, log2e, shift); /* round(x / ln2) in the low bits of kd */
    double k = kd - shift;
    double r = fma(-k, ln2lo, fma(-k, ln2hi, xv));
    double p = 1.0 / 6227020800.0;
    p = fma(p, r, 1.0 / 479001600.0);
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    uint64_t kb, shift_bits;
    memcpy(&kb, &kd, sizeof kb);
    memcpy(&shift_bits, &shift, sizeof shift_bits);
    uint64_t sb = (kb - shift_bits + 1023u) << 52; /* the bits of 2^k */
    double scale;
    memcpy(&scale, &sb, sizeof scale);
    return p * scale;
}

/* Whether some argument of exp_core lies outside [-708, 709] (or is NaN). */
static int exp_out_of_range(const double *arg, long m) {
    int out = 0;
    for (long i = 0; i < m; ++i) out |= (arg[i] < -708.0) | (arg[i] > 709.0) | (arg[i] != arg[i]);
    return out;
}

/* K_SC [n, A] (and cs [A, d]) of the scaled stored points xs [n, d] and the candidates, a row
 * at a time: D = (|x|^2 + (-2) x.c) + |c|^2 clamped at 0 (the order of the torch path's addmm
 * and add), then the closed form (the operations of kernel_fast.ScaledStationary.of_sqdist_),
 * times s, in one vectorised loop per row; the entries whose exp argument is out of exp_core's
 * range are redone with libm's exp. scratch: (3 + d) A doubles. */
static void kernel_block(long n, long A, long d, const double *xs, const double *cand,
                         const double *w, long dw, int kind, double outscale, int has_scale,
                         double *cs, double *kq, double *scratch) { /* cs may be NULL */
    double *csq = scratch, *dist = scratch + A, *arg = scratch + 2 * A;
    double *cst = scratch + 3 * A; /* cs transposed [d, A] */
    double s = has_scale ? outscale : 1.0; /* (x * 1.0 == x) */
    for (long j = 0; j < A; ++j) {
        double sq = 0.0;
        for (long k = 0; k < d; ++k) {
            double v = cand[j * d + k] * w[dw == 1 ? 0 : k];
            if (cs) cs[j * d + k] = v;
            cst[k * A + j] = v;
            sq += v * v;
        }
        csq[j] = sq;
    }
    for (long i = 0; i < n; ++i) {
        const double *x = xs + i * d;
        double xsq = 0.0;
        for (long k = 0; k < d; ++k) xsq += x[k] * x[k];
        double *row = kq + i * A;
        for (long j = 0; j < A; ++j) dist[j] = x[0] * cst[j];
        for (long k = 1; k < d; ++k)
            for (long j = 0; j < A; ++j) dist[j] += x[k] * cst[k * A + j];
        for (long j = 0; j < A; ++j) {
            double dd = (xsq + -2.0 * dist[j]) + csq[j];
            dist[j] = dd > 0.0 ? dd : 0.0;
        }
        if (kind == RBF) /* exp(-D) */
            for (long j = 0; j < A; ++j) {
                double a = -dist[j];
                arg[j] = a;
                row[j] = exp_core(a) * s;
            }
        else if (kind == MATERN12) /* exp(-u) */
            for (long j = 0; j < A; ++j) {
                double a = -sqrt(dist[j]);
                arg[j] = a;
                row[j] = exp_core(a) * s;
            }
        else if (kind == MATERN32) /* (1 + u) / exp(u) */
            for (long j = 0; j < A; ++j) {
                double u = sqrt(dist[j]);
                arg[j] = u;
                row[j] = ((u + 1.0) / exp_core(u)) * s;
            }
        else /* (u + D/3 + 1) / exp(u) */
            for (long j = 0; j < A; ++j) {
                double u = sqrt(dist[j]);
                arg[j] = u;
                row[j] = (((u + dist[j] * (1.0 / 3.0)) + 1.0) / exp_core(u)) * s;
            }
        if (exp_out_of_range(arg, A))
            for (long j = 0; j < A; ++j) {
                double a = arg[j];
                if (a >= -708.0 && a <= 709.0) continue;
                if (kind == RBF || kind == MATERN12) row[j] = exp(a) * s;
                else if (kind == MATERN32) row[j] = ((a + 1.0) / exp(a)) * s;
                else row[j] = (((a + dist[j] * (1.0 / 3.0)) + 1.0) / exp(a)) * s;
            }
    }
}

/* Row i of a GrowingCholesky factor (columns 0..i). */
static inline const double *factor_row(const double *head, long n0, const double *tail,
                                       long width, long i) {
    return i < n0 ? head + i * n0 : tail + (i - n0) * width;
}

/* The forward substitution's packing and tiles (panel_width, pack_k, factor_rows, solve_tile_*,
 * panel_sums_*). */
#include "exact_solve_tiles.h"

/* Rows i_from .. i_to - 1 (multiples of MR) of a panel of w columns (kpan its packed kernel
 * block [npad, w], vp its solved rows [npad, w]; pf: prefetch the factor's rows, the first panel
 * of a solve). A panel solved in pieces is solved by the same operations as in one go. */
static inline void solve_panel_rows(const double *const *lrow, const double *inv, long w,
                                    const double *kpan, double *vp, long i_from, long i_to,
                                    int pf) {
    (void)pf; /* read by the vector tiles only */
    if (w == LANES) /* one vector: eight rows a tile (full rate), the last four alone */
        for (long i0 = i_from; i0 < i_to; i0 += 2 * MR) {
            if (i0 + 2 * MR <= i_to) solve_tile_8x1(lrow + i0, inv, i0, kpan, vp, pf);
            else solve_tile_1(lrow + i0, inv, i0, kpan, vp, pf);
        }
    else
        for (long i0 = i_from; i0 < i_to; i0 += MR) {
            if (w == 3 * LANES) solve_tile_3(lrow + i0, inv, i0, kpan, vp, pf);
            else solve_tile_2(lrow + i0, inv, i0, kpan, vp, pf);
        }
}

/* The sums of a solved panel of w columns, c of them real: mu = z^T V and colsum(V (.) V) of
 * those c, accumulated in the order of the rows (a product, then a sum), and V's rows copied to
 * v [n, A] at the panel's first column (v NULL: not written). */
static void panel_finish(long n, long A, long w, long c, const double *vp, const double *z,
                         double *v, double *mu, double *sumsq) {
#if defined(__AVX__) && defined(__FMA__)
    if (c == w) { /* a full panel: the sums in registers (the same operations) */
        if (w == 3 * LANES) panel_sums_3(n, A, vp, z, v, mu, sumsq);
        else if (w == 2 * LANES) panel_sums_2(n, A, vp, z, v, mu, sumsq);
        else panel_sums_1(n, A, vp, z, v, mu, sumsq);
        return;
    }
#endif
    double m[NR], s[NR];
    for (long q = 0; q < w; ++q) m[q] = s[q] = 0.0;
    for (long i = 0; i < n; ++i) {
        const double *vi = vp + i * w;
        double zi = z[i];
        for (long q = 0; q < w; ++q) {
            m[q] += zi * vi[q];
            s[q] += vi[q] * vi[q];
        }
        if (v)
            for (long q = 0; q < c; ++q) v[i * A + q] = vi[q];
    }
    for (long q = 0; q < c; ++q) mu[q] = m[q], sumsq[q] = s[q];
}

/* One factor: V = L^{-1} K [n, A] from the packed kp, the rows of L and 1 / L_ii (lrow, inv
 * [npad], see above; vp [npad, NR] scratch per panel), mu = z^T V and colsum(V (.) V) [A].
 * v may be NULL: V is not written (mu and colsum only). */
static void solve_factor(long n, long npad, long A, const double *kp, const double *const *lrow,
                         const double *inv, const double *z, double *vp, double *v, double *mu,
                         double *sumsq) {
    for (long j0 = 0, w; j0 < A; j0 += w) {
        w = panel_width(A, j0);
        long c = A - j0 < w ? A - j0 : w;
        solve_panel_rows(lrow, inv, w, kp + npad * j0, vp, 0, npad, j0 == 0);
        panel_finish(n, A, w, c, vp, z, v ? v + j0 : NULL, mu + j0, sumsq + j0);
    }
}

/* The scoring's scratch for n points and A candidates: the packed kp [npad, apad] (64-byte
 * aligned), the panel vp [npad, NR], inv [npad], zeros [npad] (zeroed), then `extra` doubles of
 * the caller's at rest; lrow [npad + PF_ROWS] the addresses of a factor's rows. Returns 0, or -1
 * when memory could not be allocated (nothing to free then). */
typedef struct {
    double *block, *kp, *vp, *inv, *zeros, *rest;
    const double **lrow;
    long npad;
} score_scratch;

static int score_scratch_alloc(score_scratch *s, long n, long A, size_t extra) {
    long npad = (n + MR - 1) / MR * MR, apad = padded_columns(A);
    size_t size = (size_t)(npad * apad) + (size_t)(npad * NR) + 8 + 2 * (size_t)npad + extra;
    s->block = malloc(size * sizeof(double));
    s->lrow = malloc((size_t)(npad + PF_ROWS) * sizeof(const double *));
    if (!s->block || !s->lrow) {
        free(s->block);
        free((void *)s->lrow);
        return -1;
    }
    s->npad = npad;
    s->kp = (double *)(((uintptr_t)s->block + 63) & ~(uintptr_t)63);
    s->vp = s->kp + npad * apad;
    s->inv = s->vp + npad * NR;
    s->zeros = s->inv + npad;
    s->rest = s->zeros + npad;
    for (long i = 0; i < npad; ++i) s->zeros[i] = 0.0;
    return 0;
}

static void score_scratch_free(score_scratch *s) {
    free(s->block);
    free((void *)s->lrow);
}

/* One term of the bound: sqrt(var / div) beta + mu (IEEE: the bits of mu + beta sqrt(var/div)). */
static inline double bound_term(double var, double mu, double div, double beta) {
    return sqrt(var / div) * beta + mu;
}

/* Whether term t replaces the running minimum m: the first smallest term, a NaN propagated (as
 * torch.min). */
static inline int takes_min(double t, double m) { return (t < m && m == m) || (t != t && m == m); }

/* The upper confidence bound min_r (sqrt(var_r / div_r) beta_r + mu_r) per candidate (one
 * term: a radius rule, Flynn & Reeb 2024's AMM; several: their DMM, Sec. 5.4, the minimum over
 * the grid of Eq. (14)), the minimising r per candidate (arg, may be NULL) and the first index of
 * the largest bound (a NaN counts as largest, as torch.argmax). The minimum takes the first
 * smallest term and propagates a NaN (as torch.min). */
static long ucb_argmax(long A, long R, const double *mean, const double *var, const double *beta,
                       const double *div, double *ucb, long long *arg) {
    enum { CH = 64 }; /* candidates per chunk: the terms of a chunk are computed first, in loops
                       * without branches that the compiler vectorises (the same operations) */
    double term[CH];
    long best = 0;
    for (long j0 = 0; j0 < A; j0 += CH) {
        long c = A - j0 < CH ? A - j0 : CH;
        for (long q = 0; q < c; ++q) {
            if (R <= 0) ucb[j0 + q] = 0.0;
            if (arg) arg[j0 + q] = 0;
        }
        for (long r = 0; r < R; ++r) {
            const double *vr = var + r * A + j0, *mr = mean + r * A + j0;
            double dv = div[r], b = beta[r];
            double *u = r == 0 ? ucb + j0 : term; /* the first term is the running minimum */
            for (long q = 0; q < c; ++q) u[q] = bound_term(vr[q], mr[q], dv, b);
            for (long q = 0; q < c && r > 0; ++q) {
                double m = ucb[j0 + q], t = term[q];
                if (takes_min(t, m)) {
                    ucb[j0 + q] = t;
                    if (arg) arg[j0 + q] = r;
                }
            }
        }
        for (long q = 0; q < c; ++q) {
            long j = j0 + q;
            double u = ucb[j], top = ucb[best];
            if (j > 0 && top == top && (u > top || u != u)) best = j;
        }
    }
    return best;
}

/* The pruned select of the closed-form bound (one term or DMM's several): select_pruned. */
#include "exact_prune.h"

/* Score A candidates at R maintained regularisers.
 *   n, A, d, R: sizes; xs [n, d] scaled stored points; cand [A, d]; w [dw] weights (dw = 1 or d);
 *   kind (RBF, MATERN12, MATERN32, MATERN52), outscale s (has_scale = 0: none), kdiag = k(x, x);
 *   fac [R, 5]: per factor the address of its head [n0, n0], n0, the address of its tail
 *   [., width], width, and the address of its z = L^{-1} y [n].
 * Outputs: v [R, n, A], mean [R, A], sumsq [R, A]; optional (NULL: not kept): cs [A, d],
 * kq [n, A] = K_SC, var [R, A]. With bound [2R] = (beta [R], div [R]) (else NULL): the bound of
 * ucb_argmax and its minimising r into arg [A] (NULL: not kept).
 * Returns the argmax of the bound (0 without bound), or -1 when scratch memory could not be
 * allocated (nothing usable written). */
long tb_exact_score(long n, long A, long d, long R, const double *xs, const double *cand,
                    const double *w, long dw, int kind, double outscale, int has_scale,
                    double kdiag, const long long *fac, double *v, double *mean, double *sumsq,
                    double *cs, double *kq, double *var, const double *bound, long long *arg) {
    long a1 = A > 0 ? A : 1;
    /* scratch after the scoring's own: the kernel rows (3 + d) A, then var R A and the bound A
     * when not kept, then K_SC [n, A] when not kept and R > 1 (with one factor V is computed in
     * place of K: K is packed first) */
    score_scratch sc;
    if (score_scratch_alloc(&sc, n, A, (size_t)((3 + d) * a1) + (var ? 0 : (size_t)(R * a1))
                            + (size_t)a1 + (kq || R <= 1 ? 0 : (size_t)(n * a1))))
        return -1;
    long npad = sc.npad;
    double *kp = sc.kp, *vp = sc.vp, *inv = sc.inv, *zeros = sc.zeros;
    const double **lrow = sc.lrow;
    double *rows = sc.rest, *rest = rows + (3 + d) * a1;
    if (!var) var = rest, rest += R * a1;
    double *ucb = rest;
    rest += a1;
    if (!kq) kq = R <= 1 ? v : rest;
    kernel_block(n, A, d, xs, cand, w, dw, kind, outscale, has_scale, cs, kq, rows);
    if (R > 0) pack_k(n, npad, A, kq, kp);
    for (long r = 0; r < R; ++r) {
        const long long *f = fac + 5 * r;
        const double *head = (const double *)(intptr_t)f[0], *tail = (const double *)(intptr_t)f[2];
        const double *z = (const double *)(intptr_t)f[4];
        double *vr = v + r * n * A, *mr = mean + r * A, *sr = sumsq + r * A, *pr = var + r * A;
        factor_rows(n, npad, head, (long)f[1], tail, (long)f[3], zeros, lrow, inv);
        solve_factor(n, npad, A, kp, lrow, inv, z, vp, vr, mr, sr);
        for (long j = 0; j < A; ++j) {
            double rho2 = kdiag - sr[j];
            pr[j] = rho2 > 0.0 ? rho2 : 0.0;
        }
    }
    long best = 0;
    if (bound && A > 0) best = ucb_argmax(A, R, mean, var, bound, bound + R, ucb, arg);
    score_scratch_free(&sc);
    return best;
}

/* Append the scored candidate j to R factors (the O(n) append of the scored set).
 *   src [R, 3]: per factor the addresses of the scoring's V_r [n, A], mu_r [A], colsum(V_r^2) [A];
 *   kxx = k(x_j, x_j); dbl [R]: the regularisers a_r; y the (offset) reward;
 *   dst [R, 2]: per factor the address of the new row of its tail (n + 1 entries: V_r[:, j],
 *   then the pivot) and the address of z_r[n];
 *   copies [4]: the addresses of the point x [d], its row in the model's points, the reward's
 *   entry, and the point's row in the scaled points (0: none; written x * w, w [dw]).
 *   out [R, 2]: (d_r, z_new_r) for the caller's running log-det and |z|^2.
 * Returns 0, or r + 1 when the pivot of factor r is not positive (nothing is written then). */
int tb_exact_append(long n, long A, long d, long R, long j, const long long *src, double kxx,
                    const double *regs, double y, const long long *dst, const long long *copies,
                    const double *w, long dw, double *out) {
    for (long r = 0; r < R; ++r) {
        const double *mean = (const double *)(intptr_t)src[3 * r + 1];
        const double *sumsq = (const double *)(intptr_t)src[3 * r + 2];
        double d2 = (kxx + regs[r]) - sumsq[j];
        if (!(d2 > 0.0)) return (int)r + 1;
        double piv = sqrt(d2);
        out[2 * r] = piv;
        out[2 * r + 1] = (y - mean[j]) / piv;
    }
    for (long r = 0; r < R; ++r) {
        const double *col = (const double *)(intptr_t)src[3 * r] + j;
        double *row = (double *)(intptr_t)dst[2 * r];
        for (long i = 0; i < n; ++i) row[i] = col[i * A];
        row[n] = out[2 * r];
        *(double *)(intptr_t)dst[2 * r + 1] = out[2 * r + 1];
    }
    const double *x = (const double *)(intptr_t)copies[0];
    memcpy((void *)(intptr_t)copies[1], x, (size_t)d * sizeof(double));
    *(double *)(intptr_t)copies[2] = y;
    double *scaled = (double *)(intptr_t)copies[3];
    if (scaled)
        for (long k = 0; k < d; ++k) scaled[k] = x[k] * w[dw == 1 ? 0 : k];
    return 0;
}

/* The fused single-run step (tb_exact_fused_select, tb_exact_fused_append). */
#include "exact_fused_step.h"
