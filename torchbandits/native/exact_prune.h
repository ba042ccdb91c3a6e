/* The pruned select of the closed-form bound min_g t_g(x), t_g = sqrt(rho^2_g / div_g) beta_g +
 * mu_g over G factors (included by exact_step.c after solve_factor, bound_term and takes_min;
 * used by its fused single-run select and by exact_batch.c's batched select): one term for the
 * radius rules and AMM (Flynn & Reeb 2024, Sec. 5.5), DMM's grid of regularisers for G > 1
 * (Sec. 5.4, Eq. (14)). rho^2_g = max(k(x, x) - |l_g|^2, 0), l_g = L_g^{-1} k_S(x),
 * mu_g = z_g^T l_g.
 *
 * Any one member's term bounds the minimum from above; the select bounds member g0's term (the
 * caller's hint: the minimiser at the last chosen candidate) before its solve is finished. The
 * forward substitution l_i = (k_i - sum_{k<i} L_ik l_k) / L_ii gives l's entries in order, and
 * the running sum s_j of l_i^2 over i < j, the same additions that make |l|^2, can only grow (a
 * rounded sum of non-negative terms is non-decreasing), so after j rows
 * sqrt(max(k(x, x) - s_j, 0) / div) beta + mu is, for beta >= 0, at least the term's computed
 * value. mu = z^T l itself is known only at the end; in exact arithmetic it equals alpha^T k_S(x),
 * alpha = L^{-T} z = (K + aI)^{-1} y, made once per select by a back substitution (n^2 / 2) and
 * one product over the candidates (n A). Both are substitutions with L, each with a backward
 * error |dL| <= gamma_n |L| (Higham 2002, Thm 8.5), so to first order
 * |z^T l - alpha^T k| <= 2 gamma_n |alpha|^T |L| |l| + gamma_n (|z|^T |l| + |alpha|^T |k|)
 * <= gamma_n (2 |L|_F |alpha| |l| + |z| |l| + |alpha|^T |k|), |l| <= k(x, x)^(1/2) (a posterior
 * variance is not negative); MU_SLACK times that bound, plus the rounding of alpha^T k itself, is
 * added to alpha^T k: an upper bound on the computed mu.
 *
 * The candidates are taken in order of decreasing prior bound (s_0 = 0), PRUNE_W at a time; a
 * group's g0 solve runs ROW_CHECK rows at a time and the group is dropped as soon as none of its
 * columns can still be chosen (its bound below the best bound found, or equal to it at a larger
 * index); a group solved to the end has the other members solved on its columns and gives their
 * bounds as the full select computes them: a column is solved by the same operations whatever
 * the other columns of its panel, and whether its panel is solved in one go or in pieces. So the
 * choice, its minimising member and its append pieces have the bits of the full select
 * (ucb_argmax over every member's scoring). At the papers' sizes most candidates are dropped
 * before their first row: their prior bound is below the best posterior bound. The pruning needs
 * every member finite, beta_g0 >= 0 and div > 0 (a NaN bound counts as largest), and a one-term
 * bound at least rows_min_n(A) points: the caller takes the full select otherwise, and for
 * FULL_AFTER_POOR selects after two in a row that pruned too little (the state in the caller's
 * cache). Below ROWS_MIN_N points several members are keyed instead by member g0's exact terms,
 * g0 solved on every candidate first (no row checks then). */
#ifndef TB_EXACT_PRUNE_H
#define TB_EXACT_PRUNE_H

/* One factor of the bound: rows i < n0 at head + i n0, the others at tail + (i - n0) width
 * (factor_row; n0 = 0 and head NULL for a plain [n, width] row-major factor), and its
 * whitened targets z = L^{-1} y [n]. */
typedef struct {
    const double *head;
    long n0;
    const double *tail;
    long width;
    const double *z;
} factor_ref;

/* V = L^{-1} K of the packed columns in sc (v may be NULL: not written), mu = z^T V and
 * colsum(V^2) [A], for the factor f. */
static void ref_solve(score_scratch *sc, long n, long A, const factor_ref *f, double *v,
                      double *mu, double *sumsq) {
    factor_rows(n, sc->npad, f->head, f->n0, f->tail, f->width, sc->zeros, sc->lrow, sc->inv);
    solve_factor(n, sc->npad, A, sc->kp, sc->lrow, sc->inv, f->z, sc->vp, v, mu, sumsq);
}

/* Candidates per group of the pruned select (two 8-wide or four 4-wide vectors). */
#define PRUNE_W 16

/* idx [A] sorted by key descending, ties by index ascending (a merge sort; tmp [A] scratch). */
static void sort_desc(long A, const double *key, long *idx, long *tmp) {
    for (long w = 1; w < A; w *= 2) {
        for (long lo = 0; lo < A; lo += 2 * w) {
            long mid = lo + w < A ? lo + w : A, hi = lo + 2 * w < A ? lo + 2 * w : A;
            long i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                long a = idx[i], b = idx[j];
                int take_b = key[b] > key[a] || (key[b] == key[a] && b < a);
                tmp[k++] = take_b ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)A * sizeof(long));
    }
}

/* Whether the pieces of factor f that the pruning reads are finite: z [n], the pivots L_ii (the
 * rows' other entries enter the pivots, so a non-finite row gives a non-finite pivot), beta and
 * div > 0. */
static int member_finite(long n, const factor_ref *f, double b, double dv) {
    if (!isfinite(b) || !isfinite(dv) || !(dv > 0.0)) return 0;
    for (long i = 0; i < n; ++i) {
        double piv = factor_row(f->head, f->n0, f->tail, f->width, i)[i];
        if (!isfinite(f->z[i]) || !isfinite(piv) || piv == 0.0) return 0;
    }
    return 1;
}

/* Scratch of the pruned select: the prior bounds, the upper bounds on mu_g0 and |alpha|^T |k|
 * [A], order and tmp [A] (long), alpha [n] (in gk), per member its group V [n, W], mu [W] and
 * colsum [W]. */
typedef struct {
    double *term, *mu0, *ss0, *gk, *gv, *gm, *gs;
    long *order, *tmp;
} prune_scratch;

static int prune_alloc(prune_scratch *p, long G, long n, long A) {
    long a1 = A > 0 ? A : 1, n1 = n > 0 ? n : 1;
    p->term = malloc((3 * (size_t)a1 + (size_t)(n1 * PRUNE_W) * (size_t)(G + 1)
                      + 2 * (size_t)(G * PRUNE_W)) * sizeof(double));
    p->order = malloc(2 * (size_t)a1 * sizeof(long));
    if (!p->term || !p->order) {
        free(p->term);
        free(p->order);
        p->term = NULL;
        p->order = NULL;
        return -1;
    }
    p->mu0 = p->term + a1;
    p->ss0 = p->mu0 + a1;
    p->gk = p->ss0 + a1;
    p->gv = p->gk + n1 * PRUNE_W;
    p->gm = p->gv + G * n1 * PRUNE_W;
    p->gs = p->gm + G * PRUNE_W;
    p->tmp = p->order + a1;
    return 0;
}

static void prune_free(prune_scratch *p) {
    free(p->term);
    free(p->order);
}

/* Rows between two checks of a group's bounds (a multiple of MR), and the columns of a group
 * (one panel: at most NR). */
#define ROW_CHECK 32
#define ROW_GROUP (PRUNE_W < NR ? PRUNE_W : NR)
/* The first group, solved to the end before any bound is known: one vector (the eight-row tile
 * runs it at the full rate, at half the cost of two vectors). */
#define FIRST_GROUP LANES
/* Where the rows are pruned. Below, the full solve (A n^2 / 2 multiply-adds) costs about what
 * the row pruning's own passes cost (alpha, the upper bounds, the sort, the gathers), so a
 * one-term bound takes the full select under rows_min_n(A) points; DMM's grid under ROWS_MIN_N
 * points solves its member g0 on every candidate and keys the candidates by its exact terms.
 * What the rows save depends on the state: on a K-UCB run's own points (d = 3, a step's select
 * and append, pruned against full alternated; benchmarks/bench_pruning.py) they paid from
 * n = 80 at A = 100-1000 and 160-250 at A = 20; on the random points of
 * benchmarks/bench_vs_reference.py only from 160-250 at A = 100-300 (0.84-0.93x at n = 80-130),
 * but from 80 at A = 1000 (1.23-1.44x); with 10 or 20 candidates from 250-500 (0.85-0.97x
 * below), with 5 never (0.87-0.95x). So: from 160 points, from 80 with at least ROWS_WIDE_A
 * candidates, from 320 with fewer than two groups' worth, never with one group's. */
#define ROWS_MIN_N 160
#define ROWS_WIDE_A 500
static inline long rows_min_n(long A) {
    if (A <= FIRST_GROUP) return LONG_MAX; /* (every candidate in the first group: none dropped) */
    return A < FIRST_GROUP + ROW_GROUP ? 2 * ROWS_MIN_N : A < ROWS_WIDE_A ? ROWS_MIN_N : 80;
}
/* The caller's cache per run: PRUNE_HEAD values (alpha's length, the poor-pruning state), then
 * alpha (see select_pruned). */
#define PRUNE_HEAD 2
/* ac[1] == PRUNE_FORCED: the caller asks for the pruned select wherever it applies (a one-term
 * bound's rows at any n; no poor-pruning rule; for tests and benchmarks), once. */
#define PRUNE_FORCED -2.0
/* A one-term select with its rows pruned whose substitutions after the first group cost more
 * than POOR_PRUNING times the full select's on the same candidates (its multiply-adds counted as
 * it runs; at least ROW_GROUP candidates after the first group) pruned too little to pay for its
 * own passes and its narrower panels. After two such selects in a row the next FULL_AFTER_POOR
 * selects of the run take the full select (the caller's cache holds the state, ac[1]: -1 after
 * one poor select, then the count), then one prunes again. Measured on AMM-UCB's runs in d = 6
 * (100 candidates: the variance high everywhere, hardly a candidate dropped): 0.8-0.85 of the
 * full select's substitutions, the select 1.2-1.3 times as long as the full one; K-UCB's in
 * d = 2 and 6: 0 - 0.1, a gain. Not for DMM's grid: a poor select there is its member g0 chosen
 * badly for a select or two, and its full select costs five factors' solves (with 1000
 * candidates the rule made a run 30% slower). */
#define POOR_PRUNING 0.6
#define FULL_AFTER_POOR 16
/* The multiple of the first-order bound on |z^T l - alpha^T k| that is added to alpha^T k. */
#define MU_SLACK 8.0

#include "exact_prune_keys.h"

/* Rows i0 .. i1 - 1 of the packed panel [npad, w] of the c columns cols of K_SC [n, A] (zero
 * padding: columns c .. w - 1 and rows from n). */
static void pack_rows(long n, long A, const double *kq, const long *cols, long c, long w, long i0,
                      long i1, double *kp) {
    for (long i = i0; i < i1; ++i) {
        double *out = kp + i * w;
        long c0 = i < n ? c : 0;
        for (long q = 0; q < c0; ++q) out[q] = kq[i * A + cols[q]];
        for (long q = c0; q < w; ++q) out[q] = 0.0;
    }
}

/* The state of one pruned select: its inputs, and the best bound found so far (top at column
 * bj, minimising member bg; bj = -1: none yet). */
typedef struct {
    score_scratch *sc;
    prune_scratch *p;
    long G, g0, n, A;
    const factor_ref *fr;
    const double *beta, *div, *kq;
    double kdiag, top;
    long bj, bg;
    int rows; /* whether a group's g0 rows are checked against top as they are solved */
    double *pend;
    int g0_rows; /* whether sc's lrow and inv hold member g0's rows */
    double work; /* member g0's substitutions after the first group so far, in units of half a
                  * multiply-add (rows^2 a column; the poor-pruning rule's count, one term) */
} prune_run;

/* Solve the group of c columns cols (member g0 ROW_CHECK rows at a time, dropped as soon as none
 * of its columns can still be chosen; then the other members) and take its best column into the
 * run's best. first: the select's first group (no bound known: solved to the end, its factor's
 * rows prefetched). Returns 0, or 1 for a NaN bound. */
static int run_group(prune_run *r, const long *cols, long c, int first) {
    score_scratch *sc = r->sc;
    prune_scratch *p = r->p;
    const factor_ref *f = r->fr + r->g0;
    long n = r->n, G = r->G, g0 = r->g0, npad = sc->npad, w = panel_width(c, 0);
    double b0 = r->beta[g0], d0 = r->div[g0], kdiag = r->kdiag, part[PRUNE_W];
    if (!r->g0_rows)
        factor_rows(n, npad, f->head, f->n0, f->tail, f->width, sc->zeros, sc->lrow, sc->inv);
    r->g0_rows = G == 1; /* (the other members' solves below set sc's rows to theirs) */
    for (long q = 0; q < c; ++q) part[q] = 0.0;
    int alive = 1;
    long i1 = 0;
    for (long i0 = 0; i0 < npad && alive; i0 += ROW_CHECK) {
        i1 = i0 + ROW_CHECK < npad ? i0 + ROW_CHECK : npad;
        pack_rows(n, r->A, r->kq, cols, c, w, i0, i1, sc->kp); /* (packed as far as solved) */
        solve_panel_rows(sc->lrow, sc->inv, w, sc->kp, sc->vp, i0, i1, first);
        if (!r->rows || r->bj < 0 || i1 >= npad) continue;
        alive = 0;
        for (long q = 0; q < c; ++q) { /* the running sums, then each column's bound */
            double sq = part[q];
            for (long i = i0; i < i1 && i < n; ++i) {
                double x = sc->vp[i * w + q];
                sq += x * x;
            }
            part[q] = sq;
            double rho2 = kdiag - sq;
            double t = bound_term(rho2 > 0.0 ? rho2 : 0.0, p->mu0[cols[q]], d0, b0);
            alive |= t > r->top || (t == r->top && cols[q] < r->bj);
        }
    }
    if (!first) r->work += (double)c * (double)i1 * (double)i1;
    if (!alive) return 0;
    /* member g0's pieces of the group, then the other members' on its columns (kp holds the
     * group's whole panel now) */
    double *gv0 = p->gv + g0 * n * c, *pend = r->pend;
    panel_finish(n, c, w, c, sc->vp, f->z, pend ? gv0 : NULL, p->gm + g0 * c, p->gs + g0 * c);
    for (long g = 0; g < G; ++g)
        if (g != g0)
            ref_solve(sc, n, c, r->fr + g, pend ? p->gv + g * n * c : NULL, p->gm + g * c,
                      p->gs + g * c);
    for (long q = 0; q < c; ++q) { /* each column's bound: ucb_argmax's running minimum */
        long col = cols[q], ag = 0;
        double mn = 0.0;
        for (long g = 0; g < G; ++g) {
            double rho2 = kdiag - p->gs[g * c + q];
            double t = bound_term(rho2 > 0.0 ? rho2 : 0.0, p->gm[g * c + q], r->div[g], r->beta[g]);
            if (g == 0) mn = t;
            else if (takes_min(t, mn)) mn = t, ag = g;
        }
        if (mn != mn) return 1; /* a NaN bound (not expected: every input finite) */
        if (r->bj < 0 || mn > r->top || (mn == r->top && col < r->bj)) {
            r->top = mn, r->bj = col, r->bg = ag;
            for (long g = 0; g < G && pend; ++g) { /* the pieces of the new best */
                double *o = pend + g * (n + 2);
                for (long i = 0; i < n; ++i) o[i] = p->gv[g * n * c + i * c + q];
                o[n] = p->gm[g * c + q];
                o[n + 1] = p->gs[g * c + q];
            }
        }
    }
    return 0;
}

/* The pruned select over A candidates of the bound min_g (sqrt(rho^2_g / div[g]) beta[g] + mu_g)
 * of the G factors fr [G] (see the top of the file) from their kernel block K_SC [n, A] (kq,
 * row-major; sc's packing is not read, and spent here). g0: the member whose rows are pruned.
 * ac [PRUNE_HEAD + cap] (may be NULL): the caller's cache between selects (zeros at first):
 * ac[1] the state of the poor prunings (see POOR_PRUNING; -1: one, 1 .. FULL_AFTER_POOR: the full
 * selects left; PRUNE_FORCED: prune this select wherever the pruning applies; anything else:
 * none), then member g0's alpha, ac[0] its length m and its values from ac + PRUNE_HEAD (read
 * only where m <= n <= cap): with the rows pruned, the first group is guessed from it and solved
 * before this select's alpha, whose back substitution then finds the factor's rows in the cache,
 * and this alpha is written back.
 * The first index of the largest bound into *best, the minimising g there into *argb; where
 * pend is not NULL the chosen candidate's append pieces per member g at pend + g (n + 2):
 * l = L_g^{-1} k_S(c) [n], z_g^T l, |l|^2. Returns 0, or 1 (nothing chosen) where the pruning
 * does not apply: the caller then takes the full select. */
static int select_pruned(score_scratch *sc, prune_scratch *p, long G, long g0, long n, long A,
                         const factor_ref *fr, const double *beta, const double *div,
                         double kdiag, const double *kq, double *ac, long cap, long *best,
                         long *argb, double *pend) {
    const factor_ref *f = fr + g0;
    double b0 = beta[g0], d0 = div[g0];
    int forced = ac && ac[1] == PRUNE_FORCED;
    if (forced) ac[1] = 0.0;
    int rows = n >= (G > 1 ? ROWS_MIN_N : forced ? 1 : rows_min_n(A));
    if ((G == 1 && !rows) || (rows && !(b0 >= 0.0)) || !(kdiag > 0.0) || !isfinite(kdiag))
        return 1;
    if (rows && ac && ac[1] >= 1.0 && ac[1] <= (double)FULL_AFTER_POOR) { /* FULL_AFTER_POOR */
        ac[1] -= 1.0;
        return 1;
    }
    for (long g = 0; g < G; ++g)
        if (!member_finite(n, fr + g, beta[g], div[g])) return 1;
    prune_run r = {sc, p, G, g0, n, A, fr, beta, div, kq, kdiag, 0.0, -1, 0, rows, pend, 0, 0.0};
    double *key = p->term;
    long first[FIRST_GROUP], nfirst = 0;
    if (r.rows && ac && cap >= n) { /* the first group guessed and solved before alpha */
        long m = (long)ac[0];
        nfirst = guess_first(n, A, kq, ac + PRUNE_HEAD, m >= 0 && m <= n ? m : 0, key, first);
        if (run_group(&r, first, nfirst, 1)) return 1;
    }
    /* the keys: below ROWS_MIN_N points (several members) member g0's exact terms, g0 solved on
     * every candidate in one pass; else the prior bounds, the rows pruned as the groups run */
    if (r.rows ? prior_keys(p, n, A, f, b0, d0, kdiag, kq)
               : exact_keys(sc, p, n, A, f, b0, d0, kdiag, kq))
        return 1;
    if (r.rows && ac && cap >= n) { /* this alpha for the next select */
        ac[0] = (double)n;
        memcpy(ac + PRUNE_HEAD, p->gk, (size_t)n * sizeof(double));
    }
    for (long q = 0; q < nfirst; ++q) key[first[q]] = -INFINITY; /* (solved) */
    for (long j = 0; j < A; ++j) p->order[j] = j;
    sort_desc(A, key, p->order, p->tmp);
    for (long pos = 0, group = nfirst > 0, c = 0; pos < A; pos += c, ++group) {
        const long *cols = p->order + pos;
        long width = group == 0 ? FIRST_GROUP : ROW_GROUP;
        c = A - pos < width ? A - pos : width;
        if (r.bj >= 0) { /* the group's columns that can still be chosen: a prefix of the order */
            long keep = 0;
            while (keep < c && (key[cols[keep]] > r.top || (key[cols[keep]] == r.top &&
                                                            cols[keep] < r.bj)))
                ++keep;
            if (keep == 0) break;
            c = keep;
        }
        if (run_group(&r, cols, c, group == 0)) return 1;
    }
    *best = r.bj;
    *argb = r.bg;
    if (G == 1 && rows && ac && !forced) { /* a second poor pruning: the next selects in full */
        long rest = A - FIRST_GROUP;
        double npad2 = (double)sc->npad * (double)sc->npad;
        int poor = rest >= ROW_GROUP && r.work > POOR_PRUNING * (double)rest * npad2;
        ac[1] = !poor ? 0.0 : ac[1] == -1.0 ? (double)FULL_AFTER_POOR : -1.0;
    }
    return 0;
}

#endif /* TB_EXACT_PRUNE_H */
