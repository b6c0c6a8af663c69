/* y = x @ W.T for the few rows of a decode or verification step: fp32, int8 (per channel or
 * per group) and int4 weights, fp32 activations (the contract:
 * promptlookup/runtime/kernels/__init__.py).
 *
 * Instruction sets, chosen at run time: AVX-512 (avx512f+bw+vl), AVX2+FMA, and a portable
 * generic path. Each kernel family is written once per path; set_isa() selects one, and
 * refuses a path this CPU cannot run.
 *
 * Row invariance (the hard requirement): output y[m, n] is computed by the same sequence
 * of floating-point operations whatever the number of rows and the row's place among them.
 * Every path keeps one accumulator per (row, output) pair -- a vector of L lanes (16, 8,
 * or 8 emulated lanes on the generic path), lane l summing the products of the columns k
 * with k % L == l in increasing k -- reduced by a fixed tree at the end. Rows are blocked
 * (4 rows share each weight load on the AVX-512 and generic paths, 3 on AVX2's 16
 * registers) and outputs are blocked (4 weight rows per step; AVX2's fp32 at 2-16 rows and
 * int8 per channel at 2+ rows: 3 weight rows x 4 rows, avx2_wide_block), but a block of fewer rows
 * runs the very same operations on each of its accumulators, so the blocking changes which
 * loads are shared, never the arithmetic. Quantized weights times more rows than one block
 * are first dequantized, a block of weight rows at a time, into a scratch that the fp32
 * block then reads: the same values the direct loads give, so the same results.
 * One row times 4 weight rows (a decoding step) has its own written-out int8 and int4
 * kernels (*_row4): the same operations as the general blocks, in the same order, with the
 * weight rows prefetched PF_BLOCKS blocks ahead into L1 and FAR_BLOCKS blocks ahead into L2
 * (the two streams together: int8 steps 0.81-0.93x the time of the near one alone, int4
 * 0.77-1.05x, noisy). int4 steps go a group at a time; AVX-512
 * looks int4 weights up in a per-group table of the 16 values code * scale + offset (one
 * FMA per group, so each the value an FMA per element gives; one row reads x permuted so
 * that the lookup's indices need one shift, avx512_i4_deq_perm). AVX2's int4 sums instead, per
 * group, x times the codes (each byte's low nibble and whole byte, against a transformed copy
 * of x, so no shift per weight) and scales that sum; the offsets' term is one dot product per
 * output with the groups' sums of x. No dequantizing per weight; its own order, the same for
 * every row count (see avx2_i4_prep). Rows go in pairs (avx2_i4_rows2: each block of 4
 * weight rows decoded in registers once for both rows; the block stays in L1 for the next
 * pair), an odd last row alone; decoding into a float scratch once for all rows, read back
 * by each, was 1.03-1.65x slower at 3-33 rows (docs/benchmarks.md).
 * int8 per group (kind 3) dequantizes each weight by one FMA (code * scale + offset, a group's
 * scale and offset broadcast once) and then runs the fp32 block's operations on it, on both
 * SIMD paths: the one-row kernels (*_i8g_row4), the small blocks and the scratch alike.
 * Two rows times 4 weight rows (a one-token draft's verification) have their own kernels for
 * int8 per group (both paths) and int4 (AVX-512: the permuted lookup of avx512_i4_row4;
 * AVX2: avx2_i4_rows2): each weight decoded once for both rows, each output's operations
 * those of the one-row kernel, in its order.
 * One-row fp32 blocks prefetch their weight rows F32_PF bytes ahead, and F32_FAR bytes beyond
 * that into L2 (a plain step 0.95-0.97x the time of the near stream alone; same operations).
 * Blocks of several rows prefetch the next block of weight rows while their first block of
 * rows runs, and reduce their sums several at a time (avx512_reduce16, avx2_reduce8): the
 * very additions of the one-sum reduction, in its order, so the same results.
 * The file is built with -ffp-contract=off, so the compiler never fuses a multiply and an
 * add differently in two specialisations of a block.
 *
 * Threads: output rows are split across OpenMP threads (as many as the calling thread's
 * omp_get_max_threads(), which is torch.get_num_threads() since the module links the libgomp
 * torch already loaded); the split only decides which thread computes an output, never how.
 *
 * Cost: one pass over the weight per call (each block of NB_MAX weight rows is read from
 * memory once and from L1 for every further block of rows) and rows * in * out FMAs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define NB_MAX 4 /* weight rows per block (generic and AVX2; AVX-512: AVX512_NB) */
#ifndef PF_BLOCKS
#define PF_BLOCKS 2 /* the one-row quantized kernels prefetch the weight rows this many blocks ahead */
#endif
#ifndef FAR_BLOCKS
#define FAR_BLOCKS 4 /* ... and this many blocks ahead into L2 */
#endif
#ifndef F32_NB
#define F32_NB 4 /* weight rows per block of the one-row fp32 kernels */
#endif
#ifndef F32_PF
#define F32_PF 8192 /* bytes ahead the one-row fp32 kernels prefetch their weight rows (0: none; 8 KiB measured best) */
#endif
#ifndef F32_FAR
#define F32_FAR 8192 /* bytes past F32_PF that the one-row fp32 kernels prefetch into L2 */
#endif
#ifndef AVX2_F32_NB
#define AVX2_F32_NB 2 /* weight rows per block of the AVX2 one-row fp32 kernel */
#endif
#ifndef AVX2_F32_STREAMS
#define AVX2_F32_STREAMS 4 /* blocks it reads at once (4 of 2 rows, 8 of 1 best on a Zen 3; 2 of 4 0.86x) */
#endif
#ifndef F32_HINT
#define F32_HINT _MM_HINT_T0
#endif
#define SPLIT 24 /* threads take outputs in multiples of this (of every path's block of weight rows) */

#include "cpu_kernels.h" /* PLD_X86, T_AVX2/T_512, ALWAYS_INLINE, ISA levels, best_isa(), the reductions, parse_args() */
static const char *const ISA_NAMES[] = {"generic", "avx2", "avx512"};

/* One call's operands. A kernel computes outputs [n0, n1) of every row. */
typedef struct {
    const float *x;      /* [M, K] */
    const void *w;       /* fp32 [N, K]; int8 and int8 per group [N, K]; int4 uint8 [N, K / 2] */
    const float *scale;  /* int8: [N]; int4 and int8 per group: [N, K / gs] */
    const float *offset; /* int4 and int8 per group: [N, K / gs] */
    float *y;            /* [M, N] */
    Py_ssize_t M, K, N, gs;
} Product;

typedef void (*RangeFn)(const Product *p, Py_ssize_t n0, Py_ssize_t n1);

/* ------------------------------------------------------------------ generic (8 lanes) */

#define GL 8

ALWAYS_INLINE float gen_reduce(const float *a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Weights of `nb` rows for columns [k, k + len) (len <= GL) as floats, zero-padded. */
typedef void (*GenLoad)(const Product *p, Py_ssize_t n, Py_ssize_t k, Py_ssize_t len, float *out);

ALWAYS_INLINE void gen_block(const Product *p, Py_ssize_t m0, int mb, Py_ssize_t n0, int nb, GenLoad load) {
    float acc[4][NB_MAX][GL];
    float wv[NB_MAX][GL], xv[GL];
    memset(acc, 0, sizeof acc);
    for (Py_ssize_t k = 0; k < p->K; k += GL) {
        Py_ssize_t len = p->K - k < GL ? p->K - k : GL;
        for (int j = 0; j < nb; j++) load(p, n0 + j, k, len, wv[j]);
        for (int i = 0; i < mb; i++) {
            const float *xr = p->x + (m0 + i) * p->K + k;
            for (int l = 0; l < GL; l++) xv[l] = l < len ? xr[l] : 0.0f;
            for (int j = 0; j < nb; j++)
                for (int l = 0; l < GL; l++) acc[i][j][l] += xv[l] * wv[j][l];
        }
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) p->y[(m0 + i) * p->N + n0 + j] = gen_reduce(acc[i][j]);
}

static void gen_load_f32(const Product *p, Py_ssize_t n, Py_ssize_t k, Py_ssize_t len, float *out) {
    const float *w = (const float *)p->w + n * p->K + k;
    for (int l = 0; l < GL; l++) out[l] = l < len ? w[l] : 0.0f;
}

static void gen_load_i8(const Product *p, Py_ssize_t n, Py_ssize_t k, Py_ssize_t len, float *out) {
    const int8_t *w = (const int8_t *)p->w + n * p->K + k;
    for (int l = 0; l < GL; l++) out[l] = l < len ? (float)w[l] : 0.0f;
}

static void gen_load_i4(const Product *p, Py_ssize_t n, Py_ssize_t k, Py_ssize_t len, float *out) {
    const uint8_t *w = (const uint8_t *)p->w + n * (p->K / 2);
    Py_ssize_t groups = p->K / p->gs;
    if (len == GL && p->gs % GL == 0) { /* the GL columns are one group's (k % GL == 0): one lookup */
        const float sc = p->scale[n * groups + k / p->gs], of = p->offset[n * groups + k / p->gs];
        for (int l = 0; l < GL; l++) {
            uint8_t b = w[(k + l) >> 1];
            out[l] = (float)((l & 1) ? (b >> 4) : (b & 0xF)) * sc + of;
        }
        return;
    }
    for (int l = 0; l < GL; l++) {
        if (l >= len) { out[l] = 0.0f; continue; }
        Py_ssize_t c = k + l, g = c / p->gs;
        uint8_t b = w[c >> 1];
        float code = (float)((c & 1) ? (b >> 4) : (b & 0xF));
        out[l] = code * p->scale[n * groups + g] + p->offset[n * groups + g];
    }
}

/* int8 per group: code * scale + offset (two roundings: the file is built without contraction) */
static void gen_load_i8g(const Product *p, Py_ssize_t n, Py_ssize_t k, Py_ssize_t len, float *out) {
    const int8_t *w = (const int8_t *)p->w + n * p->K + k;
    Py_ssize_t groups = p->K / p->gs;
    if (len == GL && p->gs % GL == 0) { /* the GL columns are one group's (k % GL == 0): one lookup */
        const float sc = p->scale[n * groups + k / p->gs], of = p->offset[n * groups + k / p->gs];
        for (int l = 0; l < GL; l++) out[l] = (float)w[l] * sc + of;
        return;
    }
    for (int l = 0; l < GL; l++) {
        Py_ssize_t gi = n * groups + (k + l) / p->gs;
        out[l] = l < len ? (float)w[l] * p->scale[gi] + p->offset[gi] : 0.0f;
    }
}

/* Rows in blocks of 4, then the 1-3 left; outputs in blocks of NB_MAX, then one at a time. */
#define GEN_RANGE(NAME, LOAD)                                                               \
    static void NAME(const Product *p, Py_ssize_t n0, Py_ssize_t n1) {                      \
        Py_ssize_t n = n0;                                                                  \
        for (; n < n1; n += NB_MAX) {                                                       \
            int nb = n1 - n < NB_MAX ? (int)(n1 - n) : NB_MAX;                              \
            Py_ssize_t m = 0;                                                               \
            for (; m + 4 <= p->M; m += 4) gen_block(p, m, 4, n, nb, LOAD);                  \
            if (m < p->M) gen_block(p, m, (int)(p->M - m), n, nb, LOAD);                    \
        }                                                                                   \
    }

GEN_RANGE(gen_f32, gen_load_f32)
GEN_RANGE(gen_i8, gen_load_i8)
GEN_RANGE(gen_i4, gen_load_i4)
GEN_RANGE(gen_i8g, gen_load_i8g)

/* int8 and int4 scale their sums per output (int8) -- the generic loads above dequantize
 * int8 to the code only, so the scale is applied here, once per output, as the SIMD paths do. */
static void gen_i8_scaled(const Product *p, Py_ssize_t n0, Py_ssize_t n1) {
    gen_i8(p, n0, n1);
    for (Py_ssize_t m = 0; m < p->M; m++)
        for (Py_ssize_t n = n0; n < n1; n++) p->y[m * p->N + n] *= p->scale[n];
}

/* int8 on the scratch path: the fp32 code's sums times the output's scale, the one rounding
 * the direct int8 blocks apply too. */
static void scale_outputs(const Product *p, Py_ssize_t n0, int nb) {
    for (Py_ssize_t m = 0; m < p->M; m++)
        for (int j = 0; j < nb; j++) p->y[m * p->N + n0 + j] *= p->scale[n0 + j];
}

/* Blocks of many rows prefetch the next block of 4 weight rows (contiguous) while the first
 * block of rows runs on the current one: PF_LINES(kind) cache lines per step of 16 columns
 * cover 4 rows of 16 columns (fp32: 4 lines; int8: 1; int4: half a line, so 1 reaches a
 * step's lines twice as fast, the rest of the prefetches landing past the block). */
#ifndef BLOCK_HINT /* into L2: the block's first block of rows brings each line on to L1 itself */
#define BLOCK_HINT _MM_HINT_T1 /* 11 rows of SmolLM2's 30 layers from memory, 1 thread: 0.93x T0's time (AVX2 0.95x) */
#endif
#define PF_LINES(kind) ((kind) == 0 ? 4 : 1)

/* FN(..., gs) with the common group sizes passed as constants, so FN's (inlined) steps unroll
 * for them: the one-row grouped kernels' entry points. */
#define WITH_GROUP_SIZE(gs, FN, ...)                                                        \
    do {                                                                                    \
        if ((gs) == 32) FN(__VA_ARGS__, 32);                                                \
        else if ((gs) == 128) FN(__VA_ARGS__, 128);                                         \
        else FN(__VA_ARGS__, (gs));                                                         \
    } while (0)
static const char *next_block(const Product *p, Py_ssize_t n, int kind) {
    if (kind == 0) return (const char *)((const float *)p->w + n * p->K);
    if (kind == 1 || kind == 3) return (const char *)p->w + n * p->K;
    return (const char *)p->w + n * (p->K / 2);
}

#if PLD_X86
/* ------------------------------------------------------------------ AVX2 + FMA (8 lanes) */

#ifndef AVX2_MB
/* 4 weight rows x 3 rows: 12 accumulators + 4 weights + 1 x (11 rows of 30 layers from memory:
 * 0.87x the time of 2 x 4, which kept only 8 sums in flight for the FMAs' latency) */
#define AVX2_MB 3
#endif


/* The sums of 8 accumulators a[2 * j + i] (unused ones zero), each by the very additions of
 * avx2_reduce in the same operand order (lane l + lane l + 4, then + 2, + 1), in shuffled
 * vectors: out[4 * i + j] is the sum of a[2 * j + i]. */
T_AVX2 ALWAYS_INLINE void avx2_reduce8(const __m256 *a, float *out) {
    __m256 v[4], u[2];
    for (int q = 0; q < 4; q++) /* [a s0-3, b s0-3]: lanes 0-3 + lanes 4-7 */
        v[q] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * q], a[2 * q + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * q], a[2 * q + 1], 0x31));
    for (int q = 0; q < 2; q++) /* s0 + s2, s1 + s3 */
        u[q] = _mm256_add_ps(_mm256_shuffle_ps(v[2 * q], v[2 * q + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(v[2 * q], v[2 * q + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1))));
}

T_AVX2 ALWAYS_INLINE __m256i avx2_tail_mask(Py_ssize_t len) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)len), lanes);
}

/* The 8 weights of row n at columns [k, k + 8), as floats (the kind-specific part). */
T_AVX2 ALWAYS_INLINE __m256 avx2_w_f32(const Product *p, Py_ssize_t n, Py_ssize_t k) {
    return _mm256_loadu_ps((const float *)p->w + n * p->K + k);
}
T_AVX2 ALWAYS_INLINE __m256 avx2_w_i8(const Product *p, Py_ssize_t n, Py_ssize_t k) {
    __m128i b = _mm_loadl_epi64((const __m128i *)((const int8_t *)p->w + n * p->K + k));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

/* int8 per group (group_size % 16 == 0, so 8 columns never cross a group): the 8 codes at w
 * as code * scale + offset, by one FMA (every int8-per-group load of this path is this one). */
T_AVX2 ALWAYS_INLINE __m256 avx2_i8g_deq(const int8_t *w, __m256 scale, __m256 offset) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)w))), scale, offset);
}
T_AVX2 ALWAYS_INLINE __m256 avx2_w_i8g(const Product *p, Py_ssize_t n, Py_ssize_t k) {
    const Py_ssize_t gi = n * (p->K / p->gs) + k / p->gs;
    return avx2_i8g_deq((const int8_t *)p->w + n * p->K + k, _mm256_broadcast_ss(p->scale + gi),
                        _mm256_broadcast_ss(p->offset + gi));
}

/* Tail (len < 8 columns left; fp32 and int8 only: int8 per group has none): zero-padded
 * copies, so no load reads past the row. */
T_AVX2 ALWAYS_INLINE __m256 avx2_w_tail(const Product *p, Py_ssize_t n, Py_ssize_t k, Py_ssize_t len, int kind) {
    float buf[8];
    if (kind == 0) {
        return _mm256_maskload_ps((const float *)p->w + n * p->K + k, avx2_tail_mask(len));
    }
    const int8_t *w = (const int8_t *)p->w + n * p->K + k;
    for (int l = 0; l < 8; l++) buf[l] = l < len ? (float)w[l] : 0.0f;
    return _mm256_loadu_ps(buf);
}

/* kind 0: fp32, 1: int8 (sums scaled per output at the end), 3: int8 per group; with `scr`
 * (rows of weights already as floats, from avx2_dequant_i8g) kind 0. Weight rows n0 + j; with
 * nfar >= 0, rows 2 and 3 of the block are nfar and nfar + 1 instead (two pairs of rows far
 * apart, avx2_f32_far_pairs), pf2 prefetching the far pair's next rows as pf the near one's.
 * Each output's operations are the same either way. */
T_AVX2 ALWAYS_INLINE void avx2_block_far(const Product *p, Py_ssize_t m0, int mb, Py_ssize_t n0, int nb, int kind,
                                         const float *scr, const char *pf, int pfl, Py_ssize_t nfar, const char *pf2) {
    Py_ssize_t nr[NB_MAX];
    for (int j = 0; j < NB_MAX; j++) nr[j] = nfar >= 0 && j >= 2 ? nfar + j - 2 : n0 + j;
    __m256 acc[AVX2_MB][NB_MAX], wv[NB_MAX];
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) acc[i][j] = _mm256_setzero_ps();
    const float *x = p->x + m0 * p->K;
    Py_ssize_t k = 0;
    for (; k + 8 <= p->K; k += 8) {
        if (pf != NULL && (k & 8) == 0) { /* the next block's weights, pfl lines per 16 columns */
            for (int q = 0; q < pfl; q++) _mm_prefetch(pf + q * 64, BLOCK_HINT);
            pf += pfl * 64;
            if (pf2 != NULL) {
                for (int q = 0; q < pfl; q++) _mm_prefetch(pf2 + q * 64, BLOCK_HINT);
                pf2 += pfl * 64;
            }
        }
        for (int j = 0; j < nb; j++)
            wv[j] = scr != NULL ? _mm256_loadu_ps(scr + j * p->K + k)
                    : kind == 0 ? avx2_w_f32(p, nr[j], k) : kind == 3 ? avx2_w_i8g(p, nr[j], k)
                                                                        : avx2_w_i8(p, nr[j], k);
        for (int i = 0; i < mb; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * p->K + k);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < p->K) {
        Py_ssize_t len = p->K - k;
        __m256i mask = avx2_tail_mask(len);
        for (int j = 0; j < nb; j++)
            wv[j] = scr != NULL ? _mm256_maskload_ps(scr + j * p->K + k, mask) : avx2_w_tail(p, nr[j], k, len, kind);
        for (int i = 0; i < mb; i++) {
            __m256 xv = _mm256_maskload_ps(x + i * p->K + k, mask);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i0 = 0; i0 < mb; i0 += 2) { /* two rows' sums at a time */
        __m256 a[8];
        float out[8];
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 2; i++) a[2 * j + i] = i0 + i < mb && j < nb ? acc[i0 + i][j] : _mm256_setzero_ps();
        avx2_reduce8(a, out);
        for (int i = 0; i < 2 && i0 + i < mb; i++)
            for (int j = 0; j < nb; j++)
                p->y[(m0 + i0 + i) * p->N + nr[j]] = kind == 1 ? out[4 * i + j] * p->scale[nr[j]] : out[4 * i + j];
    }
}
T_AVX2 ALWAYS_INLINE void avx2_block(const Product *p, Py_ssize_t m0, int mb, Py_ssize_t n0, int nb, int kind,
                                     const float *scr, const char *pf, int pfl) {
    avx2_block_far(p, m0, mb, n0, nb, kind, scr, pf, pfl, -1, NULL);
}

/* Row m0 times nblk (1 or 2) blocks of 4 weight rows, block s at nr[s], written out (the
 * general blocks above leave their accumulators on the stack for this shape): the very
 * operations of avx2_block (int8) for mb = 1, nb = 4, in the same order, so the same results
 * for either nblk. Two distant blocks are two streams, as in avx2_f32_blocks. */
T_AVX2 ALWAYS_INLINE void avx2_i8_blocks(const Product *p, Py_ssize_t m0, const Py_ssize_t *nr, const int nblk) {
    const Py_ssize_t K = p->K;
    const int8_t *w[2];
    const float *x = p->x + m0 * K;
    __m256 a[2][4];
    for (int s = 0; s < nblk; s++) {
        w[s] = (const int8_t *)p->w + nr[s] * K;
        for (int j = 0; j < 4; j++) a[s][j] = _mm256_setzero_ps();
    }
#define I8(w, k) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((w) + (k)))))
    Py_ssize_t k = 0;
    for (; k + 8 <= K; k += 8) {
        for (int s = 0; s < nblk; s++) {
            _mm_prefetch((const char *)w[s] + PF_BLOCKS * 4 * K + 4 * k, _MM_HINT_T0); /* the next blocks' rows */
            _mm_prefetch((const char *)w[s] + FAR_BLOCKS * 4 * K + 4 * k, _MM_HINT_T1); /* and further ones into L2 */
        }
        __m256 xv = _mm256_loadu_ps(x + k);
        for (int s = 0; s < nblk; s++)
            for (int j = 0; j < 4; j++) a[s][j] = _mm256_fmadd_ps(xv, I8(w[s] + j * K, k), a[s][j]);
    }
#undef I8
    if (k < K) {
        Py_ssize_t len = K - k;
        __m256 xv = _mm256_maskload_ps(x + k, avx2_tail_mask(len));
        for (int s = 0; s < nblk; s++)
            for (int j = 0; j < 4; j++) a[s][j] = _mm256_fmadd_ps(xv, avx2_w_tail(p, nr[s] + j, k, len, 1), a[s][j]);
    }
    for (int s = 0; s < nblk; s++)
        for (int j = 0; j < 4; j++) p->y[m0 * p->N + nr[s] + j] = avx2_reduce(a[s][j]) * p->scale[nr[s] + j];
}
T_AVX2 static void avx2_i8_row4(const Product *p, Py_ssize_t m0, Py_ssize_t n0) { avx2_i8_blocks(p, m0, &n0, 1); }

/* int8 per group, one row times 4 weight rows: the operations of avx2_block (kind 3, mb = 1,
 * nb = 4) on each output in the same order, so the same results; a group's scales and
 * offsets broadcast once, the weight rows prefetched as avx2_i8_row4 does. */
T_AVX2 ALWAYS_INLINE void avx2_i8g_row4_gs(const Product *p, Py_ssize_t m0, Py_ssize_t n0, const Py_ssize_t gs) {
    const Py_ssize_t K = p->K, groups = K / gs;
    const int8_t *w0 = (const int8_t *)p->w + n0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    const float *s0 = p->scale + n0 * groups, *o0 = p->offset + n0 * groups, *x = p->x + m0 * K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define I8G(w, k, j) avx2_i8g_deq((w) + (k), _mm256_broadcast_ss(s0 + (j) * groups + g), _mm256_broadcast_ss(o0 + (j) * groups + g))
    for (Py_ssize_t g = 0, k = 0; g < groups; g++) {
        for (Py_ssize_t end = k + gs; k < end; k += 8) {
            _mm_prefetch((const char *)w0 + PF_BLOCKS * 4 * K + 4 * k, _MM_HINT_T0); /* the next blocks' rows */
            _mm_prefetch((const char *)w0 + FAR_BLOCKS * 4 * K + 4 * k, _MM_HINT_T1); /* and further ones into L2 */
            const __m256 xv = _mm256_loadu_ps(x + k);
            a0 = _mm256_fmadd_ps(xv, I8G(w0, k, 0), a0);
            a1 = _mm256_fmadd_ps(xv, I8G(w1, k, 1), a1);
            a2 = _mm256_fmadd_ps(xv, I8G(w2, k, 2), a2);
            a3 = _mm256_fmadd_ps(xv, I8G(w3, k, 3), a3);
        }
    }
#undef I8G
    float *y = p->y + m0 * p->N + n0;
    y[0] = avx2_reduce(a0);
    y[1] = avx2_reduce(a1);
    y[2] = avx2_reduce(a2);
    y[3] = avx2_reduce(a3);
}

T_AVX2 static void avx2_i8g_row4(const Product *p, Py_ssize_t m0, Py_ssize_t n0) {
    WITH_GROUP_SIZE(p->gs, avx2_i8g_row4_gs, p, m0, n0);
}

/* y[m0 + i][n0 + j] = avx2_reduce(a[4 * i + j]) for a two-row kernel's 8 sums. */
T_AVX2 ALWAYS_INLINE void avx2_store_rows2(const Product *p, Py_ssize_t m0, Py_ssize_t n0, const __m256 *a) {
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) p->y[(m0 + i) * p->N + n0 + j] = avx2_reduce(a[4 * i + j]);
}

/* int8 per group, two rows times 4 weight rows: each weight dequantized once for both rows
 * (a one-token draft's verification step; the scratch would dequantize and store the block
 * first), each output's operations those of avx2_i8g_row4_gs in its order. */
T_AVX2 ALWAYS_INLINE void avx2_i8g_rows2_gs(const Product *p, Py_ssize_t m0, Py_ssize_t n0, const Py_ssize_t gs) {
    const Py_ssize_t K = p->K, groups = K / gs;
    const int8_t *w0 = (const int8_t *)p->w + n0 * K;
    const float *s0 = p->scale + n0 * groups, *o0 = p->offset + n0 * groups, *x0 = p->x + m0 * K, *x1 = x0 + K;
    __m256 a[8]; /* a[j]: row m0 times weight row n0 + j; a[4 + j]: row m0 + 1 */
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
    for (Py_ssize_t g = 0, k = 0; g < groups; g++) {
        for (Py_ssize_t end = k + gs; k < end; k += 8) {
            _mm_prefetch((const char *)w0 + PF_BLOCKS * 4 * K + 4 * k, _MM_HINT_T0); /* as avx2_i8g_row4_gs */
            _mm_prefetch((const char *)w0 + FAR_BLOCKS * 4 * K + 4 * k, _MM_HINT_T1);
            const __m256 xv0 = _mm256_loadu_ps(x0 + k), xv1 = _mm256_loadu_ps(x1 + k);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256 wv = avx2_i8g_deq(w0 + j * K + k, _mm256_broadcast_ss(s0 + j * groups + g),
                                               _mm256_broadcast_ss(o0 + j * groups + g));
                a[j] = _mm256_fmadd_ps(xv0, wv, a[j]);
                a[4 + j] = _mm256_fmadd_ps(xv1, wv, a[4 + j]);
            }
        }
    }
    avx2_store_rows2(p, m0, n0, a);
}

T_AVX2 static void avx2_i8g_rows2(const Product *p, Py_ssize_t m0, Py_ssize_t n0) {
    WITH_GROUP_SIZE(p->gs, avx2_i8g_rows2_gs, p, m0, n0);
}

/* int4 on AVX2, group_size % 16 == 0 (so K % 16 == 0), as a dot product per group:
 *     y = sum over groups g of  scale[g] * D[g] + offset[g] * S[g],
 * D[g] the group's columns of x times the codes, S[g] the sum of the group's columns of x
 * (the same for every output, so computed once per row and call). This form needs no
 * dequantizing FMA per weight. A byte b = l + 16 h holds the codes of columns 2j (l) and
 * 2j + 1 (h); instead of shifting h down, D sums
 *     l * (x[2j] - x[2j + 1] / 16)  +  b * (x[2j + 1] / 16),
 * which is l * x[2j] + h * x[2j + 1] (b / 16 = h + l / 16): a step of 16 columns (8 bytes)
 * widens the bytes to 8 lanes (vpmovzxbd), masks the low nibbles, and converts l and b --
 * two conversions and two FMAs on the FMA ports, where shifting h down cost a third
 * operation there. So x is read transformed (a copy per call: for each 16 columns the 8
 * values x[2j] - x[2j + 1] / 16, then the 8 values x[2j + 1] / 16; the division by 16 is
 * exact). Per output, in 8-lane vectors: D accumulates the l then the b term of each step
 * in column order; at the end of a group A = fma(D, scale, A). The offsets' term is one dot
 * product per output over its groups, 8 groups a vector (avx2_i4_offsets: O = fma(offset[8c..],
 * S[8c..], O), the last vector masked), not an FMA per group; the output is A + O reduced by
 * avx2_reduce (avx2_i4_output). Every block below (one row times 4 weight rows, two rows
 * times 4, rows x 2 weight rows) runs exactly these operations on each output, so the
 * results are the same for every row count.
 * (Not the order of the other paths: a sum of x * code, scaled per group, is within float
 * tolerance of x @ dequantized W.T, not equal.) */

/* The per-call copy of x: xd [M][K] (each 16 columns as the 8 values x[2j] - x[2j + 1] / 16,
 * then the 8 values x[2j + 1] / 16) and the group sums xs [M][I4_GROUPS(groups)] (the sum of
 * the group's columns in column order; zero past the last group). */
#define I4_GROUPS(groups) (((groups) + 7) / 8 * 8)
T_AVX2 static float *avx2_i4_prep(const Product *p) {
    const Py_ssize_t K = p->K, groups = K / p->gs;
    size_t n = (size_t)p->M * (size_t)(K + I4_GROUPS(groups));
    float *buf = aligned_alloc(32, (n * sizeof(float) + 31) / 32 * 32);
    if (buf == NULL) return NULL;
    float *xd = buf, *xs = buf + p->M * K;
    for (Py_ssize_t m = 0; m < p->M; m++) {
        const float *x = p->x + m * K;
        float *d = xd + m * K;
        float *sums = xs + m * I4_GROUPS(groups);
        for (Py_ssize_t g = 0, k = 0; g < I4_GROUPS(groups); g++) {
            float sum = 0.0f;
            for (Py_ssize_t end = g < groups ? k + p->gs : k; k < end; k += 16)
                for (int b = 0; b < 8; b++) {
                    const float even = x[k + 2 * b], odd = x[k + 2 * b + 1];
                    d[k + b] = even - odd * 0.0625f;
                    d[k + 8 + b] = odd * 0.0625f;
                    sum += even;
                    sum += odd;
                }
            sums[g] = sum;
        }
    }
    return buf;
}

/* The offsets' term of one output: its groups' offsets (offset, `groups` of them) times the
 * row's group sums (sums, zero-padded to I4_GROUPS), 8 groups a vector. */
T_AVX2 ALWAYS_INLINE __m256 avx2_i4_offsets(const float *offset, const float *sums, Py_ssize_t groups) {
    __m256 o = _mm256_setzero_ps();
    Py_ssize_t g = 0;
    for (; g + 8 <= groups; g += 8) o = _mm256_fmadd_ps(_mm256_loadu_ps(offset + g), _mm256_load_ps(sums + g), o);
    if (g < groups) o = _mm256_fmadd_ps(_mm256_maskload_ps(offset + g, avx2_tail_mask(groups - g)), _mm256_load_ps(sums + g), o);
    return o;
}

/* Output (m, n) from its group totals a: avx2_reduce(a + the offsets' term). */
T_AVX2 ALWAYS_INLINE float avx2_i4_output(const Product *p, const float *xs, __m256 a, Py_ssize_t m, Py_ssize_t n,
                                          Py_ssize_t groups) {
    return avx2_reduce(_mm256_add_ps(a, avx2_i4_offsets(p->offset + n * groups, xs + m * I4_GROUPS(groups), groups)));
}

/* The codes of 16 columns (8 bytes at w) as floats: the low nibbles l in lo, the bytes b in hi. */
T_AVX2 ALWAYS_INLINE void avx2_i4_nibbles(const uint8_t *w, __m256 *lo, __m256 *hi) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)w));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x0F)));
    *hi = _mm256_cvtepi32_ps(v);
}

/* Row m0 times 4 weight rows, the codes decoded in registers, the next blocks' weights
 * prefetched I4_PF bytes ahead. */
#ifndef I4_PF
#define I4_PF 8192 /* bytes ahead the one-row int4 kernel prefetches its weight rows */
#endif
T_AVX2 ALWAYS_INLINE void avx2_i4_row4_gs(const Product *p, const float *xd, const float *xs, Py_ssize_t m0,
                                          Py_ssize_t n0, const Py_ssize_t gs) {
    const Py_ssize_t K = p->K, groups = K / gs;
    const uint8_t *w0 = (const uint8_t *)p->w + n0 * (K / 2), *w1 = w0 + K / 2, *w2 = w1 + K / 2, *w3 = w2 + K / 2;
    const char *pf = (const char *)w0 + I4_PF;
    const float *s0 = p->scale + n0 * groups;
    const float *x = xd + m0 * K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, lo, hi;
    for (Py_ssize_t g = 0; g < groups; g++) {
        __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
        for (Py_ssize_t c = 0; c < gs; c += 16, x += 16, w0 += 8, w1 += 8, w2 += 8, w3 += 8) {
            const __m256 xl = _mm256_load_ps(x), xh = _mm256_load_ps(x + 8);
            if ((c & 31) == 0) { /* 4 rows x 16 bytes: one line */
                _mm_prefetch(pf, _MM_HINT_T0);
                _mm_prefetch(pf + I4_PF, _MM_HINT_T1); /* and as far again into L2 */
                pf += 64;
            }
            avx2_i4_nibbles(w0, &lo, &hi);
            d0 = _mm256_fmadd_ps(xh, hi, _mm256_fmadd_ps(xl, lo, d0));
            avx2_i4_nibbles(w1, &lo, &hi);
            d1 = _mm256_fmadd_ps(xh, hi, _mm256_fmadd_ps(xl, lo, d1));
            avx2_i4_nibbles(w2, &lo, &hi);
            d2 = _mm256_fmadd_ps(xh, hi, _mm256_fmadd_ps(xl, lo, d2));
            avx2_i4_nibbles(w3, &lo, &hi);
            d3 = _mm256_fmadd_ps(xh, hi, _mm256_fmadd_ps(xl, lo, d3));
        }
        a0 = _mm256_fmadd_ps(d0, _mm256_broadcast_ss(s0 + g), a0);
        a1 = _mm256_fmadd_ps(d1, _mm256_broadcast_ss(s0 + groups + g), a1);
        a2 = _mm256_fmadd_ps(d2, _mm256_broadcast_ss(s0 + 2 * groups + g), a2);
        a3 = _mm256_fmadd_ps(d3, _mm256_broadcast_ss(s0 + 3 * groups + g), a3);
    }
    float *y = p->y + m0 * p->N + n0;
    y[0] = avx2_i4_output(p, xs, a0, m0, n0, groups);
    y[1] = avx2_i4_output(p, xs, a1, m0, n0 + 1, groups);
    y[2] = avx2_i4_output(p, xs, a2, m0, n0 + 2, groups);
    y[3] = avx2_i4_output(p, xs, a3, m0, n0 + 3, groups);
}

T_AVX2 static void avx2_i4_row4(const Product *p, const float *xd, const float *xs, Py_ssize_t m0, Py_ssize_t n0) {
    WITH_GROUP_SIZE(p->gs, avx2_i4_row4_gs, p, xd, xs, m0, n0);
}

/* Rows m0 and m0 + 1 times 4 weight rows, the codes decoded in registers once for both rows (two
 * one-row passes would decode them twice); each output's operations are avx2_i4_row4_gs's,
 * in its order. The group totals live on the stack, touched once per group. */
T_AVX2 ALWAYS_INLINE void avx2_i4_rows2_gs(const Product *p, const float *xd, const float *xs, Py_ssize_t m0,
                                           Py_ssize_t n0, const Py_ssize_t gs) {
    const Py_ssize_t K = p->K, groups = K / gs;
    const uint8_t *w = (const uint8_t *)p->w + n0 * (K / 2);
    const char *pf = (const char *)w + I4_PF;
    const float *s0 = p->scale + n0 * groups, *x0 = xd + m0 * K, *x1 = x0 + K;
    __m256 a[2][4], lo, hi;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) a[i][j] = _mm256_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        __m256 d00 = _mm256_setzero_ps(), d01 = d00, d02 = d00, d03 = d00, d10 = d00, d11 = d00, d12 = d00, d13 = d00;
        for (Py_ssize_t k = g * gs, end = k + gs; k < end; k += 16) {
            const uint8_t *wk = w + k / 2;
            if ((k & 31) == 0) { /* as avx2_i4_row4_gs: the next blocks' weights (no effect on the values) */
                _mm_prefetch(pf, _MM_HINT_T0);
                _mm_prefetch(pf + I4_PF, _MM_HINT_T1);
                pf += 64;
            }
            avx2_i4_nibbles(wk, &lo, &hi);
            d00 = _mm256_fmadd_ps(_mm256_load_ps(x0 + k + 8), hi, _mm256_fmadd_ps(_mm256_load_ps(x0 + k), lo, d00));
            d10 = _mm256_fmadd_ps(_mm256_load_ps(x1 + k + 8), hi, _mm256_fmadd_ps(_mm256_load_ps(x1 + k), lo, d10));
            avx2_i4_nibbles(wk + K / 2, &lo, &hi);
            d01 = _mm256_fmadd_ps(_mm256_load_ps(x0 + k + 8), hi, _mm256_fmadd_ps(_mm256_load_ps(x0 + k), lo, d01));
            d11 = _mm256_fmadd_ps(_mm256_load_ps(x1 + k + 8), hi, _mm256_fmadd_ps(_mm256_load_ps(x1 + k), lo, d11));
            avx2_i4_nibbles(wk + K, &lo, &hi);
            d02 = _mm256_fmadd_ps(_mm256_load_ps(x0 + k + 8), hi, _mm256_fmadd_ps(_mm256_load_ps(x0 + k), lo, d02));
            d12 = _mm256_fmadd_ps(_mm256_load_ps(x1 + k + 8), hi, _mm256_fmadd_ps(_mm256_load_ps(x1 + k), lo, d12));
            avx2_i4_nibbles(wk + 3 * (K / 2), &lo, &hi);
            d03 = _mm256_fmadd_ps(_mm256_load_ps(x0 + k + 8), hi, _mm256_fmadd_ps(_mm256_load_ps(x0 + k), lo, d03));
            d13 = _mm256_fmadd_ps(_mm256_load_ps(x1 + k + 8), hi, _mm256_fmadd_ps(_mm256_load_ps(x1 + k), lo, d13));
        }
        const __m256 c0 = _mm256_broadcast_ss(s0 + g), c1 = _mm256_broadcast_ss(s0 + groups + g);
        const __m256 c2 = _mm256_broadcast_ss(s0 + 2 * groups + g), c3 = _mm256_broadcast_ss(s0 + 3 * groups + g);
        a[0][0] = _mm256_fmadd_ps(d00, c0, a[0][0]);
        a[0][1] = _mm256_fmadd_ps(d01, c1, a[0][1]);
        a[0][2] = _mm256_fmadd_ps(d02, c2, a[0][2]);
        a[0][3] = _mm256_fmadd_ps(d03, c3, a[0][3]);
        a[1][0] = _mm256_fmadd_ps(d10, c0, a[1][0]);
        a[1][1] = _mm256_fmadd_ps(d11, c1, a[1][1]);
        a[1][2] = _mm256_fmadd_ps(d12, c2, a[1][2]);
        a[1][3] = _mm256_fmadd_ps(d13, c3, a[1][3]);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) p->y[(m0 + i) * p->N + n0 + j] = avx2_i4_output(p, xs, a[i][j], m0 + i, n0 + j, groups);
}

T_AVX2 static void avx2_i4_rows2(const Product *p, const float *xd, const float *xs, Py_ssize_t m0, Py_ssize_t n0) {
    WITH_GROUP_SIZE(p->gs, avx2_i4_rows2_gs, p, xd, xs, m0, n0);
}

/* mb (1 or 2) rows times nb (1 or 2) weight rows, the codes decoded in registers. */
T_AVX2 ALWAYS_INLINE void avx2_i4_block(const Product *p, const float *xd, const float *xs, Py_ssize_t m0, int mb,
                                        Py_ssize_t n0, int nb) {
    const Py_ssize_t K = p->K, gs = p->gs, groups = K / gs;
    __m256 a[2][2], d[2][2], lo[2], hi[2];
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) a[i][j] = _mm256_setzero_ps();
    for (Py_ssize_t g = 0, k = 0; g < groups; g++) {
        for (int i = 0; i < mb; i++)
            for (int j = 0; j < nb; j++) d[i][j] = _mm256_setzero_ps();
        for (Py_ssize_t end = k + gs; k < end; k += 16) {
            for (int j = 0; j < nb; j++)
                avx2_i4_nibbles((const uint8_t *)p->w + (n0 + j) * (K / 2) + k / 2, &lo[j], &hi[j]);
            for (int i = 0; i < mb; i++) {
                const __m256 xl = _mm256_load_ps(xd + (m0 + i) * K + k), xh = _mm256_load_ps(xd + (m0 + i) * K + k + 8);
                for (int j = 0; j < nb; j++) d[i][j] = _mm256_fmadd_ps(xh, hi[j], _mm256_fmadd_ps(xl, lo[j], d[i][j]));
            }
        }
        for (int i = 0; i < mb; i++)
            for (int j = 0; j < nb; j++)
                a[i][j] = _mm256_fmadd_ps(d[i][j], _mm256_broadcast_ss(p->scale + (n0 + j) * groups + g), a[i][j]);
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++)
            p->y[(m0 + i) * p->N + n0 + j] = avx2_i4_output(p, xs, a[i][j], m0 + i, n0 + j, groups);
}

/* A last block of fewer than 4 weight rows: rows in pairs times weight rows in pairs. */
#define AVX2_I4_ROWS(N0, NB)                                                                \
    do {                                                                                    \
        for (int j = 0; j < (NB); j += 2) {                                                 \
            int nj = (NB) - j < 2 ? (NB) - j : 2;                                           \
            Py_ssize_t m = 0;                                                               \
            for (; m + 2 <= p->M; m += 2) {                                                 \
                if (nj == 2) avx2_i4_block(p, xd, xs, m, 2, (N0) + j, 2);                   \
                else avx2_i4_block(p, xd, xs, m, 2, (N0) + j, 1);                           \
            }                                                                               \
            if (m < p->M) {                                                                 \
                if (nj == 2) avx2_i4_block(p, xd, xs, m, 1, (N0) + j, 2);                   \
                else avx2_i4_block(p, xd, xs, m, 1, (N0) + j, 1);                           \
            }                                                                               \
        }                                                                                   \
    } while (0)
T_AVX2 static void avx2_i4(const Product *p, Py_ssize_t n0, Py_ssize_t n1) {
    float *buf = avx2_i4_prep(p);
    if (buf == NULL) abort(); /* out of memory for a copy of x */
    const float *xd = buf, *xs = buf + p->M * p->K;
    for (Py_ssize_t n = n0; n < n1; n += 4) {
        int nb = n1 - n < 4 ? (int)(n1 - n) : 4;
        if (nb == 4) { /* rows in pairs, then an odd last row; the block stays in L1 meanwhile */
            Py_ssize_t m = 0;
            for (; m + 2 <= p->M; m += 2) avx2_i4_rows2(p, xd, xs, m, n);
            if (m < p->M) avx2_i4_row4(p, xd, xs, m, n);
        } else {
            AVX2_I4_ROWS(n, nb);
        }
    }
    free(buf);
}

/* Rows [n0, n0 + nb) of an int8-per-group weight as floats into scr [nb][K]: the values the
 * direct loads give (avx2_i8g_deq). */
T_AVX2 static void avx2_dequant_i8g(const Product *p, Py_ssize_t n0, int nb, float *scr) {
    const Py_ssize_t K = p->K, groups = K / p->gs;
    for (int j = 0; j < nb; j++) { /* a group at a time: its scale and offset broadcast once */
        const int8_t *w = (const int8_t *)p->w + (n0 + j) * K;
        const float *sc = p->scale + (n0 + j) * groups, *of = p->offset + (n0 + j) * groups;
        float *row = scr + j * K;
        for (Py_ssize_t g = 0, k = 0; g < groups; g++) {
            const __m256 sv = _mm256_set1_ps(sc[g]), ov = _mm256_set1_ps(of[g]);
            for (Py_ssize_t end = k + p->gs; k < end; k += 8) _mm256_storeu_ps(row + k, avx2_i8g_deq(w + k, sv, ov));
        }
    }
}


/* fp32, one row times nblk (1 to AVX2_F32_STREAMS) blocks of AVX2_F32_NB weight rows, block s
 * at nr[s]: the operations of avx2_block (kind 0, mb = 1) for each output, in the same order,
 * so the same results for any nblk. Each block's weight rows (contiguous, AVX2_F32_NB * K
 * floats) are prefetched F32_PF bytes ahead, a cache line per row per step (one block alone
 * also F32_FAR beyond, into L2). Distant blocks read at once are as many streams, and a core's
 * hardware prefetchers follow them side by side, where one stream alone leaves memory idle: on
 * a Zen 3 core a sequential read ran at 10-12.5 GB/s, two to twelve distant ones at 13-20, and
 * a step's one-row products 1.08-1.12x faster in two blocks of 4 rows, 1.14-1.17x more in four
 * blocks of 2 (docs/benchmarks.md). */
T_AVX2 ALWAYS_INLINE void avx2_f32_blocks(const Product *p, const Py_ssize_t *nr, const int nblk) {
    const Py_ssize_t K = p->K;
    const float *w[AVX2_F32_STREAMS], *x = p->x;
    const char *pf[AVX2_F32_STREAMS];
    __m256 acc[AVX2_F32_STREAMS][AVX2_F32_NB];
    for (int s = 0; s < nblk; s++) {
        w[s] = (const float *)p->w + nr[s] * K;
        pf[s] = (const char *)w[s] + F32_PF;
        for (int j = 0; j < AVX2_F32_NB; j++) acc[s][j] = _mm256_setzero_ps();
    }
    Py_ssize_t k = 0;
    for (; k + 16 <= K; k += 16) { /* two steps of 8 columns per line of each weight row */
        if (F32_PF) {
            for (int s = 0; s < nblk; s++)
                for (int j = 0; j < AVX2_F32_NB; j++) _mm_prefetch(pf[s] + j * 64, F32_HINT);
            if (nblk == 1)
                for (int j = 0; j < AVX2_F32_NB; j++) _mm_prefetch(pf[0] + F32_FAR + j * 64, _MM_HINT_T1);
            for (int s = 0; s < nblk; s++) pf[s] += AVX2_F32_NB * 64;
        }
        const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        for (int s = 0; s < nblk; s++)
            for (int j = 0; j < AVX2_F32_NB; j++) acc[s][j] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w[s] + j * K + k), acc[s][j]);
        for (int s = 0; s < nblk; s++)
            for (int j = 0; j < AVX2_F32_NB; j++) acc[s][j] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w[s] + j * K + k + 8), acc[s][j]);
    }
    for (; k + 8 <= K; k += 8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        for (int s = 0; s < nblk; s++)
            for (int j = 0; j < AVX2_F32_NB; j++) acc[s][j] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[s] + j * K + k), acc[s][j]);
    }
    if (k < K) {
        __m256i mask = avx2_tail_mask(K - k);
        __m256 xv = _mm256_maskload_ps(x + k, mask);
        for (int s = 0; s < nblk; s++)
            for (int j = 0; j < AVX2_F32_NB; j++)
                acc[s][j] = _mm256_fmadd_ps(xv, _mm256_maskload_ps(w[s] + j * K + k, mask), acc[s][j]);
    }
    for (int s = 0; s < nblk; s++)
        for (int j = 0; j < AVX2_F32_NB; j++) p->y[nr[s] + j] = avx2_reduce(acc[s][j]);
}

/* One row (M == 1) times the weight rows [n0, n1), cut into AVX2_F32_STREAMS parts read side
 * by side (block b of each part together), then what is left in pairs of blocks and a last
 * block alone; returns the first row no whole block covers. */
T_AVX2 static Py_ssize_t avx2_f32_one_row(const Product *p, Py_ssize_t n0, Py_ssize_t n1) {
    const Py_ssize_t part = (n1 - n0) / AVX2_F32_NB / AVX2_F32_STREAMS;
    for (Py_ssize_t b = 0; b < part; b++) {
        Py_ssize_t nr[AVX2_F32_STREAMS];
        for (int s = 0; s < AVX2_F32_STREAMS; s++) nr[s] = n0 + (s * part + b) * AVX2_F32_NB;
        avx2_f32_blocks(p, nr, AVX2_F32_STREAMS);
    }
    n0 += AVX2_F32_STREAMS * part * AVX2_F32_NB;
    for (; n0 + 2 * AVX2_F32_NB <= n1; n0 += 2 * AVX2_F32_NB) { /* fewer than AVX2_F32_STREAMS blocks left */
        const Py_ssize_t nr[2] = {n0, n0 + AVX2_F32_NB};
        avx2_f32_blocks(p, nr, 2);
    }
    if (n0 + AVX2_F32_NB <= n1) {
        avx2_f32_blocks(p, &n0, 1);
        n0 += AVX2_F32_NB;
    }
    return n0;
}

/* int8 per channel, one row (M == 1) times the weight rows [n0, n1): block b of 4 with block
 * half + b (two streams; 1.18x a step's products at 1 thread on a Zen 3, 1.02x at 2; the same
 * for int8 in groups, compute-bound, was slower: docs/benchmarks.md). Returns the first row
 * the pairs leave. */
T_AVX2 static Py_ssize_t avx2_i8_one_row(const Product *p, Py_ssize_t n0, Py_ssize_t n1) {
    const Py_ssize_t half = (n1 - n0) / 4 / 2;
    for (Py_ssize_t b = 0; b < half; b++) {
        const Py_ssize_t nr[2] = {n0 + b * 4, n0 + (half + b) * 4};
        avx2_i8_blocks(p, 0, nr, 2);
    }
    return n0 + 2 * half * 4;
}
/* fp32, more than AVX2_WIDE_MAX rows (fewer take avx2_wide, below), times the weight rows
 * [n0, n1): blocks of 4 weight rows made of pair b of the range's first half and pair b of its
 * second half, so the weights stream from two places at once (as the one-row kernel's,
 * avx2_f32_blocks); each output by avx2_block's operations, so the same results as blocks of 4
 * neighbours (2-33 rows 1.05-1.17x their speed on a Zen 3, docs/benchmarks.md). Returns the
 * first row the pairs leave (at most 3 rows before n1). */
T_AVX2 static Py_ssize_t avx2_f32_far_pairs(const Product *p, Py_ssize_t n0, Py_ssize_t n1) {
    const Py_ssize_t half = (n1 - n0) / 4;
    for (Py_ssize_t b = 0; b < half; b++) {
        const Py_ssize_t na = n0 + 2 * b, nf = n0 + 2 * (half + b);
        const char *pf = b + 1 < half ? next_block(p, na + 2, 0) : NULL;
        const char *pf2 = b + 1 < half ? next_block(p, nf + 2, 0) : NULL;
        Py_ssize_t m = 0;
        for (; m + AVX2_MB <= p->M; m += AVX2_MB, pf = pf2 = NULL)
            avx2_block_far(p, m, AVX2_MB, na, 4, 0, NULL, pf, 2, nf, pf2);
        if (p->M - m == 2) avx2_block_far(p, m, 2, na, 4, 0, NULL, pf, 2, nf, pf2);
        else if (p->M - m == 1) avx2_block_far(p, m, 1, na, 4, 0, NULL, pf, 2, nf, pf2);
    }
    return n0 + 4 * half;
}
/* fp32 at AVX2_WIDE_MIN to AVX2_WIDE_MAX rows, int8 per channel at 2 rows or more: blocks of
 * 3 weight rows x 4 rows, 12 accumulators + 3 weights + 1 x, so every FMA's operands are in
 * registers (4 weight rows x 3 rows needed a 17th register and spilled), the block's 3 weight
 * rows taken one from each third of the range (three streams from memory, each prefetched
 * AVX2_WIDE_PF rows ahead while the block's first rows run). Each output by avx2_block's very
 * operations (its FMAs over k in order, its reduction, int8's scale at the end), so the same
 * results as at any other row count. A step's products on a Zen 3, against the blocks before:
 * fp32 1.06-1.19x at 2-12 rows, 16 rows the same, 33 rows 0.91x (x no longer fits L1 and is
 * read once per 3 weight rows instead of 4), so fp32 keeps avx2_f32_far_pairs past 16; int8
 * per channel 1.05-1.59x at 2-33 rows (its conversions shared by 4 rows instead of 3):
 * docs/benchmarks.md. */
#ifndef AVX2_WIDE_MIN
#define AVX2_WIDE_MIN 2
#endif
#ifndef AVX2_WIDE_MAX
#define AVX2_WIDE_MAX 16
#endif
#ifndef AVX2_WIDE_PF
#define AVX2_WIDE_PF 1
#endif
#define WIDE_NB 3
#define WIDE_MB 4
T_AVX2 ALWAYS_INLINE void avx2_wide_block(const Product *p, Py_ssize_t m0, const int mb, const Py_ssize_t *nr,
                                          const int nb, const char *const *pf, const int kind) {
    const Py_ssize_t K = p->K;
    const float *x = p->x + m0 * K;
    const char *pfs[WIDE_NB];
    __m256 acc[WIDE_MB][WIDE_NB], wv[WIDE_NB];
    for (int j = 0; j < nb; j++) pfs[j] = pf != NULL ? pf[j] : NULL;
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) acc[i][j] = _mm256_setzero_ps();
    Py_ssize_t k = 0;
    for (; k + 8 <= K; k += 8) {
        if (pf != NULL && (k & (kind == 0 ? 8 : 56)) == 0) /* each stream's row AVX2_WIDE_PF ahead: */
            for (int j = 0; j < nb; j++) {                      /* a line per 16 (fp32) or 64 columns */
                _mm_prefetch(pfs[j], BLOCK_HINT);
                pfs[j] += 64;
            }
        for (int j = 0; j < nb; j++) wv[j] = kind == 0 ? avx2_w_f32(p, nr[j], k) : avx2_w_i8(p, nr[j], k);
        for (int i = 0; i < mb; i++) {
            const __m256 xv = _mm256_loadu_ps(x + i * K + k);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        const __m256i mask = avx2_tail_mask(K - k);
        for (int j = 0; j < nb; j++) wv[j] = avx2_w_tail(p, nr[j], k, K - k, kind);
        for (int i = 0; i < mb; i++) {
            const __m256 xv = _mm256_maskload_ps(x + i * K + k, mask);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    __m256 a[16]; /* sum c = i * nb + j at a[c]; avx2_reduce8 gives a[8h + 2j' + i'] at out[8h + 4i' + j'] */
    float out[16];
    int c = 0;
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) a[c++] = acc[i][j];
    for (; c < 16; c++) a[c] = _mm256_setzero_ps();
    avx2_reduce8(a, out);
    if (mb * nb > 8) avx2_reduce8(a + 8, out + 8);
    c = 0;
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++, c++) {
            const float sum = out[c / 8 * 8 + c % 2 * 4 + c % 8 / 2];
            p->y[(m0 + i) * p->N + nr[j]] = kind == 1 ? sum * p->scale[nr[j]] : sum;
        }
}

/* The weight rows [n0, n1) as blocks of 3 rows, one from each third of the range (row b of
 * each third: three streams), times all rows, 4 at a time; the one or two rows the thirds
 * leave at the end, alone. */
T_AVX2 ALWAYS_INLINE Py_ssize_t avx2_wide(const Product *p, Py_ssize_t n0, Py_ssize_t n1, const int kind) {
    const Py_ssize_t third = (n1 - n0) / WIDE_NB;
    for (Py_ssize_t b = 0; b < third; b++) {
        const Py_ssize_t nr[WIDE_NB] = {n0 + b, n0 + third + b, n0 + 2 * third + b};
        const char *ahead[WIDE_NB], *const *pf = b + AVX2_WIDE_PF < third ? ahead : NULL;
        for (int j = 0; j < WIDE_NB; j++) ahead[j] = next_block(p, nr[j] + AVX2_WIDE_PF, kind);
        Py_ssize_t m = 0;
        for (; m + WIDE_MB <= p->M; m += WIDE_MB, pf = NULL) avx2_wide_block(p, m, WIDE_MB, nr, WIDE_NB, pf, kind);
        switch (p->M - m) {
        case 3: avx2_wide_block(p, m, 3, nr, WIDE_NB, pf, kind); break;
        case 2: avx2_wide_block(p, m, 2, nr, WIDE_NB, pf, kind); break;
        case 1: avx2_wide_block(p, m, 1, nr, WIDE_NB, pf, kind); break;
        }
    }
    for (Py_ssize_t n = n0 + WIDE_NB * third; n < n1; n++)
        for (Py_ssize_t m = 0; m < p->M; m++) avx2_wide_block(p, m, 1, &n, 1, NULL, kind);
    return n1;
}

/* The range [n0, n1) of weight rows for KIND (0 fp32, 1 int8, 3 int8 per group). int8 per
 * group with more than two rows dequantizes each block of weight rows once into a per-thread
 * scratch instead of once per block of rows; fp32 and int8 per channel read their weights
 * directly at every row count (int8 per channel: 1.02-1.22x faster at 4-33 rows than through
 * the scratch; int8 per group 0.6-0.8x, docs/benchmarks.md). */
#define AVX2_RANGE(NAME, KIND)                                                              \
    T_AVX2 static void NAME(const Product *p, Py_ssize_t n0, Py_ssize_t n1) {               \
        float *scr = NULL;                                                                  \
        if (KIND == 0 && p->M == 1) n0 = avx2_f32_one_row(p, n0, n1);                      \
        if ((KIND == 0 && p->M >= AVX2_WIDE_MIN && p->M <= AVX2_WIDE_MAX) || (KIND == 1 && p->M > 1)) \
            n0 = avx2_wide(p, n0, n1, KIND);                                                \
        if (KIND == 0 && p->M > 1) n0 = avx2_f32_far_pairs(p, n0, n1);                     \
        if (KIND == 1 && p->M == 1) n0 = avx2_i8_one_row(p, n0, n1);                        \
        if (KIND == 3 && p->M > 2)                                                          \
            scr = aligned_alloc(64, ((size_t)NB_MAX * p->K * sizeof(float) + 63) / 64 * 64); \
        for (Py_ssize_t n = n0; n < n1; n += NB_MAX) {                                      \
            int nb = n1 - n < NB_MAX ? (int)(n1 - n) : NB_MAX;                              \
            const char *pf = p->M > 1 && n + 2 * NB_MAX <= n1 ? next_block(p, n + NB_MAX, KIND) : NULL; \
            if (scr != NULL) avx2_dequant_i8g(p, n, nb, scr);                               \
            Py_ssize_t m = 0;                                                               \
            for (; m + AVX2_MB <= p->M; m += AVX2_MB, pf = NULL) {                          \
                if (nb == NB_MAX) AVX2_CALL(KIND, m, AVX2_MB, NB_MAX); else AVX2_CALL(KIND, m, AVX2_MB, nb); \
            }                                                                               \
            if (p->M - m == 2) {                                                            \
                if (nb == NB_MAX) AVX2_CALL(KIND, m, 2, NB_MAX); else AVX2_CALL(KIND, m, 2, nb); \
            } else if (p->M - m == 1) {                                                     \
                if (nb == NB_MAX) AVX2_CALL(KIND, m, 1, NB_MAX); else AVX2_CALL(KIND, m, 1, nb); \
            }                                                                               \
        }                                                                                   \
        free(scr);                                                                          \
    }
/* the block for KIND: from the scratch when there is one */
#define AVX2_CALL(KIND, m, mb, nb)                                                          \
    do {                                                                                    \
        if (scr != NULL) avx2_block(p, m, mb, n, nb, 0, scr, pf, PF_LINES(KIND));           \
        else if (KIND == 1 && mb == 1 && nb == NB_MAX) avx2_i8_row4(p, m, n);               \
        else if (KIND == 3 && mb == 1 && nb == NB_MAX) avx2_i8g_row4(p, m, n);              \
        else if (KIND == 3 && mb == 2 && nb == NB_MAX) avx2_i8g_rows2(p, m, n);             \
        else avx2_block(p, m, mb, n, nb, KIND, NULL, pf, PF_LINES(KIND));                   \
    } while (0)
AVX2_RANGE(avx2_f32, 0)
AVX2_RANGE(avx2_i8, 1)
AVX2_RANGE(avx2_i8g, 3)

/* ------------------------------------------------------------------ AVX-512 (16 lanes) */

#define AVX512_MB 4 /* 4 weight rows x 4 rows: 16 accumulators + 4 weights + 1 x of 32 registers (6 x 4 measured slower) */
#define AVX512_NB 4


/* The sums of up to 16 accumulators a[4 * j + i] (unused ones zero), each reduced by the very
 * additions of avx512_reduce in the same operand order (lane l + lane l + 8, then + 4, + 2,
 * + 1), four at a time in shuffled vectors: 30 shuffles and 15 additions for 16 sums where
 * 16 avx512_reduce take some 110 operations, most on the shuffle port the FMAs share.
 * out[4 * i + j] is the sum of a[4 * j + i]. */
T_512 ALWAYS_INLINE void avx512_reduce16(const __m512 *a, float *out) {
    __m512 v[8], u[4], z[2];
    for (int q = 0; q < 8; q++) /* [a lanes 0-7, b lanes 0-7] + [a lanes 8-15, b lanes 8-15] */
        v[q] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * q], a[2 * q + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * q], a[2 * q + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int q = 0; q < 4; q++) /* quarters: h 0-3 + h 4-7 of a[4q], a[4q+1], a[4q+2], a[4q+3] */
        u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * q], v[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(v[2 * q], v[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int q = 0; q < 2; q++) /* within each quarter: s0 + s2, s1 + s3 */
        z[q] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * q], u[2 * q + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * q], u[2 * q + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* t0 + t1: quarter q holds the sums of a[q], a[4 + q], a[8 + q], a[12 + q] */
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1))));
}

/* The outputs of a block of mb rows x nb weight rows (acc[i][j]) reduced by avx512_reduce16
 * into y (row i, output j at y[(m0 + i) * N + n0 + j]), times scale[n0 + j] when given. */
T_512 ALWAYS_INLINE void avx512_store_block(const Product *p, __m512 acc[AVX512_MB][AVX512_NB], Py_ssize_t m0, int mb,
                                            Py_ssize_t n0, int nb, const float *scale) {
    __m512 a[16];
    float out[16];
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 4; i++) a[4 * j + i] = i < mb && j < nb ? acc[i][j] : _mm512_setzero_ps();
    avx512_reduce16(a, out);
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++)
            p->y[(m0 + i) * p->N + n0 + j] = scale != NULL ? out[4 * i + j] * scale[n0 + j] : out[4 * i + j];
}

T_512 ALWAYS_INLINE __m512 avx512_w(const Product *p, Py_ssize_t n, Py_ssize_t k, __mmask16 mask, int kind) {
    if (kind == 0) return _mm512_maskz_loadu_ps(mask, (const float *)p->w + n * p->K + k);
    __m128i b = _mm_maskz_loadu_epi8(mask, (const int8_t *)p->w + n * p->K + k);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

/* int8 per group (group_size % 16 == 0): the 16 codes at w as code * scale + offset, by one
 * FMA (every int8-per-group load of this path is this one). */
T_512 ALWAYS_INLINE __m512 avx512_i8g_deq(const int8_t *w, __m512 scale, __m512 offset) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w))), scale, offset);
}
T_512 ALWAYS_INLINE __m512 avx512_i8g_w(const Product *p, Py_ssize_t n, Py_ssize_t k) {
    const Py_ssize_t gi = n * (p->K / p->gs) + k / p->gs;
    return avx512_i8g_deq((const int8_t *)p->w + n * p->K + k, _mm512_set1_ps(p->scale[gi]), _mm512_set1_ps(p->offset[gi]));
}

/* int4, group_size % 16 == 0. A group's 16 possible weights, code * scale + offset for the
 * codes 0..15 (one FMA: each lane the very value an FMA per element gives), are a table in
 * one register; the 16 weights of columns [k, k + 16) (8 bytes at w) are looked up in it:
 * the bytes broadcast, one per 32-bit lane (vpshufb), odd columns shifted down 4 bits, and
 * vpermps, which reads only the low 4 bits of each lane (no mask, no convert, no FMA).
 * Where the CPU has AVX512-VBMI (use_vbmi), one vpmultishiftqb puts the 4 bits of column l
 * (bit 4l of the 8 bytes, broadcast to every quadword) in the low bits of lane l instead of
 * vpshufb + vpsrlvd: the same indices, so bitwise the same weights, one port-5 and one
 * port-0 operation fewer per 16 weights (blocks of 2-4 rows and the dequantization; one row
 * decodes with avx512_i4_deq_perm, one port-5 operation per 16 weights, on any AVX-512). */
static int use_vbmi; /* set at import: __builtin_cpu_supports("avx512vbmi"), unless PLD_KERNEL_NO_VBMI is set (tests of the other decode) */
T_512 ALWAYS_INLINE __m512 avx512_i4_table(float scale, float offset) {
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_fmadd_ps(codes, _mm512_set1_ps(scale), _mm512_set1_ps(offset));
}

#define Z(b) ((int)(0xFFFFFF00u | (b))) /* byte b in the low byte of a lane, the others zeroed */
T_512 ALWAYS_INLINE __m512 avx512_i4_deq(const uint8_t *w, __m512 table, const int vb) {
    const __m512i sel = _mm512_set_epi32(Z(7), Z(7), Z(6), Z(6), Z(5), Z(5), Z(4), Z(4), Z(3), Z(3), Z(2), Z(2), Z(1), Z(1),
                                         Z(0), Z(0));
    const __m512i shift = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    int64_t q;
    memcpy(&q, w, 8);
    __m512i d;
    if (vb) { /* lane l's low byte: the 8 bits from bit 4l (as asm: the file's target lacks VBMI) */
        const __m512i ctl = _mm512_set_epi32(60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0);
        __asm__("vpmultishiftqb %2, %1, %0" : "=v"(d) : "v"(ctl), "v"(_mm512_set1_epi64(q)));
    } else {
        d = _mm512_srlv_epi32(_mm512_shuffle_epi8(_mm512_set1_epi64(q), sel), shift);
    }
    return _mm512_permutexvar_ps(d, table);
}
#undef Z

T_512 ALWAYS_INLINE __m512 avx512_i4_w(const Product *p, Py_ssize_t n, Py_ssize_t k) {
    const uint8_t *w = (const uint8_t *)p->w + n * (p->K / 2) + k / 2;
    Py_ssize_t gi = n * (p->K / p->gs) + k / p->gs;
    return avx512_i4_deq(w, avx512_i4_table(p->scale[gi], p->offset[gi]), 0);
}

/* int4 straight from the codes: the steps of avx512_block (kind 2) group by group, a group's
 * scale and offset broadcast once (no division per step); the same operations in the same
 * order, so the same results. */
T_512 ALWAYS_INLINE void avx512_i4_block(const Product *p, Py_ssize_t m0, int mb, Py_ssize_t n0, int nb, const int vb) {
    __m512 acc[AVX512_MB][AVX512_NB], wv[AVX512_NB], t[AVX512_NB];
    const uint8_t *w[AVX512_NB];
    const float *sc[AVX512_NB], *of[AVX512_NB];
    Py_ssize_t groups = p->K / p->gs;
    for (int j = 0; j < nb; j++) {
        w[j] = (const uint8_t *)p->w + (n0 + j) * (p->K / 2);
        sc[j] = p->scale + (n0 + j) * groups;
        of[j] = p->offset + (n0 + j) * groups;
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) acc[i][j] = _mm512_setzero_ps();
    const float *x = p->x + m0 * p->K;
    for (Py_ssize_t g = 0, k = 0; g < groups; g++) {
        for (int j = 0; j < nb; j++) t[j] = avx512_i4_table(sc[j][g], of[j][g]);
        for (Py_ssize_t end = k + p->gs; k < end; k += 16) {
            for (int j = 0; j < nb; j++) wv[j] = avx512_i4_deq(w[j] + k / 2, t[j], vb);
            for (int i = 0; i < mb; i++) {
                __m512 xv = _mm512_loadu_ps(x + i * p->K + k);
                for (int j = 0; j < nb; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
            }
        }
    }
    avx512_store_block(p, acc, m0, mb, n0, nb, NULL);
}

/* The 16 weights of row n at columns [k, k + 16) as floats, lanes outside `mask` zero
 * (int4 has no tail: K % 16 == 0). `scr`, when given, holds them already ([nb][K] floats
 * from avx512_dequant, the same values), for blocks of many rows. */
T_512 ALWAYS_INLINE __m512 avx512_load_w(const Product *p, Py_ssize_t n0, int j, Py_ssize_t k, __mmask16 mask, int kind,
                                         const float *scr) {
    if (scr != NULL) return _mm512_maskz_loadu_ps(mask, scr + j * p->K + k);
    if (kind == 2) return avx512_i4_w(p, n0 + j, k);
    if (kind == 3) return avx512_i8g_w(p, n0 + j, k); /* no tail: K % 16 == 0 */
    return avx512_w(p, n0 + j, k, mask, kind);
}

/* kind 0: fp32; 1: int8 (sums scaled per output at the end); 2: int4; 3: int8 per group. */
T_512 ALWAYS_INLINE void avx512_block(const Product *p, Py_ssize_t m0, int mb, Py_ssize_t n0, int nb, int kind,
                                      const float *scr, const char *pf, int pfl) {
    __m512 acc[AVX512_MB][AVX512_NB], wv[AVX512_NB];
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) acc[i][j] = _mm512_setzero_ps();
    const float *x = p->x + m0 * p->K;
    Py_ssize_t k = 0;
    for (; k + 16 <= p->K; k += 16) {
        if (pf != NULL) { /* the next block's weights, pfl lines a step (no effect on the values) */
            for (int q = 0; q < pfl; q++) _mm_prefetch(pf + q * 64, BLOCK_HINT);
            pf += pfl * 64;
        }
        for (int j = 0; j < nb; j++) wv[j] = avx512_load_w(p, n0, j, k, 0xFFFF, kind, scr);
        for (int i = 0; i < mb; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * p->K + k);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < p->K) {
        __mmask16 mask = (__mmask16)((1u << (p->K - k)) - 1u);
        for (int j = 0; j < nb; j++) wv[j] = avx512_load_w(p, n0, j, k, mask, kind, scr);
        for (int i = 0; i < mb; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * p->K + k);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    avx512_store_block(p, acc, m0, mb, n0, nb, kind == 1 ? p->scale : NULL);
}

/* One row times 4 weight rows, written out: the very operations of avx512_block (int8) and
 * avx512_i4_block (int4) for mb = 1, nb = 4, in the same order, so the same results. */
T_512 static void avx512_i8_row4(const Product *p, Py_ssize_t m0, Py_ssize_t n0) {
    const Py_ssize_t K = p->K;
    const int8_t *w0 = (const int8_t *)p->w + n0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    const float *x = p->x + m0 * K;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define I8(w, k) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((w) + (k)))))
    Py_ssize_t k = 0;
    for (; k + 16 <= K; k += 16) {
        _mm_prefetch((const char *)w0 + PF_BLOCKS * 4 * K + 4 * k, _MM_HINT_T0); /* the next blocks' rows */
        _mm_prefetch((const char *)w0 + FAR_BLOCKS * 4 * K + 4 * k, _MM_HINT_T1); /* and further ones into L2 */
        __m512 xv = _mm512_loadu_ps(x + k);
        a0 = _mm512_fmadd_ps(xv, I8(w0, k), a0);
        a1 = _mm512_fmadd_ps(xv, I8(w1, k), a1);
        a2 = _mm512_fmadd_ps(xv, I8(w2, k), a2);
        a3 = _mm512_fmadd_ps(xv, I8(w3, k), a3);
    }
#undef I8
    if (k < K) {
        __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(mask, x + k);
        a0 = _mm512_fmadd_ps(xv, avx512_w(p, n0 + 0, k, mask, 1), a0);
        a1 = _mm512_fmadd_ps(xv, avx512_w(p, n0 + 1, k, mask, 1), a1);
        a2 = _mm512_fmadd_ps(xv, avx512_w(p, n0 + 2, k, mask, 1), a2);
        a3 = _mm512_fmadd_ps(xv, avx512_w(p, n0 + 3, k, mask, 1), a3);
    }
    float *y = p->y + m0 * p->N + n0;
    y[0] = avx512_reduce(a0) * p->scale[n0];
    y[1] = avx512_reduce(a1) * p->scale[n0 + 1];
    y[2] = avx512_reduce(a2) * p->scale[n0 + 2];
    y[3] = avx512_reduce(a3) * p->scale[n0 + 3];
}

/* int8 per group, one row times 4 weight rows: the operations of avx512_block (kind 3, mb = 1,
 * nb = 4) on each output in the same order, so the same results; a group's scales and
 * offsets broadcast once, the weight rows prefetched as avx512_i8_row4 does. */
T_512 ALWAYS_INLINE void avx512_i8g_row4_gs(const Product *p, Py_ssize_t m0, Py_ssize_t n0, const Py_ssize_t gs) {
    const Py_ssize_t K = p->K, groups = K / gs;
    const int8_t *w0 = (const int8_t *)p->w + n0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    const float *s0 = p->scale + n0 * groups, *o0 = p->offset + n0 * groups, *x = p->x + m0 * K;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (Py_ssize_t g = 0, k = 0; g < groups; g++) {
        const __m512 sc0 = _mm512_set1_ps(s0[g]), sc1 = _mm512_set1_ps(s0[groups + g]);
        const __m512 sc2 = _mm512_set1_ps(s0[2 * groups + g]), sc3 = _mm512_set1_ps(s0[3 * groups + g]);
        const __m512 of0 = _mm512_set1_ps(o0[g]), of1 = _mm512_set1_ps(o0[groups + g]);
        const __m512 of2 = _mm512_set1_ps(o0[2 * groups + g]), of3 = _mm512_set1_ps(o0[3 * groups + g]);
        for (Py_ssize_t end = k + gs; k < end; k += 16) {
            _mm_prefetch((const char *)w0 + PF_BLOCKS * 4 * K + 4 * k, _MM_HINT_T0); /* the next blocks' rows */
            _mm_prefetch((const char *)w0 + FAR_BLOCKS * 4 * K + 4 * k, _MM_HINT_T1); /* and further ones into L2 */
            const __m512 xv = _mm512_loadu_ps(x + k);
            a0 = _mm512_fmadd_ps(xv, avx512_i8g_deq(w0 + k, sc0, of0), a0);
            a1 = _mm512_fmadd_ps(xv, avx512_i8g_deq(w1 + k, sc1, of1), a1);
            a2 = _mm512_fmadd_ps(xv, avx512_i8g_deq(w2 + k, sc2, of2), a2);
            a3 = _mm512_fmadd_ps(xv, avx512_i8g_deq(w3 + k, sc3, of3), a3);
        }
    }
    float *y = p->y + m0 * p->N + n0;
    y[0] = avx512_reduce(a0);
    y[1] = avx512_reduce(a1);
    y[2] = avx512_reduce(a2);
    y[3] = avx512_reduce(a3);
}

T_512 static void avx512_i8g_row4(const Product *p, Py_ssize_t m0, Py_ssize_t n0) {
    WITH_GROUP_SIZE(p->gs, avx512_i8g_row4_gs, p, m0, n0);
}

/* int4, one row times 4 weight rows, decoded on the shift port instead of the shuffle port.
 * The 8 bytes of 16 columns broadcast to every quadword put their low dword (columns 0-7) in
 * the even 32-bit lanes and their high dword (columns 8-15) in the odd ones, so one vpsrlvd
 * by 4i brings column i to the low 4 bits of lane 2i and column 8 + i to those of lane
 * 2i + 1, where the table's vpermps reads them. Lane l thus holds column I4_PERM(l): x is
 * permuted the same way once per call (xp, from i4_permute_x), and each accumulator is
 * permuted back before its reduction, so lane c sums the very products of column class c in
 * the very order of avx512_i4_block: bitwise the same results, with one shuffle-port
 * operation per 16 weights instead of two (the FMAs share that port). */
T_512 ALWAYS_INLINE __m512 avx512_i4_deq_perm(const uint8_t *w, __m512 table) {
    const __m512i shift = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
    int64_t q;
    memcpy(&q, w, 8);
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi64(q), shift), table);
}

/* xp[16b + l] = x[16b + I4_PERM(l)], I4_PERM(2i) = i, I4_PERM(2i + 1) = 8 + i (K % 16 == 0). */
T_512 static void i4_permute_x(const float *x, Py_ssize_t K, float *xp) {
    const __m512i perm = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    for (Py_ssize_t k = 0; k < K; k += 16) _mm512_storeu_ps(xp + k, _mm512_permutexvar_ps(perm, _mm512_loadu_ps(x + k)));
}

/* avx512_reduce of acc with lane c moved back to where column class c belongs (I4_PERM's inverse) */
T_512 ALWAYS_INLINE float avx512_reduce_unperm(__m512 acc) {
    const __m512i inv = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return avx512_reduce(_mm512_permutexvar_ps(inv, acc));
}

T_512 ALWAYS_INLINE void avx512_i4_row4_gs(const Product *p, const float *xp, Py_ssize_t m0, Py_ssize_t n0,
                                          const Py_ssize_t gs) {
    const Py_ssize_t K = p->K, groups = K / gs;
    const uint8_t *w0 = (const uint8_t *)p->w + n0 * (K / 2), *w1 = w0 + K / 2, *w2 = w1 + K / 2, *w3 = w2 + K / 2;
    const uint8_t *pf = w0 + PF_BLOCKS * 4 * (K / 2);
    const float *s0 = p->scale + n0 * groups, *o0 = p->offset + n0 * groups;
    const float *x = xp;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        const __m512 t0 = avx512_i4_table(s0[g], o0[g]), t1 = avx512_i4_table(s0[groups + g], o0[groups + g]);
        const __m512 t2 = avx512_i4_table(s0[2 * groups + g], o0[2 * groups + g]);
        const __m512 t3 = avx512_i4_table(s0[3 * groups + g], o0[3 * groups + g]);
        for (Py_ssize_t c = 0; c < gs; c += 16, x += 16, w0 += 8, w1 += 8, w2 += 8, w3 += 8, pf += 32) {
            _mm_prefetch((const char *)pf, _MM_HINT_T0); /* the next blocks' rows */
            _mm_prefetch((const char *)pf + (FAR_BLOCKS - PF_BLOCKS) * 4 * (K / 2), _MM_HINT_T1); /* and further ones into L2 */
            __m512 xv = _mm512_loadu_ps(x);
            a0 = _mm512_fmadd_ps(xv, avx512_i4_deq_perm(w0, t0), a0);
            a1 = _mm512_fmadd_ps(xv, avx512_i4_deq_perm(w1, t1), a1);
            a2 = _mm512_fmadd_ps(xv, avx512_i4_deq_perm(w2, t2), a2);
            a3 = _mm512_fmadd_ps(xv, avx512_i4_deq_perm(w3, t3), a3);
        }
    }
    float *y = p->y + m0 * p->N + n0;
    y[0] = avx512_reduce_unperm(a0);
    y[1] = avx512_reduce_unperm(a1);
    y[2] = avx512_reduce_unperm(a2);
    y[3] = avx512_reduce_unperm(a3);
}

/* xp: row m0 of x, permuted */
T_512 static void avx512_i4_row4(const Product *p, const float *xp, Py_ssize_t m0, Py_ssize_t n0) {
    WITH_GROUP_SIZE(p->gs, avx512_i4_row4_gs, p, xp, m0, n0);
}

/* y[m0 + i][n0 + j] = the reduction of a[4 * i + j] (avx512_reduce_unperm where unperm, for
 * the permuted int4 lookup; else avx512_reduce) for a two-row kernel's 8 sums. */
T_512 ALWAYS_INLINE void avx512_store_rows2(const Product *p, Py_ssize_t m0, Py_ssize_t n0, const __m512 *a,
                                           const int unperm) {
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            p->y[(m0 + i) * p->N + n0 + j] = unperm ? avx512_reduce_unperm(a[4 * i + j]) : avx512_reduce(a[4 * i + j]);
}

/* Two rows (m0, m0 + 1; xp: both rows of x permuted) times 4 weight rows: each 16 weights
 * looked up once for both rows, each output's operations those of avx512_i4_row4_gs in its
 * order (a one-token draft's verification step; the general block decodes per block of rows
 * with two shuffle-port operations per 16 weights). */
T_512 ALWAYS_INLINE void avx512_i4_rows2_gs(const Product *p, const float *xp, Py_ssize_t m0, Py_ssize_t n0,
                                           const Py_ssize_t gs) {
    const Py_ssize_t K = p->K, groups = K / gs;
    const uint8_t *w0 = (const uint8_t *)p->w + n0 * (K / 2), *w1 = w0 + K / 2, *w2 = w1 + K / 2, *w3 = w2 + K / 2;
    const uint8_t *pf = w0 + PF_BLOCKS * 4 * (K / 2);
    const float *s0 = p->scale + n0 * groups, *o0 = p->offset + n0 * groups;
    const float *x0 = xp, *x1 = xp + K;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00, wv;
    for (Py_ssize_t g = 0; g < groups; g++) {
        const __m512 t0 = avx512_i4_table(s0[g], o0[g]), t1 = avx512_i4_table(s0[groups + g], o0[groups + g]);
        const __m512 t2 = avx512_i4_table(s0[2 * groups + g], o0[2 * groups + g]);
        const __m512 t3 = avx512_i4_table(s0[3 * groups + g], o0[3 * groups + g]);
        for (Py_ssize_t c = 0; c < gs; c += 16, x0 += 16, x1 += 16, w0 += 8, w1 += 8, w2 += 8, w3 += 8, pf += 32) {
            _mm_prefetch((const char *)pf, _MM_HINT_T0); /* as avx512_i4_row4_gs */
            _mm_prefetch((const char *)pf + (FAR_BLOCKS - PF_BLOCKS) * 4 * (K / 2), _MM_HINT_T1);
            const __m512 xv0 = _mm512_loadu_ps(x0), xv1 = _mm512_loadu_ps(x1);
            wv = avx512_i4_deq_perm(w0, t0);
            a00 = _mm512_fmadd_ps(xv0, wv, a00);
            a10 = _mm512_fmadd_ps(xv1, wv, a10);
            wv = avx512_i4_deq_perm(w1, t1);
            a01 = _mm512_fmadd_ps(xv0, wv, a01);
            a11 = _mm512_fmadd_ps(xv1, wv, a11);
            wv = avx512_i4_deq_perm(w2, t2);
            a02 = _mm512_fmadd_ps(xv0, wv, a02);
            a12 = _mm512_fmadd_ps(xv1, wv, a12);
            wv = avx512_i4_deq_perm(w3, t3);
            a03 = _mm512_fmadd_ps(xv0, wv, a03);
            a13 = _mm512_fmadd_ps(xv1, wv, a13);
        }
    }
    const __m512 a[8] = {a00, a01, a02, a03, a10, a11, a12, a13};
    avx512_store_rows2(p, m0, n0, a, 1);
}

T_512 static void avx512_i4_rows2(const Product *p, const float *xp, Py_ssize_t m0, Py_ssize_t n0) {
    WITH_GROUP_SIZE(p->gs, avx512_i4_rows2_gs, p, xp, m0, n0);
}

/* int8 per group, two rows times 4 weight rows: each weight dequantized once for both rows,
 * each output's operations those of avx512_i8g_row4_gs in its order (a one-token draft's
 * verification step; the scratch would dequantize and store the block first). */
T_512 ALWAYS_INLINE void avx512_i8g_rows2_gs(const Product *p, Py_ssize_t m0, Py_ssize_t n0, const Py_ssize_t gs) {
    const Py_ssize_t K = p->K, groups = K / gs;
    const int8_t *w0 = (const int8_t *)p->w + n0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    const float *s0 = p->scale + n0 * groups, *o0 = p->offset + n0 * groups, *x0 = p->x + m0 * K, *x1 = x0 + K;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00, wv;
    for (Py_ssize_t g = 0, k = 0; g < groups; g++) {
        const __m512 sc0 = _mm512_set1_ps(s0[g]), sc1 = _mm512_set1_ps(s0[groups + g]);
        const __m512 sc2 = _mm512_set1_ps(s0[2 * groups + g]), sc3 = _mm512_set1_ps(s0[3 * groups + g]);
        const __m512 of0 = _mm512_set1_ps(o0[g]), of1 = _mm512_set1_ps(o0[groups + g]);
        const __m512 of2 = _mm512_set1_ps(o0[2 * groups + g]), of3 = _mm512_set1_ps(o0[3 * groups + g]);
        for (Py_ssize_t end = k + gs; k < end; k += 16) {
            _mm_prefetch((const char *)w0 + PF_BLOCKS * 4 * K + 4 * k, _MM_HINT_T0); /* as avx512_i8g_row4_gs */
            _mm_prefetch((const char *)w0 + FAR_BLOCKS * 4 * K + 4 * k, _MM_HINT_T1);
            const __m512 xv0 = _mm512_loadu_ps(x0 + k), xv1 = _mm512_loadu_ps(x1 + k);
            wv = avx512_i8g_deq(w0 + k, sc0, of0);
            a00 = _mm512_fmadd_ps(xv0, wv, a00);
            a10 = _mm512_fmadd_ps(xv1, wv, a10);
            wv = avx512_i8g_deq(w1 + k, sc1, of1);
            a01 = _mm512_fmadd_ps(xv0, wv, a01);
            a11 = _mm512_fmadd_ps(xv1, wv, a11);
            wv = avx512_i8g_deq(w2 + k, sc2, of2);
            a02 = _mm512_fmadd_ps(xv0, wv, a02);
            a12 = _mm512_fmadd_ps(xv1, wv, a12);
            wv = avx512_i8g_deq(w3 + k, sc3, of3);
            a03 = _mm512_fmadd_ps(xv0, wv, a03);
            a13 = _mm512_fmadd_ps(xv1, wv, a13);
        }
    }
    const __m512 a[8] = {a00, a01, a02, a03, a10, a11, a12, a13};
    avx512_store_rows2(p, m0, n0, a, 0);
}

T_512 static void avx512_i8g_rows2(const Product *p, Py_ssize_t m0, Py_ssize_t n0) {
    WITH_GROUP_SIZE(p->gs, avx512_i8g_rows2_gs, p, m0, n0);
}

/* fp32, one row times F32_NB weight rows: the operations of avx512_block (kind 0, mb = 1)
 * for each output, in the same order, so the same results; the block's weight rows
 * (contiguous, F32_NB * K floats) are prefetched F32_PF bytes ahead, a line per row per step. */
T_512 static void avx512_f32_row(const Product *p, Py_ssize_t m0, Py_ssize_t n0) {
    const Py_ssize_t K = p->K;
    const float *w = (const float *)p->w + n0 * K, *x = p->x + m0 * K;
    const char *pf = (const char *)w + F32_PF;
    __m512 acc[F32_NB];
    for (int j = 0; j < F32_NB; j++) acc[j] = _mm512_setzero_ps();
    Py_ssize_t k = 0;
    for (; k + 16 <= K; k += 16) {
        if (F32_PF) {
            for (int j = 0; j < F32_NB; j++) _mm_prefetch(pf + j * 64, F32_HINT);
            for (int j = 0; j < F32_NB; j++) _mm_prefetch(pf + F32_FAR + j * 64, _MM_HINT_T1);
            pf += F32_NB * 64;
        }
        __m512 xv = _mm512_loadu_ps(x + k);
        for (int j = 0; j < F32_NB; j++) acc[j] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + j * K + k), acc[j]);
    }
    if (k < K) {
        __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(mask, x + k);
        for (int j = 0; j < F32_NB; j++) acc[j] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(mask, w + j * K + k), acc[j]);
    }
    for (int j = 0; j < F32_NB; j++) p->y[m0 * p->N + n0 + j] = avx512_reduce(acc[j]);
}

/* Rows [n0, n0 + nb) of a quantized weight as floats into scr [nb][K]: the very values the
 * direct loads give, so a block reading them computes bitwise what it would without. */
T_512 static void avx512_dequant(const Product *p, Py_ssize_t n0, int nb, int kind, float *scr) {
    for (int j = 0; j < nb; j++) {
        float *row = scr + j * p->K;
        Py_ssize_t k = 0;
        if (kind == 2) {
            const uint8_t *w = (const uint8_t *)p->w + (n0 + j) * (p->K / 2);
            const float *sc = p->scale + (n0 + j) * (p->K / p->gs), *of = p->offset + (n0 + j) * (p->K / p->gs);
            for (Py_ssize_t g = 0; k < p->K; g++) {
                __m512 t = avx512_i4_table(sc[g], of[g]);
                if (use_vbmi)
                    for (Py_ssize_t end = k + p->gs; k < end; k += 16) _mm512_storeu_ps(row + k, avx512_i4_deq(w + k / 2, t, 1));
                else
                    for (Py_ssize_t end = k + p->gs; k < end; k += 16) _mm512_storeu_ps(row + k, avx512_i4_deq(w + k / 2, t, 0));
            }
            continue;
        }
        if (kind == 3) { /* a group at a time: its scale and offset broadcast once */
            const int8_t *w = (const int8_t *)p->w + (n0 + j) * p->K;
            const float *sc = p->scale + (n0 + j) * (p->K / p->gs), *of = p->offset + (n0 + j) * (p->K / p->gs);
            for (Py_ssize_t g = 0; k < p->K; g++) {
                const __m512 sv = _mm512_set1_ps(sc[g]), ov = _mm512_set1_ps(of[g]);
                for (Py_ssize_t end = k + p->gs; k < end; k += 16) _mm512_storeu_ps(row + k, avx512_i8g_deq(w + k, sv, ov));
            }
            continue;
        }
#pragma GCC unroll 4 /* int8: 1.08-1.1x on 11 rows of cached weights */
        for (; k + 16 <= p->K; k += 16) _mm512_storeu_ps(row + k, avx512_load_w(p, n0, j, k, 0xFFFF, kind, NULL));
        if (k < p->K) {
            __mmask16 mask = (__mmask16)((1u << (p->K - k)) - 1u);
            _mm512_mask_storeu_ps(row + k, mask, avx512_load_w(p, n0, j, k, mask, kind, NULL));
        }
    }
}

/* Rows in blocks of 4, then one block of the 1-3 left (each its own specialisation). */
#define AVX512_ROWS(BLOCK_CALL, NB)                                                         \
    do {                                                                                    \
        Py_ssize_t m = 0;                                                                   \
        for (; m + AVX512_MB <= p->M; m += AVX512_MB, pf = NULL) BLOCK_CALL(m, AVX512_MB, NB); \
        switch (p->M - m) {                                                                 \
        case 3: BLOCK_CALL(m, 3, NB); break;                                                \
        case 2: BLOCK_CALL(m, 2, NB); break;                                                \
        case 1: BLOCK_CALL(m, 1, NB); break;                                                \
        default: break;                                                                     \
        }                                                                                   \
    } while (0)

/* Quantized weights with more rows than one block: each block of weight rows is dequantized
 * once into a per-thread scratch (L1/L2-resident) instead of once per block of rows. */
#define AVX512_RANGE(NAME, KIND)                                                            \
    T_512 static void NAME(const Product *p, Py_ssize_t n0, Py_ssize_t n1) {                \
        const int kind = KIND;                                                              \
        float *scr = NULL;                                                                  \
        if (KIND == 0 && p->M == 1) {                                                       \
            for (; n0 + F32_NB <= n1; n0 += F32_NB) avx512_f32_row(p, 0, n0);               \
        }                                                                                   \
        if (KIND != 0 && p->M > (KIND == 3 ? 2 : AVX512_MB)) /* int8 per group: blocks of 3 rows or more */ \
            scr = aligned_alloc(64, ((size_t)AVX512_NB * p->K * sizeof(float) + 63) / 64 * 64); \
        float *xp = NULL; /* int4, one or two rows: x permuted for avx512_i4_row4 / _rows2 */ \
        if (KIND == 2 && p->M <= 2 && n0 + AVX512_NB <= n1) { /* (without it, avx512_i4_block: */ \
            xp = aligned_alloc(64, ((size_t)p->M * p->K * sizeof(float) + 63) / 64 * 64); /* the same values) */ \
            for (Py_ssize_t r = 0; xp != NULL && r < p->M; r++) i4_permute_x(p->x + r * p->K, p->K, xp + r * p->K); \
        }                                                                                   \
        Py_ssize_t n = n0;                                                                  \
        for (; n + AVX512_NB <= n1; n += AVX512_NB) {                                             \
            const char *pf = NULL; /* the next block's weight rows, prefetched by the first block of rows */ \
            if (p->M > 1 && n + 2 * AVX512_NB <= n1) pf = next_block(p, n + AVX512_NB, KIND);  \
            if (scr != NULL) {                                                              \
                avx512_dequant(p, n, AVX512_NB, KIND, scr);                                    \
                AVX512_ROWS(SCR_512, AVX512_NB);                                               \
                if (kind == 1) scale_outputs(p, n, AVX512_NB);                                 \
            } else {                                                                        \
                AVX512_ROWS(DIRECT_512, AVX512_NB);                                            \
            }                                                                               \
        }                                                                                   \
        for (; n < n1; n++) { const char *pf = NULL; AVX512_ROWS(DIRECT_512, 1); }          \
        free(scr);                                                                          \
        free(xp);                                                                           \
    }
#define DIRECT_512(m, mb, nb)                                                               \
    do {                                                                                    \
        if (kind == 1 && mb == 1 && nb == AVX512_NB) avx512_i8_row4(p, m, n);               \
        else if (kind == 3 && mb == 1 && nb == AVX512_NB) avx512_i8g_row4(p, m, n);         \
        else if (kind == 3 && mb == 2 && nb == AVX512_NB) avx512_i8g_rows2(p, m, n);        \
        else if (kind == 2 && mb == 1 && nb == AVX512_NB && xp) avx512_i4_row4(p, xp, m, n); \
        else if (kind == 2 && mb == 2 && nb == AVX512_NB && xp) avx512_i4_rows2(p, xp, m, n); \
        else if (kind == 2 && use_vbmi) avx512_i4_block(p, m, mb, n, nb, 1);                \
        else if (kind == 2) avx512_i4_block(p, m, mb, n, nb, 0);                            \
        else avx512_block(p, m, mb, n, nb, kind, NULL, pf, PF_LINES(kind));                 \
    } while (0)
#define SCR_512(m, mb, nb) avx512_block(p, m, mb, n, nb, 0, scr, pf, PF_LINES(kind)) /* the fp32 code itself on the scratch */
AVX512_RANGE(avx512_f32, 0)
AVX512_RANGE(avx512_i8, 1)
AVX512_RANGE(avx512_i4, 2)
AVX512_RANGE(avx512_i8g, 3)
#endif /* PLD_X86 */

/* ------------------------------------------------------------------ dispatch */

enum { KIND_F32 = 0, KIND_I8 = 1, KIND_I4 = 2, KIND_I8G = 3 };


static int current_isa = -1; /* set at import */

static RangeFn range_fn(int isa, int kind, Py_ssize_t gs) {
#if PLD_X86
    static const RangeFn table[3][4] = {
        {gen_f32, gen_i8_scaled, gen_i4, gen_i8g},
        {avx2_f32, avx2_i8, avx2_i4, avx2_i8g},
        {avx512_f32, avx512_i8, avx512_i4, avx512_i8g},
    };
    if (kind == KIND_I4 && gs % 16 != 0) return gen_i4; /* the SIMD grouped steps are 16 columns of one group */
    if (kind == KIND_I8G && gs % 16 != 0) return gen_i8g;
    return table[isa][kind];
#else
    static const RangeFn table[4] = {gen_f32, gen_i8_scaled, gen_i4, gen_i8g};
    (void)isa;
    (void)gs;
    return table[kind];
#endif
}

/* The threads a product uses out of `available`: one below PARALLEL_MIN_WORK multiply-adds,
 * never more than its blocks of SPLIT outputs. */
static int product_threads(const Product *p, int available) {
    if ((double)p->M * (double)p->N * (double)p->K < PARALLEL_MIN_WORK) return 1;
    Py_ssize_t blocks = (p->N + SPLIT - 1) / SPLIT;
    return available < blocks ? available : (int)blocks;
}

/* Thread t's outputs [n0, n1) out of `threads` (whole blocks of SPLIT; may be empty). */
static void product_share(const Product *p, int threads, int t, Py_ssize_t *n0, Py_ssize_t *n1) {
    Py_ssize_t blocks = (p->N + SPLIT - 1) / SPLIT;
    Py_ssize_t b0 = blocks * t / threads, b1 = blocks * (t + 1) / threads;
    *n0 = b0 * SPLIT;
    *n1 = b1 * SPLIT < p->N ? b1 * SPLIT : p->N;
}

static void run_product(const Product *p, int kind) {
    RangeFn fn = range_fn(current_isa, kind, p->gs);
    int threads = 1;
#ifdef _OPENMP
    threads = product_threads(p, omp_get_max_threads());
#endif
    if (threads <= 1) {
        fn(p, 0, p->N);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
    {
        Py_ssize_t n0, n1;
        product_share(p, omp_get_num_threads(), omp_get_thread_num(), &n0, &n1);
        if (n0 < n1) fn(p, n0, n1);
    }
#endif
}


static PyObject *call(const Product *p, int kind) {
    if (p->M == 0 || p->N == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    run_product(p, kind);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* fp32(x, w, y, rows, in, out) */
static PyObject *py_fp32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *ptr[3];
    Py_ssize_t s[3];
    if (parse_args(args, nargs, 6, ptr, 3, s, 0) < 0) return NULL;
    Product p = {ptr[0], ptr[1], NULL, NULL, ptr[2], s[0], s[1], s[2], 0};
    return call(&p, KIND_F32);
}

/* int8(x, qweight, scale, y, rows, in, out) */
static PyObject *py_int8(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *ptr[4];
    Py_ssize_t s[3];
    if (parse_args(args, nargs, 7, ptr, 4, s, 0) < 0) return NULL;
    Product p = {ptr[0], ptr[1], ptr[2], NULL, ptr[3], s[0], s[1], s[2], 0};
    return call(&p, KIND_I8);
}

/* int4(x, qweight, scale, offset, y, rows, in, out, group_size) */
static PyObject *py_int4(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *ptr[5];
    Py_ssize_t s[4];
    if (parse_args(args, nargs, 9, ptr, 5, s, 0) < 0) return NULL;
    if (s[3] < 2 || s[3] % 2 || s[1] % s[3]) {
        PyErr_SetString(PyExc_ValueError, "group_size must be even and divide in");
        return NULL;
    }
    Product p = {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], s[0], s[1], s[2], s[3]};
    return call(&p, KIND_I4);
}

/* int8g(x, qweight, scale, offset, y, rows, in, out, group_size): int8 per group */
static PyObject *py_int8g(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *ptr[5];
    Py_ssize_t s[4];
    if (parse_args(args, nargs, 9, ptr, 5, s, 0) < 0) return NULL;
    if (s[3] < 1 || s[1] % s[3]) {
        PyErr_SetString(PyExc_ValueError, "group_size must divide in");
        return NULL;
    }
    Product p = {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], s[0], s[1], s[2], s[3]};
    return call(&p, KIND_I8G);
}

#if PLD_X86
/* The probe's chunk [c, end) (a multiple of 16 floats) on AVX2: two lines a step into two
 * accumulators, prefetched F32_PF bytes ahead as the one-row fp32 kernels read. */
T_AVX2 static float read_avx2(const float *a, Py_ssize_t c, Py_ssize_t end) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    Py_ssize_t i = c;
    for (; i + 32 <= end; i += 32) {
        _mm_prefetch((const char *)(a + i) + F32_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + F32_PF + 64, _MM_HINT_T0);
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
    }
    for (; i < end; i += 16) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
    }
    return avx2_reduce(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}
#endif

/* read(ptr, nbytes) -> float: sums nbytes / 4 floats (a multiple of 64 bytes) on every
 * thread, to measure the memory bandwidth the products are bound by. */
static PyObject *py_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *ptr[1];
    Py_ssize_t s[1];
    if (parse_args(args, nargs, 2, ptr, 1, s, 0) < 0) return NULL;
    const float *a = ptr[0];
    Py_ssize_t n = s[0] / 4 / 16 * 16;
    double total = 0.0;
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel for reduction(+ : total) schedule(static)
#endif
    for (Py_ssize_t c = 0; c < n; c += 1024) {
        Py_ssize_t end = c + 1024 < n ? c + 1024 : n;
#if PLD_X86
        if (current_isa >= ISA_AVX2) {
            total += read_avx2(a, c, end);
            continue;
        }
#endif
        float acc[16] = {0};
        for (Py_ssize_t i = c; i < end; i += 16)
            for (int l = 0; l < 16; l++) acc[l] += a[i + l];
        float s2 = 0.0f;
        for (int l = 0; l < 16; l++) s2 += acc[l];
        total += s2;
    }
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(total);
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred()) return NULL;
    if (level < ISA_GENERIC || level > best_isa()) {
        PyErr_Format(PyExc_ValueError, "this CPU cannot run the %s path (best: %s)",
                     level >= ISA_GENERIC && level <= ISA_AVX512 ? ISA_NAMES[level] : "unknown", ISA_NAMES[best_isa()]);
        return NULL;
    }
    current_isa = (int)level;
    Py_RETURN_NONE;
}

static PyObject *py_best_isa(PyObject *self, PyObject *unused) { return PyLong_FromLong(best_isa()); }
static PyObject *py_get_isa(PyObject *self, PyObject *unused) { return PyLong_FromLong(current_isa); }

static PyMethodDef methods[] = {
    {"fp32", (PyCFunction)(void (*)(void))py_fp32, METH_FASTCALL, "fp32(x, w, y, rows, in, out)"},
    {"int8", (PyCFunction)(void (*)(void))py_int8, METH_FASTCALL, "int8(x, qweight, scale, y, rows, in, out)"},
    {"int4", (PyCFunction)(void (*)(void))py_int4, METH_FASTCALL,
     "int4(x, qweight, scale, offset, y, rows, in, out, group_size)"},
    {"int8g", (PyCFunction)(void (*)(void))py_int8g, METH_FASTCALL,
     "int8g(x, qweight, scale, offset, y, rows, in, out, group_size): int8 per group"},
    {"read", (PyCFunction)(void (*)(void))py_read, METH_FASTCALL, "read(ptr, nbytes): sum of the floats (bandwidth probe)"},
    {"set_isa", py_set_isa, METH_O, "set_isa(level): 0 generic, 1 avx2, 2 avx512"},
    {"best_isa", py_best_isa, METH_NOARGS, "the widest path this CPU runs (0, 1 or 2)"},
    {"get_isa", py_get_isa, METH_NOARGS, "the path in use (0, 1 or 2)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gemv_module = {
    PyModuleDef_HEAD_INIT, "_gemv", "fp32/int8/int4 products for few rows (see gemv.c)", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* The product for other C code that runs its own team of threads (step_ops.c runs a whole
 * decoding step's layers in one parallel region): thread t of a team of nt computes its share
 * of the outputs, the same split run_product() makes, so the same values; the caller waits
 * for the whole team before it reads y. The capsule "product" in this module holds this
 * function's address. kind: 0 fp32, 1 int8, 2 int4, 3 int8 per group (the KIND_ values); the path is this
 * module's current one. */
static void api_product(const float *x, const void *w, const float *scale, const float *offset, float *y,
                        Py_ssize_t M, Py_ssize_t K, Py_ssize_t N, Py_ssize_t gs, int kind, int t, int nt) {
    Product p = {x, w, scale, offset, y, M, K, N, gs};
    if (M <= 0 || N <= 0) return;
    int threads = product_threads(&p, nt);
    if (t >= threads) return;
    Py_ssize_t n0, n1;
    product_share(&p, threads, t, &n0, &n1);
    if (n0 < n1) range_fn(current_isa, kind, p.gs)(&p, n0, n1);
}

PyMODINIT_FUNC PyInit__gemv(void) {
    current_isa = best_isa();
#if PLD_X86
    use_vbmi = __builtin_cpu_supports("avx512vbmi") && getenv("PLD_KERNEL_NO_VBMI") == NULL;
#endif
    PyObject *m = PyModule_Create(&gemv_module);
    if (m == NULL) return NULL;
    PyObject *api = PyCapsule_New((void *)api_product, "promptlookup._gemv.product", NULL);
    if (api == NULL || PyModule_AddObject(m, "product", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
