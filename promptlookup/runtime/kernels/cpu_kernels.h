/* What the CPU kernel modules (gemv.c, step_ops.c) share: the instruction-set levels, the
 * widest one this CPU runs, the target attributes of the AVX2 and AVX-512 paths, the
 * reduction of one vector of sums by the tree both modules' row invariance rests on, and
 * how their Python entry points read their arguments. Include after Python.h. */
#ifndef PLD_CPU_KERNELS_H
#define PLD_CPU_KERNELS_H

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define PLD_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#else
#define PLD_X86 0
#endif
#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum { ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* Less work than this many multiply-adds runs on one thread: a product (gemv.c) or an operation
 * of step_ops.c alone, and step_ops' layers() forms no team where its products would not split. */
#define PARALLEL_MIN_WORK (1 << 16)

#if PLD_X86
/* The 8 lanes of a summed by a fixed tree: l + (l + 4), then l + (l + 2), then l + (l + 1). */
T_AVX2 ALWAYS_INLINE float avx2_reduce(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 16 lanes of a summed by a fixed tree: l + (l + 8), then avx2_reduce's. */
T_512 ALWAYS_INLINE float avx512_reduce(__m512 a) {
    return avx2_reduce(_mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
}
#endif

/* The widest path this CPU runs: AVX-512 needs avx512f+bw+vl, AVX2 needs avx2+fma; both
 * need F16C (the float16 K/V pool's conversions; every CPU with AVX2 has it). */
static int best_isa(void) {
#if PLD_X86
    unsigned int eax, ebx, ecx = 0, edx;
    __builtin_cpu_init();
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C)) return ISA_GENERIC;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
#endif
    return ISA_GENERIC;
}

/* `want` arguments: `nptrs` addresses (Python ints from Tensor.data_ptr(); 0 only where
 * `nullable`, for an absent optional tensor), then sizes (>= 0). The Python wrappers check
 * the tensors behind them; this checks only what Python passed. 0 on success, else -1 with
 * the exception set. */
static int parse_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, void **ptrs, int nptrs,
                      Py_ssize_t *sizes, int nullable) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", want, nargs);
        return -1;
    }
    for (int i = 0; i < nptrs; i++) {
        ptrs[i] = PyLong_AsVoidPtr(args[i]);
        if (ptrs[i] == NULL) {
            if (PyErr_Occurred()) return -1;
            if (!nullable) {
                PyErr_SetString(PyExc_ValueError, "null address");
                return -1;
            }
        }
    }
    for (Py_ssize_t i = nptrs; i < want; i++) {
        sizes[i - nptrs] = PyLong_AsSsize_t(args[i]);
        if (sizes[i - nptrs] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative size");
            return -1;
        }
    }
    return 0;
}

#endif
