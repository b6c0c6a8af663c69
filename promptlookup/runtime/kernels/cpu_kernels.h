/* What the CPU kernel modules (gemv.c, step_ops.c) share: the instruction-set levels, the
 * widest one this CPU runs, and how their Python entry points read their arguments.
 * Include after Python.h, with PLD_X86 defined (1 on x86 with GCC or clang, else 0). */
#ifndef PLD_CPU_KERNELS_H
#define PLD_CPU_KERNELS_H

enum { ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* The widest path this CPU runs: AVX-512 needs avx512f+bw+vl, AVX2 needs avx2+fma. */
static int best_isa(void) {
#if PLD_X86
    __builtin_cpu_init();
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
