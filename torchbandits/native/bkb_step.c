/* BKB's single-run round on a fixed arm set in one call (Calandriello, Carratino, Lazaric, Valko
 * & Rosasco, "Gaussian Process Optimization with Adaptive Sketching: Scalable and No Regret",
 * COLT 2019: the DTC posterior of eq. 4 rebuilt from the count statistics of §3.2, the UCB of
 * eq. 4 with its argmax, and the dictionary draw of §3.1 / Fig. 1).
 *
 * The statements are those of torchbandits.models.nystrom_arms.dtc_round (the torch path, which
 * stays the reference), with the kernel rows k(x_j, X_A) of the n distinct pulled points (rows
 * [n, A]), their arm rows idx [n], the dictionary's positions sel [m] among them, pull counts c and
 * reward sums s [n]:
 *
 *   K_ZP[i, j] = rows[sel_i, idx_j],  K_ZZ = K_ZP[:, sel] (+ jitter I),  K_ZZ = L Lᵀ,  P = L⁻¹,
 *   Eᵀ = P K_ZP [m, n],  A = (Eᵀ C) E + λI = R Rᵀ,  N = R⁻¹,  w = Nᵀ (N (Eᵀ s)),
 *   G = I − λ NᵀN = H Hᵀ,  [g; μ̃] = ([Hᵀ; wᵀ] P) K_ZA  [m+1, A],
 *   σ̃² = max(k/λ − 1ᵀ(g∘g)/λ, 0)  (the ridge DTC variance, eq. 4).
 *
 * Every factorisation and product is the BLAS/LAPACK call that torch makes for the same statement
 * (potrf, trsm, gemm, gemv, dot, through function pointers that the caller resolves in the very
 * library torch calls), with the same arguments, on buffers in the layouts torch uses (a
 * row-major [r, c] matrix is the column-major [c, r] one: C = A·B is computed as Cᵀ = Bᵀ·Aᵀ;
 * torch's factors and triangular solves are column-major) and 64-byte aligned like torch's
 * allocations: the results are those of the torch path bit for bit, without its ~50 operator
 * dispatches. Cases the torch path handles differently (a numerically singular K_ZZ, which it
 * factors with pivoting; a G whose Cholesky factorisation fails) return a non-zero code.
 *
 * bkb_dtc_rounds does the round of every run of a batch (batched BKB's padded per-run buffers)
 * in one call, each run by the same code on its own slices: the sequential run's numbers.
 *
 * Plain C99, no global state, no pointer kept between calls; memory is allocated and freed inside
 * each call. */
#define _POSIX_C_SOURCE 200112L
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*potrf_fn)(const char *, const int *, double *, const int *, int *);
typedef void (*trsm_fn)(const char *, const char *, const char *, const char *, const int *,
                        const int *, const double *, const double *, const int *, double *,
                        const int *);
typedef void (*gemm_fn)(const char *, const char *, const int *, const int *, const int *,
                        const double *, const double *, const int *, const double *, const int *,
                        const double *, double *, const int *);
typedef void (*gemv_fn)(const char *, const int *, const int *, const double *, const double *,
                        const int *, const double *, const int *, const double *, double *,
                        const int *);
typedef double (*dot_fn)(const int *, const double *, const int *, const double *, const int *);

/* The BLAS/LAPACK entry points, in the order the caller passes them. */
typedef struct {
    potrf_fn potrf;
    trsm_fn trsm;
    gemm_fn gemm;
    gemv_fn gemv;
    dot_fn dot;
} blas_t;

/* Row-major C [rows, cols] = A [rows, k] · B [k, cols] + beta C, for A and B each row-major
 * (trans 'n') or column-major ('t', i.e. stored as its transpose), as torch.mm / torch.addmm call
 * gemm for a contiguous result: column-major Cᵀ = op(B)ᵀ op(A)ᵀ. */
static void mm(const blas_t *b, char ta, char tb, int rows, int cols, int k, double alpha,
               const double *a, int lda, const double *bm, int ldb, double beta, double *c) {
    b->gemm(&tb, &ta, &cols, &rows, &k, &alpha, bm, &ldb, a, &lda, &beta, c, &cols);
}

/* y = M x for M [r, c] row-major (torch.mv on a contiguous matrix: gemv 't' on the column-major
 * [c, r]) or, for trans 'n', M column-major (gemv 'n'). */
static void mv(const blas_t *b, char trans, int r, int c, const double *mat, const double *x,
               double *y) {
    const int one = 1;
    const double alpha = 1.0, beta = 0.0;
    if (trans == 't') b->gemv(&trans, &c, &r, &alpha, mat, &c, x, &one, &beta, y, &one);
    else b->gemv(&trans, &r, &c, &alpha, mat, &r, x, &one, &beta, y, &one);
}

/* Lower Cholesky factor as torch.linalg.cholesky_ex: column-major copy of the lower triangle of
 * the row-major [m, m] matrix a (upper zeroed), potrf 'L'. Returns LAPACK's info. */
static int cholesky(const blas_t *b, int m, const double *a, double *l) {
    int info = 0;
    for (int j = 0; j < m; ++j)
        for (int i = 0; i < m; ++i) l[j * m + i] = i >= j ? a[i * m + j] : 0.0;
    b->potrf("L", &m, l, &m, &info);
    return info;
}

/* x = L⁻¹ (column-major) for a column-major lower L, as torch.linalg.solve_triangular(L, I,
 * upper=False): trsm on the identity. */
static void lower_inverse(const blas_t *b, int m, const double *l, double *x) {
    const double one = 1.0;
    memset(x, 0, (size_t)m * (size_t)m * sizeof(double));
    for (int i = 0; i < m; ++i) x[i * m + i] = 1.0;
    b->trsm("L", "L", "N", "N", &m, &m, &one, l, &m, x, &m);
}

static size_t up64(size_t count) { return (count + 7) / 8 * 8; } /* doubles to 64 bytes */

/* The round's posterior (module comment) at all na arms: mean, var [na] (ridge DTC variance,
 * clamped at 0) and *sum_var = Σ_j c_j var[idx_j] (S_t of Theorem 2, torch.dot's call).
 * Returns 0; 1 when K_ZZ needs the pivoted factor (Cholesky fails or a pivot² is
 * ≤ pivot_tol·(kconst + jitter)); 2 when G's Cholesky fails; 3 when memory runs out; 4 when
 * m < 1. */
static size_t core_doubles(long m_, long n_, long na_) {
    size_t m = (size_t)m_, n = (size_t)n_, na = (size_t)na_, m1 = m + 1;
    return 3 * up64(m * n) + 8 * up64(m * m) + 2 * up64(m1 * m) + up64(m * na) + up64(m1 * na)
           + 4 * up64(m1);
}

/* A reusable 64-byte aligned scratch area: rounds() keeps one for all runs of a call instead of
 * an allocation per run (the same layout inside it: dtc_core carves it as before). */
typedef struct {
    void *mem;
    size_t doubles;
} scratch_t;

static double *scratch_take(scratch_t *s, size_t doubles) {
    if (s->doubles < doubles) {
        free(s->mem);
        s->mem = NULL;
        s->doubles = 0;
        size_t want = doubles + doubles / 2;
        if (posix_memalign(&s->mem, 64, want * sizeof(double))) return NULL;
        s->doubles = want;
    }
    return s->mem;
}

static int dtc_core(const blas_t *b, long m_, long n_, long na_, const double *rows,
                    const int64_t *idx, const int64_t *sel, const double *counts,
                    const double *sums, double lam, double kconst, double jitter,
                    double pivot_tol, double *mean, double *var, double *sum_var,
                    scratch_t *keep) {
    if (m_ < 1) return 4;
    int m = (int)m_, n = (int)n_, na = (int)na_, m1 = m + 1;
    size_t mm_ = up64((size_t)m * m), mn = up64((size_t)m * n), ma = up64((size_t)m * na);
    scratch_t own = {NULL, 0}, *ws = keep ? keep : &own;
    double *mem = scratch_take(ws, core_doubles(m_, n_, na_));
    if (!mem) return 3;
    double *kzp = mem, *et = kzp + mn, *ec = et + mn, *kzz = ec + mn, *l = kzz + mm_;
    double *p = l + mm_, *a = p + mm_, *ra = a + mm_, *ninv = ra + mm_, *g = ninv + mm_;
    double *h = g + mm_, *cat = h + mm_, *wm = cat + up64((size_t)m1 * m);
    double *kza = wm + up64((size_t)m1 * m);
    double *out = kza + ma, *v = out + up64((size_t)m1 * na), *u = v + up64((size_t)m1);
    double *w = u + up64((size_t)m1), *ones = w + up64((size_t)m1);
    int code = 0;
    /* K_ZA, K_ZP = K_ZA[:, idx] and K_ZZ = K_ZP[:, sel] (+ jitter I): gathers */
    for (int i = 0; i < m; ++i) memcpy(kza + (size_t)i * na, rows + sel[i] * na_,
                                       (size_t)na * sizeof(double));
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) kzp[(size_t)i * n + j] = kza[(size_t)i * na + idx[j]];
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < m; ++j)
            kzz[i * m + j] = jitter != 0.0 ? kzp[(size_t)i * n + sel[j]] + (i == j ? jitter : 0.0)
                                           : kzp[(size_t)i * n + sel[j]];
    /* P = L⁻¹ (column-major) unless K_ZZ is numerically singular (the torch path pivots) */
    if (cholesky(b, m, kzz, l)) { code = 1; goto done; }
    double dmin = l[0];
    for (int i = 1; i < m; ++i) dmin = fmin(dmin, l[i * m + i]);
    if (!(dmin * dmin > pivot_tol * (kconst + jitter))) { code = 1; goto done; }
    lower_inverse(b, m, l, p);
    /* Eᵀ = P K_ZP [m, n] row-major, C Eᵀ (elementwise), A = λI + (CEᵀ)(Eᵀ)ᵀ */
    mm(b, 't', 'n', m, n, m, 1.0, p, m, kzp, n, 0.0, et);
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) ec[(size_t)i * n + j] = et[(size_t)i * n + j] * counts[j];
    memset(a, 0, (size_t)m * m * sizeof(double));
    for (int i = 0; i < m; ++i) a[i * m + i] = 1.0;
    mm(b, 'n', 't', m, m, n, 1.0, ec, n, et, n, lam, a);
    /* R = chol(A) (A ⪰ λI), N = R⁻¹ (column-major), w = Nᵀ(N(Eᵀ s)) */
    cholesky(b, m, a, ra);
    lower_inverse(b, m, ra, ninv);
    mv(b, 't', m, n, et, sums, v);
    mv(b, 'n', m, m, ninv, v, u);
    mv(b, 't', m, m, ninv, u, w); /* Nᵀ is N's column-major buffer read row-major */
    /* G = I − λ NᵀN (row-major), H = chol(G) (column-major) */
    memset(g, 0, (size_t)m * m * sizeof(double));
    for (int i = 0; i < m; ++i) g[i * m + i] = 1.0;
    mm(b, 'n', 't', m, m, m, -lam, ninv, m, ninv, m, 1.0, g);
    if (cholesky(b, m, g, h)) { code = 2; goto done; }
    /* W = [Hᵀ; wᵀ] P [m+1, m]: Hᵀ row-major is H's column-major buffer */
    memcpy(cat, h, (size_t)m * m * sizeof(double));
    memcpy(cat + (size_t)m * m, w, (size_t)m * sizeof(double));
    mm(b, 'n', 't', m1, m, m, 1.0, cat, m, p, m, 0.0, wm);
    /* [g; μ̃] = W K_ZA, g∘g in place, σ̃² = k/λ·1 − (1/λ) 1ᵀ(g∘g) (eq. 4), clamped at 0 */
    mm(b, 'n', 'n', m1, na, m, 1.0, wm, m, kza, na, 0.0, out);
    for (size_t q = 0; q < (size_t)m * na; ++q) out[q] = out[q] * out[q];
    for (int i = 0; i < m; ++i) ones[i] = 1.0;
    for (int j = 0; j < na; ++j) var[j] = 1.0;
    mm(b, 'n', 'n', 1, na, m, -1.0 / lam, ones, m, out, na, kconst / lam, var);
    for (int j = 0; j < na; ++j) {
        mean[j] = out[(size_t)m * na + j];
        if (var[j] < 0.0) var[j] = 0.0;
    }
    /* S_t = Σ_j c_j σ̃²(x_j): torch.dot of the counts and the gathered variances */
    {
        double *pv = kzp; /* K_ZP is no longer needed: [n] gathered variances */
        const int one = 1;
        for (int j = 0; j < n; ++j) pv[j] = var[idx[j]];
        *sum_var = b->dot(&n, counts, &one, pv, &one);
    }
done:
    if (!keep) free(own.mem);
    return code;
}

/* The BLAS/LAPACK function pointers fns (potrf, trsm, gemm, gemv, dot) as a table. */
static blas_t blas_table(const void *const *fns) {
    blas_t bl;
    memcpy(&bl.potrf, &fns[0], sizeof(void *));
    memcpy(&bl.trsm, &fns[1], sizeof(void *));
    memcpy(&bl.gemm, &fns[2], sizeof(void *));
    memcpy(&bl.gemv, &fns[3], sizeof(void *));
    memcpy(&bl.dot, &fns[4], sizeof(void *));
    return bl;
}

int bkb_dtc_round(const void *const *fns, long m_, long n_, long na_, const double *rows,
                  const int64_t *idx, const int64_t *sel, const double *counts,
                  const double *sums, double lam, double kconst, double jitter, double pivot_tol,
                  double *mean, double *var, double *sum_var) {
    blas_t bl = blas_table(fns);
    return dtc_core(&bl, m_, n_, na_, rows, idx, sel, counts, sums, lam, kconst, jitter,
                    pivot_tol, mean, var, sum_var, NULL);
}

/* The fused choice of a round (eq. 4), optional in rounds(): the width β̃_t of every run and the
 * first argmax of μ̃ + β̃_t σ̃ with σ̃ = sqrt(σ̃²) by the vector square root that torch.sqrt calls
 * (MKL's vmdSqrt in the mode torch passes; it is not the correctly rounded sqrt, so it is called,
 * not re-implemented). β̃_t is given per run (beta_in, the constant rule) or, as BKBBeta.radius
 * computes it in double precision (Theorem 2 / App. D.1; the authors' code's rule has the same
 * form), β̃_t = (c_r + k1·sqrt(k2·max(S_t, 0) + log(1/δ)))·scale with c_r, k1, k2 and log(1/δ)
 * computed by the caller in the rule's own float arithmetic. */
typedef void (*vsqrt_fn)(int, const double *, double *, long long);
typedef struct {
    vsqrt_fn vsqrt;
    long long mode;
    const double *beta_in; /* [nr], or NULL: the formula */
    const double *c;       /* [nr] */
    double k1, k2, log_delta, scale;
    double *sd;            /* [na] scratch */
    double *beta;          /* [nr] out */
    int64_t *choice;       /* [nr] out */
} ucb_t;

/* The first index of the largest fma(sd[a], b, mean[a]) (a NaN counts as the largest): the entries
 * and the scan of bkb_ucb_argmax, i.e. torch.argmax of torch.add(mean, sd, alpha=b). */
static long ucb_first_argmax(long na, const double *mean, const double *sd, double b) {
    long best = 0;
    double top = fma(sd[0], b, mean[0]);
    for (long a = 1; a < na && !isnan(top); ++a) {
        double u = fma(sd[a], b, mean[a]);
        if (isnan(u) || u > top) {
            best = a;
            top = u;
        }
    }
    return best;
}

/* β̃_t of run r (ucb_t); Python's max(S_t, 0.0) keeps a NaN (and −0.0), as here. */
static double ucb_width(const ucb_t *u, long r, double sum_var) {
    if (u->beta_in) return u->beta_in[r];
    double s = 0.0 > sum_var ? 0.0 : sum_var;
    return (u->c[r] + u->k1 * sqrt(u->k2 * s + u->log_delta)) * u->scale;
}

/* The round of every run of a batch (the padded per-run buffers of batched BKB): run r has n_r =
 * n_distinct[r] distinct pulled points, kernel rows rows + r·rows_run ([≥ n_r, na] row-major),
 * arm rows idx + r·idx_run, dictionary mask in_dict + r·dict_run (its positions sel are the
 * set entries among the first n_r, in order), counts and sums + r·stat_run, regulariser lam[r].
 * Each run's posterior is the single-run round above (bkb_dtc_round: the same calls on the same
 * shapes, so run r's numbers are those of the sequential run); an empty dictionary gives the
 * prior, μ̃ = 0 and σ̃² = k/λ (eq. 4 with no inducing point). Writes mean, var [nr, na] (ridge
 * variances), pvar [nr, width] (σ̃² at the pulled points, var[idx_j], 0 past n_r), sum_var [nr]
 * (S_t = Σ_j c_j σ̃²(x_j), torch.dot's call) and codes [nr] (those of bkb_dtc_round, 0 for an
 * empty dictionary), and with u (not NULL) every run's β̃_t and UCB argmax (ucb_t) while its
 * row is in cache; returns the number of runs with a non-zero code (their outputs are not
 * set: the caller takes the torch path for the round). */
static long rounds(const void *const *fns, long nr, long na, long width, const double *rows,
                   long rows_run, const int64_t *idx, long idx_run, const uint8_t *in_dict,
                   long dict_run, const double *counts, const double *sums, long stat_run,
                   const int64_t *n_distinct, const double *lam, double kconst, double jitter,
                   double pivot_tol, double *mean, double *var, double *pvar, double *sum_var,
                   int32_t *codes, const ucb_t *u) {
    blas_t bl = blas_table(fns);
    long failed = 0;
    /* per-run scratch: sel, and the counts and sums copied to 64-byte aligned memory like the
     * single run's (BLAS reads them in place: dot, gemv) */
    size_t w8 = up64((size_t)(width > 0 ? width : 1));
    void *mem = NULL;
    if (posix_memalign(&mem, 64, 3 * w8 * sizeof(double))) return nr;
    int64_t *sel = mem;
    double *cr = (double *)mem + w8, *sr = cr + w8;
    scratch_t ws = {NULL, 0}; /* dtc_core's scratch, kept across the runs */
    for (long r = 0; r < nr; ++r) {
        long n = (long)n_distinct[r], m = 0;
        const int64_t *ir = idx + r * idx_run;
        const uint8_t *dr = in_dict + r * dict_run;
        memcpy(cr, counts + r * stat_run, (size_t)n * sizeof(double));
        memcpy(sr, sums + r * stat_run, (size_t)n * sizeof(double));
        double *mr = mean + r * na, *vr = var + r * na, *pr = pvar + r * width;
        for (long j = 0; j < n; ++j)
            if (dr[j]) sel[m++] = j;
        int code = 0;
        if (m) {
            code = dtc_core(&bl, m, n, na, rows + r * rows_run, ir, sel, cr, sr, lam[r], kconst,
                            jitter, pivot_tol, mr, vr, sum_var + r, &ws);
        } else { /* the prior (no inducing point), S_t by dot as the single-run torch route */
            for (long a = 0; a < na; ++a) {
                mr[a] = 0.0;
                vr[a] = kconst / lam[r];
            }
        }
        codes[r] = code;
        if (code) { ++failed; continue; }
        for (long j = 0; j < n; ++j) pr[j] = vr[ir[j]];
        for (long j = n; j < width; ++j) pr[j] = 0.0;
        if (!m) {
            const int one = 1, ni = (int)n;
            sum_var[r] = n ? bl.dot(&ni, cr, &one, pr, &one) : 0.0;
        }
        if (u) { /* the UCB's choice (eq. 4) while the run's mean and variances are in cache */
            u->vsqrt((int)na, vr, u->sd, u->mode);
            u->beta[r] = ucb_width(u, r, sum_var[r]);
            u->choice[r] = ucb_first_argmax(na, mr, u->sd, u->beta[r]);
        }
    }
    free(ws.mem);
    free(mem);
    return failed;
}

long bkb_dtc_rounds(const void *const *fns, long nr, long na, long width, const double *rows,
                    long rows_run, const int64_t *idx, long idx_run, const uint8_t *in_dict,
                    long dict_run, const double *counts, const double *sums, long stat_run,
                    const int64_t *n_distinct, const double *lam, double kconst, double jitter,
                    double pivot_tol, double *mean, double *var, double *pvar, double *sum_var,
                    int32_t *codes) {
    return rounds(fns, nr, na, width, rows, rows_run, idx, idx_run, in_dict, dict_run, counts,
                  sums, stat_run, n_distinct, lam, kconst, jitter, pivot_tol, mean, var, pvar,
                  sum_var, codes, NULL);
}

/* bkb_dtc_rounds and every run's choice (ucb_t): vsqrt and mode the vector square root of
 * torch.sqrt and its mode; beta_in [nr] the given widths or NULL for the formula with c [nr], k1,
 * k2, log_delta, scale; writes beta [nr] and choice [nr] of every run whose code is 0. */
long bkb_select_rounds(const void *const *fns, long nr, long na, long width, const double *rows,
                       long rows_run, const int64_t *idx, long idx_run, const uint8_t *in_dict,
                       long dict_run, const double *counts, const double *sums, long stat_run,
                       const int64_t *n_distinct, const double *lam, double kconst,
                       double jitter, double pivot_tol, double *mean, double *var, double *pvar,
                       double *sum_var, int32_t *codes, const void *vsqrt, long long mode,
                       const double *beta_in, const double *c, double k1, double k2,
                       double log_delta, double scale, double *beta, int64_t *choice) {
    ucb_t u;
    memcpy(&u.vsqrt, &vsqrt, sizeof(void *));
    u.mode = mode;
    u.beta_in = beta_in;
    u.c = c;
    u.k1 = k1;
    u.k2 = k2;
    u.log_delta = log_delta;
    u.scale = scale;
    u.beta = beta;
    u.choice = choice;
    if (posix_memalign((void **)&u.sd, 64, up64((size_t)(na > 0 ? na : 1)) * sizeof(double)))
        return nr;
    long failed = rounds(fns, nr, na, width, rows, rows_run, idx, idx_run, in_dict, dict_run,
                         counts, sums, stat_run, n_distinct, lam, kconst, jitter, pivot_tol, mean,
                         var, pvar, sum_var, codes, &u);
    free(u.sd);
    return failed;
}

/* Every run's UCB argmax of a batch (eq. 4): for run r, the first index of the largest
 * fma(sd[r, a], beta[r], mean[r, a]) (a NaN counts as the largest), the same entries and the same
 * scan as bkb_ucb_argmax (and as torch.argmax of torch.addcmul(mean, sd, beta[:, None])), without
 * writing the UCB. mean, sd [nr, na] row-major; writes choice [nr]. */
void bkb_ucb_argmax_rounds(long nr, long na, const double *mean, const double *sd,
                           const double *beta, int64_t *choice) {
    for (long r = 0; r < nr; ++r) choice[r] = ucb_first_argmax(na, mean + r * na, sd + r * na, beta[r]);
}

/* The count update of every run of a batch (§3.2: the posterior needs the distinct pulled points,
 * their pull counts n_j and reward sums), as BatchedCounts.record: run r played arm choice[r]
 * (its point x[r] [d] must equal cand[r, choice[r]], else nothing is changed and the number of
 * runs where it does not is returned); the point joins its first equal distinct point j < n_r
 * (every coordinate ==) or becomes distinct point n_r: counts[j] += 1, sums[j] += y[r],
 * px[slot] = x[r] and n_r += 1 when new, the cache's arm row idx[slot] = choice[r] when new.
 * Also writes slot [nr], isnew [nr] (0/1), and the variances of the dictionary draw var_out
 * [nr, w] (w = n + 1 ≥ n_r + 1): pvar[r, j] for j < n, 0 at n, and var[r, choice[r]] (the played
 * arm's σ̃² under the model that chose it) at a new slot. Buffers: px [nr, ·, d] (stride
 * px_run), counts / sums (stride stat_run), idx (stride idx_run), cand [nr, na, d], var [nr, na],
 * pvar (stride pvar_run), all with room for slot n_r. With p_out (not NULL), also the binomial
 * draw's probabilities p = min(q̄ σ̃², 1) (0 where σ̃² ≤ 0 or NaN: those draw nothing, as
 * torch.clamp(q̄ · σ̃².clamp_min(0), max=1).nan_to_num(0) gives them) at p_out + r·p_run, [w].
 * Returns 0 when every run was updated. */
long bkb_record_rounds(long nr, long na, long d, long w, const double *cand, const int64_t *choice,
                       const double *x, const double *y, const double *var, const double *pvar,
                       long pvar_run, double *px, long px_run, double *counts, double *sums,
                       long stat_run, int64_t *n_distinct, int64_t *idx, long idx_run,
                       int64_t *slot, uint8_t *isnew, double *var_out, double qbar,
                       double *p_out, long p_run) {
    long missed = 0;
    for (long r = 0; r < nr; ++r) {
        const double *c = cand + (r * na + choice[r]) * d, *xr = x + r * d;
        for (long k = 0; k < d; ++k)
            if (!(c[k] == xr[k])) {
                ++missed;
                break;
            }
    }
    if (missed) return missed;
    for (long r = 0; r < nr; ++r) {
        const double *xr = x + r * d;
        double *pr = px + r * px_run, *cr = counts + r * stat_run, *sr = sums + r * stat_run;
        long n = (long)n_distinct[r], j = 0;
        for (; j < n; ++j) {
            long k = 0;
            while (k < d && pr[j * d + k] == xr[k]) ++k;
            if (k == d) break;
        }
        const int fresh = j == n;
        if (fresh) {
            memcpy(pr + j * d, xr, (size_t)d * sizeof(double));
            idx[r * idx_run + j] = choice[r];
            n_distinct[r] = n + 1;
        }
        cr[j] += 1.0;
        sr[j] += y[r];
        slot[r] = j;
        isnew[r] = (uint8_t)fresh;
        double *vo = var_out + r * w;
        memcpy(vo, pvar + r * pvar_run, (size_t)(w - 1) * sizeof(double));
        vo[w - 1] = 0.0;
        if (fresh) vo[j] = var[r * na + choice[r]];
        if (p_out) {
            double *po = p_out + r * p_run;
            for (long q = 0; q < w; ++q) po[q] = vo[q] > 0.0 ? fmin(qbar * vo[q], 1.0) : 0.0;
        }
    }
    return 0;
}

/* The drawn dictionaries of every run (§3.1): copies [nr, w] (stride copies_run, whole numbers
 * ≥ 0) give in_dict[r, j] = copies_j > 0 for j < w and 0 for w ≤ j < cap (stride dict_run),
 * m_theory[r] = Σ_j copies_j (the multiset size; an exact sum of whole numbers) and
 * empty[r] += 1 when no point is kept. */
void bkb_set_dictionary(long nr, long w, long cap, const double *copies, long copies_run,
                        uint8_t *in_dict, long dict_run, int64_t *m_theory, int64_t *empty) {
    for (long r = 0; r < nr; ++r) {
        const double *cr = copies + r * copies_run;
        uint8_t *dr = in_dict + r * dict_run;
        double total = 0.0;
        int any = 0;
        for (long j = 0; j < w; ++j) {
            dr[j] = (uint8_t)(cr[j] > 0.0);
            any |= dr[j];
            total += cr[j];
        }
        if (cap > w) memset(dr + w, 0, (size_t)(cap - w));
        m_theory[r] = (int64_t)total;
        empty[r] += !any;
    }
}

/* ucb[a] = mean[a] + beta · sd[a] (eq. 4, the ridge sd = torch.sqrt of the variance, which the
 * caller takes: torch's vectorised sqrt is not always the correctly rounded one) in one rounding,
 * as torch.add(mean, sd, alpha=beta) (a fused multiply-add), and the first index of the largest
 * (a NaN counts as the largest, as torch.argmax). */
long bkb_ucb_argmax(long na, const double *mean, const double *sd, double beta, double *ucb) {
    long best = 0;
    for (long a = 0; a < na; ++a) ucb[a] = fma(sd[a], beta, mean[a]);
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
