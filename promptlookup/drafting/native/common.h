/* Helpers shared by the drafters' C modules (pool.c, suffix_automaton.c).
 *
 * Include after <Python.h>. Everything here is static, so each module keeps its own copy
 * and no symbol is exported.
 */
#ifndef PROMPTLOOKUP_NATIVE_COMMON_H
#define PROMPTLOOKUP_NATIVE_COMMON_H

#include <stdint.h>

/* Make room for `need` items of `item` bytes in *buf (capacity *cap items), doubling from
 * 16. Returns 0, or -1 with MemoryError set (the buffer is then unchanged). */
static inline int grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t c = *cap > 0 ? *cap : 16;
    while (c < need) {
        if (c > PY_SSIZE_T_MAX / 2) { PyErr_NoMemory(); return -1; }
        c *= 2;
    }
    if ((size_t)c > (size_t)PY_SSIZE_T_MAX / item) { PyErr_NoMemory(); return -1; }
    void *p = PyMem_Realloc(*buf, (size_t)c * item);
    if (p == NULL) { PyErr_NoMemory(); return -1; }
    *buf = p;
    *cap = c;
    return 0;
}

/* A token id: any object with __index__ in the int64 range. Returns 0, or -1 with
 * TypeError (not an integer) or OverflowError set. May run Python code (__index__). */
static inline int as_token(PyObject *o, int64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

/* Convert the tokens of `seq` (a list or tuple nobody else can resize: see
 * private_tokens) into a new PyMem buffer of *n tokens. Returns NULL with an exception set
 * on failure. */
static inline int64_t *tokens_to_buffer(PyObject *seq, Py_ssize_t *n) {
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    int64_t *buf = PyMem_Malloc(len > 0 ? (size_t)len * sizeof(int64_t) : 1);
    if (buf == NULL) { PyErr_NoMemory(); return NULL; }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < len; i++) {
        if (as_token(items[i], &buf[i]) < 0) { PyMem_Free(buf); return NULL; }
    }
    *n = len;
    return buf;
}

/* A private snapshot of seq[start:] as a new list or tuple, and len(seq) in *len.
 *
 * The length is the number of items actually there (a sequence's __len__ may disagree
 * with its items; PySequence_Fast iterates). The snapshot holds its own references and is
 * referenced by no one else, so __index__ methods that resize or clear the caller's list
 * while its tokens are converted cannot free what is being read. Cost O(len(seq) - start)
 * for a list or tuple (no copy of the prefix), O(len(seq)) for other iterables. */
static inline PyObject *private_tokens(PyObject *seq, Py_ssize_t start, Py_ssize_t *len, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL) return NULL;
    *len = PySequence_Fast_GET_SIZE(fast);
    PyObject *tail = PySequence_GetSlice(fast, start < *len ? start : *len, *len);
    Py_DECREF(fast);
    return tail;
}

#endif
