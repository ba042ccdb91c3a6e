/* The keys of the pruned select (included by exact_prune.h, after its scratch and constants):
 * alpha = L^{-T} z by a back substitution, the candidates' prior bounds and upper bounds on mu
 * from it (with the rows pruned), member g0's exact terms (DMM's grid below ROWS_MIN_N points),
 * and the first group guessed from the previous select's alpha. */
#ifndef TB_EXACT_PRUNE_KEYS_H
#define TB_EXACT_PRUNE_KEYS_H

/* alpha = L^{-T} z [n]: a column-oriented back substitution on the rows of L, four rows at a
 * time (their 4 x 4 triangle first, then one pass over alpha[0 .. k) for the four: a load and a
 * store of alpha per four multiply-adds). Its rounding only enters the margin (see above). */
static void back_alpha(long n, const factor_ref *f, double *alpha) {
    memcpy(alpha, f->z, (size_t)n * sizeof(double));
    long k = n - 1;
    for (; k >= 3; k -= 4) {
        const double *r3 = factor_row(f->head, f->n0, f->tail, f->width, k);
        const double *r2 = factor_row(f->head, f->n0, f->tail, f->width, k - 1);
        const double *r1 = factor_row(f->head, f->n0, f->tail, f->width, k - 2);
        const double *r0 = factor_row(f->head, f->n0, f->tail, f->width, k - 3);
        double a3 = alpha[k] / r3[k];
        double a2 = (alpha[k - 1] - r3[k - 1] * a3) / r2[k - 1];
        double a1 = (alpha[k - 2] - r3[k - 2] * a3 - r2[k - 2] * a2) / r1[k - 2];
        double a0 = (alpha[k - 3] - r3[k - 3] * a3 - r2[k - 3] * a2 - r1[k - 3] * a1) / r0[k - 3];
        alpha[k] = a3, alpha[k - 1] = a2, alpha[k - 2] = a1, alpha[k - 3] = a0;
        /* the next four rows, a line of each per line of these (a batch's factors come from
         * memory, and the next rows start where the hardware's stream prefetch has none) */
        const double *p0 = r0, *p1 = r0, *p2 = r0, *p3 = r0;
        if (k >= 7) {
            p3 = factor_row(f->head, f->n0, f->tail, f->width, k - 4);
            p2 = factor_row(f->head, f->n0, f->tail, f->width, k - 5);
            p1 = factor_row(f->head, f->n0, f->tail, f->width, k - 6);
            p0 = factor_row(f->head, f->n0, f->tail, f->width, k - 7);
        }
        for (long i0 = 0; i0 < k - 3; i0 += 8) {
            __builtin_prefetch(p3 + i0, 0, 3);
            __builtin_prefetch(p2 + i0, 0, 3);
            __builtin_prefetch(p1 + i0, 0, 3);
            __builtin_prefetch(p0 + i0, 0, 3);
            long i1 = i0 + 8 < k - 3 ? i0 + 8 : k - 3;
            for (long i = i0; i < i1; ++i)
                alpha[i] -= (r3[i] * a3 + r2[i] * a2) + (r1[i] * a1 + r0[i] * a0);
        }
    }
    for (; k >= 0; --k) {
        const double *row = factor_row(f->head, f->n0, f->tail, f->width, k);
        double ak = alpha[k] / row[k];
        alpha[k] = ak;
        for (long i = 0; i < k; ++i) alpha[i] -= row[i] * ak;
    }
}

/* The prior bounds (see the top of the file) of the A candidates into p->term, their upper bounds
 * on mu_g0 into p->mu0 (for the row checks), from alpha = L^{-T} z (in p->gk); 1 where a bound is
 * not finite. */
static int prior_keys(prune_scratch *p, long n, long A, const factor_ref *f, double b0, double d0,
                      double kdiag, const double *kq) {
    const double u = 0x1p-53;
    double *alpha = p->gk, *mu1 = p->mu0, *mag = p->ss0, *key = p->term;
    back_alpha(n, f, alpha);
    /* |L|_F: every row of L has the squared norm k(x, x) + a = L_00^2 (a stationary kernel's
     * constant diagonal), so |L|_F = n^(1/2) L_00; twice that covers the factor's rounding */
    double l00 = factor_row(f->head, f->n0, f->tail, f->width, 0)[0];
    double lf = 2.0 * sqrt((double)n) * fabs(l00), zn = 0.0, an = 0.0;
    for (long i = 0; i < n; ++i) zn += f->z[i] * f->z[i], an += alpha[i] * alpha[i];
    for (long j = 0; j < A; ++j) mu1[j] = mag[j] = 0.0;
    for (long i = 0; i < n; ++i) {
        double ai = alpha[i], aa = fabs(ai);
        const double *ki = kq + i * A;
        for (long j = 0; j < A; ++j) {
            mu1[j] += ai * ki[j];
            mag[j] += aa * fabs(ki[j]);
        }
    }
    double sk = sqrt(kdiag), gam = MU_SLACK * (double)(n + 2) * u;
    double common = gam * (2.0 * lf * sqrt(an) * sk + sqrt(zn) * sk);
    for (long j = 0; j < A; ++j) { /* mu1: an upper bound on mu_g0; key: the prior bound */
        double hi = mu1[j] + (common + gam * mag[j] + gam * fabs(mu1[j]));
        mu1[j] = hi;
        key[j] = bound_term(kdiag, hi, d0, b0);
        if (!isfinite(key[j])) return 1;
    }
    return 0;
}

/* Member g0's exact terms (its bound's term on every candidate, the full select's operations)
 * into p->term; 1 where one is NaN. */
static int exact_keys(score_scratch *sc, prune_scratch *p, long n, long A, const factor_ref *f,
                      double b0, double d0, double kdiag, const double *kq) {
    pack_k(n, sc->npad, A, kq, sc->kp);
    ref_solve(sc, n, A, f, NULL, p->mu0, p->ss0);
    for (long j = 0; j < A; ++j) {
        double rho2 = kdiag - p->ss0[j];
        p->term[j] = bound_term(rho2 > 0.0 ? rho2 : 0.0, p->mu0[j], d0, b0);
        if (p->term[j] != p->term[j]) return 1;
    }
    return 0;
}

/* The FIRST_GROUP candidates of the largest alpha_prev^T k_S(x) (ties: the smaller index) into
 * cols, from the m entries of the previous select's alpha (a guess of the first group's order: any
 * guess gives the same choice). */
static long guess_first(long n, long A, const double *kq, const double *ac, long m, double *score,
                        long *cols) {
    for (long j = 0; j < A; ++j) score[j] = 0.0;
    for (long i = 0; i < m && i < n; ++i) {
        double ai = ac[i];
        for (long j = 0; j < A; ++j) score[j] += ai * kq[i * A + j];
    }
    long c = 0;
    for (long j = 0; j < A; ++j) { /* insertion into the running top FIRST_GROUP */
        if (c == FIRST_GROUP && !(score[j] > score[cols[c - 1]])) continue;
        long at = c < FIRST_GROUP ? c++ : c - 1;
        while (at > 0 && score[j] > score[cols[at - 1]]) cols[at] = cols[at - 1], --at;
        cols[at] = j;
    }
    return c;
}

#endif /* TB_EXACT_PRUNE_KEYS_H */
