/* R runs of the exact kernel-ridge posterior stepped together
 * (torchbandits.models.BatchedExactKernelRidge on the CPU): scoring every run's candidates in one
 * call, and appending one point to every run in one call, with the kernels of the single-run step
 * (exact_step.c: kernel_block, pack_k, factor_rows, solve_factor), looped over the runs.
 *
 * Layout (float64, row-major, read by strides at call time; no pointer kept between calls):
 *   R*G factors ("members"), member m = r*G + g is run r at its g-th regulariser (G = 1: the
 *   model itself; G = 5: the companion of DMM, Flynn & Reeb 2024, Sec. 5.4, whose members share
 *   their run's points);
 *   points x [R*G, cap, d] (member m's block at x + m*xs; run r's points those of member r*G),
 *     unscaled: each run's n rows are scaled by the kernel weights w into scratch (x_i * w, the
 *     same product the single-run model stores);
 *   factors L [R*G, cap, cap] (member m's at L + m*ls, row i at + i*lc: the lower Cholesky
 *     factor of K_r + a_m I), whitened targets z [R*G, cap] (z_m = L_m^{-1} y_r, at z + m*zs).
 *
 * Scoring (the Cholesky form of the posterior, Flynn & Reeb 2024, App. E.2, as exact_step.c):
 *   per run r: K_SC [n, A] of its points and its candidates C_r [A, d] (at cand + r*A*d), packed
 *   once; per member m of the run: V_m = L_m^{-1} K_SC, mu_m = z_m^T V_m,
 *   var_m = max(k_CC - colsum(V_m^2), 0): the GP posterior mean and variance of
 *   Flynn & Reeb 2024, Eq. (14)'s pieces, written into mean [R*G, A] and var [R*G, A].
 *
 * Selecting (tb_batch_select): the scoring, then per run the largest upper bound
 * min_g (sqrt(var_{rG+g} / div_{rG+g}) beta_{rG+g} + mu_{rG+g}) over its A candidates
 * (exact_step.c's ucb_argmax, the rule of the fused single-run select: one term for the radius
 * rules and AMM, Flynn & Reeb 2024, Sec. 5.5; the G = 5 regularisers of DMM, Sec. 5.4, the
 * minimum over the grid of Eq. (14)); and, for the chosen candidate c_r, the pieces of its append
 * ("pending": per member l = L_m^{-1} k_S(c_r), z_m^T l and |l|^2), read off the scoring: column
 * c_r of V_m, mu_m and colsum(V_m^2) (V kept in scratch for the run's members: n A stores per
 * member, against an O(n^2) second pass over the factor for the append).
 *
 * With a hint, a run's select is pruned (exact_prune.h's select_pruned: the candidates in order
 * of their prior bound, a group of them dropped as soon as the partial sums of one member's
 * solve rule them out, the other members solved on the groups that survive; the same choice,
 * member and pieces, bit for bit, as the full select).
 *
 * Appending x_r [d] with reward y_r to every run (the bordered Cholesky step, Flynn & Reeb 2024,
 * App. E.2): per member the new row l = L_m^{-1} k_S(x_r) (the same tile code on one column: the
 * numbers of column j of the scoring of a set that holds x_r as candidate j), the pivot
 * d = sqrt(k(x_r, x_r) + a_m - |l|^2), z_m[n] = (y_r - z_m^T l) / d; x_r and y_r become row n.
 * Where x_r holds the bits of the candidate the last select chose for run r, l, z_m^T l and
 * |l|^2 are read from its pending pieces (computed by the same operations: the same bits).
 */
#include "exact_step.c"

/* Per run scratch of the scoring: the scoring's own (exact_step.c's score_scratch: kp, vp, inv,
 * zeros, lrow), then the scaled points xs [n, d], the kernel rows (3 + d) A and K_SC kq [n, A]. */
typedef struct {
    score_scratch sc;
    double *xs, *rows, *kq;
} batch_scratch;

static int scratch_alloc(batch_scratch *s, long n, long A, long d) {
    long a1 = A > 0 ? A : 1, n1 = n > 0 ? n : 1;
    if (score_scratch_alloc(&s->sc, n, A,
                            (size_t)(n1 * d) + (size_t)((3 + d) * a1) + (size_t)(n1 * a1)))
        return -1;
    s->xs = s->sc.rest;
    s->rows = s->xs + n1 * d;
    s->kq = s->rows + (3 + d) * a1;
    return 0;
}

static void scratch_free(batch_scratch *s) { score_scratch_free(&s->sc); }

/* xs = x * w of a run's n points [n, d] (row stride d). */
static void scale_points(long n, long d, const double *x, const double *w, long dw, double *xs) {
    for (long i = 0; i < n; ++i)
        for (long k = 0; k < d; ++k) xs[i * d + k] = x[i * d + k] * w[dw == 1 ? 0 : k];
}

/* The kernel of a call: weights w [dw], closed form `kind`, output scale (has_scale = 0: none)
 * and kdiag = k(x, x) (exact_step.c's kernel_block). */
typedef struct {
    const double *w;
    long dw;
    int kind;
    double outscale;
    int has_scale;
    double kdiag;
} kernel_args;

/* K_SC [n, A] of a run's scaled points s->xs and candidates c [A, d], packed into s->sc.kp. */
static void kernel_packed(batch_scratch *s, long n, long A, long d, const double *c,
                          const kernel_args *k) {
    kernel_block(n, A, d, s->xs, c, k->w, k->dw, k->kind, k->outscale, k->has_scale, NULL, s->kq,
                 s->rows);
    pack_k(n, s->sc.npad, A, s->kq, s->sc.kp);
}

/* Member m's factor (L at L + m ls, rows lc apart) and z (at z + m zs) as a factor_ref. */
static factor_ref member_ref(long m, const double *L, long ls, long lc, const double *z, long zs) {
    factor_ref f = {NULL, 0, L + m * ls, lc, z + m * zs};
    return f;
}

/* Member m's V = L^{-1} K_SC of the packed columns (v may be NULL), mu = z^T V, colsum(V^2). */
static void member_solve(batch_scratch *s, long n, long A, long m, const double *L, long ls,
                         long lc, const double *z, long zs, double *v, double *mu, double *sumsq) {
    factor_ref f = member_ref(m, L, ls, lc, z, zs);
    ref_solve(&s->sc, n, A, &f, v, mu, sumsq);
}

/* The append pieces of the point p [d] for the G members of run r: per member m = r G + g,
 * out[m (n + 2) ...] = (l = L_m^{-1} k_S(p) [n], z_m^T l, |l|^2). */
static void point_pieces(batch_scratch *s, long r, long G, long n, long d, const double *p,
                         const kernel_args *k, const double *L, long ls, long lc,
                         const double *z, long zs, double *out) {
    kernel_packed(s, n, 1, d, p, k);
    for (long g = 0; g < G; ++g) {
        long m = r * G + g;
        double *o = out + m * (n + 2);
        member_solve(s, n, 1, m, L, ls, lc, z, zs, o, o + n, o + n + 1);
    }
}

/* Score A candidates per run for R runs of G members each (see the top of the file).
 *   x, xs_: points and the member stride of their blocks; cand [R, A, d], run r's [A, d] block
 *   (contiguous) at cand + r * cs;
 *   w [dw], kind, outscale (has_scale = 0: none), kdiag = k(x, x): the kernel (exact_step.c);
 *   L, ls, lc: factors, member stride and row stride; z, zs: whitened targets, member stride.
 * Writes mean [R*G, A] and var [R*G, A]; where not NULL also v [R*G, n, A] (V of every
 * member) and sumsq [R*G, A] (colsum(V^2)): what a cache of the candidate set keeps.
 * Returns 0, or -1 when scratch memory could not be allocated (nothing usable written). */
long tb_batch_score(long R, long G, long n, long A, long d, const double *x, long xs_,
                    const double *cand, long cs, const double *w, long dw, int kind, double outscale,
                    int has_scale, double kdiag, const double *L, long ls, long lc,
                    const double *z, long zs, double *mean, double *var, double *v,
                    double *sumsq) {
    kernel_args k = {w, dw, kind, outscale, has_scale, kdiag};
    batch_scratch s;
    if (scratch_alloc(&s, n, A, d)) return -1;
    for (long r = 0; r < R; ++r) {
        scale_points(n, d, x + r * G * xs_, w, dw, s.xs);
        kernel_packed(&s, n, A, d, cand + r * cs, &k);
        for (long g = 0; g < G; ++g) {
            long m = r * G + g;
            double *mu = mean + m * A, *pr = var + m * A;
            /* colsum(V^2) into var, then var = max(k_CC - colsum, 0) in place */
            member_solve(&s, n, A, m, L, ls, lc, z, zs, v ? v + m * n * A : NULL, mu, pr);
            if (sumsq) memcpy(sumsq + m * A, pr, (size_t)A * sizeof(double));
            for (long j = 0; j < A; ++j) {
                double rho2 = kdiag - pr[j];
                pr[j] = rho2 > 0.0 ? rho2 : 0.0;
            }
        }
    }
    scratch_free(&s);
    return 0;
}

/* Select one candidate per run (see the top of the file): the scoring of tb_batch_score (its
 * arguments up to zs, cand's run stride cs included; mean, var and each member's V in scratch), then per run r the first index
 * j of the largest bound min_g (sqrt(var_m / div[m]) beta[m] + mu_m), m = r G + g (exact_step.c's
 * ucb_argmax: a NaN counts as largest, as torch.argmax; the minimum takes the first smallest
 * term), into best [R] (int64); where not NULL the minimising g at the chosen candidate into
 * arg [R] (int64), and the chosen candidate's append pieces into pend [R*G, n + 2]: per member column j
 * of V, mu_m[j] and colsum(V_m^2)_j (the numbers point_pieces computes for that point: the
 * solve is column by column the same operations), and its point into pend_x [R, d].
 * hint [R] (int64, may be NULL): the pruned select (see the top of the file); with G > 1 each
 * run's member to solve first (out of range: G / 2), set to the minimising g at the chosen
 * candidate (0 with G = 1); NULL: the full select. The choice does not depend on it.
 * ac [R, acs] (may be NULL): per run the pruned select's cache (exact_prune.h: the poor-pruning
 * state, then alpha, for acs - PRUNE_HEAD points), read and written; the choice does not
 * depend on it.
 * Returns 0, or -1 when scratch memory could not be allocated (the runs before the failing one
 * chosen, the later ones not). */
long tb_batch_select(long R, long G, long n, long A, long d, const double *x, long xs_,
                     const double *cand, long cs, const double *w, long dw, int kind, double outscale,
                     int has_scale, double kdiag, const double *L, long ls, long lc,
                     const double *z, long zs, const double *beta, const double *div,
                     long long *best, long long *arg, double *pend, double *pend_x,
                     long long *hint, double *ac, long acs) {
    kernel_args k = {w, dw, kind, outscale, has_scale, kdiag};
    batch_scratch s;
    prune_scratch ps = {0};
    long a1 = A > 0 ? A : 1, n1 = n > 0 ? n : 1;
    int prune = hint && G > 0 && n > 0 && A > 0;
    /* per member of a run: mu, colsum(V^2), var [G, A], the bound [A], the minimising g [A];
     * V [G, n, A] if pend, made when a run first takes the full select (a pruned one keeps its
     * own pieces) */
    double *mv = malloc((size_t)((3 * G + 1) * a1) * sizeof(double));
    long long *argv = malloc((size_t)a1 * sizeof(long long));
    factor_ref *refs = malloc((size_t)(G > 0 ? G : 1) * sizeof(factor_ref));
    int scratch = !mv || !argv || !refs ? -1 : scratch_alloc(&s, n, A, d);
    if (scratch || (prune && prune_alloc(&ps, G, n, A))) {
        if (!scratch) scratch_free(&s);
        free(mv);
        free(argv);
        free(refs);
        return -1;
    }
    double *mean = mv, *ss = mv + G * a1, *var = ss + G * a1, *ucb = var + G * a1;
    double *vs = NULL;
    long rc = 0;
    for (long r = 0; r < R; ++r) {
        const double *cr = cand + r * cs;
        scale_points(n, d, x + r * G * xs_, w, dw, s.xs);
        if (prune) /* (the pruned select packs its own) */
            kernel_block(n, A, d, s.xs, cr, k.w, k.dw, k.kind, k.outscale, k.has_scale, NULL,
                         s.kq, s.rows);
        else kernel_packed(&s, n, A, d, cr, &k);
        if (prune) {
            long g0 = hint[r] >= 0 && hint[r] < G ? (long)hint[r] : G / 2;
            long bj;
            long bg = 0;
            double *pp = pend ? pend + r * G * (n + 2) : NULL;
            for (long g = 0; g < G; ++g) refs[g] = member_ref(r * G + g, L, ls, lc, z, zs);
            if (!select_pruned(&s.sc, &ps, G, g0, n, A, refs, beta + r * G, div + r * G, kdiag,
                               s.kq, ac ? ac + r * acs : NULL, acs - PRUNE_HEAD, &bj, &bg,
                               pp)) {
                best[r] = bj;
                hint[r] = bg;
                if (arg) arg[r] = bg;
                if (pend) memcpy(pend_x + r * d, cr + bj * d, (size_t)d * sizeof(double));
                continue;
            }
            pack_k(n, s.sc.npad, A, s.kq, s.sc.kp); /* the full select: K packed again */
        }
        if (pend && !vs && !(vs = malloc((size_t)(G * n1 * a1) * sizeof(double)))) {
            rc = -1;
            break;
        }
        for (long g = 0; g < G; ++g) {
            long m = r * G + g;
            double *sg = ss + g * A, *pr = var + g * A;
            member_solve(&s, n, A, m, L, ls, lc, z, zs, vs ? vs + g * n * A : NULL,
                         mean + g * A, sg);
            for (long j = 0; j < A; ++j) {
                double rho2 = kdiag - sg[j];
                pr[j] = rho2 > 0.0 ? rho2 : 0.0;
            }
        }
        long j = A > 0 ? ucb_argmax(A, G, mean, var, beta + r * G, div + r * G, ucb, argv) : 0;
        best[r] = j;
        if (arg) arg[r] = A > 0 ? argv[j] : 0;
        if (hint && A > 0) hint[r] = argv[j];
        if (pend && A > 0) {
            for (long g = 0; g < G; ++g) {
                double *o = pend + (r * G + g) * (n + 2);
                const double *vg = vs + g * n * A + j;
                for (long i = 0; i < n; ++i) o[i] = vg[i * A];
                o[n] = mean[g * A + j];
                o[n + 1] = ss[g * A + j];
            }
            memcpy(pend_x + r * d, cr + j * d, (size_t)d * sizeof(double));
        }
    }
    scratch_free(&s);
    free(mv);
    free(vs);
    free(argv);
    free(refs);
    if (prune) prune_free(&ps);
    return rc;
}

/* Append one point per run to R runs of G members with n points each (see the top of the file).
 *   xnew [R, d], ynew [R]: the points and rewards; x, xs_ / y, ys_: the members' points and
 *   targets (row n written) and their member strides; w, dw, kind, outscale, has_scale, kdiag:
 *   the kernel; L, ls, lc: factors (row n written: l, then the pivot at column n); z, zs;
 *   regs [R*G]: the regularisers a_m; work [R*G, n + 2]: per member l, z_m^T l, |l|^2;
 *   pend [R*G, n + 2], pend_x [R, d] (NULL: none): the pieces of the last select, used for the
 *   runs whose xnew holds the bits of pend_x (the others are computed here);
 *   piv, ps (NULL: none): a copy of the factors' diagonals, member m's at piv + m * ps; the new
 *   pivot d is also written at its column n.
 * Every pivot is computed before anything is written: returns 0, -1 (no scratch memory), or
 * m + 1 for the first member m whose pivot^2 is not positive (nothing written then). */
long tb_batch_append(long R, long G, long n, long d, const double *xnew, const double *ynew,
                     double *x, long xs_, double *y, long ys_, const double *w, long dw,
                     int kind, double outscale, int has_scale, double kdiag, double *L, long ls,
                     long lc, double *z, long zs, const double *regs, double *work,
                     const double *pend, const double *pend_x, double *piv, long ps) {
    kernel_args k = {w, dw, kind, outscale, has_scale, kdiag};
    batch_scratch s;
    if (scratch_alloc(&s, n, 1, d)) return -1;
    long bad = 0;
    for (long r = 0; r < R && !bad; ++r) {
        const double *xr = xnew + r * d;
        const double *got = work; /* the pieces of run r's members: work's or pend's rows */
        if (pend && !memcmp(xr, pend_x + r * d, (size_t)d * sizeof(double))) {
            got = pend;
        } else { /* k_S(x_r) [n, 1] by the closed form, l = L^{-1} k_S(x_r) by the tiles */
            scale_points(n, d, x + r * G * xs_, w, dw, s.xs);
            point_pieces(&s, r, G, n, d, xr, &k, L, ls, lc, z, zs, work);
        }
        for (long g = 0; g < G && !bad; ++g) {
            long m = r * G + g;
            const double *in = got + m * (n + 2);
            double *out = work + m * (n + 2);
            double mu = in[n], d2 = (kdiag + regs[m]) - in[n + 1];
            if (!(d2 > 0.0)) {
                bad = m + 1;
                break;
            }
            if (in != out) memcpy(out, in, (size_t)n * sizeof(double));
            out[n] = sqrt(d2);
            out[n + 1] = (ynew[r] - mu) / out[n];
        }
    }
    scratch_free(&s);
    if (bad) return bad;
    for (long m = 0; m < R * G; ++m) {
        long r = m / G;
        const double *out = work + m * (n + 2);
        memcpy(L + m * ls + n * lc, out, (size_t)(n + 1) * sizeof(double)); /* (l, d) */
        z[m * zs + n] = out[n + 1];
        if (piv) piv[m * ps + n] = out[n];
        memcpy(x + m * xs_ + n * d, xnew + r * d, (size_t)d * sizeof(double));
        y[m * ys_ + n] = ynew[r];
    }
    return 0;
}
