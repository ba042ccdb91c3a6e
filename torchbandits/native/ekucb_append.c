/* The data update of a batched EK-UCB round on the compiled CPU path (Zenati et al., AISTATS 2022,
 * Algorithm 2, in the whitened form of their Prop. 4.2): every run r appends the candidate x_r it
 * played, whose columns the round's compiled score (ekucb_batch.c, ekucb_score) has just computed:
 *   k_Z(x) = kz[r, a],   f = e(x) = P_r k_Z(x) = f[r, a],   Q_r e(x) = qf[r, a]      (a: x's index)
 * and, for that point,
 *   fQf   = f^T Q_r f,   ff = |f|^2,   omega_r = k(x, x) + jitter - ff   (the residual of x),
 *   Q_r  <- Q_r - (Q f)(Q f)^T / (1 + fQf)   (Sherman-Morrison; deferred: a = Qf, b = Qf/(1+fQf)
 *                                             are written out, the next score applies them),
 *   g_r  <- g_r + y_r f,   E_r[n] = f,   log det A_r += log1p(fQf),   X_r[n] = x_r,  S_r[n] = y_r.
 * One call replaces the ~20 small tensor operations of BatchedNystrom.scored_columns and .append.
 *
 * Rounding: the sums fQf and ff are four interleaved partial sums (one rounding per product and
 * per addition, no fused multiply-add: -std=c99 does not contract); the torch path reduces them
 * in another order, so the two agree to rounding, not to the bit. Every other number is the torch path's.
 *
 * No global state; no pointer is kept between calls. Sizes are int64 (the tensors' `long`).
 */
#include <math.h>
#include <stdint.h>

/* The index of the first of run r's A candidates (rows of d coordinates, stride cs) equal to x
 * coordinate by coordinate (a NaN equals nothing), or -1. */
static int64_t find_row(const double *cand, int64_t A, int64_t cs, const double *x, int64_t d) {
    for (int64_t a = 0; a < A; ++a) {
        const double *c = cand + a * cs;
        int64_t j = 0;
        while (j < d && c[j] == x[j]) ++j;
        if (j == d) return a;
    }
    return -1;
}

/* Append the played candidates x [R, d] with rewards y [R] to the R runs. The arguments come
 * packed (one ctypes argument each instead of about forty): iv holds, in this order,
 *   R, A, W, d,
 *   cand, c_rs, c_as        cand [R, A, d] (coordinates contiguous): the last score's candidates
 *   x, x_rs, y              x [R, d] (row stride x_rs), y [R] (contiguous)
 *   kz, kz_rs, kz_as        kz, f [R, A, W] and qf [R, >= A, W] (run, candidate strides; last
 *   f, f_rs, f_as           dimension contiguous): the score's columns, zero beyond each run's
 *   qf, qf_rs, qf_as        size (W = the round's width)
 *   kxx                     k(x, x) [R], or 0 (then dv[0])
 *   out                     [4, R, W] (contiguous): kz_out, f_out, a_out, b_out
 *   omega                   [R]
 *   flags                   int64 [2, R]: missing (1 where x_r is not a candidate), index
 *   write_missing
 *   g, g_rs                 state, written in place: g (W entries a run),
 *   e_row, e_rs             &E[0, n, 0] (W entries a run),
 *   x_row, xb_rs            &X[0, n, 0] (d entries a run),
 *   s_row, s_rs             &S[0, n],
 *   logdet                  [R] (contiguous)
 * (pointers as integers) and dv = {kconst, jitter}.
 *
 * Returns the number of missing runs. With it > 0 and write_missing == 0 nothing is written (the
 * caller takes its torch path); with write_missing != 0 a missing run takes candidate 0's
 * columns (the caller flags it: the torch path's choice under deferred checks). */
#define PTR(type, k) ((type *)(intptr_t)iv[k])
int64_t ekucb_append(const int64_t *iv, const double *dv) {
    const int64_t R = iv[0], A = iv[1], W = iv[2], d = iv[3];
    const double *cand = PTR(const double, 4), *x = PTR(const double, 7), *y = PTR(const double, 9);
    const int64_t c_rs = iv[5], c_as = iv[6], x_rs = iv[8];
    const double *kz = PTR(const double, 10), *f = PTR(const double, 13);
    const double *qf = PTR(const double, 16), *kxx = PTR(const double, 19);
    const int64_t kz_rs = iv[11], kz_as = iv[12], f_rs = iv[14], f_as = iv[15];
    const int64_t qf_rs = iv[17], qf_as = iv[18];
    double *out = PTR(double, 20);
    double *omega = PTR(double, 21);
    int64_t *missing = PTR(int64_t, 22), *index = missing + R, write_missing = iv[23];
    double *g = PTR(double, 24), *e_row = PTR(double, 26), *x_row = PTR(double, 28);
    double *s_row = PTR(double, 30), *logdet = PTR(double, 32);
    const int64_t g_rs = iv[25], e_rs = iv[27], xb_rs = iv[29], s_rs = iv[31];
    const double kconst = dv[0], jitter = dv[1];
    double *kz_out = out, *f_out = out + R * W, *a_out = out + 2 * R * W, *b_out = out + 3 * R * W;
    int64_t count = 0;
    for (int64_t r = 0; r < R; ++r) {
        int64_t a = find_row(cand + r * c_rs, A, c_as, x + r * x_rs, d);
        missing[r] = a < 0;
        count += a < 0;
        index[r] = a < 0 ? 0 : a;
    }
    if (count && !write_missing) return count;
    for (int64_t r = 0; r < R; ++r) {
        int64_t a = index[r];
        const double *restrict kr = kz + r * kz_rs + a * kz_as, *restrict fr = f + r * f_rs + a * f_as;
        const double *restrict qr = qf + r * qf_rs + a * qf_as;
        double *restrict ko = kz_out + r * W, *restrict fo = f_out + r * W;
        double *restrict ao = a_out + r * W, *restrict bo = b_out + r * W;
        double *restrict gr = g + r * g_rs, *restrict er = e_row + r * e_rs;
        double q4[4] = {0.0, 0.0, 0.0, 0.0}, f4[4] = {0.0, 0.0, 0.0, 0.0}, yr = y[r];
        int64_t j = 0;   /* four interleaved partial sums (j mod 4), then (s0 + s1) + (s2 + s3) */
        for (; j + 4 <= W; j += 4)
            for (int k = 0; k < 4; ++k) {
                double t0 = fr[j + k] * qr[j + k], t1 = fr[j + k] * fr[j + k];
                q4[k] += t0;
                f4[k] += t1;
            }
        for (int k = 0; j < W; ++j, ++k) {
            double t0 = fr[j] * qr[j], t1 = fr[j] * fr[j];
            q4[k] += t0;
            f4[k] += t1;
        }
        double fq = (q4[0] + q4[1]) + (q4[2] + q4[3]), ff = (f4[0] + f4[1]) + (f4[2] + f4[3]);
        double kx = kxx ? kxx[r] : kconst;
        omega[r] = (kx + jitter) - ff;
        double den = 1.0 + fq;
        for (j = 0; j < W; ++j) {   /* (restrict: no two of these overlap; vectorised) */
            double fj = fr[j], qj = qr[j], prod = fj * yr;
            ko[j] = kr[j];
            fo[j] = fj;
            ao[j] = qj;
            bo[j] = qj / den;
            gr[j] += prod;
            er[j] = fj;
        }
        logdet[r] += log1p(fq);
        for (j = 0; j < d; ++j) x_row[r * xb_rs + j] = x[r * x_rs + j];
        s_row[r * s_rs] = yr;
    }
    return count;
}
