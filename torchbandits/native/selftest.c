/* A trivial kernel used to check that builds and calls work: y[i] = a * x[i] + y[i]. */
#include <stddef.h>

void axpy(long n, double a, const double *x, double *y) {
    for (long i = 0; i < n; ++i) y[i] += a * x[i];
}
