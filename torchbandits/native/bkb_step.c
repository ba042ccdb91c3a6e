/* BKB's single-run round on a fixed arm set in one call (Calandriello, Carratino, Lazaric, Valko
 * & Rosasco, "Gaussian Process Optimization with Adaptive Sketching: Scalable and No Regret",
 * COLT 2019: the DTC posterior of eq. 4 rebuilt from the count statistics of §3.2, the UCB of
 * eq. 4 and its argmax, and the dictionary draw of §3.1 / Fig. 1).
 *
 * The statements are those of torchbandits.models.nystrom_arms.dtc_round (the torch path, which
 * stays the reference): with the kernel rows k(x_j, X_A) of the n distinct pulled points (rows
 * [n, A]), their arm rows idx [n], the dictionary's positions sel [m] among them, pull counts c and
 * reward sums s [n]:
 *
 *   K_ZP[i, j] = rows[sel_i, idx_j],  K_ZZ = K_ZP[:, sel] (+ jitter I),  K_ZZ = L Lᵀ,  P = L⁻¹,
 *   Eᵀ = P K_ZP [m, n],  A = Eᵀ C Eᵀᵀ + λI = R Rᵀ,  N = R⁻¹,  w = NᵀN Eᵀ s,
 *   G = I − λ NᵀN = H Hᵀ,  [g; μ̃] = [HᵀP; wᵀP] K_ZA  [m+1, A],
 *   σ̃² = max(k/λ − ‖g‖²/λ, 0)  (the ridge DTC variance, eq. 4),
 *
 * every product summed in index order, in float64, without -ffast-math (no reassociation); the
 * numbers agree with the torch path's LAPACK/BLAS calls to rounding. Cases the torch path handles
 * (a numerically singular K_ZZ, which it factors with pivoting; a G whose Cholesky factorisation
 * fails) return a non-zero code and write nothing the caller uses.
 *
 * Plain C99, no global state, no pointer kept between calls; memory is malloc'ed and freed inside
 * each call. Row-major matrices throughout. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Σ_q a[q] b[q] in 8 interleaved partial sums (lane l takes q ≡ l mod 8, lanes added pairwise at
 * the end): independent fused multiply-adds that the compiler maps onto vector registers. */
static double dot(long n, const double *a, const double *b) {
    double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    long n8 = n - n % 8;
    for (long q = 0; q < n8; q += 8)
        for (long l = 0; l < 8; ++l) acc[l] = fma(a[q + l], b[q + l], acc[l]);
    for (long q = n8; q < n; ++q) acc[q - n8] = fma(a[q], b[q], acc[q - n8]);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* In-place lower Cholesky factor of the symmetric [m, m] matrix a (lower triangle read, upper
 * triangle zeroed): a = L Lᵀ, L_jj = sqrt(a_jj − Σ_k L_jk²), L_ij = (a_ij − Σ_k L_ik L_jk) / L_jj.
 * Returns 0, or j + 1 when the j-th leading minor is not positive definite (LAPACK's potrf
 * convention, as torch.linalg.cholesky_ex's info). */
static long cholesky_lower(long m, double *a) {
    for (long j = 0; j < m; ++j) {
        double *lj = a + j * m;
        double d = lj[j] - dot(j, lj, lj);
        if (!(d > 0.0)) return j + 1;
        double ljj = sqrt(d);
        lj[j] = ljj;
        for (long i = j + 1; i < m; ++i) {
            double *li = a + i * m;
            li[j] = (li[j] - dot(j, li, lj)) / ljj;
        }
        for (long k = j + 1; k < m; ++k) lj[k] = 0.0;
    }
    return 0;
}

/* xt = (L⁻¹)ᵀ (upper [m, m]) for a lower L, by forward substitution on the identity: row c of xt
 * is column c of X = L⁻¹, X_cc = 1 / L_cc, X_ic = −(Σ_{c≤k<i} L_ik X_kc) / L_ii. */
static void lower_inverse_t(long m, const double *l, double *xt) {
    memset(xt, 0, (size_t)(m * m) * sizeof(double));
    for (long c = 0; c < m; ++c) {
        double *xc = xt + c * m;
        xc[c] = 1.0 / l[c * m + c];
        for (long i = c + 1; i < m; ++i) {
            const double *li = l + i * m;
            xc[i] = -dot(i - c, li + c, xc + c) / li[i];
        }
    }
}

/* xt = xᵀ for [m, m] matrices. */
static void transpose(long m, const double *x, double *xt) {
    for (long i = 0; i < m; ++i)
        for (long j = 0; j < m; ++j) xt[j * m + i] = x[i * m + j];
}

/* The scoring product [HᵀP; wᵀP] K_ZA for 8 arms a0..a0+7 (all present): out[i, a] = Σ_k
 * w[i, k] x_k[a] for the nr rows of w ([nr4, m], zero rows padding nr up to a multiple of 4; x_k
 * the kernel row of dictionary point k), 4 rows × 8 arms of accumulators at a time; then
 * mean[a] = out[nr − 1, a] and sq[a] = Σ_{i < nr−1} out[i, a]². */
static void score8(long nr, long nr4, long m, const double *w, const double *const *x, long a0,
                   double *mean, double *sq) {
    double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (long i0 = 0; i0 < nr4; i0 += 4) {
        double acc0[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        double acc1[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        double acc2[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        double acc3[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        const double *w0 = w + i0 * m, *w1 = w0 + m, *w2 = w1 + m, *w3 = w2 + m;
        for (long k = 0; k < m; ++k) {
            const double *xk = x[k] + a0;
            double b0 = w0[k], b1 = w1[k], b2 = w2[k], b3 = w3[k];
            for (long j = 0; j < 8; ++j) {
                acc0[j] = fma(b0, xk[j], acc0[j]);
                acc1[j] = fma(b1, xk[j], acc1[j]);
                acc2[j] = fma(b2, xk[j], acc2[j]);
                acc3[j] = fma(b3, xk[j], acc3[j]);
            }
        }
        double *accs[4] = {acc0, acc1, acc2, acc3};
        for (long ii = 0; ii < 4 && i0 + ii < nr; ++ii) {
            const double *ac = accs[ii];
            if (i0 + ii == nr - 1) {
                for (long j = 0; j < 8; ++j) mean[a0 + j] = ac[j];
            } else {
                for (long j = 0; j < 8; ++j) s[j] = fma(ac[j], ac[j], s[j]);
            }
        }
    }
    for (long j = 0; j < 8; ++j) sq[j] = s[j];
}

/* score8 for one arm a (the arms past the last multiple of 8). */
static void score1(long nr, long m, const double *w, const double *const *x, long a,
                   double *mean, double *sq) {
    double s = 0.0;
    for (long i = 0; i < nr; ++i) {
        double acc = 0.0;
        for (long k = 0; k < m; ++k) acc = fma(w[i * m + k], x[k][a], acc);
        if (i == nr - 1) mean[a] = acc;
        else s = fma(acc, acc, s);
    }
    *sq = s;
}

/* The round's posterior (module comment) at all na arms: mean, var [na] (ridge DTC variance,
 * clamped at 0) and *sum_var = Σ_j c_j var[idx_j] (S_t of Theorem 2, summed in index order).
 * Returns 0; 1 when K_ZZ needs the pivoted factor (plain Cholesky fails or a pivot² is
 * ≤ pivot_tol·(kconst + jitter)); 2 when G's Cholesky fails; 3 when memory runs out; 4 when m < 1. */
int bkb_dtc_round(long m, long n, long na, const double *rows, const int64_t *idx,
                  const int64_t *sel, const double *counts, const double *sums, double lam,
                  double kconst, double jitter, double pivot_tol, double *mean, double *var,
                  double *sum_var) {
    if (m < 1) return 4;
    long nr = m + 1, nr4 = (nr + 3) / 4 * 4;
    size_t mm = (size_t)(m * m), mn = (size_t)(m * n);
    double *buf = malloc((3 * mn + 6 * mm + (size_t)(nr4 * m) + 2 * (size_t)m) * sizeof(double));
    const double **x = malloc((size_t)m * sizeof(double *));
    if (buf == NULL || x == NULL) {
        free(buf);
        free((void *)x);
        return 3;
    }
    double *kzp = buf, *et = kzp + mn, *ec = et + mn, *l = ec + mn, *pt = l + mm, *a = pt + mm;
    double *nt = a + mm, *g = nt + mm, *ht = g + mm, *wm = ht + mm, *v = wm + nr4 * m, *u = v + m;
    int code = 0;
    for (long i = 0; i < m; ++i) x[i] = rows + sel[i] * na;
    /* K_ZP [m, n] and K_ZZ = K_ZP[:, sel] (+ jitter I) */
    for (long i = 0; i < m; ++i)
        for (long j = 0; j < n; ++j) kzp[i * n + j] = x[i][idx[j]];
    for (long i = 0; i < m; ++i)
        for (long j = 0; j < m; ++j) l[i * m + j] = kzp[i * n + sel[j]] + (i == j ? jitter : 0.0);
    /* P = L⁻¹ unless K_ZZ is numerically singular (the torch path then pivots); pt = Pᵀ */
    if (cholesky_lower(m, l)) { code = 1; goto done; }
    double dmin = l[0];
    for (long i = 1; i < m; ++i) dmin = fmin(dmin, l[i * m + i]);
    if (!(dmin * dmin > pivot_tol * (kconst + jitter))) { code = 1; goto done; }
    lower_inverse_t(m, l, pt);
    /* Eᵀ = P K_ZP (P lower triangular: row i sums k ≤ i), C Eᵀ, v = Eᵀ s */
    for (long i = 0; i < m; ++i) {
        double *ei = et + i * n;
        memset(ei, 0, (size_t)n * sizeof(double));
        for (long k = 0; k <= i; ++k) {
            double pik = pt[k * m + i];
            const double *kk = kzp + k * n;
            for (long j = 0; j < n; ++j) ei[j] = fma(pik, kk[j], ei[j]);
        }
        for (long j = 0; j < n; ++j) ec[i * n + j] = ei[j] * counts[j];
        v[i] = dot(n, ei, sums);
    }
    /* A = Eᵀ C E + λI (lower triangle), R = chol(A) (A ⪰ λI: positive definite), nt = (R⁻¹)ᵀ */
    for (long i = 0; i < m; ++i)
        for (long j = 0; j <= i; ++j) {
            double s = dot(n, ec + i * n, et + j * n);
            a[i * m + j] = i == j ? s + lam : s;
        }
    cholesky_lower(m, a);
    lower_inverse_t(m, a, nt);
    /* w = Nᵀ (N v) */
    for (long i = 0; i < m; ++i) {
        double s = 0.0;
        for (long k = 0; k <= i; ++k) s = fma(nt[k * m + i], v[k], s);
        u[i] = s;
    }
    for (long i = 0; i < m; ++i) v[i] = dot(m - i, nt + i * m + i, u + i); /* v now holds w */
    /* G = I − λ NᵀN (lower triangle; N lower: Σ over k ≥ i), H = chol(G), ht = Hᵀ */
    for (long i = 0; i < m; ++i)
        for (long j = 0; j <= i; ++j)
            g[i * m + j] = (i == j ? 1.0 : 0.0) - lam * dot(m - i, nt + i * m + i, nt + j * m + i);
    if (cholesky_lower(m, g)) { code = 2; goto done; }
    transpose(m, g, ht);
    /* W = [HᵀP; wᵀP] [m+1, m] (Σ over k ≥ max(i, j)), zero rows up to a multiple of 4 */
    memset(wm, 0, (size_t)(nr4 * m) * sizeof(double));
    for (long i = 0; i < m; ++i)
        for (long j = 0; j < m; ++j) {
            long k0 = i > j ? i : j;
            wm[i * m + j] = dot(m - k0, ht + i * m + k0, pt + j * m + k0);
        }
    for (long j = 0; j < m; ++j) wm[m * m + j] = dot(m - j, v + j, pt + j * m + j);
    /* [g; μ̃] = W K_ZA and σ̃² = max(k/λ − ‖g‖²/λ, 0) (eq. 4), 8 arms at a time */
    double c0 = kconst / lam, c1 = -1.0 / lam;
    long na8 = na - na % 8;
    for (long a0 = 0; a0 < na; a0 += 8) {
        double sq[8];
        long width = a0 < na8 ? 8 : na - a0;
        if (width == 8) score8(nr, nr4, m, wm, x, a0, mean, sq);
        else
            for (long j = 0; j < width; ++j) score1(nr, m, wm, x, a0 + j, mean, sq + j);
        for (long j = 0; j < width; ++j) {
            double vj = c1 * sq[j] + c0;
            var[a0 + j] = vj > 0.0 || isnan(vj) ? vj : 0.0;
        }
    }
    /* the pulled points' variances and S_t = Σ_j c_j σ̃²(x_j) */
    double st = 0.0;
    for (long j = 0; j < n; ++j) {
        st = fma(counts[j], var[idx[j]], st);
    }
    *sum_var = st;
done:
    free(buf);
    free((void *)x);
    return code;
}

/* ucb[a] = mean[a] + beta · sqrt(var[a]) (eq. 4, the ridge sd) and the first index of the largest
 * (a NaN counts as the largest, as torch.argmax). */
long bkb_ucb_argmax(long na, const double *mean, const double *var, double beta, double *ucb) {
    long best = 0;
    for (long a = 0; a < na; ++a) ucb[a] = fma(beta, sqrt(var[a]), mean[a]);
    for (long a = 1; a < na; ++a) {
        if (isnan(ucb[best])) break;
        if (isnan(ucb[a]) || ucb[a] > ucb[best]) best = a;
    }
    return best;
}

/* The linearised dictionary draw of the authors' code (§3.1): point j is kept when
 * u_j < (c_j q̄) σ̃²(x_j), σ̃²(x_j) = var[idx_j], u_j ~ U[0, 1) drawn by the caller's generator.
 * Writes mask [n] (0/1) and the kept positions into sel; returns their number m. */
long bkb_draw(long n, const double *u, const double *counts, const double *var,
              const int64_t *idx, double qbar, uint8_t *mask, int64_t *sel) {
    long m = 0;
    for (long j = 0; j < n; ++j) {
        int keep = u[j] < counts[j] * qbar * var[idx[j]];
        mask[j] = (uint8_t)keep;
        if (keep) sel[m++] = j;
    }
    return m;
}
