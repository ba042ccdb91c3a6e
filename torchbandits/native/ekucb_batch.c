/* The CPU float64 products of one batched EK-UCB round (Zenati et al., AISTATS 2022, Algorithms 2
 * and 4, in the whitened form of their Prop. 4.2), run by run at each run's own dictionary size.
 *
 * Every run r of a batch keeps, in buffers padded to a common capacity (rows of stride `ld`, runs
 * of stride `rs`, last dimension contiguous):
 *   P_r = L_r^{-1}   (L_r the Cholesky factor of K_{Z_r Z_r} + eta I)          [m_r, m_r]
 *   Q_r = A_r^{-1}   (A_r = E_r^T C E_r + lambda I)                             [m_r, m_r]
 *   g_r = E_r^T s                                                               [m_r]
 *   N_r = (K_{Z_r Z_r} + mu diag(p))^{-1}   (KORS, Zenati et al. 2022, §4.2, eq. 41)
 * with everything beyond the run's size m_r zero. The batched torch path multiplies whole padded
 * chunks ([10, W] x [W, W] batched GEMMs, which pack the [W, W] operand for only ten rows); here
 * each run's [m_r, m_r] block is streamed once, without packing, by register tiles (4 rows x 12
 * candidates, 4-wide vectors on AVX2), and the padding is skipped.
 *
 * Rounding: every entry of a product is the plain sum of its terms in order, one fused
 * multiply-add per term — the order of a GEMM micro-kernel's accumulator, which is how most entries
 * of the batched torch product come out of the BLAS on this kind of machine (the rest, and the
 * reductions, agree to rounding). On Chessboard (cond(K_ZZ) ~ 1e12) such rounding differences
 * are amplified to ~1e-10 in the UCBs and can flip a `min_residual` refusal right at the
 * threshold, as between the batched and the sequential torch paths (docs/batch.md).
 *
 * The compacted growth of the dictionaries (ekucb_grow, ekucb_kors_grow; at the end of the file)
 * borders each growing run's P, Q, E and KORS's N in place: its sums run in another order than
 * the batched torch border's products (the same numbers to rounding, not to the bit).
 *
 * No global state; no pointer is kept between calls. Sizes are int64 (the tensors' `long`).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define EKUCB_AVX2 1
#endif

/* The products are taken in the layout "candidates along the vector": a run's columns x_a (the
 * candidates' kernel columns, then their embeddings and g) are held transposed, xt[j][a]
 * ([m, CW], CW = 12 columns, a multiple of the vector width), and
 *     out[i][a] = sum_{j<m} B[i][j] * xt[j][a]     (j in order, one FMA per term)
 * is accumulated for 4 rows i and 12 columns a at once. B's rows are streamed once per 12
 * columns, never packed or transposed. */
#define CW 12

#ifdef FP_FAST_FMA   /* the portable loop: fused where the machine fuses (the AVX2 tiles' sums) */
#define MADD(w, x, acc) fma(w, x, acc)
#else
#define MADD(w, x, acc) ((acc) + (w) * (x))
#endif

#if defined(EKUCB_AVX2) && defined(__AVX512F__)
/* AVX-512: the 12 columns as one 8-wide and one 4-wide vector (two FMAs a row and term instead of
 * three). Every lane is still its own sum over j in order, one FMA per term: the same numbers as
 * the AVX2 tiles below. */
#define MULADD2(acc0, acc1, w) \
    acc0 = _mm512_fmadd_pd(w, x0, acc0); \
    acc1 = _mm256_fmadd_pd(_mm512_castpd512_pd256(w), x1, acc1)

/* rows 0..3 of out = B xt (see the AVX2 tile4 below; the next tile's rows fetched meanwhile) */
static void tile4(const double *b, int64_t ldb, const double *xt, int64_t m, double *out,
                  const double *next, int64_t nld) {
    __m512d a00 = _mm512_setzero_pd(), a10 = a00, a20 = a00, a30 = a00;
    __m256d a01 = _mm256_setzero_pd(), a11 = a01, a21 = a01, a31 = a01;
    const double *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    for (int64_t j = 0; j < m; ++j) {
        const double *x = xt + j * CW;
        __m512d x0 = _mm512_loadu_pd(x), w;
        __m256d x1 = _mm256_loadu_pd(x + 8);
        if ((j & 7) == 0) {
            _mm_prefetch((const char *)(next + j), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + nld + j), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + 2 * nld + j), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + 3 * nld + j), _MM_HINT_T0);
        }
        w = _mm512_set1_pd(b0[j]);
        MULADD2(a00, a01, w);
        w = _mm512_set1_pd(b1[j]);
        MULADD2(a10, a11, w);
        w = _mm512_set1_pd(b2[j]);
        MULADD2(a20, a21, w);
        w = _mm512_set1_pd(b3[j]);
        MULADD2(a30, a31, w);
    }
    _mm512_storeu_pd(out, a00);
    _mm256_storeu_pd(out + 8, a01);
    _mm512_storeu_pd(out + CW, a10);
    _mm256_storeu_pd(out + CW + 8, a11);
    _mm512_storeu_pd(out + 2 * CW, a20);
    _mm256_storeu_pd(out + 2 * CW + 8, a21);
    _mm512_storeu_pd(out + 3 * CW, a30);
    _mm256_storeu_pd(out + 3 * CW + 8, a31);
}

/* one row of out = B xt */
static void tile1(const double *b, const double *xt, int64_t m, double *out) {
    __m512d a0 = _mm512_setzero_pd();
    __m256d a1 = _mm256_setzero_pd();
    for (int64_t j = 0; j < m; ++j) {
        const double *x = xt + j * CW;
        __m512d x0 = _mm512_loadu_pd(x), w = _mm512_set1_pd(b[j]);
        __m256d x1 = _mm256_loadu_pd(x + 8);
        MULADD2(a0, a1, w);
    }
    _mm512_storeu_pd(out, a0);
    _mm256_storeu_pd(out + 8, a1);
}
#elif defined(EKUCB_AVX2)
/* acc += w * x (fused multiply-add), three vectors */
#define MULADD3(acc0, acc1, acc2, w) \
    acc0 = _mm256_fmadd_pd(w, x0, acc0); \
    acc1 = _mm256_fmadd_pd(w, x1, acc1); \
    acc2 = _mm256_fmadd_pd(w, x2, acc2)

/* rows 0..3 of out = B xt (12 columns: 3 vectors; 12 accumulators in registers), the sums over
 * j < m. The four rows at `next` (row stride nld: the next tile, or the next matrix's first
 * rows) are fetched into the cache meanwhile, one line per row every 8 terms: the matrices of a
 * batch (tens of MB) do not stay in the cache from one round to the next. */
static void tile4(const double *b, int64_t ldb, const double *xt, int64_t m, double *out,
                  const double *next, int64_t nld) {
    __m256d a00 = _mm256_setzero_pd(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256d a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    const double *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    for (int64_t j = 0; j < m; ++j) {
        const double *x = xt + j * CW;
        __m256d x0 = _mm256_loadu_pd(x), x1 = _mm256_loadu_pd(x + 4);
        __m256d x2 = _mm256_loadu_pd(x + 8), w;
        if ((j & 7) == 0) {
            _mm_prefetch((const char *)(next + j), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + nld + j), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + 2 * nld + j), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + 3 * nld + j), _MM_HINT_T0);
        }
        w = _mm256_broadcast_sd(b0 + j);
        MULADD3(a00, a01, a02, w);
        w = _mm256_broadcast_sd(b1 + j);
        MULADD3(a10, a11, a12, w);
        w = _mm256_broadcast_sd(b2 + j);
        MULADD3(a20, a21, a22, w);
        w = _mm256_broadcast_sd(b3 + j);
        MULADD3(a30, a31, a32, w);
    }
    _mm256_storeu_pd(out, a00);
    _mm256_storeu_pd(out + 4, a01);
    _mm256_storeu_pd(out + 8, a02);
    _mm256_storeu_pd(out + CW, a10);
    _mm256_storeu_pd(out + CW + 4, a11);
    _mm256_storeu_pd(out + CW + 8, a12);
    _mm256_storeu_pd(out + 2 * CW, a20);
    _mm256_storeu_pd(out + 2 * CW + 4, a21);
    _mm256_storeu_pd(out + 2 * CW + 8, a22);
    _mm256_storeu_pd(out + 3 * CW, a30);
    _mm256_storeu_pd(out + 3 * CW + 4, a31);
    _mm256_storeu_pd(out + 3 * CW + 8, a32);
}

/* one row of out = B xt */
static void tile1(const double *b, const double *xt, int64_t m, double *out) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0;
    for (int64_t j = 0; j < m; ++j) {
        const double *x = xt + j * CW;
        __m256d x0 = _mm256_loadu_pd(x), x1 = _mm256_loadu_pd(x + 4);
        __m256d x2 = _mm256_loadu_pd(x + 8), w = _mm256_broadcast_sd(b + j);
        MULADD3(a0, a1, a2, w);
    }
    _mm256_storeu_pd(out, a0);
    _mm256_storeu_pd(out + 4, a1);
    _mm256_storeu_pd(out + 8, a2);
}
#endif

/* The Sherman-Morrison step of an append (Zenati et al. 2022, Algorithm 4, the update of
 * A^{-1}) on one row: row[j] -= a_i * b[j] for j < m (fused where the machine fuses, as the
 * vectorised torch `addcmul_` does). */
static inline void rank1_row(double *row, double ai, const double *b, int64_t m) {
    for (int64_t j = 0; j < m; ++j) row[j] = MADD(-ai, b[j], row[j]);
}

/* out[i][a] = sum_{j<m} B[i][j] xt[j][a] for i < nb, a < CW (row i of B at b + i*ldb; xt and
 * out [*, CW]). lower != 0: B is lower triangular (B[i][j] = 0 for j > i), so row i's sum stops
 * at j = i (rows 4k..4k+3 at j = 4k+3): the terms left out are exact zeros, which leave an
 * ordered sum unchanged — the same numbers, half the reads. */
static void b_times_xt(int64_t nb, double *b, int64_t ldb, const double *xt, int64_t m,
                       int lower, double *out, const double *after, int64_t after_ld,
                       const double *ua, const double *ub, int64_t u_w) {
    /* ua != NULL: first B <- B - ua ub^T (a deferred Sherman-Morrison step) on rows and columns
     * below min(m, u_w) (ua, ub hold u_w entries), row by row just before the row is read, so
     * that B is streamed from memory once for both */
    int64_t mu = m < u_w ? m : u_w;
#ifdef EKUCB_AVX2
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        int more = i + 8 <= nb;   /* fetch the next tile's rows, else the matrix after B's */
        if (ua)
            for (int k = 0; k < 4; ++k)
                if (i + k < mu) rank1_row(b + (i + k) * ldb, ua[i + k], ub, mu);
        tile4(b + i * ldb, ldb, xt, lower && i + 4 < m ? i + 4 : m, out + i * CW,
              more ? b + (i + 4) * ldb : after, more ? ldb : after_ld);
    }
    for (; i < nb; ++i) {
        if (ua && i < mu) rank1_row(b + i * ldb, ua[i], ub, mu);
        tile1(b + i * ldb, xt, lower && i + 1 < m ? i + 1 : m, out + i * CW);
    }
#else
    (void)after;
    (void)after_ld;
    for (int64_t i = 0; i < nb; ++i) {
        double acc[CW] = {0.0};
        if (ua && i < mu) rank1_row(b + i * ldb, ua[i], ub, mu);
        int64_t mi = lower && i + 1 < m ? i + 1 : m;
        for (int64_t j = 0; j < mi; ++j) {
            const double w = b[i * ldb + j], *x = xt + j * CW;
            for (int a = 0; a < CW; ++a) acc[a] = MADD(w, x[a], acc[a]);
        }
        for (int a = 0; a < CW; ++a) out[i * CW + a] = acc[a];
    }
#endif
}

/* sum_{j<m} x[j] y[j], in order */
static inline double dot(const double *x, const double *y, int64_t m) {
    double s = 0.0;
    for (int64_t j = 0; j < m; ++j) s += x[j] * y[j];
    return s;
}

/* The three sums of the scores of one group of candidates, from the transposed scratch (ft[i][c]
 * = e(x_c)_i, qt[i][c] = (Q e(x_c))_i, qt[i][nc] = (Q g)_i when with_w): for every column c < CW
 * at once, in order over i, each term rounded and then added (no fused multiply-add: the numbers
 * of `dot`, whose in-order reductions the compiler does not fuse either),
 *   ff[c] = sum_i ft[i][c]^2,   fq[c] = sum_i ft[i][c] qt[i][c],   fw[c] = sum_i ft[i][c] qt[i][nc].
 * The columns are independent chains (vectorised across c), where `dot` is one serial chain of
 * additions per candidate and sum. (The library is built with -std=c99, where the compiler does
 * not contract a * b + c into an FMA: only the explicit fma/_fmadd_ calls fuse.) */
static void column_sums(const double *ft, const double *qt, int64_t m, int64_t nc, int with_w,
                        double *ff, double *fq, double *fw) {
#ifdef EKUCB_AVX2
    __m256d f0, f1, f2, w;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, q0 = s0, q1 = s0, q2 = s0;
    __m256d u0 = s0, u1 = s0, u2 = s0;
    for (int64_t i = 0; i < m; ++i) {
        const double *f = ft + i * CW, *q = qt + i * CW;
        f0 = _mm256_loadu_pd(f);
        f1 = _mm256_loadu_pd(f + 4);
        f2 = _mm256_loadu_pd(f + 8);
        s0 = _mm256_add_pd(s0, _mm256_mul_pd(f0, f0));
        s1 = _mm256_add_pd(s1, _mm256_mul_pd(f1, f1));
        s2 = _mm256_add_pd(s2, _mm256_mul_pd(f2, f2));
        q0 = _mm256_add_pd(q0, _mm256_mul_pd(f0, _mm256_loadu_pd(q)));
        q1 = _mm256_add_pd(q1, _mm256_mul_pd(f1, _mm256_loadu_pd(q + 4)));
        q2 = _mm256_add_pd(q2, _mm256_mul_pd(f2, _mm256_loadu_pd(q + 8)));
        w = _mm256_set1_pd(with_w ? q[nc] : 0.0);
        u0 = _mm256_add_pd(u0, _mm256_mul_pd(f0, w));
        u1 = _mm256_add_pd(u1, _mm256_mul_pd(f1, w));
        u2 = _mm256_add_pd(u2, _mm256_mul_pd(f2, w));
    }
    _mm256_storeu_pd(ff, s0);
    _mm256_storeu_pd(ff + 4, s1);
    _mm256_storeu_pd(ff + 8, s2);
    _mm256_storeu_pd(fq, q0);
    _mm256_storeu_pd(fq + 4, q1);
    _mm256_storeu_pd(fq + 8, q2);
    _mm256_storeu_pd(fw, u0);
    _mm256_storeu_pd(fw + 4, u1);
    _mm256_storeu_pd(fw + 8, u2);
#else
    double aff[CW] = {0.0}, afq[CW] = {0.0}, afw[CW] = {0.0};
    for (int64_t i = 0; i < m; ++i) {
        const double *f = ft + i * CW, *q = qt + i * CW;
        const double w = with_w ? q[nc] : 0.0;
        for (int c = 0; c < CW; ++c) {
            double t0 = f[c] * f[c], t1 = f[c] * q[c], t2 = f[c] * w;
            aff[c] += t0;
            afq[c] += t1;
            afw[c] += t2;
        }
    }
    for (int c = 0; c < CW; ++c) {
        ff[c] = aff[c];
        fq[c] = afq[c];
        fw[c] = afw[c];
    }
#endif
}

/* var of one candidate from its sums, as before them: ((k - ff)_+ + lam fq)_+ */
static void finish(double kd, double lam, double ff, double fq, double *var) {
    double v = kd - ff;
    v = v > 0.0 ? v : 0.0;
    double t = lam * fq;
    v += t;
    *var = v > 0.0 ? v : 0.0;
}

/* The scores of a batched EK-UCB round (Zenati et al. 2022, Prop. 4.2; the UCB of Algorithm 2),
 * for R runs of A candidates with kernel columns kz [R, A, W] (contiguous; W >= every m_r):
 *   f  = e(x) = P_r k_Z(x)       f[r, a, i]  = sum_{j<m_r} P_r[i, j] kz[r, a, j]
 *   qf = Q_r e(x)                qf[r, a, i] = sum_{j<m_r} Q_r[i, j] f[r, a, j]     (a < A)
 *   w  = Q_r g_r                 qf[r, A, i] = sum_{j<m_r} Q_r[i, j] g_r[j]        (row A)
 *   mean[r, a] = e(x)^T Q_r g_r  = sum_{i<m_r} f[r, a, i] w[i]
 *   var[r, a]  = ((k(x,x) - |e(x)|^2)_+ + lambda e(x)^T Q_r e(x))_+
 * (the GP-scale variance lambda sigma~^2 before the clamp at k(x, x), which the caller applies).
 * f [R, A, W] and qf [R, A + 1, W] are contiguous and written whole: zero for i >= m_r. The
 * candidates go CW - 1 = 11 at a time (g rides in the last column of the second product of the
 * last group). A >= 1; work: scratch of 3 * W * CW doubles (CW = 12). p_lower != 0: every P_r
 * is lower triangular (L^{-1} as the borders of Algorithm 4 grow it), and its product skips the
 * zeros above the diagonal. pending != NULL: the runs with pending[r] != 0 first take the
 * Sherman-Morrison step of their last append, Q_r <- Q_r - ua_r ub_r^T (ua, ub [R, u_w], run
 * stride u_rs, u_w >= m_r for a flagged run; the numbers of ekucb_rank1_sub), fused into the
 * pass over Q_r (Q is written). */
void ekucb_score(int64_t R, int64_t A, int64_t W, const int64_t *sizes, const double *kz,
                 const double *P, int64_t p_rs, int64_t p_ld, int64_t p_lower,
                 double *Q, int64_t q_rs, int64_t q_ld,
                 const double *g, int64_t g_rs, const double *kdiag, double lam,
                 double *f, double *qf, double *mean, double *var, double *work,
                 const int64_t *pending, const double *ua, const double *ub, int64_t u_rs,
                 int64_t u_w) {
    double *xt = work, *ft = work + W * CW, *qt = work + 2 * W * CW;
    double ff[CW], fq[CW], fw[CW];
    for (int64_t r = 0; r < R; ++r) {
        int64_t m = sizes[r] < W ? sizes[r] : W;
        const double *kzr = kz + r * A * W;
        double *fr = f + r * A * W, *qfr = qf + r * (A + 1) * W, *wr = qfr + A * W;
        const double *pr = P + r * p_rs, *gr = g + r * g_rs;
        double *qr = Q + r * q_rs;
        const double *upa = pending && pending[r] ? ua + r * u_rs : NULL;  /* once per run */
        const double *nextp = r + 1 < R ? pr + p_rs : pr;   /* fetched during Q's last tile */
        for (int64_t a = 0; a <= A; ++a) {          /* the padding: f = qf = 0 beyond m_r */
            for (int64_t i = m; i < W; ++i) {
                if (a < A) fr[a * W + i] = 0.0;
                qfr[a * W + i] = 0.0;
            }
        }
        if (m <= 0) {
            for (int64_t a = 0; a < A; ++a) {
                mean[r * A + a] = 0.0;
                var[r * A + a] = kdiag[r * A + a];
            }
            continue;
        }
        /* groups of up to CW - 1 candidates; the last group also carries g (column nc) */
        int64_t pend_lo = -1, pend_hi = 0;    /* the candidates whose means wait for Q g */
        for (int64_t a0 = 0; a0 < A; ) {
            int64_t nc = A - a0 < CW - 1 ? A - a0 : CW - 1;
            int last = a0 + nc == A;
            for (int64_t j = 0; j < m; ++j) {       /* xt = kz^T of the group, zero-padded */
                double *x = xt + j * CW;
                for (int64_t c = 0; c < CW; ++c) x[c] = c < nc ? kzr[(a0 + c) * W + j] : 0.0;
            }
            /* ft = P kz^T: the embeddings e(x) (P is only read: no update is passed) */
            b_times_xt(m, (double *)pr, p_ld, xt, m, p_lower, ft, qr, q_ld, NULL, NULL, 0);
            for (int64_t i = 0; i < m; ++i) ft[i * CW + nc] = last ? gr[i] : 0.0;
            b_times_xt(m, qr, q_ld, ft, m, 0, qt, nextp, p_ld, upa, upa ? ub + r * u_rs : NULL,
                       u_w);
            upa = NULL;                                  /* qt = Q [e(x), g]; Q updated once */
            for (int64_t c = 0; c < nc; ++c) {      /* back to rows [a, i] */
                double *fa = fr + (a0 + c) * W, *qa = qfr + (a0 + c) * W;
                for (int64_t i = 0; i < m; ++i) {
                    fa[i] = ft[i * CW + c];
                    qa[i] = qt[i * CW + c];
                }
            }
            if (last)
                for (int64_t i = 0; i < m; ++i) wr[i] = qt[i * CW + nc];
            column_sums(ft, qt, m, nc, last, ff, fq, fw);
            for (int64_t c = 0; c < nc; ++c) {
                finish(kdiag[r * A + a0 + c], lam, ff[c], fq[c], var + r * A + a0 + c);
                if (last) mean[r * A + a0 + c] = fw[c];
            }
            if (!last)   /* Q g comes with the last group: these means are taken then */
                pend_lo = pend_lo < 0 ? a0 : pend_lo, pend_hi = a0 + nc;
            a0 += nc;
        }
        for (int64_t a = pend_lo < 0 ? 0 : pend_lo; a < pend_hi; ++a)
            mean[r * A + a] = dot(fr + a * W, wr, m);
    }
}

/* fetch the n doubles at p into the cache (one prefetch per 64-byte line; a no-op without
 * AVX2): the next row of a matrix while the current one is read */
static inline void fetch_row(const double *p, int64_t n) {
#ifdef EKUCB_AVX2
    for (int64_t j = 0; j < n; j += 8) _mm_prefetch((const char *)(p + j), _MM_HINT_T0);
#else
    (void)p;
    (void)n;
#endif
}

/* sum_{j<n} x[j] y[j] in four interleaved partial sums (lane l takes j = l mod 4), added
 * pairwise, then the last n mod 4 terms in order */
static inline double dot4(const double *x, const double *y, int64_t n) {
    int64_t n4 = n - (n & 3), j = 0;
    double s;
#ifdef EKUCB_AVX2
    __m256d acc = _mm256_setzero_pd();
    for (; j < n4; j += 4)
        acc = _mm256_fmadd_pd(_mm256_loadu_pd(x + j), _mm256_loadu_pd(y + j), acc);
    __m128d lo = _mm256_castpd256_pd128(acc), hi = _mm256_extractf128_pd(acc, 1);
    lo = _mm_add_pd(lo, hi);                                   /* (l0 + l2, l1 + l3) */
    s = _mm_cvtsd_f64(_mm_add_sd(lo, _mm_unpackhi_pd(lo, lo)));
#else
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (; j < n4; j += 4) {
        s0 = MADD(x[j], y[j], s0);
        s1 = MADD(x[j + 1], y[j + 1], s1);
        s2 = MADD(x[j + 2], y[j + 2], s2);
        s3 = MADD(x[j + 3], y[j + 3], s3);
    }
    s = (s0 + s2) + (s1 + s3);
#endif
    for (; j < n; ++j) s += x[j] * y[j];
    return s;
}

/* The KORS quadratic forms (Zenati et al. 2022, eq. 41 in closed form): u_r = k_r^T N_r k_r over
 * the run's m_r anchors (at most W), k [R, >= W] (run stride k_rs), N_r at N + r*n_rs (row
 * stride n_ld). N_r = (K_ZZ + mu diag(p))^{-1} is symmetric, so only its lower triangle is read
 * (half the memory traffic of a round's largest read after the score's):
 *   u = sum_i k_i (N_ii k_i + 2 sum_{j<i} N_ij k_j)
 * (the torch path reads the whole matrix; N's two triangles agree to rounding). */
void ekucb_quad(int64_t R, int64_t W, const int64_t *sizes, const double *k, int64_t k_rs,
                const double *N, int64_t n_rs, int64_t n_ld, double *u) {
    for (int64_t r = 0; r < R; ++r) {
        int64_t m = sizes[r] < W ? sizes[r] : W;
        const double *kr = k + r * k_rs, *nr = N + r * n_rs;
        double s = 0.0;
        int64_t i = 0;
#ifdef EKUCB_AVX2
        /* rows 4k..4k+3 together: their dot4 share the vector part (j < 4k), so four independent
         * FMA chains run at once; each row's sum is still dot4's, and s is added in row order */
        for (; i + 4 <= m; i += 4) {
            const double *r0 = nr + i * n_ld, *r1 = r0 + n_ld, *r2 = r1 + n_ld, *r3 = r2 + n_ld;
            const double *nx = i + 8 <= m ? r0 + 4 * n_ld : N + (r + 1 < R ? r + 1 : r) * n_rs;
            fetch_row(nx, i + 8);
            fetch_row(nx + n_ld, i + 8);
            fetch_row(nx + 2 * n_ld, i + 8);
            fetch_row(nx + 3 * n_ld, i + 8);
            __m256d c0 = _mm256_setzero_pd(), c1 = c0, c2 = c0, c3 = c0;
            for (int64_t j = 0; j < i; j += 4) {
                __m256d x = _mm256_loadu_pd(kr + j);
                c0 = _mm256_fmadd_pd(_mm256_loadu_pd(r0 + j), x, c0);
                c1 = _mm256_fmadd_pd(_mm256_loadu_pd(r1 + j), x, c1);
                c2 = _mm256_fmadd_pd(_mm256_loadu_pd(r2 + j), x, c2);
                c3 = _mm256_fmadd_pd(_mm256_loadu_pd(r3 + j), x, c3);
            }
            __m256d cs[4] = {c0, c1, c2, c3};
            for (int k = 0; k < 4; ++k) {
                const double *row = r0 + k * n_ld;
                __m128d lo = _mm256_castpd256_pd128(cs[k]), hi = _mm256_extractf128_pd(cs[k], 1);
                lo = _mm_add_pd(lo, hi);
                double d = _mm_cvtsd_f64(_mm_add_sd(lo, _mm_unpackhi_pd(lo, lo)));
                for (int64_t j = i; j < i + k; ++j) d += row[j] * kr[j];   /* dot4's tail */
                s += kr[i + k] * (row[i + k] * kr[i + k] + 2.0 * d);
            }
        }
#endif
        for (; i < m; ++i) {
            const double *row = nr + i * n_ld;
            fetch_row(i + 1 < m ? row + n_ld : N + (r + 1 < R ? r + 1 : r) * n_rs, i + 2);
            s += kr[i] * (row[i] * kr[i] + 2.0 * dot4(row, kr, i));
        }
        u[r] = s;
    }
}

/* The Sherman-Morrison step of an append (Zenati et al. 2022, Algorithm 4, the update of
 * A_r^{-1}): Q_r[i, j] -= a_r[i] * b_r[j] for i, j < m_r (at most W), a and b [*, >= W] (run
 * strides a_rs, b_rs), Q_r at Q + r*q_rs (row stride q_ld) (rank1_row), for the runs r < R,
 * or, runs != NULL, for the R runs runs[0..R-1] (indices into sizes, Q, a and b). */
void ekucb_rank1_sub(int64_t R, int64_t W, const int64_t *sizes, double *Q, int64_t q_rs,
                     int64_t q_ld, const double *a, int64_t a_rs, const double *b, int64_t b_rs,
                     const int64_t *runs) {
    for (int64_t k = 0; k < R; ++k) {
        int64_t r = runs ? runs[k] : k, m = sizes[r] < W ? sizes[r] : W;
        const double *ar = a + r * a_rs, *br = b + r * b_rs;
        double *qr = Q + r * q_rs;
        for (int64_t i = 0; i < m; ++i) {
            double *row = qr + i * q_ld;
            fetch_row(i + 1 < m ? row + q_ld : qr, m);
            rank1_row(row, ar[i], br, m);
        }
    }
}

/* sum_{k<d} (x[k] - z[k])^2 in order, unfused (0 + t0^2 = t0^2 exactly); d = 2 unrolled (a loop
 * of a run-time length two costs more than its two terms) */
static inline double sq_dist(const double *x, const double *z, int64_t d) {
    if (d == 2) {
        double t0 = x[0] - z[0], t1 = x[1] - z[1];
        return t0 * t0 + t1 * t1;
    }
    double s = 0.0;
    for (int64_t k = 0; k < d; ++k) {
        double t = x[k] - z[k];
        s += t * t;
    }
    return s;
}

#ifdef EKUCB_AVX2
/* sq_dist of x and four points z_j..z_{j+3} (row stride ld; zero beyond `lanes`), the same
 * operations lane by lane (unfused: ISO C does not contract these intrinsics into FMAs) */
static inline __m256d sq_dist4(const double *x, const double *z, int64_t ld, int64_t d,
                               int lanes) {
    if (d == 2 && ld == 2 && lanes == 4) {         /* four points [x y] in two loads */
        __m256d p01 = _mm256_loadu_pd(z), p23 = _mm256_loadu_pd(z + 4);
        __m256d zx = _mm256_unpacklo_pd(p01, p23), zy = _mm256_unpackhi_pd(p01, p23);
        __m256d t0 = _mm256_sub_pd(_mm256_set1_pd(x[0]), zx);      /* lanes (0, 2, 1, 3) */
        __m256d t1 = _mm256_sub_pd(_mm256_set1_pd(x[1]), zy);
        __m256d s = _mm256_add_pd(_mm256_mul_pd(t0, t0), _mm256_mul_pd(t1, t1));
        return _mm256_permute4x64_pd(s, 0xD8);                         /* back in order */
    }
    __m256d s = _mm256_setzero_pd();
    for (int64_t k = 0; k < d; ++k) {
        double zk[4] = {0.0, 0.0, 0.0, 0.0};
        for (int l = 0; l < lanes; ++l) zk[l] = z[l * ld + k];
        __m256d t = _mm256_sub_pd(_mm256_set1_pd(x[k]), _mm256_loadu_pd(zk));
        s = _mm256_add_pd(s, _mm256_mul_pd(t, t));
    }
    return s;
}

/* exp(x) of four lanes with x >= EXP_MIN (the caller takes libm's exp below): x = n ln2 + t,
 * n = round(x / ln2), t = (x - n ln2_hi) - n ln2_lo (ln2_hi has 21 trailing zero bits: n ln2_hi is
 * exact), |t| <= ln2/2; e^t by its Taylor polynomial to t^13 (remainder < 5e-18, Horner with
 * FMA), times 2^n built in the exponent bits. Within about one
 * ulp of exp — not bit for bit torch's exp, nor libm's. */
#define EXP_MIN (-708.0)
/* the Taylor coefficients 1/k! of exp4 and exp8_all */
static const double EXP_INV_FACT[14] = {
    1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320,
    1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800.0};
static inline __m256d exp4(__m256d x) {
    const __m256d log2e = _mm256_set1_pd(1.4426950408889634074);
    __m256d n = _mm256_round_pd(_mm256_mul_pd(x, log2e),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d t = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), x);
    t = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), t);
    __m256d p = _mm256_set1_pd(EXP_INV_FACT[13]);   /* Horner (Estrin's shorter chain lost an ulp) */
    for (int k = 12; k >= 0; --k) p = _mm256_fmadd_pd(p, t, _mm256_set1_pd(EXP_INV_FACT[k]));
    __m256i e = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n));          /* n as int64 */
    e = _mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(e));                   /* e^t 2^n */
}
#endif

#ifdef EKUCB_AVX2
/* r[l] <- libm's exp(x[l]) for the lanes l < lanes with x[l] < EXP_MIN (rare: the vector
 * exponentials of four and eight lanes call it when one of their lanes is that low) */
static void exp_low_lanes(const double *x, double *r, int lanes) {
    for (int l = 0; l < lanes; ++l)
        if (x[l] < EXP_MIN) r[l] = exp(x[l]);
}

/* exp4 of four lanes, those below EXP_MIN (rare) by libm's exp */
static inline __m256d exp4_all(__m256d e) {
    const __m256d lo = _mm256_set1_pd(EXP_MIN);
    __m256d r = exp4(_mm256_max_pd(e, lo));
    if (_mm256_movemask_pd(_mm256_cmp_pd(e, lo, _CMP_LT_OQ))) {
        double ev[4], rv[4];
        _mm256_storeu_pd(ev, e);
        _mm256_storeu_pd(rv, r);
        exp_low_lanes(ev, rv, 4);
        r = _mm256_loadu_pd(rv);
    }
    return r;
}

/* v[j] <- exp(v[j]) for j < n in place: four at a time in a loop of independent iterations (the
 * polynomial's chain of FMAs overlaps across them), the last n mod 4 in a zero-padded vector
 * (the same function for every entry) */
static void exp_row(double *v, int64_t n) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) _mm256_storeu_pd(v + j, exp4_all(_mm256_loadu_pd(v + j)));
    if (j < n) {
        double t[4] = {0.0, 0.0, 0.0, 0.0};
        for (int64_t l = j; l < n; ++l) t[l - j] = v[l];
        _mm256_storeu_pd(t, exp4_all(_mm256_loadu_pd(t)));
        for (int64_t l = j; l < n; ++l) v[l] = t[l - j];
    }
}
#endif

#if defined(EKUCB_AVX2) && defined(__AVX512F__)
#define EKUCB_AVX512 1
/* sq_dist of x and eight points z_j..z_{j+7} (row stride ld, all eight present): the operations
 * of sq_dist4 lane by lane (unfused), so the same numbers; d = 2 with ld = 2 deinterleaved by two
 * permutes */
static inline __m512d sq_dist8(const double *x, const double *z, int64_t ld, int64_t d) {
    if (d == 2 && ld == 2) {
        const __m512i even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
        const __m512i odd = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
        __m512d p0 = _mm512_loadu_pd(z), p1 = _mm512_loadu_pd(z + 8);
        __m512d t0 = _mm512_sub_pd(_mm512_set1_pd(x[0]), _mm512_permutex2var_pd(p0, even, p1));
        __m512d t1 = _mm512_sub_pd(_mm512_set1_pd(x[1]), _mm512_permutex2var_pd(p0, odd, p1));
        return _mm512_add_pd(_mm512_mul_pd(t0, t0), _mm512_mul_pd(t1, t1));
    }
    const __m512i rows = _mm512_set_epi64(7 * ld, 6 * ld, 5 * ld, 4 * ld, 3 * ld, 2 * ld, ld, 0);
    __m512d s = _mm512_setzero_pd();
    for (int64_t k = 0; k < d; ++k) {
        __m512d t = _mm512_sub_pd(_mm512_set1_pd(x[k]), _mm512_i64gather_pd(rows, z + k, 8));
        s = _mm512_add_pd(s, _mm512_mul_pd(t, t));
    }
    return s;
}

/* exp4 on eight lanes (the same operations lane by lane: the same numbers), those below EXP_MIN
 * by libm's exp */
static inline __m512d exp8_all(__m512d x) {
    const __m512d lo = _mm512_set1_pd(EXP_MIN);
    __m512d xc = _mm512_max_pd(x, lo);
    __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(xc, _mm512_set1_pd(1.4426950408889634074)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d t = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), xc);
    t = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), t);
    __m512d p = _mm512_set1_pd(EXP_INV_FACT[13]);
    for (int k = 12; k >= 0; --k) p = _mm512_fmadd_pd(p, t, _mm512_set1_pd(EXP_INV_FACT[k]));
    __m512i e = _mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(n));
    e = _mm512_slli_epi64(_mm512_add_epi64(e, _mm512_set1_epi64(1023)), 52);
    __m512d r = _mm512_mul_pd(p, _mm512_castsi512_pd(e));
    if (_mm512_cmp_pd_mask(x, lo, _CMP_LT_OQ)) {
        double xv[8], rv[8];
        _mm512_storeu_pd(xv, x);
        _mm512_storeu_pd(rv, r);
        exp_low_lanes(xv, rv, 8);
        r = _mm512_loadu_pd(rv);
    }
    return r;
}
#endif

/* The exponent of the RBF kernel block, k(x, z) = exp(c |x - z|^2) with c = -1/(2 l^2)
 * (Zenati et al. 2022, §5: the Gaussian kernel of the agents), for R runs:
 *     out[r, i, j] = c * (sqrt(sum_{k<d} (a[r, i, k] - b[r, j, k])^2))^2
 * with the rounding of torch's `cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")`
 * followed by `square_()` and `mul_(c)` (the torch path of the batched model): the squares summed
 * in order over the coordinates, unfused (ISO C: no contraction into an FMA), the square root
 * correctly rounded (four at a time with AVX2), then squared — bit for bit the same numbers
 * (tested; the caller passes d <= 2 only, where this is the order of torch's distance loop).
 * exp_block != 0: the block itself, exp of that (exp4: within about an ulp of torch's `exp_`,
 * not bit for bit; lanes below EXP_MIN and the scalar tail by libm's exp). a [R, na, d] at
 * a + r*a_rs + i*a_ld, b [R, nb, d] at b + r*b_rs + j*b_ld (coordinates contiguous), out
 * [R, na, nb] contiguous. */
static void rbf(int64_t R, int64_t na, int64_t nb, int64_t d, const double *a, int64_t a_rs,
                int64_t a_ld, const double *b, int64_t b_rs, int64_t b_ld, double c, double *out,
                int exp_block) {
    for (int64_t r = 0; r < R; ++r) {
        const double *ar = a + r * a_rs, *br = b + r * b_rs;
        double *o = out + r * na * nb;
        for (int64_t i = 0; i < na; ++i) {
            const double *x = ar + i * a_ld;
            double *oi = o + i * nb;
            int64_t j = 0;
#ifdef EKUCB_AVX512
            const __m512d cv8 = _mm512_set1_pd(c);
            for (; j + 8 <= nb; j += 8) {   /* eight at a time, the exponential in registers */
                __m512d dist = _mm512_sqrt_pd(sq_dist8(x, br + j * b_ld, b_ld, d));
                __m512d e = _mm512_mul_pd(_mm512_mul_pd(dist, dist), cv8);
                _mm512_storeu_pd(oi + j, exp_block ? exp8_all(e) : e);
            }
            const int64_t j8 = j;            /* the rest (fewer than 8) as below */
#elif defined(EKUCB_AVX2)
            const int64_t j8 = 0;
#endif
#ifdef EKUCB_AVX2
            const __m256d cv = _mm256_set1_pd(c);
            for (; j < nb; j += 4) {                 /* the exponents of the row, 4 at a time */
                int lanes = nb - j < 4 ? (int)(nb - j) : 4;
                __m256d dist = _mm256_sqrt_pd(sq_dist4(x, br + j * b_ld, b_ld, d, lanes));
                __m256d e = _mm256_mul_pd(_mm256_mul_pd(dist, dist), cv);
                if (lanes == 4) {
                    _mm256_storeu_pd(oi + j, e);
                } else {
                    double v[4];
                    _mm256_storeu_pd(v, e);
                    for (int l = 0; l < lanes; ++l) oi[j + l] = v[l];
                }
            }
            if (exp_block) exp_row(oi + j8, nb - j8);   /* then their exponentials, a second pass */
            continue;
#endif
            for (; j < nb; ++j) {
                double dist = sqrt(sq_dist(x, br + j * b_ld, d));
                oi[j] = exp_block ? exp((dist * dist) * c) : (dist * dist) * c;
            }
        }
    }
}

/* the exponent c |a_i - b_j|^2 of the RBF block (rbf) */
void ekucb_rbf_exponent(int64_t R, int64_t na, int64_t nb, int64_t d, const double *a,
                        int64_t a_rs, int64_t a_ld, const double *b, int64_t b_rs, int64_t b_ld,
                        double c, double *out) {
    rbf(R, na, nb, d, a, a_rs, a_ld, b, b_rs, b_ld, c, out, 0);
}

/* the RBF block exp(c |a_i - b_j|^2) (rbf), for the compiled score */
void ekucb_rbf_block(int64_t R, int64_t na, int64_t nb, int64_t d, const double *a, int64_t a_rs,
                     int64_t a_ld, const double *b, int64_t b_rs, int64_t b_ld, double c,
                     double *out) {
    rbf(R, na, nb, d, a, a_rs, a_ld, b, b_rs, b_ld, c, out, 1);
}

/* ---------------------------------------------------------------------------------------------
 * The compacted growth of the dictionaries (Zenati et al. 2022, Algorithms 2 and 4 for the
 * posterior, Algorithm 5 / §4.2 for KORS), run by run in place: no gather of a run's blocks.
 * --------------------------------------------------------------------------------------------- */

/* x[j] += a * y[j] for j < m, one fused multiply-add per entry (each x[j] its own sum) */
static inline void axpy(double *x, double a, const double *y, int64_t m) {
    int64_t j = 0;
#ifdef EKUCB_AVX2
    const __m256d av = _mm256_set1_pd(a);
    for (; j + 4 <= m; j += 4)
        _mm256_storeu_pd(x + j, _mm256_fmadd_pd(av, _mm256_loadu_pd(y + j),
                                                _mm256_loadu_pd(x + j)));
#endif
    for (; j < m; ++j) x[j] = MADD(a, y[j], x[j]);
}

/* M[i][j] += u_i v_j for i, j <= m (row stride ld): a bordered inverse's rank-one update,
 * u = [N k; -1], v = u / s (the update, the border and the corner at once) */
static void border_update(double *M, int64_t ld, const double *u, const double *v, int64_t m) {
    for (int64_t i = 0; i <= m; ++i) axpy(M + i * ld, u[i], v, m + 1);
}

/* u[i] = sum_{j<m} M[i][j] x[j] (dot4) for i < m, u[m] = -1; returns sum_{i<m} x[i] u[i] in
 * order: the bordered vector [M x; -1] and the quadratic form x^T M x */
static double bordered_vector(const double *M, int64_t ld, const double *x, int64_t m, double *u) {
    double quad = 0.0;
    for (int64_t i = 0; i < m; ++i) {
        u[i] = dot4(M + i * ld, x, m);
        quad += x[i] * u[i];
    }
    u[m] = -1.0;
    return quad;
}

/* The posterior's growth of the K distinct runs runs[k] (Zenati et al. 2022, Algorithm 4: the
 * last appended point z = x_{n-1} of run r joins its dictionary where accept[k] holds).
 * 0. The guard: run k grows iff accept[k] and omega[k] > min_res * k(z,z) (kzz[k], or kzz_c if
 *    kzz == NULL); ok[k] says so, refused[r] += accept[k] && !ok[k].
 * 1. For every run that grows, with m = m_r (at most W), f = e(z) = f[k, :m], d = sqrt(omega[k])
 *    and the kernel row k_S(z) [n] (krow[k] if krow != NULL, else the RBF exp(c |x_i - z|^2) of
 *    rbf): first a pending Sherman-Morrison step of Q (pflags != NULL and pflags[r] != 0: Q <-
 *    Q - pa_r pb_r^T on [:m, :m], the numbers of ekucb_rank1_sub; then pflags[r] = 0 and pa_r = 0,
 *    a zero step for a later pass over every run), then
 *      e_i   = (k_S(z)_i - E_i f) / d       (E_i row i of E_r; dot4)              i < n
 *      b     = E^T C e                       (b += C_i e_i E_i, rows in order)
 *      eCe   = sum_i e_i C_i e_i,  es = sum_i e_i s_i         (in order over i)
 *      u     = [Q b; -1]  (dot4 rows),  s = (eCe + lam) - b^T Q b                 (the Schur)
 *      row   = -(P^T f) / d               (P's rows in order, the zeros above a lower P skipped)
 *    E's new column e_i is written in the same pass over E_r as E f and E^T C e (each row read
 *    once, while it is in L1).
 * 2. Then, if no s is <= 0 (or !strict), for every run that grows:
 *      Q <- Q + u u^T / s on [:m+1, :m+1];  P[m] = [row, 1/d];  g[m] = es;  z[m] = x_{n-1};
 *      logdet += log s;  m_r <- m + 1.
 *    Otherwise (strict) nothing more is changed (the columns of E written are zeroed back: they
 *    were the zero padding; the guard's counts and the pending steps stay, as on the torch path).
 * bad[r] = 1 where s is not > 0 (NaN included); C == NULL: unit counts; grown[0] = the number of
 * runs that grew. Returns the number of bad runs, or -1 (nothing done) if some m_r > W or > u_w
 * with a pending step. Work: n + W + 1 + K (2W + 3) doubles (the last K: the Schur complements).
 * (Exported as ekucb_grow with its arguments packed, below.) */
static int64_t grow(int64_t K, const int64_t *runs, int64_t W, int64_t n, int64_t d,
                   const uint8_t *accept, const double *kzz, double kzz_c, double min_res,
                   int64_t *refused, uint8_t *ok,
                   const double *X, int64_t x_rs, int64_t x_ld,
                   const double *krow, int64_t k_rs, double c,
                   double *E, int64_t e_rs, int64_t e_ld,
                   double *P, int64_t p_rs, int64_t p_ld, int64_t p_lower,
                   double *Q, int64_t q_rs, int64_t q_ld,
                   int64_t *pflags, double *pa, const double *pb, int64_t pu_rs, int64_t u_w,
                   double *g, int64_t g_rs, const double *S, int64_t s_rs,
                   const double *C, int64_t c_rs,
                   double *Z, int64_t z_rs, int64_t z_ld,
                   double *logdet, int64_t *sizes,
                   const double *f, int64_t f_rs, const double *omega, double lam,
                   int64_t strict, double *work, uint8_t *bad, int64_t *grown) {
    double *schur = work + n + W + 1 + K * (2 * W + 2);
    for (int64_t k = 0; k < K; ++k) {
        int64_t m = sizes[runs[k]];
        if (m > W || m < 0 || (pflags && pflags[runs[k]] && m > u_w)) return -1;
    }
    double *ks = work, *b = work + n, *U = b + W + 1, *rows = U + K * (W + 1), *G = rows + K * W;
    int64_t nbad = 0, ngrow = 0;
    for (int64_t k = 0; k < K; ++k) {                      /* 0. the guard */
        ok[k] = accept[k] && omega[k] > min_res * (kzz ? kzz[k] : kzz_c);
        refused[runs[k]] += accept[k] && !ok[k];
        ngrow += ok[k];
    }
    grown[0] = ngrow;
    for (int64_t k = 0; k < K; ++k) {                      /* 1. the border's terms, E's column */
        if (!ok[k]) continue;
        const int64_t r = runs[k], m = sizes[r];
        const double dd = sqrt(omega[k]), *fk = f + k * f_rs, *Sr = S + r * s_rs;
        const double *Cr = C ? C + r * c_rs : NULL, *Pr = P + r * p_rs;
        const double *kr = ks;
        double *Er = E + r * e_rs, *Qr = Q + r * q_rs, *u = U + k * (W + 1), *row = rows + k * W;
        if (pflags && pflags[r]) {                         /* the deferred step of Q first */
            double *ar = pa + r * pu_rs;
            const double *br = pb + r * pu_rs;
            for (int64_t i = 0; i < m; ++i) rank1_row(Qr + i * q_ld, ar[i], br, m);
            for (int64_t i = 0; i < u_w; ++i) ar[i] = 0.0;
            pflags[r] = 0;
        }
        if (krow)
            kr = krow + k * k_rs;
        else
            rbf(1, 1, n, d, X + r * x_rs + (n - 1) * x_ld, 0, d, X + r * x_rs, 0, x_ld, c, ks, 1);
        for (int64_t j = 0; j < m; ++j) b[j] = 0.0;
        double ece = 0.0, es = 0.0;
        for (int64_t i = 0; i < n; ++i) {                  /* one pass over E_r */
            double *ei = Er + i * e_ld;
            fetch_row(i + 8 < n ? ei + 8 * e_ld : ei, m + 1);
            double e = (kr[i] - dot4(ei, fk, m)) / dd, ce = Cr ? Cr[i] * e : e;
            axpy(b, ce, ei, m);
            ei[m] = e;
            ece += e * ce;
            es += e * Sr[i];
        }
        for (int64_t j = 0; j < m; ++j) row[j] = 0.0;      /* P^T f, P's rows in order */
        for (int64_t i = 0; i < m; ++i)
            axpy(row, fk[i], Pr + i * p_ld, p_lower && i + 1 < m ? i + 1 : m);
        for (int64_t j = 0; j < m; ++j) row[j] = -row[j] / dd;
        double s = (ece + lam) - bordered_vector(Qr, q_ld, b, m, u);
        schur[k] = s;
        G[k] = es;
        if (!(s > 0.0)) {
            bad[r] = 1;
            ++nbad;
        }
    }
    if (strict && nbad) {                                   /* nothing changes: E back to 0 */
        for (int64_t k = 0; k < K; ++k) {
            if (!ok[k]) continue;
            double *Er = E + runs[k] * e_rs;
            for (int64_t i = 0; i < n; ++i) Er[i * e_ld + sizes[runs[k]]] = 0.0;
        }
        return nbad;
    }
    for (int64_t k = 0; k < K; ++k) {                      /* 2. the writes */
        if (!ok[k]) continue;
        const int64_t r = runs[k], m = sizes[r];
        const double s = schur[k], inv = 1.0 / s, *u = U + k * (W + 1), *row = rows + k * W;
        double *Pm = P + r * p_rs + m * p_ld, *zr = Z + r * z_rs + m * z_ld;
        const double *xl = X + r * x_rs + (n - 1) * x_ld;
        for (int64_t j = 0; j <= m; ++j) b[j] = u[j] * inv;
        border_update(Q + r * q_rs, q_ld, u, b, m);
        for (int64_t j = 0; j < m; ++j) Pm[j] = row[j];
        Pm[m] = 1.0 / sqrt(omega[k]);
        g[r * g_rs + m] = G[k];
        for (int64_t j = 0; j < d; ++j) zr[j] = xl[j];
        logdet[r] += log(s);
        sizes[r] = m + 1;
    }
    return nbad;
}

/* The arguments of a packed call: iv[i] as a pointer / an integer */
#define PTR(T, i) ((T *)(intptr_t)iv[i])

/* grow with its arguments packed (one ctypes argument each instead of fifty: a ctypes call
 * converts each argument, ~0.25 us apiece). iv, in this order:
 *   0 K, 1 runs, 2 W, 3 n, 4 d, 5 accept, 6 kzz (0: kzz_c), 7 refused, 8 ok,
 *   9 X, 10 x_rs, 11 x_ld, 12 krow (0: the RBF of c), 13 k_rs,
 *   14 E, 15 e_rs, 16 e_ld, 17 P, 18 p_rs, 19 p_ld, 20 p_lower, 21 Q, 22 q_rs, 23 q_ld,
 *   24 pflags (0: no pending step), 25 pa, 26 pb, 27 pu_rs, 28 u_w,
 *   29 g, 30 g_rs, 31 S, 32 s_rs, 33 C (0: unit counts), 34 c_rs, 35 Z, 36 z_rs, 37 z_ld,
 *   38 logdet, 39 sizes, 40 f, 41 f_rs, 42 omega, 43 strict, 44 work, 45 bad,
 *   46 (out) the number of runs that grew;
 * dv: 0 kzz_c, 1 min_res, 2 c, 3 lam. */
int64_t ekucb_grow(int64_t *iv, const double *dv) {
    return grow(iv[0], PTR(const int64_t, 1), iv[2], iv[3], iv[4], PTR(const uint8_t, 5),
                PTR(const double, 6), dv[0], dv[1], PTR(int64_t, 7), PTR(uint8_t, 8),
                PTR(const double, 9), iv[10], iv[11], PTR(const double, 12), iv[13], dv[2],
                PTR(double, 14), iv[15], iv[16], PTR(double, 17), iv[18], iv[19], iv[20],
                PTR(double, 21), iv[22], iv[23], PTR(int64_t, 24), PTR(double, 25),
                PTR(const double, 26), iv[27], iv[28], PTR(double, 29), iv[30],
                PTR(const double, 31), iv[32], PTR(const double, 33), iv[34], PTR(double, 35),
                iv[36], iv[37], PTR(double, 38), PTR(int64_t, 39), PTR(const double, 40), iv[41],
                PTR(const double, 42), dv[3], iv[43], PTR(double, 44), PTR(uint8_t, 45), iv + 46);
}

/* KORS's growth (Zenati et al. 2022, §4.2: N = (K_ZZ + mu diag(p))^{-1} bordered with the new
 * anchor) of the K distinct runs runs[k] where accept[k] holds: with m = m_r (at most W) and
 * k = kz[k, :m],
 *   u = [N k; -1] (dot4 rows),  s = (kss + mu p) - k^T N k  (kss[k], or kss_c if kss == NULL),
 * then, if no s is <= 0 (or !strict): N <- N + u u^T / s on [:m+1, :m+1], p~[m] = p[k],
 * m_r <- m + 1. bad[r] = 1 where s is not > 0; returns their number (strict: then nothing is
 * changed), or -1 (nothing done) if some m_r > W. Work: (K + 1)(W + 1) + K doubles. */
static int64_t kors_grow(int64_t K, const int64_t *runs, const uint8_t *accept, int64_t W,
                         double *N, int64_t n_rs, int64_t n_ld, double *pt, int64_t p_rs,
                         int64_t *sizes, const double *kz, int64_t kz_rs, const double *kss,
                         double kss_c, const double *p, double mu, int64_t strict, double *work,
                         uint8_t *bad) {
    for (int64_t k = 0; k < K; ++k)
        if (accept[k] && (sizes[runs[k]] > W || sizes[runs[k]] < 0)) return -1;
    double *v = work, *U = work + W + 1, *schur = U + K * (W + 1);
    int64_t nbad = 0;
    for (int64_t k = 0; k < K; ++k) {
        if (!accept[k]) continue;
        const int64_t r = runs[k], m = sizes[r];
        double quad = bordered_vector(N + r * n_rs, n_ld, kz + k * kz_rs, m, U + k * (W + 1));
        double s = ((kss ? kss[k] : kss_c) + mu * p[k]) - quad;
        schur[k] = s;
        if (!(s > 0.0)) {
            bad[r] = 1;
            ++nbad;
        }
    }
    if (strict && nbad) return nbad;
    for (int64_t k = 0; k < K; ++k) {
        if (!accept[k]) continue;
        const int64_t r = runs[k], m = sizes[r];
        const double inv = 1.0 / schur[k], *u = U + k * (W + 1);
        for (int64_t j = 0; j <= m; ++j) v[j] = u[j] * inv;
        border_update(N + r * n_rs, n_ld, u, v, m);
        pt[r * p_rs + m] = p[k];
        sizes[r] = m + 1;
    }
    return nbad;
}

/* kors_grow packed. iv: 0 K, 1 runs, 2 accept, 3 W, 4 N, 5 n_rs, 6 n_ld, 7 pt, 8 p_rs, 9 sizes,
 * 10 kz, 11 kz_rs, 12 kss (0: kss_c), 13 p, 14 strict, 15 work, 16 bad; dv: 0 kss_c, 1 mu. */
int64_t ekucb_kors_grow(const int64_t *iv, const double *dv) {
    return kors_grow(iv[0], PTR(const int64_t, 1), PTR(const uint8_t, 2), iv[3], PTR(double, 4),
                     iv[5], iv[6], PTR(double, 7), iv[8], PTR(int64_t, 9), PTR(const double, 10),
                     iv[11], PTR(const double, 12), dv[0], PTR(const double, 13), dv[1], iv[14],
                     PTR(double, 15), PTR(uint8_t, 16));
}

/* KORS's acceptance probabilities (Zenati et al. 2022, §4.2, eq. 41 in closed form) of R points:
 * u_r = k_r^T N_r k_r (ekucb_quad, written to u), then
 *   rho = (kss - u)_+,  tau = ((1 + eps) rho) / (rho + mu)
 *   (reference != 0: tau = (((1 + eps) kss) / mu - tau)_+),  p = min(gamma tau, 1)
 * each operation rounded once, in the order of the torch path's tensor operations (BatchedKORS.
 * probability): the same numbers to the bit (a NaN stays NaN, as torch's clamp keeps it).
 * kss [R] (kss == NULL: kss_c). iv: 0 R, 1 W, 2 sizes, 3 k, 4 k_rs, 5 N, 6 n_rs, 7 n_ld, 8 u,
 * 9 kss, 10 reference, 11 p; dv: 0 kss_c, 1 1 + eps, 2 mu, 3 gamma. */
void ekucb_kors_prob(const int64_t *iv, const double *dv) {
    const int64_t R = iv[0];
    const double *kss = PTR(const double, 9), *u = PTR(const double, 8);
    double *p = PTR(double, 11);
    const double one_eps = dv[1], mu = dv[2], gamma = dv[3];
    ekucb_quad(R, iv[1], PTR(const int64_t, 2), PTR(const double, 3), iv[4], PTR(const double, 5),
               iv[6], iv[7], PTR(double, 8));
    for (int64_t r = 0; r < R; ++r) {
        const double kr = kss ? kss[r] : dv[0];
        double rho = kr - u[r];
        rho = rho < 0.0 ? 0.0 : rho;
        double tau = (one_eps * rho) / (rho + mu);
        if (iv[10]) {
            tau = ((one_eps * kr) / mu) - tau;
            tau = tau < 0.0 ? 0.0 : tau;
        }
        double q = gamma * tau;
        p[r] = q > 1.0 ? 1.0 : q;
    }
}
