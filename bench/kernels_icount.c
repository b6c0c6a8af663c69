/* One product of runtime/kernels/gemv.c on one weight, outside Python: for instruction
 * counts (valgrind's callgrind, which runs the AVX2 and generic paths but not AVX-512) and
 * best-of-N timings (TIME=1) that a loaded machine disturbs less than a median.
 *
 *   cc -O3 -ffp-contract=off -I"$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
 *      bench/kernels_icount.c -o /tmp/kernels_icount -L"$LIBDIR" -lpython3.11 -Wl,-rpath,"$LIBDIR" -lm
 *   valgrind --tool=callgrind --toggle-collect=avx2_i8 /tmp/kernels_icount 1 1 1728 576 32 1
 *   TIME=1 /tmp/kernels_icount 2 2 49152 576 32 15
 *
 * Arguments: ISA (0 generic, 1 avx2, 2 avx512) KIND (0 fp32, 1 int8, 2 int4) N K GROUP REPS
 * [ROWS]. The kernel runs once to warm up, then REPS times (callgrind counts both, so
 * divide its count by REPS + 1). Prints the sum of the outputs. */
#include "../promptlookup/runtime/kernels/gemv.c"
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s ISA KIND N K GROUP REPS [ROWS]\n", argv[0]);
        return 2;
    }
    int isa = atoi(argv[1]), kind = atoi(argv[2]), reps = atoi(argv[6]);
    Py_ssize_t N = atol(argv[3]), K = atol(argv[4]), gs = atol(argv[5]), M = argc > 7 ? atol(argv[7]) : 1;
    float *x = malloc(sizeof(float) * M * K), *y = malloc(sizeof(float) * M * N);
    for (Py_ssize_t i = 0; i < M * K; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    size_t wbytes = kind == 0 ? N * K * 4 : kind == 1 ? N * K : N * K / 2;
    unsigned char *w = malloc(wbytes);
    for (size_t i = 0; i < wbytes; i++) w[i] = (unsigned char)(i * 2654435761u >> 13);
    if (kind == 0)
        for (size_t i = 0; i < (size_t)(N * K); i++) ((float *)w)[i] = (float)(w[i * 4] % 200) / 100.0f - 1.0f;
    Py_ssize_t ns = kind == 1 ? N : N * (K / (gs ? gs : 1));
    float *sc = malloc(sizeof(float) * ns), *of = malloc(sizeof(float) * ns);
    for (Py_ssize_t i = 0; i < ns; i++) {
        sc[i] = 0.01f + (i % 7) * 0.001f;
        of[i] = -8 * sc[i];
    }
    Product p = {x, w, sc, of, y, M, K, N, gs};
    RangeFn fn = range_fn(isa, kind, gs);
    fn(&p, 0, N);
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        fn(&p, 0, N);
        double t = now() - t0;
        if (t < best) best = t;
    }
    if (getenv("TIME")) fprintf(stderr, "%.3f ms (best of %d)\n", best * 1e3, reps);
    double s = 0;
    for (Py_ssize_t i = 0; i < M * N; i++) s += y[i];
    printf("%.9g\n", s);
    return 0;
}
