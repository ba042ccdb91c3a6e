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
 */
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

/* One factor: V = L^{-1} K [n, A] from the packed kp, the rows of L and 1 / L_ii (lrow, inv
 * [npad], see above; vp [npad, NR] scratch per panel), mu = z^T V and colsum(V (.) V) [A].
 * v may be NULL: V is not written (mu and colsum only). */
static void solve_factor(long n, long npad, long A, const double *kp, const double *const *lrow,
                         const double *inv, const double *z, double *vp, double *v, double *mu,
                         double *sumsq) {
    for (long j0 = 0, w; j0 < A; j0 += w) {
        w = panel_width(A, j0);
        long c = A - j0 < w ? A - j0 : w;
        const double *kpan = kp + npad * j0;
        for (long i0 = 0; i0 < npad; i0 += MR) {
            if (w == 3 * LANES) solve_tile_3(lrow + i0, inv, i0, kpan, vp, j0 == 0);
            else if (w == 2 * LANES) solve_tile_2(lrow + i0, inv, i0, kpan, vp, j0 == 0);
            else solve_tile_1(lrow + i0, inv, i0, kpan, vp, j0 == 0);
        }
#if defined(__AVX__) && defined(__FMA__)
        if (c == w) { /* a full panel: the sums in registers (the same operations) */
            if (w == 3 * LANES) panel_sums_3(n, A, vp, z, v ? v + j0 : NULL, mu + j0, sumsq + j0);
            else if (w == 2 * LANES)
                panel_sums_2(n, A, vp, z, v ? v + j0 : NULL, mu + j0, sumsq + j0);
            else panel_sums_1(n, A, vp, z, v ? v + j0 : NULL, mu + j0, sumsq + j0);
            continue;
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
                for (long q = 0; q < c; ++q) v[i * A + j0 + q] = vi[q];
        }
        for (long q = 0; q < c; ++q) mu[j0 + q] = m[q], sumsq[j0 + q] = s[q];
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

/* The pruned select of a minimum over several factors (DMM): select_pruned. */
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

/* ---- The fused step: one call per select and one per append, on a table of the model's state ----
 *
 * The caller (torchbandits.models.exact_fused) keeps, between calls, an int64 table of the
 * model's addresses and sizes and a float64 table of its scalars; it checks at every call that
 * the tensors behind them are still those (the C code keeps no pointer: the tables are the
 * caller's memory, passed at each call). int64 table `tab`:
 *   FN n, FD d, FR R (factors), FKIND, FSCALE has_scale, FDW dw, FCAP rows of every point
 *   buffer, FBLOCK tail rows per factor, FXS scaled points [cap, d], FW weights [dw], FX points
 *   [cap, d], FY rewards [cap], FZ z [R, zstride], FZST zstride, FNP number of kernel
 *   parameters, FS number of terms of the bound; at FPAR per parameter (address, address of the
 *   copy read when the table was built, bytes); at FFAC per factor (head, n0, tail, width, m);
 *   after the factors, the factor index of each term of the bound.
 * float64 table `dbl`: outscale, k(x, x), the regularisers [R], out [2R] (pivots, new z
 *   entries of the last append), then per term beta [S] and div [S]. */
enum { FN, FD, FR, FKIND, FSCALE, FDW, FCAP, FBLOCK, FXS, FW, FX, FY, FZ, FZST, FNP, FS,
       FPAR = 16, FMAXPAR = 4, FFAC = FPAR + 3 * FMAXPAR, FFACW = 5 };

/* Whether every kernel parameter still holds the bytes the table was built from. */
static int params_same(const long long *tab) {
    for (long p = 0; p < tab[FNP]; ++p) {
        const long long *e = tab + FPAR + 3 * p;
        if (memcmp((const void *)(intptr_t)e[0], (const void *)(intptr_t)e[1], (size_t)e[2]))
            return 0;
    }
    return 1;
}

/* The fused select's pruned path (exact_prune.h) over the S terms of the table (term s: factor
 * sel[s], beta[s], beta[S + s]) after kq [n, A] was packed into sc: the chosen index (its
 * minimising term into *hint, which names the term solved first), -1 (no scratch memory) or -2
 * (a term not finite: take the full select). pend (may be NULL): the chosen candidate's append
 * pieces per term s at pend + s (n + 2) (exact_prune.h). */
static long pruned_fused(score_scratch *sc, const long long *tab, long S, const long long *sel,
                         long n, long A, const double *zb, const double *beta, double kdiag,
                         const double *kq, long long *hint, double *pend) {
    prune_scratch ps;
    factor_ref *refs = malloc((size_t)S * sizeof(factor_ref));
    double *v0 = pend ? malloc((size_t)(n * A) * sizeof(double)) : NULL;
    if (!refs || (pend && !v0) || prune_alloc(&ps, S, n, A)) {
        free(refs);
        free(v0);
        return -1;
    }
    for (long s = 0; s < S; ++s) {
        const long long *f = tab + FFAC + FFACW * sel[s];
        factor_ref r = {(const double *)(intptr_t)f[0], (long)f[1], (const double *)(intptr_t)f[2],
                        (long)f[3], zb + sel[s] * tab[FZST]};
        refs[s] = r;
    }
    long g0 = *hint >= 0 && *hint < S ? (long)*hint : S / 2, best, argb;
    int rc = select_pruned(sc, &ps, S, g0, n, A, refs, beta, beta + S, kdiag, kq, v0, &best,
                           &argb, pend);
    prune_free(&ps);
    free(refs);
    free(v0);
    if (rc) return -2;
    *hint = argb;
    return best;
}

/* select: the index of the largest upper bound min_s (sqrt(rho^2_{f_s} / div_s) beta_s + mu_{f_s})
 * over the A candidates cand [A, d] (Flynn & Reeb 2024: one term for AMM and the radius rules,
 * the grid of Eq. (14) for DMM, Sec. 5.4), the pieces computed as tb_exact_score computes them
 * (the same operations in the same order: the same bits), without keeping V, K_SC or the
 * variances (one [n, A] scratch for V, reused by every factor). arg [A] (may be NULL): the
 * minimising term per candidate. prev [prev_a, d] (may be NULL): the candidates of the
 * previous call, kept alive by the caller. hint [2] (may be NULL; with S > 1 terms): hint[0] the
 * term to solve first in the pruned select (exact_prune.h; out of range: S / 2), set to the
 * minimising term at the chosen candidate; the choice and that term are those of the full
 * select, bit for bit, but arg is then written only at the chosen index. NULL: the full select.
 * pend [S, n + 2] (may be NULL): where the pruned select writes the chosen candidate's append
 * pieces per term (l = L^{-1} k_S(c), z^T l, |l|^2 of its factor), hint[1] then set to 1 (else
 * 0): tb_exact_fused_append's input.
 * Returns the index, or -1 (no scratch memory), -3 (a kernel parameter changed: rebuild the
 * table), -4 (cand holds the values of prev: the caller's candidate caches serve it), -5 (a
 * candidate is not finite). */
long tb_exact_fused_select(const long long *tab, const double *dbl, const double *cand, long A,
                           const double *prev, long prev_a, long long *arg, long long *hint,
                           double *pend) {
    long n = (long)tab[FN], d = (long)tab[FD], R = (long)tab[FR], S = (long)tab[FS];
    if (!params_same(tab)) return -3;
    if (prev && prev_a == A && !memcmp(prev, cand, (size_t)(A * d) * sizeof(double))) return -4;
    int finite = 1;
    for (long i = 0; i < A * d; ++i) finite &= isfinite(cand[i]) != 0;
    if (!finite) return -5;
    long a1 = A > 0 ? A : 1;
    /* after the scoring's scratch: the kernel rows (3 + d) A, K_SC then V [n, A] (V of each
     * factor written over K_SC once packed), mean, var [S, A], the bound [A] and colsum [A] */
    score_scratch sc;
    if (score_scratch_alloc(&sc, n, A, (size_t)((3 + d) * a1) + (size_t)(n * a1)
                            + (size_t)(2 * S * a1) + 2 * (size_t)a1))
        return -1;
    long npad = sc.npad;
    double *kp = sc.kp, *vp = sc.vp, *inv = sc.inv, *zeros = sc.zeros;
    const double **lrow = sc.lrow;
    double *rows = sc.rest, *kq = rows + (3 + d) * a1, *mean = kq + n * a1;
    double *var = mean + S * a1, *ucb = var + S * a1, *sumsq = ucb + a1;
    const double *xs = (const double *)(intptr_t)tab[FXS], *w = (const double *)(intptr_t)tab[FW];
    const double *zb = (const double *)(intptr_t)tab[FZ];
    kernel_block(n, A, d, xs, cand, w, (long)tab[FDW], (int)tab[FKIND], dbl[0], (int)tab[FSCALE],
                 NULL, kq, rows);
    pack_k(n, npad, A, kq, kp);
    const long long *sel = tab + FFAC + FFACW * R;
    const double *beta = dbl + 2 + 3 * R;
    if (hint) hint[1] = 0;
    if (hint && S > 1 && n > 0 && A > 0) {
        long pick = pruned_fused(&sc, tab, S, sel, n, A, zb, beta, dbl[1], kq, hint, pend);
        if (pick >= 0 && arg) arg[pick] = *hint;
        if (pick >= 0 && pend) hint[1] = 1;
        if (pick != -2) {
            score_scratch_free(&sc);
            return pick;
        }
        pack_k(n, npad, A, kq, kp); /* a term not finite: the full select, K packed again */
    }
    for (long s = 0; s < S; ++s) {
        const long long *f = tab + FFAC + FFACW * sel[s];
        factor_rows(n, npad, (const double *)(intptr_t)f[0], (long)f[1],
                    (const double *)(intptr_t)f[2], (long)f[3], zeros, lrow, inv);
        solve_factor(n, npad, A, kp, lrow, inv, zb + sel[s] * tab[FZST], vp, kq, mean + s * A,
                     sumsq);
        for (long j = 0; j < A; ++j) { /* rho^2 = max(k(x, x) - colsum(V^2), 0) */
            double rho2 = dbl[1] - sumsq[j];
            var[s * A + j] = rho2 > 0.0 ? rho2 : 0.0;
        }
    }
    long best = A > 0 ? ucb_argmax(A, S, mean, var, beta, beta + S, ucb, arg) : 0;
    if (hint && arg && A > 0) *hint = arg[best];
    score_scratch_free(&sc);
    return best;
}

/* append: the point x [d] (any point; a candidate of the last select included) with reward y
 * to every factor, O(n^2) per factor: the kernel column k_S(x) by kernel_block, the new row
 * L_r^{-1} k_S(x) by solve_factor on one column (the operations, per column, of the scoring:
 * for a scored candidate the same bits as its column V_r[:, j], its mu_r[j] and
 * colsum(V_r^2)_j); or, with pend [S, n + 2] (not NULL: the pieces the last pruned select
 * wrote for x, the caller's chosen candidate), read from the pieces of a term on factor r;
 * the pivot d_r = sqrt(k(x, x) + a_r - |L_r^{-1} k_S(x)|^2) and the new entry
 * (y - z_r^T L_r^{-1} k_S(x)) / d_r of z_r (Flynn & Reeb 2024, App. E.2); the point, the reward
 * and the scaled point x w are copied into row n of their buffers; n and every m advance in the
 * table and (d_r, z_new_r) are written to dbl's out. Returns 0; -1 (no scratch memory), -2 (a
 * buffer is full or a tail must be folded: the caller makes room and rebuilds the table), -3
 * (a kernel parameter changed); r + 1 when the pivot of factor r is not positive. Nothing is
 * written unless 0 is returned. */
int tb_exact_fused_append(long long *tab, double *dbl, const double *x, double y,
                          const double *pend) {
    long n = (long)tab[FN], d = (long)tab[FD], R = (long)tab[FR];
    if (n + 1 > tab[FCAP]) return -2;
    for (long r = 0; r < R; ++r) {
        const long long *f = tab + FFAC + FFACW * r;
        if (f[4] >= tab[FBLOCK] || f[3] < f[1] + f[4] + 1 || f[1] + f[4] != n) return -2;
    }
    if (!params_same(tab)) return -3;
    /* after the scoring's scratch (one column): kernel rows 3 + d, the kernel column [n], the
     * scaled point [d], the new rows [R, n], mu and colsum [R] */
    score_scratch sc;
    if (score_scratch_alloc(&sc, n, 1, (size_t)(3 + d) + (size_t)(n > 0 ? n : 1) + (size_t)d
                            + (size_t)(R * n) + 2 * (size_t)R + 2))
        return -1;
    long npad = sc.npad;
    double *kp = sc.kp, *vp = sc.vp, *inv = sc.inv, *zeros = sc.zeros, *rows = sc.rest;
    const double **lrow = sc.lrow;
    double *kcol = rows + 3 + d, *cs = kcol + (n > 0 ? n : 1), *cols = cs + d;
    double *mu = cols + R * n, *ss = mu + R, *out = dbl + 2 + R;
    const double *w = (const double *)(intptr_t)tab[FW];
    double *zb = (double *)(intptr_t)tab[FZ];
    kernel_block(n, 1, d, (const double *)(intptr_t)tab[FXS], x, w, (long)tab[FDW],
                 (int)tab[FKIND], dbl[0], (int)tab[FSCALE], cs, kcol, rows);
    pack_k(n, npad, 1, kcol, kp);
    int bad = 0;
    const long long *sel = tab + FFAC + FFACW * R;
    for (long r = 0; r < R && !bad; ++r) {
        const long long *f = tab + FFAC + FFACW * r;
        long s = 0;
        while (pend && s < tab[FS] && sel[s] != r) ++s;
        if (pend && s < tab[FS]) { /* the select's pieces of a term on factor r */
            const double *p = pend + s * (n + 2);
            memcpy(cols + r * n, p, (size_t)n * sizeof(double));
            mu[r] = p[n];
            ss[r] = p[n + 1];
        } else {
            factor_rows(n, npad, (const double *)(intptr_t)f[0], (long)f[1],
                        (const double *)(intptr_t)f[2], (long)f[3], zeros, lrow, inv);
            solve_factor(n, npad, 1, kp, lrow, inv, zb + r * tab[FZST], vp, cols + r * n, mu + r,
                         ss + r);
        }
        double d2 = (dbl[1] + dbl[2 + r]) - ss[r];
        if (!(d2 > 0.0)) bad = (int)r + 1;
        else out[r] = sqrt(d2), out[R + r] = (y - mu[r]) / out[r];
    }
    if (!bad) {
        for (long r = 0; r < R; ++r) {
            long long *f = tab + FFAC + FFACW * r;
            double *row = (double *)(intptr_t)f[2] + (f[4] * f[3]);
            memcpy(row, cols + r * n, (size_t)n * sizeof(double));
            row[n] = out[r];
            zb[r * tab[FZST] + n] = out[R + r];
            f[4] += 1;
        }
        memcpy((double *)(intptr_t)tab[FX] + n * d, x, (size_t)d * sizeof(double));
        ((double *)(intptr_t)tab[FY])[n] = y;
        memcpy((double *)(intptr_t)tab[FXS] + n * d, cs, (size_t)d * sizeof(double));
        tab[FN] = n + 1;
    }
    score_scratch_free(&sc);
    return bad;
}
