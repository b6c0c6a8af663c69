/* The per-row work of a decoder layer around its products, on the CPU, in fp32: RMSNorm
 * (with the residual add before it), the rotary embedding of Q and K with the K/V write into
 * the paged pool, attention of a few query rows over the pool, and the SiLU-gated product of
 * the MLP. Python wrappers and the contract: promptlookup/runtime/kernels/step_ops.py.
 *
 * Determinism, the hard requirement (as for the products in gemv.c): each output row is
 * computed from that row's inputs alone by a fixed sequence of IEEE operations, so it is
 * bitwise the same whatever the number of rows in the call and the row's place among them.
 * Reductions (a norm's sum of squares, a dot product, a softmax's sum) keep LANES partial
 * sums, lane l taking the terms with index % LANES == l in increasing order, reduced by a
 * fixed tree; the file is built with -ffp-contract=off, so the compiler fuses no multiply and
 * add: attention's dot products and weighted sums are written as fused multiply-adds on
 * every path (intrinsics; fmaf in the generic code), everything else as separate ones.
 * The same C is compiled three times (AVX-512, AVX2+FMA, the baseline; chosen at run time,
 * set_isa() as in gemv.c), on GCC's vector lanes (lanes_t); attention's dot products and
 * weighted sums have AVX-512 and AVX2 twins written with intrinsics that perform the very
 * same additions and multiplications in the same order. So the paths differ in speed, never
 * in results.
 *
 * Attention: a query row's result depends only on the ordered list of keys it sees (its
 * context, then its ancestors among the step's rows) and their values, not on where the
 * keys sit among the step's columns or how many other keys are masked: the visible keys are
 * first gathered into a compact list, and every sum runs over that list. So a token tree's
 * row gives bitwise the values the same row gets in a plain decoding step, where the same
 * keys sit at consecutive positions.
 *
 * exp is computed here (exp_one): a range reduction by ln 2 and a degree-6 polynomial
 * (Cephes' expf coefficients), within 2 ulp of expf over the inputs a softmax or SiLU meets,
 * the same on every path (softmax and SiLU run it 8 or 16 lanes at a time on the SIMD paths:
 * exp_block_avx2/avx512, the same operations, so the same values).
 *
 * Threads: attention splits its (query row, head) units over OpenMP threads (a thread takes a
 * run of heads of one KV head together; units go in blocks of rows a KV head at a time, see
 * attention_units), the other functions their rows; a step of one query row (decoding) by a
 * team is split finer, the keys for the scores and the head size for the values, so that the
 * threads share the K and V rows (attention_row_split); a split or an order decides which
 * thread computes a value and when, never how.
 *
 * layers() runs all of these and the products (gemv.c's, through its capsule) for every
 * decoder layer of a step in one call, with the GIL released, in one OpenMP parallel region
 * whose threads meet after each operation at a barrier that spins before it sleeps (so they
 * are woken once per step, not once per operation; see Barrier).
 *
 * The K/V pool holds float32, or float16 (`half`: KvCacheConfig.dtype "float16", half the
 * bytes attention reads): rotary_write rounds the rotated K and the V rows to float16 to
 * nearest even (F16C's vcvtps2ph on the x86 paths, float_to_half's bits on the generic one:
 * the same bits), and attention widens each K/V element it reads back to float32 (exact),
 * then computes as over a float32 pool. So every path still gives the same values, and a
 * row's attention reads the rounded K/V of every key, its own included, whichever step wrote
 * them.
 *
 * Cost per call: rms_norm and silu_mul O(rows * width); rotary_write O(rows * (H + 2 KVH) * D);
 * attention, per query row and head, two passes over its visible keys' K and V rows
 * (2 * D multiply-adds per key each); layers(), the sum of its parts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sched.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

#define LANES 16
#pragma GCC diagnostic ignored "-Wpsabi" /* lanes_t values passed between always-inline helpers */
#ifndef PF_KEYS
#define PF_KEYS 16 /* attention prefetches the K/V rows this many keys ahead */
#endif

#include "cpu_kernels.h" /* PLD_X86, T_AVX2/T_512, ALWAYS_INLINE, ISA levels, best_isa(), the reductions, parse_args() */
static int current_isa = ISA_GENERIC;

/* ------------------------------------------------------------------ the shared arithmetic */

/* LANES floats as one vector (GCC's vector extension: the compiler maps it onto the path's
 * registers, lane by lane, so every path computes the same values). */
typedef float lanes_t __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t lane_mask_t __attribute__((vector_size(LANES * sizeof(int32_t))));

ALWAYS_INLINE lanes_t load_lanes(const float *p) {
    lanes_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* p[0..n) (n < LANES), the other lanes `fill`. */
ALWAYS_INLINE lanes_t load_tail(const float *p, Py_ssize_t n, float fill) {
    float t[LANES];
    for (int l = 0; l < LANES; l++) t[l] = l < n ? p[l] : fill;
    return load_lanes(t);
}

/* The lanes summed by a fixed tree: l + (l + 8), then l + (l + 4), l + (l + 2), l + (l + 1). */
ALWAYS_INLINE float reduce_lanes(const lanes_t *v) {
    float acc[LANES];
    memcpy(acc, v, sizeof acc);
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

ALWAYS_INLINE float dot(const float *a, const float *b, Py_ssize_t n) {
    lanes_t acc = {0};
    Py_ssize_t i = 0;
    for (; i + LANES <= n; i += LANES) acc += load_lanes(a + i) * load_lanes(b + i);
    if (i < n) acc += load_tail(a + i, n - i, 0.0f) * load_tail(b + i, n - i, 0.0f);
    return reduce_lanes(&acc);
}

/* dot() with fused multiply-adds (attention's scores): lane l's running sum takes
 * fmaf(a[i], b[i], sum) for i % LANES == l in increasing order (rounded once: the hardware
 * FMA where the path has one, else the C library's, which rounds the same), then the tree. */
ALWAYS_INLINE float dot_fma(const float *a, const float *b, Py_ssize_t n) {
    float acc[LANES] = {0};
    for (Py_ssize_t i = 0; i < n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            float x = i + l < n ? a[i + l] : 0.0f, y = i + l < n ? b[i + l] : 0.0f;
            acc[l] = __builtin_fmaf(x, y, acc[l]);
        }
    lanes_t v = load_lanes(acc);
    return reduce_lanes(&v);
}

/* max_of's end, shared by its x86 twins: the LANES running maxima `top` (lane l over the
 * indices i < done with i % LANES == l) combined in lane order, then a[done..n) in order. */
ALWAYS_INLINE float max_finish(const float *top, const float *a, Py_ssize_t done, Py_ssize_t n) {
    float best = top[0];
    for (int l = 1; l < LANES; l++) best = top[l] > best ? top[l] : best;
    for (Py_ssize_t i = done; i < n; i++) best = a[i] > best ? a[i] : best;
    return best;
}

/* The largest of a[0..n) (n >= 1; exact, so any order gives it). */
ALWAYS_INLINE float max_of(const float *a, Py_ssize_t n) {
    lanes_t m = load_tail(a, 0, a[0]);
    Py_ssize_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        lanes_t x = load_lanes(a + i);
        lane_mask_t more = x > m;
        m = (lanes_t)(((lane_mask_t)x & more) | ((lane_mask_t)m & ~more));
    }
    float top[LANES];
    memcpy(top, &m, sizeof top);
    return max_finish(top, a, i, n);
}

ALWAYS_INLINE float sum_squares(const float *a, Py_ssize_t n) { return dot(a, a, n); }

ALWAYS_INLINE float sum(const float *a, Py_ssize_t n) {
    lanes_t acc = {0};
    Py_ssize_t i = 0;
    for (; i + LANES <= n; i += LANES) acc += load_lanes(a + i);
    if (i < n) acc += load_tail(a + i, n - i, 0.0f);
    return reduce_lanes(&acc);
}

/* e^x of each lane: x = n ln2 + r, |r| <= ln2 / 2, e^r by a polynomial, 2^n into the exponent
 * bits. The clamps are compares and selects, so a NaN passes through. */
ALWAYS_INLINE lanes_t exp_lanes(const lanes_t *in) { /* by address: GCC notes an ABI change for 64-byte vector arguments */
    lanes_t x = *in;
    const lanes_t lo = (lanes_t){0} - 87.33654f, hi = (lanes_t){0} + 88.0f;
    lane_mask_t below = x < lo, above = x > hi; /* below: e^x then 2^-126 (normal); the true value is smaller still */
    x = (lanes_t)(((lane_mask_t)lo & below) | ((lane_mask_t)x & ~below));
    x = (lanes_t)(((lane_mask_t)hi & above) | ((lane_mask_t)x & ~above)); /* n <= 127: finite (e^88 = 1.65e38) */
    lanes_t n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    lanes_t r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    lanes_t p = (lanes_t){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    lane_mask_t bits = (__builtin_convertvector(n, lane_mask_t) + 127) << 23;
    return p * (lanes_t)bits;
}

/* e^x of one float: exp_lanes' lane 0 (the tests' reference, through step_ops.exp). */
ALWAYS_INLINE float exp_one(float x) {
    lanes_t v = (lanes_t){0} + x;
    return exp_lanes(&v)[0];
}

/* a[i] = exp_one(a[i]) for i < n: the generic path's, LANES at a time on GCC's vector lanes;
 * the x86 paths have twins written with intrinsics (exp_block_avx2/avx512), as GCC lowers
 * these lanes' compares to scalar code for AVX2. */
typedef void (*ExpFn)(float *a, Py_ssize_t n);
typedef float (*MaxFn)(const float *a, Py_ssize_t n); /* max_of and its x86 twins */
typedef float (*SumFn)(const float *a, Py_ssize_t n); /* sum and its AVX2 twin */
static float max_generic(const float *a, Py_ssize_t n) { return max_of(a, n); }
static float sum_generic(const float *a, Py_ssize_t n) { return sum(a, n); }
static void exp_block_generic(float *a, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        lanes_t v = load_lanes(a + i);
        v = exp_lanes(&v);
        memcpy(a + i, &v, sizeof v);
    }
    if (i < n) { /* the last n - i in one more pass, the other lanes zero */
        lanes_t v = load_tail(a + i, n - i, 0.0f);
        v = exp_lanes(&v);
        memcpy(a + i, &v, (size_t)(n - i) * sizeof(float));
    }
}

/* ------------------------------------------------------------------ float16 K/V elements */

/* IEEE binary16 bits to float: exact (a subnormal is its 10-bit count times 2^-24; a NaN keeps
 * its payload, quieted, as F16C's vcvtph2ps does). */
ALWAYS_INLINE float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t bits;
    if (e == 0) {
        float f = (float)m * 0x1p-24f;
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    } else if (e == 0x1F) {
        bits = sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0);
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* float to IEEE binary16 bits, rounded to nearest even (F16C's vcvtps2ph with
 * _MM_FROUND_TO_NEAREST_INT gives the same bits): 65520 and above become infinity; below
 * 2^-14, a subnormal (|f| * 2^24 rounded to an integer, the last step to 2^-14 included). */
ALWAYS_INLINE uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu)); /* NaN, quieted */
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);                         /* >= 65520: infinity */
    if (ax >= 0x38800000u) {                                                          /* a normal half */
        uint32_t base = (ax >> 13) - 0x1C000u, rest = ax & 0x1FFFu;
        base += rest > 0x1000u || (rest == 0x1000u && (base & 1u));
        return (uint16_t)(sign | base);
    }
    float a;
    memcpy(&a, &ax, sizeof a);
    const float big = a * 0x1p24f + 0x1p23f; /* exact product; the sum (< 2^23 + 1025) rounded to an integer, to nearest even */
    return (uint16_t)(sign | (uint32_t)(big - 0x1p23f));
}

/* n floats of src rounded into float16 at dst (the pool's K/V rows when half); the x86 paths
 * have F16C twins. */
typedef void (*StoreHalfFn)(uint16_t *dst, const float *src, Py_ssize_t n);
static void store_half_generic(uint16_t *dst, const float *src, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) dst[i] = float_to_half(src[i]);
}

/* Bytes of one K/V element: float32, or float16 when `half`. */
#define KV_BYTES(half) ((half) ? 2 : 4)

/* The address of the K/V row at slot `slot` of one KV head's pool `head` ([S, D]). */
ALWAYS_INLINE const void *kv_row(const void *head, int64_t slot, Py_ssize_t D, int half) {
    return (const char *)head + slot * D * KV_BYTES(half);
}

/* Elements [d0, d1) of a K/V row as float32 into out[d0..d1) (a copy only when half). */
ALWAYS_INLINE const float *kv_floats(const void *row, Py_ssize_t d0, Py_ssize_t d1, int half, float *out) {
    if (!half) return (const float *)row;
    for (Py_ssize_t d = d0; d < d1; d++) out[d] = half_to_float(((const uint16_t *)row)[d]);
    return out;
}

/* ------------------------------------------------------------------ the kernels' bodies */

ALWAYS_INLINE void rms_rows(float *h, const float *delta, const float *w, float *y, Py_ssize_t r0, Py_ssize_t r1,
                            Py_ssize_t n, float eps) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        float *x = h + r * n;
        if (delta) {
            const float *d = delta + r * n;
            for (Py_ssize_t i = 0; i < n; i++) x[i] = x[i] + d[i];
        }
        float mean = sum_squares(x, n) / (float)n;
        float inv = 1.0f / sqrtf(mean + eps);
        float *out = y + r * n;
        for (Py_ssize_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
    }
}

ALWAYS_INLINE void silu_rows(const float *gu, float *out, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t n, ExpFn exp_block) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *g = gu + r * 2 * n, *u = g + n;
        float *o = out + r * n;
        for (Py_ssize_t i = 0; i < n; i++) o[i] = -g[i];
        exp_block(o, n);
        for (Py_ssize_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + o[i]);
        for (Py_ssize_t i = 0; i < n; i++) o[i] = o[i] * u[i];
    }
}

/* x * cos + [x2, x1] * sin_signed (the sign of rotate_half folded into the table). */
ALWAYS_INLINE void rotate(const float *x, const float *c, const float *s, float *out, Py_ssize_t d) {
    Py_ssize_t half = d / 2;
    for (Py_ssize_t i = 0; i < half; i++) out[i] = x[i] * c[i] + x[i + half] * s[i];
    for (Py_ssize_t i = half; i < d; i++) out[i] = x[i] * c[i] + x[i - half] * s[i];
}

typedef struct {
    const float *qkv;        /* [rows, stride]: Q heads, K heads, V heads, each D wide */
    const float *cos, *sin;  /* tables [positions, D] */
    const int64_t *pos;      /* [rows] */
    const int64_t *slot;     /* [rows] write slots */
    float *q;                /* [rows, H, D] */
    void *k, *v;             /* pool [KVH, S, D], float32 or (half) float16 */
    Py_ssize_t rows, stride, H, KVH, D, S;
    int half;
} Rotary;

ALWAYS_INLINE void rotary_rows(const Rotary *a, Py_ssize_t r0, Py_ssize_t r1, StoreHalfFn store_half) {
    Py_ssize_t D = a->D;
    float *rotated = a->half ? malloc((size_t)D * sizeof(float)) : NULL; /* K rotated, before its rounding */
    if (a->half && rotated == NULL) abort(); /* out of memory for one head's row */
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *x = a->qkv + r * a->stride, *c = a->cos + a->pos[r] * D, *s = a->sin + a->pos[r] * D;
        for (Py_ssize_t h = 0; h < a->H; h++) rotate(x + h * D, c, s, a->q + (r * a->H + h) * D, D);
        for (Py_ssize_t h = 0; h < a->KVH; h++) {
            Py_ssize_t at = (h * a->S + a->slot[r]) * D;
            const float *v = x + (a->H + a->KVH + h) * D;
            if (a->half) {
                rotate(x + (a->H + h) * D, c, s, rotated, D);
                store_half((uint16_t *)a->k + at, rotated, D);
                store_half((uint16_t *)a->v + at, v, D);
            } else {
                rotate(x + (a->H + h) * D, c, s, (float *)a->k + at, D);
                memcpy((float *)a->v + at, v, (size_t)D * sizeof(float));
            }
        }
    }
    free(rotated);
}

typedef struct {
    const float *q;          /* [B * Q, H, D] */
    const void *k, *v;       /* pool [KVH, S, D], float32 or (half) float16 */
    const int64_t *read;     /* [B, K] slot of each key, or NULL: slot = start + j */
    const uint8_t *mask;     /* [B, Q, K] (nonzero = visible), or NULL: every key visible */
    float *o;                /* [R, H, D] */
    const int64_t *row_at;   /* [R]: the place b * Q + qi of q's row r in the step, or NULL (R = B * Q, row r at r) */
    Py_ssize_t R, B, Q, H, KVH, D, K, S, start;
    float scale;
    int half;
} Attention;

/* p[g * K + c] = scale * (q0[g] . key c) for the n keys at `slots`, the G heads of one KV head
 * (kh: its pool [S, D]; each function reads one element type: the *_h ones float16). `vh`, when
 * not NULL, is the KV head's V pool, whose rows of the same keys the SIMD paths prefetch as they
 * go (values() reads them next: the scores, bound by their operations, leave memory idle, where
 * values() would wait on it); it changes no value. */
typedef void (*ScoresFn)(const float *q0, Py_ssize_t G, Py_ssize_t D, const void *kh, const void *vh,
                         const int64_t *slots, Py_ssize_t n, float *p, Py_ssize_t K, float scale);

ALWAYS_INLINE void scores_generic(const float *q0, Py_ssize_t G, Py_ssize_t D, const void *kh, const int64_t *slots,
                                  Py_ssize_t n, float *p, Py_ssize_t K, float scale, int half) {
    float *row = half ? malloc((size_t)D * sizeof(float)) : NULL;
    if (half && row == NULL) abort(); /* out of memory for one K row */
    for (Py_ssize_t c = 0; c < n; c++) {
        const float *kc = kv_floats(kv_row(kh, slots[c], D, half), 0, D, half, row);
        for (Py_ssize_t g = 0; g < G; g++) p[g * K + c] = dot_fma(q0 + g * D, kc, D) * scale;
    }
    free(row);
}

#if PLD_X86

/* The cache lines of elements [d0, d1) of the K or V row at `slot` of one KV head's pool
 * `head`, fetched PF_KEYS keys ahead (the pool is read from memory: the products between two
 * layers' attention evict it from the caches). */
static inline void prefetch_kv(const void *head, int64_t slot, Py_ssize_t D, Py_ssize_t d0, Py_ssize_t d1, int half) {
    const char *from = (const char *)kv_row(head, slot, D, half) + d0 * KV_BYTES(half);
    for (Py_ssize_t i = 0; i < (d1 - d0) * KV_BYTES(half); i += 64) _mm_prefetch(from + i, _MM_HINT_T0);
}

/* The V row at `slot` of the V pool `vh` (NULL: none) into the caches, for the values pass
 * after the scores. Nothing reads the V pool while the scores run, so its pages are not in the
 * TLB, and a prefetch whose page is not was dropped on Zen 3: the row that starts a page is
 * read instead (one load per 32 float16 keys), which brings the page in for the prefetches that
 * follow (without that read these prefetches did nothing: docs/benchmarks.md, "Issue 21,
 * sixteenth pass"). */
static inline void prefetch_v(const void *vh, int64_t slot, Py_ssize_t D, int half) {
    if (vh == NULL) return;
    const char *from = (const char *)kv_row(vh, slot, D, half);
    if (((uintptr_t)from & 4095) < (uintptr_t)(D * KV_BYTES(half))) {
        volatile char first = *from; /* a load, not a prefetch: it walks the page table */
        (void)first;
    }
    for (Py_ssize_t i = 0; i < D * KV_BYTES(half); i += 64) _mm_prefetch(from + i, _MM_HINT_T1);
}

/* 8 (AVX2) or 16 (AVX-512) elements of a K/V row from element i, as float32. */
T_AVX2 ALWAYS_INLINE __m256 kv8(const void *row, Py_ssize_t i, int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)))
                : _mm256_loadu_ps((const float *)row + i);
}
T_512 ALWAYS_INLINE __m512 kv16(const void *row, Py_ssize_t i, int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)))
                : _mm512_loadu_ps((const float *)row + i);
}

/* n floats rounded into float16 by F16C, to nearest even (store_half_generic's bits). */
T_AVX2 static void store_half_avx2(uint16_t *dst, const float *src, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = float_to_half(src[i]);
}
T_512 static void store_half_avx512(uint16_t *dst, const float *src, Py_ssize_t n) { store_half_avx2(dst, src, n); }

/* Four keys' lane halves (lanes 0-7, 8-15) reduced together, each by reduce_lanes' tree. */
T_AVX2 static inline __m128 tree16x4_avx2(const __m256 *lo, const __m256 *hi) {
    __m128 x[4];
    for (int j = 0; j < 4; j++) {
        __m256 h = _mm256_add_ps(lo[j], hi[j]);
        x[j] = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    }
    __m128 ab = _mm_add_ps(_mm_movelh_ps(x[0], x[1]), _mm_movehl_ps(x[1], x[0])); /* a0+a2 a1+a3 b0+b2 b1+b3 */
    __m128 cd = _mm_add_ps(_mm_movelh_ps(x[2], x[3]), _mm_movehl_ps(x[3], x[2]));
    return _mm_add_ps(_mm_shuffle_ps(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)), _mm_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* dot() for D a multiple of 16: the same lanes, products and tree, in AVX2 registers; four
 * keys at a time share one reduction. */
T_AVX2 ALWAYS_INLINE void scores_avx2_of(const float *q0, Py_ssize_t G, Py_ssize_t D, const void *kh,
                                         const void *vh, const int64_t *slots, Py_ssize_t n, float *p, Py_ssize_t K,
                                         float scale, const int half) {
    if (D % LANES) {
        scores_generic(q0, G, D, kh, slots, n, p, K, scale, half);
        return;
    }
    const __m128 sc = _mm_set1_ps(scale);
    Py_ssize_t c = 0;
    for (; c + 4 <= n; c += 4) {
        const void *k[4];
        for (int j = 0; j < 4; j++) {
            k[j] = kv_row(kh, slots[c + j], D, half);
            if (c + PF_KEYS + j < n) {
                prefetch_kv(kh, slots[c + PF_KEYS + j], D, 0, D, half);
                prefetch_v(vh, slots[c + PF_KEYS + j], D, half);
            }
        }
        for (Py_ssize_t g = 0; g < G; g++) {
            const float *qg = q0 + g * D;
            __m256 lo[4], hi[4];
            for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm256_setzero_ps();
            for (Py_ssize_t i = 0; i < D; i += LANES) {
                __m256 ql = _mm256_loadu_ps(qg + i), qh = _mm256_loadu_ps(qg + i + 8);
                for (int j = 0; j < 4; j++) {
                    lo[j] = _mm256_fmadd_ps(ql, kv8(k[j], i, half), lo[j]);
                    hi[j] = _mm256_fmadd_ps(qh, kv8(k[j], i + 8, half), hi[j]);
                }
            }
            _mm_storeu_ps(p + g * K + c, _mm_mul_ps(tree16x4_avx2(lo, hi), sc));
        }
    }
    for (; c < n; c++) {
        const void *kc = kv_row(kh, slots[c], D, half);
        for (Py_ssize_t g = 0; g < G; g++) {
            const float *qg = q0 + g * D;
            __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
            for (Py_ssize_t i = 0; i < D; i += LANES) {
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), kv8(kc, i, half), lo);
                hi = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i + 8), kv8(kc, i + 8, half), hi);
            }
            p[g * K + c] = avx2_reduce(_mm256_add_ps(lo, hi)) * scale; /* reduce_lanes' tree */
        }
    }
}

/* tree16x4_avx2 for four 16-lane vectors. */
T_512 static inline __m128 tree16x4_avx512(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 v[4] = {a, b, c, d};
    __m256 lo[4], hi[4];
    for (int j = 0; j < 4; j++) {
        lo[j] = _mm512_castps512_ps256(v[j]);
        hi[j] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[j]), 1));
    }
    return tree16x4_avx2(lo, hi);
}

T_512 ALWAYS_INLINE void scores_avx512_of(const float *q0, Py_ssize_t G, Py_ssize_t D, const void *kh,
                                          const void *vh, const int64_t *slots, Py_ssize_t n, float *p, Py_ssize_t K,
                                          float scale, const int half) {
    if (D % LANES) {
        scores_generic(q0, G, D, kh, slots, n, p, K, scale, half);
        return;
    }
    const __m128 sc = _mm_set1_ps(scale);
    Py_ssize_t c = 0;
    for (; c + 4 <= n; c += 4) { /* four keys at a time: one joint reduction */
        const void *k0 = kv_row(kh, slots[c], D, half), *k1 = kv_row(kh, slots[c + 1], D, half),
                   *k2 = kv_row(kh, slots[c + 2], D, half), *k3 = kv_row(kh, slots[c + 3], D, half);
        for (int j = 0; j < 4 && c + PF_KEYS + j < n; j++) {
            prefetch_kv(kh, slots[c + PF_KEYS + j], D, 0, D, half);
            prefetch_v(vh, slots[c + PF_KEYS + j], D, half);
        }
        for (Py_ssize_t g = 0; g < G; g++) {
            const float *qg = q0 + g * D;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (Py_ssize_t i = 0; i < D; i += LANES) {
                __m512 qv = _mm512_loadu_ps(qg + i);
                a0 = _mm512_fmadd_ps(qv, kv16(k0, i, half), a0);
                a1 = _mm512_fmadd_ps(qv, kv16(k1, i, half), a1);
                a2 = _mm512_fmadd_ps(qv, kv16(k2, i, half), a2);
                a3 = _mm512_fmadd_ps(qv, kv16(k3, i, half), a3);
            }
            _mm_storeu_ps(p + g * K + c, _mm_mul_ps(tree16x4_avx512(a0, a1, a2, a3), sc));
        }
    }
    for (; c < n; c++) {
        const void *kc = kv_row(kh, slots[c], D, half);
        for (Py_ssize_t g = 0; g < G; g++) {
            const float *qg = q0 + g * D;
            __m512 acc = _mm512_setzero_ps();
            for (Py_ssize_t i = 0; i < D; i += LANES)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + i), kv16(kc, i, half), acc);
            p[g * K + c] = avx512_reduce(acc) * scale; /* reduce_lanes' tree */
        }
    }
}
#endif

typedef void (*ValuesFn)(const float *p, Py_ssize_t G, Py_ssize_t D, const void *vh, const int64_t *slots,
                         Py_ssize_t n, Py_ssize_t K, float *acc, Py_ssize_t d0, Py_ssize_t d1);

/* acc[g * D + d] = sum over c in order of p[g * K + c] * v_c[d] (one running sum per element),
 * for the columns d0 <= d < d1 (multiples of VALUES_PART, or d1 = D: the part a thread of
 * attention_row_split takes); each element the same whatever the range. */
#define VALUES_PART 32
ALWAYS_INLINE void values_generic(const float *p, Py_ssize_t G, Py_ssize_t D, const void *vh, const int64_t *slots,
                                  Py_ssize_t n, Py_ssize_t K, float *acc, Py_ssize_t d0, Py_ssize_t d1, int half) {
    float *row = half ? malloc((size_t)D * sizeof(float)) : NULL;
    if (half && row == NULL) abort(); /* out of memory for one V row */
    for (Py_ssize_t g = 0; g < G; g++) memset(acc + g * D + d0, 0, (size_t)(d1 - d0) * sizeof(float));
    for (Py_ssize_t c = 0; c < n; c++) {
        const float *vc = kv_floats(kv_row(vh, slots[c], D, half), d0, d1, half, row);
        for (Py_ssize_t g = 0; g < G; g++) {
            float w = p[g * K + c], *ag = acc + g * D;
            for (Py_ssize_t d = d0; d < d1; d++) ag[d] = __builtin_fmaf(w, vc[d], ag[d]);
        }
    }
    free(row);
}

#if PLD_X86
/* values_generic with the sums of up to four heads in registers (D == 64): one pass over the
 * keys reads each V row once for every head of the group; each head's sums take the same
 * operations in the same order as one head alone. */
T_512 ALWAYS_INLINE void values_avx512_of(const float *p, Py_ssize_t G, Py_ssize_t D, const void *vh,
                                          const int64_t *slots, Py_ssize_t n, Py_ssize_t K, float *acc, Py_ssize_t d0,
                                          Py_ssize_t d1, const int half) {
    if (D != 64) {
        values_generic(p, G, D, vh, slots, n, K, acc, d0, d1, half);
        return;
    }
    for (Py_ssize_t g0 = 0; g0 < G; g0 += 4) {
        int gn = G - g0 < 4 ? (int)(G - g0) : 4;
        __m512 a[4][4];
        for (int g = 0; g < 4; g++)
            for (int i = 0; i < 4; i++) a[g][i] = _mm512_setzero_ps();
        for (Py_ssize_t c = 0; c < n; c++) {
            const void *vc = kv_row(vh, slots[c], D, half);
            if (g0 == 0 && c + PF_KEYS < n) prefetch_kv(vh, slots[c + PF_KEYS], D, d0, d1, half);
            const __m512 zero = _mm512_setzero_ps(); /* the columns outside [d0, d1) are not read */
            const __m512 v0 = d0 < 32 ? kv16(vc, 0, half) : zero, v1 = d0 < 32 ? kv16(vc, 16, half) : zero,
                         v2 = d1 > 32 ? kv16(vc, 32, half) : zero, v3 = d1 > 32 ? kv16(vc, 48, half) : zero;
            for (int g = 0; g < gn; g++) {
                __m512 w = _mm512_set1_ps(p[(g0 + g) * K + c]);
                if (d0 < 32) {
                    a[g][0] = _mm512_fmadd_ps(w, v0, a[g][0]);
                    a[g][1] = _mm512_fmadd_ps(w, v1, a[g][1]);
                }
                if (d1 > 32) {
                    a[g][2] = _mm512_fmadd_ps(w, v2, a[g][2]);
                    a[g][3] = _mm512_fmadd_ps(w, v3, a[g][3]);
                }
            }
        }
        for (int g = 0; g < gn; g++)
            for (int i = (int)d0 / 16; i < (int)d1 / 16; i++) _mm512_storeu_ps(acc + (g0 + g) * D + 16 * i, a[g][i]);
    }
}

/* values_generic for D == 64 with up to three heads' sums in registers, 32 elements at a
 * time (3 heads x 4 vectors: 12 of the 16 registers): one pass over the keys per half reads
 * each V row's half once for the three heads, where a head at a time read it from L2 once per
 * head (L2 -> L1 traffic, not the FMAs, bounded that loop). Each element's running sum takes
 * the same operations in the same order as one head alone. */
T_AVX2 ALWAYS_INLINE void values_avx2_of(const float *p, Py_ssize_t G, Py_ssize_t D, const void *vh,
                                         const int64_t *slots, Py_ssize_t n, Py_ssize_t K, float *acc, Py_ssize_t d0,
                                         Py_ssize_t d1, const int f16) {
    if (D != 64) {
        values_generic(p, G, D, vh, slots, n, K, acc, d0, d1, f16);
        return;
    }
    for (Py_ssize_t g0 = 0; g0 < G; g0 += 3) {
        const int gn = G - g0 < 3 ? (int)(G - g0) : 3;
        const float *p0 = p + g0 * K, *p1 = p0 + (gn > 1 ? K : 0), *p2 = p0 + (gn > 2 ? 2 * K : 0);
        for (Py_ssize_t half = d0; half < d1; half += 32) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                   a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00;
            for (Py_ssize_t c = 0; c < n; c++) {
                const void *vc = kv_row(vh, slots[c], D, f16);
                if (g0 == 0 && half == d0 && c + PF_KEYS < n) prefetch_kv(vh, slots[c + PF_KEYS], D, d0, d1, f16);
                /* heads past gn repeat a head, discarded; the half row comes from L1 for the second
                 * and third head (the empty asm keeps the compiler from holding it in 4 registers,
                 * which spilled the sums) */
#define HEAD_SUMS(pw, s0, s1, s2, s3)                         \
    do {                                                      \
        const __m256 w = _mm256_broadcast_ss(pw);             \
        s0 = _mm256_fmadd_ps(w, kv8(vc, half, f16), s0);      \
        s1 = _mm256_fmadd_ps(w, kv8(vc, half + 8, f16), s1);  \
        s2 = _mm256_fmadd_ps(w, kv8(vc, half + 16, f16), s2); \
        s3 = _mm256_fmadd_ps(w, kv8(vc, half + 24, f16), s3); \
    } while (0)
                HEAD_SUMS(p0 + c, a00, a01, a02, a03);
                __asm__ volatile("" ::: "memory");
                HEAD_SUMS(p1 + c, a10, a11, a12, a13);
                __asm__ volatile("" ::: "memory");
                HEAD_SUMS(p2 + c, a20, a21, a22, a23);
#undef HEAD_SUMS
            }
            const __m256 sums[12] = {a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23};
            for (int g = 0; g < gn; g++)
                for (int i = 0; i < 4; i++) _mm256_storeu_ps(acc + (g0 + g) * D + half + 8 * i, sums[4 * g + i]);
        }
    }
}

/* exp_one on 8 (AVX2) or 16 (AVX-512) lanes, a[i] = exp_one(a[i]) for i < n: its very
 * operations, in its order, without fused multiply-adds; its clamps as max(lo, x) and
 * min(hi, x), which give x itself where x is NaN, as exp_one's compares do. So each lane is
 * exp_one's value (a test holds them to it); written out because GCC leaves exp_one's loop
 * scalar on AVX2. The last n % L go through one more pass, padded with zeros. VT, SI: the
 * float and integer vectors of W bits; P: the intrinsics' prefix. */
#define EXP_BLOCK(NAME, TARGET, L, VT, SI, P, W)                                                     \
    TARGET static void NAME(float *a, Py_ssize_t n) {                                                \
        for (Py_ssize_t i = 0; i < n; i += L) {                                                      \
            float t[L]; /* the tail, padded */                                                       \
            const int full = i + L <= n;                                                             \
            if (!full) {                                                                             \
                memset(t, 0, sizeof t);                                                              \
                memcpy(t, a + i, (size_t)(n - i) * sizeof(float));                                   \
            }                                                                                        \
            VT x = P##_loadu_ps(full ? a + i : t);                                                   \
            x = P##_min_ps(P##_set1_ps(88.0f), P##_max_ps(P##_set1_ps(-87.33654f), x));              \
            VT k = P##_sub_ps(P##_add_ps(P##_mul_ps(x, P##_set1_ps(1.44269504088896341f)),           \
                                         P##_set1_ps(12582912.0f)), P##_set1_ps(12582912.0f));       \
            VT r = P##_sub_ps(x, P##_mul_ps(k, P##_set1_ps(0.693359375f)));                          \
            r = P##_sub_ps(r, P##_mul_ps(k, P##_set1_ps(-2.12194440e-4f)));                          \
            VT p = P##_set1_ps(1.9875691500e-4f);                                                    \
            p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(1.3981999507e-3f));                         \
            p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(8.3334519073e-3f));                         \
            p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(4.1665795894e-2f));                         \
            p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(1.6666665459e-1f));                         \
            p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(5.0000001201e-1f));                         \
            p = P##_add_ps(P##_add_ps(P##_mul_ps(p, P##_mul_ps(r, r)), r), P##_set1_ps(1.0f));       \
            SI bits = P##_slli_epi32(P##_add_epi32(P##_cvttps_epi32(k), P##_set1_epi32(127)), 23);   \
            P##_storeu_ps(full ? a + i : t, P##_mul_ps(p, P##_castsi##W##_ps(bits)));                \
            if (!full) memcpy(a + i, t, (size_t)(n - i) * sizeof(float));                           \
        }                                                                                            \
    }
EXP_BLOCK(exp_block_avx2, T_AVX2, 8, __m256, __m256i, _mm256, 256)
EXP_BLOCK(exp_block_avx512, T_512, 16, __m512, __m512i, _mm512, 512)
#undef EXP_BLOCK

/* sum() in AVX2 registers: lanes 0-7 and 8-15 of its 16 running sums, the tail's missing lanes
 * adding 0 as its load_tail does, then reduce_lanes' tree (lanes l + l + 8 first, then
 * avx2_reduce's), so the same value. GCC lowered sum's 16-lane vector through the stack here:
 * a tenth of an 11-row attention. */
T_AVX2 static float sum_avx2(const float *a, Py_ssize_t n) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = _mm256_add_ps(lo, _mm256_loadu_ps(a + i));
        hi = _mm256_add_ps(hi, _mm256_loadu_ps(a + i + 8));
    }
    if (i < n) {
        float t[16];
        for (int l = 0; l < 16; l++) t[l] = i + l < n ? a[i + l] : 0.0f;
        lo = _mm256_add_ps(lo, _mm256_loadu_ps(t));
        hi = _mm256_add_ps(hi, _mm256_loadu_ps(t + 8));
    }
    return avx2_reduce(_mm256_add_ps(lo, hi));
}
T_512 static float sum_avx512(const float *a, Py_ssize_t n) { return sum(a, n); }

/* max_of with intrinsics (GCC lowers max_of's lane compares to scalar code for AVX2): the
 * same LANES (16) running maxima, lane l over the indices = l mod 16 (max_ps(x, m) is exactly
 * x > m ? x : m, NaN and signed zeros included), combined by max_finish, as max_of does. */
T_AVX2 static float max_avx2(const float *a, Py_ssize_t n) {
    __m256 m0 = _mm256_set1_ps(a[0]), m1 = m0;
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(a + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(a + i + 8), m1);
    }
    float top[LANES];
    _mm256_storeu_ps(top, m0);
    _mm256_storeu_ps(top + 8, m1);
    return max_finish(top, a, i, n);
}

T_512 static float max_avx512(const float *a, Py_ssize_t n) {
    __m512 m = _mm512_set1_ps(a[0]);
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(a + i), m);
    float top[LANES];
    _mm512_storeu_ps(top, m);
    return max_finish(top, a, i, n);
}
#endif

/* The slots of the keys visible to the step's row at place `at` = b * Q + qi, in key order,
 * into slots; returns their count. Branch-free: each key's slot is written, and kept when the
 * mask shows the key. */
ALWAYS_INLINE Py_ssize_t visible_slots(const Attention *a, Py_ssize_t at, int64_t *slots) {
    Py_ssize_t K = a->K, b = at / a->Q, n = 0;
    const uint8_t *m = a->mask ? a->mask + at * K : NULL;
    const int64_t *read = a->read ? a->read + b * K : NULL;
    if (!m) {
        for (Py_ssize_t j = 0; j < K; j++) slots[j] = read ? read[j] : a->start + j;
        return K;
    }
    for (Py_ssize_t j = 0; j < K; j++) {
        slots[n] = read ? read[j] : a->start + j;
        n += m[j] != 0;
    }
    return n;
}

typedef struct Barrier Barrier;
static void team_wait(Barrier *b, int n);
static void share(Py_ssize_t items, int t, int nt, Py_ssize_t *r0, Py_ssize_t *r1);

/* A head's scores p[0..n) in place as exp(p[c] - their max): its softmax before the division
 * by their total. */
ALWAYS_INLINE void exp_minus_max(float *p, Py_ssize_t n, MaxFn max_fn, ExpFn exp_block) {
    const float top = max_fn(p, n);
    for (Py_ssize_t c = 0; c < n; c++) p[c] = p[c] - top;
    exp_block(p, n);
}

/* Query row `row` of q, heads [h0, h0 + gn) of KV head kvh (a head's values never depend on
 * which of its group's heads share the call), over the n keys at `slots` (visible_slots of the
 * row); scratch: gn * K scores, gn * D sums. */
ALWAYS_INLINE void attend_heads(const Attention *a, Py_ssize_t row, Py_ssize_t kvh, Py_ssize_t h0, Py_ssize_t gn,
                                const int64_t *slots, Py_ssize_t n, float *p, float *acc, ScoresFn scores,
                                ValuesFn values, ExpFn exp_block, MaxFn max_fn, SumFn sum_fn) {
    Py_ssize_t D = a->D, K = a->K;
    const void *kh = kv_row(a->k, kvh * a->S, D, a->half), *vh = kv_row(a->v, kvh * a->S, D, a->half);
    scores(a->q + (row * a->H + h0) * D, gn, D, kh, vh, slots, n, p, K, a->scale);
    for (Py_ssize_t g = 0; g < gn; g++) exp_minus_max(p + g * K, n, max_fn, exp_block);
    values(p, gn, D, vh, slots, n, K, acc, 0, D);
    for (Py_ssize_t g = 0; g < gn; g++) {
        float total = n ? sum_fn(p + g * K, n) : 1.0f;
        float *out = a->o + (row * a->H + h0 + g) * D;
        for (Py_ssize_t d = 0; d < D; d++) out[d] = acc[g * D + d] / total;
    }
}

/* The units [t0, t1) of R * H, numbered in blocks of ATT_ROW_BLOCK query rows (the last one
 * shorter) and within a block by KV head, query row, head of the KV head's group, from the
 * slowest to the fastest: each run of heads of one row and one KV head goes together, so one
 * thread reads the row's keys once for all its heads; and a KV head's K/V rows (a few hundred
 * KiB at a thousand keys) stay in L2 while the block's rows read them, instead of coming from
 * L3 (or memory) once per row. A row's visible slots are listed once per block, for all its
 * units. The order only decides when a unit runs, never how. */
#ifndef ATT_ROW_BLOCK
#define ATT_ROW_BLOCK 16
#endif
ALWAYS_INLINE int attention_units(const Attention *a, Py_ssize_t t0, Py_ssize_t t1, ScoresFn scores,
                                  ValuesFn values, ExpFn exp_block, MaxFn max_fn, SumFn sum_fn) {
    const Py_ssize_t G = a->H / a->KVH, H = a->H, K = a->K;
    int64_t *slots = malloc((size_t)(ATT_ROW_BLOCK * K) * sizeof(int64_t));
    float *p = malloc((size_t)(G * K + G * a->D) * sizeof(float));
    if (!slots || !p) {
        free(slots);
        free(p);
        return -1;
    }
    Py_ssize_t counts[ATT_ROW_BLOCK]; /* visible keys of the block's rows; -1: not listed yet */
    Py_ssize_t block = -1;
    for (Py_ssize_t t = t0; t < t1;) {
        const Py_ssize_t b = t / (ATT_ROW_BLOCK * H), first = b * ATT_ROW_BLOCK;
        const Py_ssize_t rows = a->R - first < ATT_ROW_BLOCK ? a->R - first : ATT_ROW_BLOCK;
        const Py_ssize_t u = t - first * H, kvh = u / (rows * G), i = u % (rows * G) / G, g = u % G;
        const Py_ssize_t row = first + i, gn = G - g < t1 - t ? G - g : t1 - t;
        if (b != block) {
            for (Py_ssize_t r = 0; r < ATT_ROW_BLOCK; r++) counts[r] = -1;
            block = b;
        }
        if (counts[i] < 0) counts[i] = visible_slots(a, a->row_at ? a->row_at[row] : row, slots + i * K);
        attend_heads(a, row, kvh, kvh * G + g, gn, slots + i * K, counts[i], p, p + G * K, scores, values, exp_block,
                     max_fn, sum_fn);
        t += gn;
    }
    free(slots);
    free(p);
    return 0;
}

/* Attention of a step's one query row (a decoding step: R = 1) by a team of nt threads
 * (layers()' team, or attention_row_team's for step_ops.attention), in three parts with the team meeting after each: (1) the scores, the row's visible
 * keys split between the threads in runs of 4 (scores' groups), each thread every KV head's
 * heads over its keys; (2) each head's softmax (max, exp, total), the heads split; (3) the
 * values, the head size split in parts of VALUES_PART columns, each thread every head's sums
 * over every key for its columns. So each thread reads about 1/nt of the K and V rows, where
 * attention_units splitting whole heads had one of two threads read two of the three KV heads.
 * Every score, exp, total and sum is computed by the operations attend_heads uses, in the same
 * order: the same values as attention_units, whatever nt. Scratch `p`, shared by the team:
 * ROW_SPLIT_SCRATCH(a) floats, the H * K scores then the H totals. Returns -1 (after meeting the
 * team twice, as every thread must) when out of memory. */
#define ROW_SPLIT_SCRATCH(a) ((a)->H * (a)->K + (a)->H)
ALWAYS_INLINE int attention_row_split(const Attention *a, float *p, Barrier *bar, int t, int nt, ScoresFn scores,
                                      ValuesFn values, ExpFn exp_block, MaxFn max_fn, SumFn sum_fn) {
    const Py_ssize_t H = a->H, G = H / a->KVH, K = a->K, D = a->D, S = a->S;
    float *totals = p + H * K;
    int64_t *slots = malloc((size_t)K * sizeof(int64_t));
    float *acc = malloc((size_t)(H * D) * sizeof(float));
    const int ok = slots && acc;
    Py_ssize_t n = ok ? visible_slots(a, a->row_at ? a->row_at[0] : 0, slots) : 0, r0, r1;
    share(n / 4, t, nt, &r0, &r1); /* the last part also takes the n % 4 left; fewer than 4: thread 0 */
    const Py_ssize_t k0 = 4 * r0, k1 = (r0 < r1 && r1 == n / 4) || (n < 4 && t == 0) ? n : 4 * r1;
    if (k0 < k1)
        for (Py_ssize_t kvh = 0; kvh < a->KVH; kvh++)
            scores(a->q + kvh * G * D, G, D, kv_row(a->k, kvh * S, D, a->half), kv_row(a->v, kvh * S, D, a->half),
                   slots + k0, k1 - k0, p + kvh * G * K + k0, K, a->scale);
    team_wait(bar, nt);
    share(H, t, nt, &r0, &r1);
    for (Py_ssize_t h = r0; h < r1 && n; h++) {
        exp_minus_max(p + h * K, n, max_fn, exp_block);
        totals[h] = sum_fn(p + h * K, n);
    }
    team_wait(bar, nt);
    const Py_ssize_t parts = D % VALUES_PART ? 1 : D / VALUES_PART;
    share(parts, t, nt, &r0, &r1);
    const Py_ssize_t d0 = r0 * (D / parts), d1 = r1 * (D / parts);
    if (ok && d0 < d1)
        for (Py_ssize_t kvh = 0; kvh < a->KVH; kvh++) {
            values(p + kvh * G * K, G, D, kv_row(a->v, kvh * S, D, a->half), slots, n, K, acc + kvh * G * D, d0, d1);
            for (Py_ssize_t h = kvh * G; h < (kvh + 1) * G; h++) {
                const float total = n ? totals[h] : 1.0f; /* no visible key: zeros, as attend_heads */
                for (Py_ssize_t d = d0; d < d1; d++) a->o[h * D + d] = acc[h * D + d] / total;
            }
        }
    free(slots);
    free(acc);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------ one copy per path */

/* The attention functions of one path for each pool element type: NAME (float32), NAME_h (float16). */
#define KV_TWINS(SUFFIX, TARGET)                                                                              \
    TARGET static void scores_##SUFFIX(const float *q0, Py_ssize_t G, Py_ssize_t D, const void *kh,           \
                                       const void *vh, const int64_t *slots, Py_ssize_t n, float *p, Py_ssize_t K, \
                                       float scale) {                                                         \
        scores_##SUFFIX##_of(q0, G, D, kh, vh, slots, n, p, K, scale, 0);                                     \
    }                                                                                                         \
    TARGET static void scores_##SUFFIX##_h(const float *q0, Py_ssize_t G, Py_ssize_t D, const void *kh,       \
                                           const void *vh, const int64_t *slots, Py_ssize_t n, float *p,      \
                                           Py_ssize_t K, float scale) {                                       \
        scores_##SUFFIX##_of(q0, G, D, kh, vh, slots, n, p, K, scale, 1);                                     \
    }                                                                                                         \
    TARGET static void values_##SUFFIX(const float *p, Py_ssize_t G, Py_ssize_t D, const void *vh,            \
                                       const int64_t *slots, Py_ssize_t n, Py_ssize_t K, float *acc, Py_ssize_t d0, \
                                       Py_ssize_t d1) {                                                       \
        values_##SUFFIX##_of(p, G, D, vh, slots, n, K, acc, d0, d1, 0);                                       \
    }                                                                                                         \
    TARGET static void values_##SUFFIX##_h(const float *p, Py_ssize_t G, Py_ssize_t D, const void *vh,        \
                                           const int64_t *slots, Py_ssize_t n, Py_ssize_t K, float *acc,      \
                                           Py_ssize_t d0, Py_ssize_t d1) {                                    \
        values_##SUFFIX##_of(p, G, D, vh, slots, n, K, acc, d0, d1, 1);                                       \
    }

#define PATHS(SUFFIX, TARGET)                                                                              \
    TARGET static void rms_##SUFFIX(float *h, const float *delta, const float *w, float *y, Py_ssize_t r0, \
                                    Py_ssize_t r1, Py_ssize_t n, float eps) {                              \
        rms_rows(h, delta, w, y, r0, r1, n, eps);                                                          \
    }                                                                                                      \
    TARGET static void silu_##SUFFIX(const float *gu, float *out, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t n) { \
        silu_rows(gu, out, r0, r1, n, exp_block_##SUFFIX);                                                 \
    }                                                                                                      \
    TARGET static void rotary_##SUFFIX(const Rotary *a, Py_ssize_t r0, Py_ssize_t r1) {                    \
        rotary_rows(a, r0, r1, store_half_##SUFFIX);                                                       \
    }                                                                                                      \
    TARGET static int attention_##SUFFIX(const Attention *a, Py_ssize_t t0, Py_ssize_t t1) {              \
        return a->half ? attention_units(a, t0, t1, scores_##SUFFIX##_h, values_##SUFFIX##_h, exp_block_##SUFFIX, \
                                         max_##SUFFIX, sum_##SUFFIX)                                        \
                       : attention_units(a, t0, t1, scores_##SUFFIX, values_##SUFFIX, exp_block_##SUFFIX,   \
                                         max_##SUFFIX, sum_##SUFFIX);                                       \
    }                                                                                                      \
    TARGET static int attention_split_##SUFFIX(const Attention *a, float *p, Barrier *bar, int t, int nt) { \
        return a->half ? attention_row_split(a, p, bar, t, nt, scores_##SUFFIX##_h, values_##SUFFIX##_h,  \
                                             exp_block_##SUFFIX, max_##SUFFIX, sum_##SUFFIX)                \
                       : attention_row_split(a, p, bar, t, nt, scores_##SUFFIX, values_##SUFFIX,          \
                                             exp_block_##SUFFIX, max_##SUFFIX, sum_##SUFFIX);               \
    }

static void scores_generic_of(const float *q0, Py_ssize_t G, Py_ssize_t D, const void *kh, const void *vh,
                              const int64_t *slots, Py_ssize_t n, float *p, Py_ssize_t K, float scale, int half) {
    scores_generic(q0, G, D, kh, slots, n, p, K, scale, half); /* no prefetching here: vh unused */
}
static void values_generic_of(const float *p, Py_ssize_t G, Py_ssize_t D, const void *vh, const int64_t *slots,
                              Py_ssize_t n, Py_ssize_t K, float *acc, Py_ssize_t d0, Py_ssize_t d1, int half) {
    values_generic(p, G, D, vh, slots, n, K, acc, d0, d1, half);
}
#define scores_generic scores_generic_fn
#define values_generic values_generic_fn
KV_TWINS(generic, )
PATHS(generic, )
#undef scores_generic
#undef values_generic
#if PLD_X86
KV_TWINS(avx2, T_AVX2)
KV_TWINS(avx512, T_512)
PATHS(avx2, T_AVX2)
PATHS(avx512, T_512)
#endif

typedef void (*RmsFn)(float *, const float *, const float *, float *, Py_ssize_t, Py_ssize_t, Py_ssize_t, float);
typedef void (*SiluFn)(const float *, float *, Py_ssize_t, Py_ssize_t, Py_ssize_t);
typedef void (*RotaryFn)(const Rotary *, Py_ssize_t, Py_ssize_t);
typedef int (*AttentionFn)(const Attention *, Py_ssize_t, Py_ssize_t);
typedef int (*AttentionSplitFn)(const Attention *, float *, Barrier *, int, int);

#if PLD_X86
static const RmsFn RMS[] = {rms_generic, rms_avx2, rms_avx512};
static const SiluFn SILU[] = {silu_generic, silu_avx2, silu_avx512};
static const RotaryFn ROTARY[] = {rotary_generic, rotary_avx2, rotary_avx512};
static const StoreHalfFn STORE_HALF[] = {store_half_generic, store_half_avx2, store_half_avx512};
static const AttentionFn ATTENTION[] = {attention_generic, attention_avx2, attention_avx512};
static const AttentionSplitFn ATTENTION_SPLIT[] = {attention_split_generic, attention_split_avx2, attention_split_avx512};
#else
static const RmsFn RMS[] = {rms_generic};
static const SiluFn SILU[] = {silu_generic};
static const RotaryFn ROTARY[] = {rotary_generic};
static const StoreHalfFn STORE_HALF[] = {store_half_generic};
static const AttentionFn ATTENTION[] = {attention_generic};
static const AttentionSplitFn ATTENTION_SPLIT[] = {attention_split_generic};
#endif


/* Threads for `items` independent items of `work` multiply-adds in all. */
static int threads_for(Py_ssize_t items, double work) {
    int threads = 1;
#ifdef _OPENMP
    if (work >= PARALLEL_MIN_WORK) threads = omp_get_max_threads();
#endif
    return items < threads ? (int)items : threads;
}

/* ------------------------------------------------------------------ Python bindings */


static float as_float(PyObject *o, int *err) {
    double d = PyFloat_AsDouble(o);
    *err = d == -1.0 && PyErr_Occurred();
    return (float)d;
}

/* Split rows [0, rows) over threads; fn(r0, r1) per thread. */
#define OVER_ROWS(rows, work, CALL)                                                \
    do {                                                                           \
        int nt_ = threads_for((rows), (work));                                     \
        if (nt_ <= 1) {                                                            \
            Py_ssize_t r0 = 0, r1 = (rows);                                        \
            CALL;                                                                  \
        } else {                                                                   \
            _Pragma("omp parallel num_threads(nt_)") {                             \
                int t_ = omp_get_thread_num(), n_ = omp_get_num_threads();         \
                Py_ssize_t r0 = (rows) * t_ / n_, r1 = (rows) * (t_ + 1) / n_;     \
                CALL;                                                              \
            }                                                                      \
        }                                                                          \
    } while (0)

/* rms_norm(h, delta, w, y, rows, n, eps): h += delta (when delta is not 0), y = RMSNorm(h) * w. */
static PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *ptr[4];
    Py_ssize_t s[2];
    int err;
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "expected 7 arguments, got %zd", nargs);
    float eps = as_float(args[6], &err);
    if (err || parse_args(args, 6, 6, ptr, 4, s, 1) < 0) return NULL;
    RmsFn fn = RMS[current_isa];
    Py_BEGIN_ALLOW_THREADS
    OVER_ROWS(s[0], (double)s[0] * s[1] * 4, fn(ptr[0], ptr[1], ptr[2], ptr[3], r0, r1, s[1], eps));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* silu_mul(gate_up, out, rows, n): out = silu(gate_up[:, :n]) * gate_up[:, n:]. */
static PyObject *py_silu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *ptr[2];
    Py_ssize_t s[2];
    if (parse_args(args, nargs, 4, ptr, 2, s, 1) < 0) return NULL;
    SiluFn fn = SILU[current_isa];
    Py_BEGIN_ALLOW_THREADS
    OVER_ROWS(s[0], (double)s[0] * s[1] * 16, fn(ptr[0], ptr[1], r0, r1, s[1]));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* rotary_write(qkv, cos, sin, pos, slot, q, k, v, rows, stride, H, KVH, D, S, half) */
static PyObject *py_rotary_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *p[8];
    Py_ssize_t s[7];
    if (parse_args(args, nargs, 15, p, 8, s, 1) < 0) return NULL;
    Rotary a = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], s[0], s[1], s[2], s[3], s[4], s[5], s[6] != 0};
    RotaryFn fn = ROTARY[current_isa];
    Py_BEGIN_ALLOW_THREADS
    OVER_ROWS(a.rows, (double)a.rows * (a.H + 2 * a.KVH) * a.D * 2, fn(&a, r0, r1));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* attention(q, k, v, read, mask, o, B, Q, H, KVH, D, K, S, start, half, scale) */
static int attention_row_team(const Attention *a, int nt);

static PyObject *py_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *p[6];
    Py_ssize_t s[9];
    int err;
    if (nargs != 16) return PyErr_Format(PyExc_TypeError, "expected 16 arguments, got %zd", nargs);
    float scale = as_float(args[15], &err);
    if (err || parse_args(args, 15, 15, p, 6, s, 1) < 0) return NULL;
    Attention a = {.q = p[0], .k = p[1], .v = p[2], .read = p[3], .mask = p[4], .o = p[5], .row_at = NULL,
                   .R = s[0] * s[1], .B = s[0], .Q = s[1], .H = s[2], .KVH = s[3], .D = s[4], .K = s[5], .S = s[6],
                   .start = s[7], .scale = scale, .half = s[8] != 0};
    if (a.KVH == 0 || a.H % a.KVH) return PyErr_Format(PyExc_ValueError, "heads (%zd) must be a multiple of KV heads", a.H);
    AttentionFn fn = ATTENTION[current_isa];
    Py_ssize_t units = a.R * a.H;
    const double work = (double)a.B * a.Q * a.H * a.K * a.D * 2;
    const int team = a.R == 1 ? threads_for(units, work) : 1; /* one row: attention_row_split by a team */
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (team > 1) {
        failed = attention_row_team(&a, team);
    } else {
        OVER_ROWS(units, work, if (fn(&a, r0, r1)) {
            _Pragma("omp atomic write") failed = 1;
        });
    }
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ a whole step's layers */

/* The products, from gemv.c (its module's capsule "product"; set_product() installs it): thread
 * t of a team of nt computes its share of y's outputs. */
typedef void (*ProductFn)(const float *x, const void *w, const float *scale, const float *offset, float *y,
                          Py_ssize_t M, Py_ssize_t K, Py_ssize_t N, Py_ssize_t gs, int kind, int t, int nt);
static ProductFn product = NULL;

/* One layer's record (int64 each): for qkv, o, gate_up, down in turn the weight, scale,
 * offset (0 when absent), kind (0 fp32, 1 int8, 2 int4, 3 int8 per group) and group size; then the layer's input
 * norm, its post-attention norm, and the next layer's input norm (0 for the last layer). */
enum { PROJ_FIELDS = 5, REC_IN_NORM = 4 * PROJ_FIELDS, REC_POST_NORM, REC_NEXT_NORM, RECORD };

/* The barrier of layers()' team. A step's operations follow each other every few
 * microseconds, so a thread that arrives first spins (a pause per check) for up to a budget
 * before it sleeps: OpenMP's own barrier under OMP_WAIT_POLICY=PASSIVE (which the entry points
 * set, so that idle threads never burn a core) sleeps at once, and each wake-up costs tens of
 * microseconds, ten times a layer. Sleeping is a futex on Linux (else yielding the core at
 * each check).
 *
 * The budget: on a machine to itself almost every wait inside a step is shorter than
 * SPIN_NS (measured: 2% longer), and spinning that long is what makes two threads read at
 * twice one thread's rate. Where other processes hold the cores, a thread mostly waits for
 * one that was descheduled (95% of the waits are longer), and every spin takes CPU from the
 * thread being waited for; sleeping at once (SHORT_SPIN_NS) is then best. So layers() counts
 * the waits longer than SPIN_NS in a call made with the full budget; where they are more than
 * half, the next PROBE_EVERY - 1 calls use the short one, and every PROBE_EVERY-th call looks
 * again. Only the time a step takes depends on this, never a value.
 *
 * Sense by phase: the last thread to arrive resets the count and then advances the phase
 * (release), waking sleepers if there are any; the others wait for the phase to move
 * (acquire), so every write before the barrier is visible after it. A sleeper registers before
 * it sleeps and the futex sleeps only while the phase is unchanged, so no wake is lost. */
#define SPIN_NS 20000
#define SHORT_SPIN_NS 2000
#define PROBE_EVERY 16
struct Barrier {
    int count, phase, sleepers;
    long long spin_ns;       /* this call's budget */
    long waits, long_waits;  /* waits, and those longer than SPIN_NS (atomic counters) */
};

static void cpu_relax(void) {
#if PLD_X86
    __builtin_ia32_pause();
#endif
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void team_wait(Barrier *b, int n) {
    if (n <= 1) return;
    int phase = __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == n) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->phase, phase + 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
        if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST)) syscall(SYS_futex, &b->phase, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
        return;
    }
    long long start = 0, deadline = 0;
    for (unsigned checks = 1; __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE) == phase; checks++) {
        if (checks % 64) {
            cpu_relax();
            continue;
        }
        long long t = now_ns();
        if (start == 0) start = t, deadline = t + b->spin_ns;
        if (t < deadline) continue;
#ifdef __linux__
        __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, &b->phase, FUTEX_WAIT_PRIVATE, phase, NULL, NULL, 0);
        __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
#else
        sched_yield();
#endif
    }
    __atomic_add_fetch(&b->waits, 1, __ATOMIC_RELAXED);
    if (start && now_ns() - start >= SPIN_NS) __atomic_add_fetch(&b->long_waits, 1, __ATOMIC_RELAXED);
}

/* attention_row_split of a one-row step by a team of nt threads of its own (step_ops.attention;
 * layers() runs it in its team). Returns -1 when out of memory. */
static int attention_row_team(const Attention *a, int nt) {
    float *p = malloc((size_t)ROW_SPLIT_SCRATCH(a) * sizeof(float));
    if (p == NULL) return -1;
    AttentionSplitFn split = ATTENTION_SPLIT[current_isa];
    Barrier bar = {.spin_ns = SPIN_NS};
    int failed = 0;
    _Pragma("omp parallel num_threads(nt)") {
        if (split(a, p, &bar, omp_get_thread_num(), omp_get_num_threads())) {
            _Pragma("omp atomic write") failed = 1;
        }
    }
    free(p);
    return failed ? -1 : 0;
}

/* What layers() works on; every thread of the team reads it. */
typedef struct {
    float *h, *x, *qkv, *q, *o, *tmp, *gu, *act;
    float *split_scratch;    /* attention_row_split's, shared by the team (one-row steps by a team), else NULL */
    const float *cos, *sin;
    const int64_t *pos, *slot, *read, *records, *pools, *row_at;
    const uint8_t *mask;
    Py_ssize_t rows, hidden, H, KVH, D, inter, S, B, Q, K, start, L, width;
    float eps, scale;
    int half;                /* the pools hold float16 (else float32) */
} Layers;

/* Thread t of nt's share [r0, r1) of `items` independent items (empty for the threads left
 * out where there are fewer items than threads). The team is running already, so even a small
 * operation is split: the threads would otherwise wait at the next barrier. */
static void share(Py_ssize_t items, int t, int nt, Py_ssize_t *r0, Py_ssize_t *r1) {
    Py_ssize_t used = items < nt ? items : nt;
    *r0 = t < used ? items * t / used : 0;
    *r1 = t < used ? items * (t + 1) / used : 0;
}

/* Thread t's part of every operation of every layer, with the team's barrier after each. */
static int layers_part(const Layers *a, Barrier *bar, int t, int nt) {
    RmsFn rms = RMS[current_isa];
    SiluFn silu = SILU[current_isa];
    RotaryFn rotary = ROTARY[current_isa];
    AttentionFn attention = ATTENTION[current_isa];
    AttentionSplitFn split = ATTENTION_SPLIT[current_isa];
    Py_ssize_t rows = a->rows, hidden = a->hidden, HD = a->H * a->D, r0, r1;
    int failed = 0;
#define PROJ(rec, in, out, K_, N_) \
    product(in, (const void *)(intptr_t)(rec)[0], (const float *)(intptr_t)(rec)[1], (const float *)(intptr_t)(rec)[2], \
            out, rows, K_, N_, (Py_ssize_t)(rec)[4], (int)(rec)[3], t, nt)
#define NORM(delta, weight)                                                                          \
    do {                                                                                             \
        share(rows, t, nt, &r0, &r1);                                                                \
        if (r0 < r1) rms(a->h, delta, (const float *)(intptr_t)(weight), a->x, r0, r1, hidden, a->eps); \
    } while (0)
    NORM(NULL, a->records[REC_IN_NORM]);
    team_wait(bar, nt);
    for (Py_ssize_t l = 0; l < a->L; l++) {
        const int64_t *r = a->records + l * RECORD;
        void *pk = (void *)(intptr_t)a->pools[2 * l], *pv = (void *)(intptr_t)a->pools[2 * l + 1];
        PROJ(r, a->x, a->qkv, hidden, a->width);
        team_wait(bar, nt);
        Rotary ra = {a->qkv, a->cos, a->sin, a->pos, a->slot, a->q, pk, pv, rows, a->width, a->H, a->KVH, a->D, a->S,
                     a->half};
        share(rows, t, nt, &r0, &r1);
        if (r0 < r1) rotary(&ra, r0, r1);
        team_wait(bar, nt);
        Attention aa = {.q = a->q, .k = pk, .v = pv, .read = a->read, .mask = a->mask, .o = a->o, .row_at = a->row_at,
                        .R = rows, .B = a->B, .Q = a->Q, .H = a->H, .KVH = a->KVH, .D = a->D, .K = a->K, .S = a->S,
                        .start = a->start, .scale = a->scale, .half = a->half};
        if (a->split_scratch) { /* one row, a team: every thread part of every head (it meets the team twice inside) */
            if (split(&aa, a->split_scratch, bar, t, nt)) failed = 1;
        } else {
            share(rows * a->H, t, nt, &r0, &r1);
            if (r0 < r1 && attention(&aa, r0, r1)) failed = 1; /* the team goes on to the end, so no thread waits alone */
        }
        team_wait(bar, nt);
        PROJ(r + PROJ_FIELDS, a->o, a->tmp, HD, hidden);
        team_wait(bar, nt);
        NORM(a->tmp, r[REC_POST_NORM]);
        team_wait(bar, nt);
        PROJ(r + 2 * PROJ_FIELDS, a->x, a->gu, hidden, 2 * a->inter);
        team_wait(bar, nt);
        share(rows, t, nt, &r0, &r1);
        if (r0 < r1) silu(a->gu, a->act, r0, r1, a->inter);
        team_wait(bar, nt);
        PROJ(r + 3 * PROJ_FIELDS, a->act, a->tmp, a->inter, hidden);
        team_wait(bar, nt);
        if (r[REC_NEXT_NORM]) {
            NORM(a->tmp, r[REC_NEXT_NORM]);
        } else {
            share(rows, t, nt, &r0, &r1);
            for (Py_ssize_t i = r0 * hidden; i < r1 * hidden; i++) a->h[i] = a->h[i] + a->tmp[i];
        }
        team_wait(bar, nt);
    }
#undef PROJ
#undef NORM
    return failed;
}

/* layers(h, cos, sin, pos, slot, read, mask, records, pools, row_at, rows, hidden, H, KVH, D, inter, S, B,
 *        Q, K, start, L, half, eps, scale): the L decoder layers over the residual rows h [rows, hidden], in place:
 * per layer norm, QKV product, rotary + K/V write, attention, O product, residual add + norm,
 * gate/up product, SiLU gate, down product, residual add (+ the next layer's norm): the very
 * operations, in the same order, that PagedLlama._step_ops_forward calls one by one, so the
 * same values bitwise. pools: int64 [L, 2], each layer's K and V pool address. row_at: NULL
 * (rows = B * Q), or int64 [rows], the place b * Q + qi in the step of each row (which mask row
 * and which sequence's keys it reads): a batch whose sequences feed fewer than Q tokens runs
 * its real rows only, not the padding. One OpenMP region for the whole call (its team meets
 * at Barrier after each operation), so the threads are woken once per step, not once per
 * operation. */
static PyObject *py_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *p[10];
    Py_ssize_t s[13];
    int err1, err2;
    if (nargs != 25) return PyErr_Format(PyExc_TypeError, "expected 25 arguments, got %zd", nargs);
    if (product == NULL) return PyErr_Format(PyExc_RuntimeError, "set_product() was not called");
    float eps = as_float(args[23], &err1), scale = as_float(args[24], &err2);
    if (err1 || err2 || parse_args(args, 23, 23, p, 10, s, 1) < 0) return NULL;
    Layers a = {.h = p[0], .cos = p[1], .sin = p[2], .pos = p[3], .slot = p[4], .read = p[5], .mask = p[6],
                .records = p[7], .pools = p[8], .row_at = p[9], .rows = s[0], .hidden = s[1], .H = s[2], .KVH = s[3], .D = s[4],
                .inter = s[5], .S = s[6], .B = s[7], .Q = s[8], .K = s[9], .start = s[10], .L = s[11],
                .half = s[12] != 0, .eps = eps, .scale = scale};
    Py_ssize_t rows = a.rows, hidden = a.hidden;
    a.width = (a.H + 2 * a.KVH) * a.D;
    if (a.KVH == 0 || a.H % a.KVH || (a.row_at ? rows > a.B * a.Q : a.B * a.Q != rows))
        return PyErr_Format(PyExc_ValueError, "layers: bad shape");
    int failed = 0, team = 1;
#ifdef _OPENMP
    /* A team only where the products are split (gemv.c's product_threads: the QKV product's work). */
    if ((double)rows * hidden * a.width >= PARALLEL_MIN_WORK) team = omp_get_max_threads();
#endif
    const int split = rows == 1 && team > 1; /* attention_row_split, with its scratch */
    size_t floats = (size_t)rows * (size_t)(2 * hidden + a.width + 2 * a.H * a.D + 3 * a.inter);
    if (split) floats += (size_t)ROW_SPLIT_SCRATCH(&a);
    a.x = malloc(floats * sizeof(float));
    if (a.x == NULL) return PyErr_NoMemory();
    a.qkv = a.x + rows * hidden;
    a.q = a.qkv + rows * a.width;
    a.o = a.q + rows * a.H * a.D;
    a.tmp = a.o + rows * a.H * a.D;
    a.gu = a.tmp + rows * hidden;
    a.act = a.gu + rows * 2 * a.inter;
    if (split) a.split_scratch = a.act + rows * a.inter;
    static int calls, short_spins; /* the budget's state (see Barrier); read and written under the GIL */
    int probe = !short_spins || calls++ % PROBE_EVERY == 0;
    Barrier bar = {.spin_ns = probe ? SPIN_NS : SHORT_SPIN_NS};
    Py_BEGIN_ALLOW_THREADS
    if (team <= 1) {
        failed = layers_part(&a, &bar, 0, 1);
    } else {
        _Pragma("omp parallel num_threads(team)") {
            if (layers_part(&a, &bar, omp_get_thread_num(), omp_get_num_threads())) {
                _Pragma("omp atomic write") failed = 1;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (probe && bar.waits) short_spins = 2 * bar.long_waits > bar.waits;
    free(a.x);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_set_product(PyObject *self, PyObject *capsule) {
    void *fn = PyCapsule_GetPointer(capsule, "promptlookup._gemv.product");
    if (fn == NULL) return NULL;
    product = (ProductFn)fn;
    Py_RETURN_NONE;
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred()) return NULL;
    if (level < ISA_GENERIC || level > best_isa()) return PyErr_Format(PyExc_ValueError, "this CPU cannot run level %ld", level);
    current_isa = (int)level;
    Py_RETURN_NONE;
}

static PyObject *py_get_isa(PyObject *self, PyObject *unused) { return PyLong_FromLong(current_isa); }

static PyObject *py_exp(PyObject *self, PyObject *arg) {
    double x = PyFloat_AsDouble(arg);
    if (x == -1.0 && PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(exp_one((float)x));
}

/* store_half(src, dst, n): the current path's rounding of n floats into float16 (tests). */
static PyObject *py_store_half(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *p[2];
    Py_ssize_t s[1];
    if (parse_args(args, nargs, 3, p, 2, s, 0) < 0) return NULL;
    STORE_HALF[current_isa]((uint16_t *)p[1], (const float *)p[0], s[0]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL, "rms_norm(h, delta, w, y, rows, n, eps)"},
    {"silu_mul", (PyCFunction)(void (*)(void))py_silu_mul, METH_FASTCALL, "silu_mul(gate_up, out, rows, n)"},
    {"rotary_write", (PyCFunction)(void (*)(void))py_rotary_write, METH_FASTCALL,
     "rotary_write(qkv, cos, sin, pos, slot, q, k, v, rows, stride, H, KVH, D, S, half)"},
    {"attention", (PyCFunction)(void (*)(void))py_attention, METH_FASTCALL,
     "attention(q, k, v, read, mask, o, B, Q, H, KVH, D, K, S, start, half, scale)"},
    {"layers", (PyCFunction)(void (*)(void))py_layers, METH_FASTCALL,
     "layers(h, cos, sin, pos, slot, read, mask, records, pools, row_at, rows, hidden, H, KVH, D, inter, S, B, Q, K, start, L, "
     "half, eps, scale)"},
    {"store_half", (PyCFunction)(void (*)(void))py_store_half, METH_FASTCALL,
     "store_half(src, dst, n): n floats rounded to float16 as rotary_write stores them (tests)"},
    {"set_product", py_set_product, METH_O, "set_product(capsule): the products of gemv.c, for layers()"},
    {"set_isa", py_set_isa, METH_O, "set_isa(level): 0 generic, 1 avx2, 2 avx512"},
    {"get_isa", py_get_isa, METH_NOARGS, "the path in use (0, 1 or 2)"},
    {"exp", py_exp, METH_O, "exp(x): the kernels' e^x of one float (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef step_ops_module = {
    PyModuleDef_HEAD_INIT, "_step_ops", "per-row layer work around the products (see step_ops.c)", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__step_ops(void) {
    current_isa = best_isa();
    return PyModule_Create(&step_ops_module);
}
