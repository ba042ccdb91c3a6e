/* The fused single-run step of exact_step.c (included at its end): one call per select and one
 * per append on a table of the model's state (torchbandits.models.exact_fused). Needs
 * exact_step.c's kernel_block, pack_k, the scratch and the solve, ucb_argmax and exact_prune.h's
 * select_pruned. */
#ifndef TB_EXACT_FUSED_STEP_H
#define TB_EXACT_FUSED_STEP_H

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

/* The fused select's pruned path (exact_prune.h's select_pruned, from kq [n, A]) over the S
 * terms of the table (term s: factor sel[s], beta[s], beta[S + s]): the chosen index (its
 * minimising term into *hint, which names the term whose rows are pruned), -1 (no scratch
 * memory) or -2 (the pruning does not apply: take the full select). pend (may be NULL): the
 * chosen candidate's append pieces per term s at pend + s (n + 2) (exact_prune.h). */
static long pruned_fused(score_scratch *sc, const long long *tab, long S, const long long *sel,
                         long n, long A, const double *zb, const double *beta, double kdiag,
                         const double *kq, long long *hint, double *pend, double *ac,
                         long acap) {
    prune_scratch ps;
    factor_ref *refs = malloc((size_t)S * sizeof(factor_ref));
    if (!refs || prune_alloc(&ps, S, n, A)) {
        free(refs);
        return -1;
    }
    for (long s = 0; s < S; ++s) {
        const long long *f = tab + FFAC + FFACW * sel[s];
        factor_ref r = {(const double *)(intptr_t)f[0], (long)f[1], (const double *)(intptr_t)f[2],
                        (long)f[3], zb + sel[s] * tab[FZST]};
        refs[s] = r;
    }
    long g0 = *hint >= 0 && *hint < S ? (long)*hint : S / 2, best, argb;
    int rc = select_pruned(sc, &ps, S, g0, n, A, refs, beta, beta + S, kdiag, kq, ac, acap, &best,
                           &argb, pend);
    prune_free(&ps);
    free(refs);
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
 * previous call, kept alive by the caller. hint [2] (may be NULL): the pruned select
 * (exact_prune.h: one term, its rows; S > 1 terms, its members), hint[0] the term to solve first
 * (S > 1; out of range: S / 2), set to the minimising term at the chosen candidate; the choice
 * and that term are those of the full select, bit for bit, but arg is then written only at the
 * chosen index. NULL: the full select.
 * pend [S, n + 2] (may be NULL): where the pruned select writes the chosen candidate's append
 * pieces per term (l = L^{-1} k_S(c), z^T l, |l|^2 of its factor), hint[1] then set to 1 (else
 * 0): tb_exact_fused_append's input. ac [PRUNE_HEAD + acap] (may be NULL): the pruned select's
 * cache (exact_prune.h: the poor-pruning state, then alpha), read and written; the choice does
 * not depend on it.
 * Returns the index, or -1 (no scratch memory), -3 (a kernel parameter changed: rebuild the
 * table), -4 (cand holds the values of prev: the caller's candidate caches serve it), -5 (a
 * candidate is not finite). */
long tb_exact_fused_select(const long long *tab, const double *dbl, const double *cand, long A,
                           const double *prev, long prev_a, long long *arg, long long *hint,
                           double *pend, double *ac, long acap) {
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
    if (!(hint && S > 0 && n > 0 && A > 0)) /* (the pruned select packs its own) */
        pack_k(n, npad, A, kq, kp);
    const long long *sel = tab + FFAC + FFACW * R;
    const double *beta = dbl + 2 + 3 * R;
    if (hint) hint[1] = 0;
    if (hint && S > 0 && n > 0 && A > 0) {
        long pick =
            pruned_fused(&sc, tab, S, sel, n, A, zb, beta, dbl[1], kq, hint, pend, ac, acap);
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

#endif /* TB_EXACT_FUSED_STEP_H */
