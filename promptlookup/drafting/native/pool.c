/* TensorRT-LLM's n-gram pool in C: module promptlookup.drafting.native._pool.
 *
 * Same classes, same drafts as the pure-Python fallback promptlookup/drafting/pool.py (the
 * incremental window, the skip-while-removing quirk); the rules are specified in
 * promptlookup/drafting/pool_spec.py (TensorRT-LLM's NGramPoolManager). This file only
 * changes the representation:
 *
 *   NGramPool(k, n, is_keep_all, is_use_oldest)
 *     texts      every text a cursor has seen, copied as int64 tokens. A match is a
 *                reference (text, offset, length) into them; texts only grow, so a
 *                reference keeps denoting what TensorRT-LLM inserted at that moment.
 *     patterns   one record per (size, n-gram): the ordered set S of its matches, as in
 *                pool.py's MatchSet: the first/last full-length match with sequence
 *                numbers and a count (full matches are never removed), and the truncated
 *                matches in insertion order, each with its sequence number and the number
 *                of full matches inserted before it (adjacency in S for the quirk).
 *     index      open addressing (linear probing, load <= 1/2) from hash(size, n-gram) to
 *                the pattern; keys are compared against the n-gram's first occurrence.
 *     fullset    open addressing set of (pattern, generation, full match) for the
 *                membership test "m in S" on full matches; a pattern's generation changes
 *                when is_keep_all=False replaces its whole S, which empties it at once.
 *   PoolCursor(pool)
 *     one request: its text in the pool, the length at its previous call, and per size
 *     the positions whose match was still truncated then (the "tails" of pool.py).
 *
 * Insertions are applied eagerly, in TensorRT-LLM's order. With is_use_oldest a pattern
 * whose oldest match is full is settled: its draft can never change, so later insertions
 * are skipped and its truncated matches freed (pool.py explains why this is exact).
 *
 * Candidates (NGramPool's optional 5th argument max_candidates = c, default 1): each pattern
 * also keeps, in `keep`, its first c (is_use_oldest) or last c full matches with their
 * sequence numbers, allocated only when c > 1, so S[0:c] / S[-c:] are a merge of `keep`
 * and the truncated matches by sequence number. With c > 1 a pattern settles only once
 * S[0:c] are all full. PoolCursor.candidates reads the pool and never changes it.
 *
 * Size limit (NGramPool's optional 6th argument max_patterns, None: unbounded): the live
 * patterns are also on a doubly linked list in order of last use (lru_prev/lru_next), with
 * the same uses and the same moments as pool_index.py states: a new occurrence of a pattern
 * in a cursor's text (created or found), and the hit that gives a draft; candidates() uses
 * nothing. Creating a pattern in a full pool first evicts the least recently used one: its
 * index slot is deleted (backward shift), its matches freed, its slot put on a free list
 * and reused by a later pattern with a new uid. Tails remember the uid, so a cursor drops a
 * position whose pattern was evicted (as pool.py drops a dead record). Stale full-set
 * entries (an evicted slot's, a settled pattern's, a replaced generation's) are purged when
 * the set is rebuilt. O(1) per use and per eviction, plus the index's backward shift.
 *
 * Texts: a cursor's text is TEXT_OWNED while the cursor lives, then TEXT_DEAD (matches and
 * keys may still refer to it). When the dead texts hold more than twice the tokens of the
 * last compaction's arena plus COMPACT_MIN_TOKENS, the next new cursor compacts first: every
 * reference into a dead text (keys, matches, kept matches, live full-set entries) is copied
 * into one new arena text and the dead texts are freed, so what the pool holds stays
 * proportional to its live patterns. Cost O(pattern slots + full-set slots + tokens
 * copied), at most once per that many dead tokens: amortised O(1) per token. Drafts never
 * change (references keep denoting the same tokens).
 *
 * Cost of PoolCursor.propose, L the text length, k and n the options: copying the new
 * tokens, then O(n * (k + new tokens)) insertions, each O(k) for hashing and comparing
 * plus O(truncated matches of the pattern) for the removal walk; the lookup is O(n * n)
 * hashing. Nothing depends on L. Memory: 8 bytes per token per text, about 100 bytes per
 * distinct n-gram, 32 bytes per full match of unsettled patterns.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

typedef int64_t tok_t;

#define MAX_CANDIDATES 64 /* base.py's MAX_CANDIDATES */

typedef struct {
    int32_t text, off, len;
} Ref; /* the match texts[text][off : off + len] */

typedef struct {
    Ref m;
    int64_t seq;
    int64_t nfull; /* full matches inserted before this one (same value = adjacent in S) */
} Short;

typedef struct {
    Ref m;
    int64_t seq;
} Kept; /* a full match kept for candidates */

typedef struct {
    uint64_t hash;
    int32_t key_text, key_off, size;
    int32_t gen;
    int64_t nfull, seq, full_first_seq, full_last_seq;
    Ref full_first, full_last;
    Short *shorts;
    int32_t nshort;
    Py_ssize_t cap_short;
    int settled;
    Kept *keep; /* max_candidates > 1: first (oldest) or last full matches, S order */
    int32_t nkeep;
    int64_t uid; /* 0: a free slot (size 0 too) */
    int32_t lru_prev, lru_next; /* -1: none; a free slot's lru_next links the free list */
} Pattern;

typedef struct {
    uint64_t hash;
    int32_t pat, gen; /* pat < 0: empty slot */
    Ref m;
} FullEntry;

typedef struct {
    tok_t *data;
    Py_ssize_t len, cap;
    int state; /* TEXT_FREE, TEXT_OWNED (a live cursor's) or TEXT_DEAD (kept for refs into it) */
} Text;

enum { TEXT_FREE = 0, TEXT_OWNED = 1, TEXT_DEAD = 2 };
#define COMPACT_MIN_TOKENS 65536 /* dead tokens tolerated beyond twice the last arena */

typedef struct {
    PyObject_HEAD
    int k, n, keep_all, use_oldest, cand;
    Text *texts;
    int32_t ntexts;
    Py_ssize_t cap_texts;
    Pattern *pats;
    int32_t npats;
    Py_ssize_t cap_pats;
    int32_t *index; /* pattern numbers, -1 empty */
    uint64_t index_mask;
    FullEntry *fullset;
    uint64_t fullset_mask, fullset_used;
    int64_t max_patterns; /* 0: unbounded */
    int32_t live, lru_head, lru_tail, free_head; /* live patterns; LRU ends; free slots */
    int64_t next_uid, evictions;
    int32_t *free_texts; /* text slots to reuse */
    Py_ssize_t nfree_texts, cap_free_texts;
    int64_t dead_tokens, arena_tokens; /* tokens in dead texts; in the arena of the last compaction */
} PoolObject;

typedef struct {
    int64_t p;
    int32_t pat;
    int64_t uid; /* the pattern's uid when remembered: another one means it was evicted */
} Tail;

typedef struct {
    Tail *items;
    Py_ssize_t len, cap;
} TailList;

typedef struct {
    PyObject_HEAD
    PoolObject *pool;
    int32_t text;
    int64_t prev_len;
    TailList *tails; /* tails[s] for s in 1..n */
} CursorObject;

static PyTypeObject PoolType;

/* ---------------------------------------------------------------- helpers */

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 31;
    h *= 0x9E3779B97F4A7C15ULL;
    h ^= h >> 29;
    return h;
}

static inline uint64_t hash_tokens(uint64_t seed, const tok_t *t, int64_t len) {
    uint64_t h = mix(seed + 0x632BE59BD9B4E019ULL);
    for (int64_t i = 0; i < len; i++) h = mix(h ^ (uint64_t)t[i]) + (uint64_t)i;
    return h;
}

static inline const tok_t *ref_data(const PoolObject *pool, Ref r) {
    return pool->texts[r.text].data + r.off;
}

static inline int ref_eq(const PoolObject *pool, Ref a, Ref b) {
    return a.len == b.len &&
           (a.len == 0 || memcmp(ref_data(pool, a), ref_data(pool, b), (size_t)a.len * sizeof(tok_t)) == 0);
}

/* ---------------------------------------------------------------- the index */

static int index_rebuild(PoolObject *pool, uint64_t slots) {
    int32_t *idx = PyMem_Malloc((size_t)slots * sizeof(int32_t));
    if (!idx) { PyErr_NoMemory(); return -1; }
    memset(idx, 0xff, (size_t)slots * sizeof(int32_t));
    uint64_t mask = slots - 1;
    for (int32_t i = 0; i < pool->npats; i++) {
        if (pool->pats[i].uid == 0) continue; /* a free slot */
        uint64_t j = pool->pats[i].hash & mask;
        while (idx[j] >= 0) j = (j + 1) & mask;
        idx[j] = i;
    }
    PyMem_Free(pool->index);
    pool->index = idx;
    pool->index_mask = mask;
    return 0;
}

/* Pattern pi was used: it becomes the most recently used (no-op without a limit). O(1). */
static void touch(PoolObject *pool, int32_t pi) {
    if (!pool->max_patterns || pool->lru_tail == pi) return;
    Pattern *pt = &pool->pats[pi];
    if (pt->lru_prev >= 0) pool->pats[pt->lru_prev].lru_next = pt->lru_next; else pool->lru_head = pt->lru_next;
    pool->pats[pt->lru_next].lru_prev = pt->lru_prev; /* pi is not the tail: it has a next */
    pt->lru_prev = pool->lru_tail;
    pt->lru_next = -1;
    pool->pats[pool->lru_tail].lru_next = pi;
    pool->lru_tail = pi;
}

/* Evict the least recently used pattern: unlink it, delete its index slot (backward shift,
 * so linear probing still finds every other key), free its matches, free its slot. */
static void evict_lru(PoolObject *pool) {
    int32_t pi = pool->lru_head;
    Pattern *pt = &pool->pats[pi];
    pool->lru_head = pt->lru_next;
    if (pool->lru_head >= 0) pool->pats[pool->lru_head].lru_prev = -1; else pool->lru_tail = -1;
    uint64_t mask = pool->index_mask, i = pt->hash & mask;
    while (pool->index[i] != pi) i = (i + 1) & mask;
    for (uint64_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        int32_t q = pool->index[j];
        if (q < 0) break;
        uint64_t home = pool->pats[q].hash & mask; /* q may move to i if i lies on its probe path */
        if ((j > i) ? (home <= i || home > j) : (home <= i && home > j)) {
            pool->index[i] = q;
            i = j;
        }
    }
    pool->index[i] = -1;
    PyMem_Free(pt->shorts);
    PyMem_Free(pt->keep);
    int32_t gen = pt->gen;
    memset(pt, 0, sizeof(*pt));
    pt->gen = gen;
    pt->lru_prev = -1;
    pt->lru_next = pool->free_head;
    pool->free_head = pi;
    pool->live--;
    pool->evictions++;
}

/* Find the pattern for key (size s, tokens at texts[text][off:]); create it (empty S) when
 * `create` and absent. Returns its number, -1 when absent, -2 on error. *created is set. */
static int32_t find_pattern(PoolObject *pool, int32_t text, int64_t off, int32_t s, int create, int *created) {
    const tok_t *key = pool->texts[text].data + off;
    uint64_t h = hash_tokens((uint64_t)s, key, s);
    uint64_t mask = pool->index_mask, j = h & mask;
    *created = 0;
    for (;;) {
        int32_t i = pool->index[j];
        if (i < 0) break;
        Pattern *pt = &pool->pats[i];
        if (pt->hash == h && pt->size == s &&
            memcmp(pool->texts[pt->key_text].data + pt->key_off, key, (size_t)s * sizeof(tok_t)) == 0)
            return i;
        j = (j + 1) & mask;
    }
    if (!create) return -1;
    if (pool->max_patterns && pool->live >= pool->max_patterns) {
        evict_lru(pool); /* moves index entries: probe again */
        mask = pool->index_mask;
        j = h & mask;
        while (pool->index[j] >= 0) j = (j + 1) & mask;
    }
    if ((uint64_t)(pool->live + 1) * 2 > mask + 1) {
        if (index_rebuild(pool, (mask + 1) * 2) < 0) return -2;
        mask = pool->index_mask;
        j = h & mask;
        while (pool->index[j] >= 0) j = (j + 1) & mask;
    }
    int32_t i;
    if (pool->free_head >= 0) {
        i = pool->free_head;
        pool->free_head = pool->pats[i].lru_next;
    } else {
        if (pool->npats == INT32_MAX) { PyErr_NoMemory(); return -2; }
        if (grow((void **)&pool->pats, &pool->cap_pats, (int64_t)pool->npats + 1, sizeof(Pattern)) < 0) return -2;
        i = pool->npats++;
        pool->pats[i].gen = 0;
    }
    Pattern *pt = &pool->pats[i];
    int32_t gen = pt->gen + 1; /* never a generation an older occupant's full-set entries have */
    memset(pt, 0, sizeof(*pt));
    pt->gen = gen;
    pt->uid = pool->next_uid++;
    pt->lru_next = -1;
    pt->lru_prev = pool->lru_tail;
    if (pool->lru_tail >= 0) pool->pats[pool->lru_tail].lru_next = i; else pool->lru_head = i;
    pool->lru_tail = i;
    pool->live++;
    pt->hash = h;
    pt->key_text = text;
    pt->key_off = (int32_t)off;
    pt->size = s;
    pool->index[j] = i;
    *created = 1;
    return i;
}

/* ---------------------------------------------------------------- full-match set */

static uint64_t full_hash(const PoolObject *pool, int32_t pat, int32_t gen, Ref m) {
    return hash_tokens(((uint64_t)(uint32_t)pat << 32) ^ (uint32_t)gen, ref_data(pool, m), m.len);
}

static int fullset_contains(const PoolObject *pool, int32_t pat, int32_t gen, Ref m) {
    uint64_t h = full_hash(pool, pat, gen, m), mask = pool->fullset_mask, j = h & mask;
    for (;;) {
        const FullEntry *e = &pool->fullset[j];
        if (e->pat < 0) return 0;
        if (e->hash == h && e->pat == pat && e->gen == gen && ref_eq(pool, e->m, m)) return 1;
        j = (j + 1) & mask;
    }
}

/* An entry some later membership test may still ask about: its slot's current pattern
 * (same generation), not settled (a settled pattern takes no insertions). */
static inline int fullset_live(const PoolObject *pool, const FullEntry *e) {
    const Pattern *pt = &pool->pats[e->pat];
    return pt->uid != 0 && pt->gen == e->gen && !pt->settled;
}

static int fullset_add(PoolObject *pool, int32_t pat, int32_t gen, Ref m) {
    if ((pool->fullset_used + 1) * 2 > pool->fullset_mask + 1) { /* rebuild without stale entries */
        uint64_t live = 0;
        for (uint64_t i = 0; i <= pool->fullset_mask; i++)
            if (pool->fullset[i].pat >= 0 && fullset_live(pool, &pool->fullset[i])) live++;
        uint64_t slots = 64;
        while ((live + 1) * 4 > slots) slots *= 2;
        uint64_t mask = slots - 1;
        FullEntry *fs = PyMem_Malloc((size_t)slots * sizeof(FullEntry));
        if (!fs) { PyErr_NoMemory(); return -1; }
        for (uint64_t j = 0; j < slots; j++) fs[j].pat = -1;
        for (uint64_t i = 0; i <= pool->fullset_mask; i++) {
            FullEntry *e = &pool->fullset[i];
            if (e->pat < 0 || !fullset_live(pool, e)) continue;
            uint64_t j = e->hash & mask;
            while (fs[j].pat >= 0) j = (j + 1) & mask;
            fs[j] = *e;
        }
        PyMem_Free(pool->fullset);
        pool->fullset = fs;
        pool->fullset_mask = mask;
        pool->fullset_used = live;
    }
    uint64_t h = full_hash(pool, pat, gen, m), mask = pool->fullset_mask, j = h & mask;
    while (pool->fullset[j].pat >= 0) j = (j + 1) & mask;
    pool->fullset[j] = (FullEntry){h, pat, gen, m};
    pool->fullset_used++;
    return 0;
}

/* ---------------------------------------------------------------- one pattern's S */

static inline Ref first_of(const Pattern *pt) {
    if (pt->nshort && (pt->nfull == 0 || pt->shorts[0].seq < pt->full_first_seq)) return pt->shorts[0].m;
    return pt->full_first;
}

static inline Ref last_of(const Pattern *pt) {
    if (pt->nshort && (pt->nfull == 0 || pt->shorts[pt->nshort - 1].seq > pt->full_last_seq))
        return pt->shorts[pt->nshort - 1].m;
    return pt->full_last;
}

/* With is_use_oldest: S[0:cand] are all full, so no draft or candidate can change again. */
static int is_final(const PoolObject *pool, const Pattern *pt) {
    if (!pool->use_oldest) return 0;
    if (pool->cand == 1) return first_of(pt).len == pool->k;
    return pt->nkeep == pool->cand && (pt->nshort == 0 || pt->shorts[0].seq > pt->keep[pt->nkeep - 1].seq);
}

static int keep_full(PoolObject *pool, Pattern *pt, Ref m, int64_t seq) {
    if (!pt->keep) {
        pt->keep = PyMem_Malloc((size_t)pool->cand * sizeof(Kept));
        if (!pt->keep) { PyErr_NoMemory(); return -1; }
    }
    if (pt->nkeep < pool->cand) {
        pt->keep[pt->nkeep++] = (Kept){m, seq};
    } else if (!pool->use_oldest) { /* keep the last cand: drop the oldest */
        memmove(pt->keep, pt->keep + 1, (size_t)(pool->cand - 1) * sizeof(Kept));
        pt->keep[pool->cand - 1] = (Kept){m, seq};
    }
    return 0;
}

static int append_match(PoolObject *pool, int32_t pi, Ref m) {
    Pattern *pt = &pool->pats[pi];
    int64_t seq = pt->seq++;
    if (m.len == pool->k) {
        if (pt->nfull == 0) {
            pt->full_first = m;
            pt->full_first_seq = seq;
        }
        pt->full_last = m;
        pt->full_last_seq = seq;
        pt->nfull++;
        if (pool->cand > 1 && keep_full(pool, pt, m, seq) < 0) return -1;
        /* a settled pattern is never asked again; the set is only for unsettled ones */
        if (!is_final(pool, pt)) return fullset_add(pool, pi, pt->gen, m);
        return 0;
    }
    if (grow((void **)&pt->shorts, &pt->cap_short, (int64_t)pt->nshort + 1, sizeof(Short)) < 0) return -1;
    pt->shorts[pt->nshort++] = (Short){m, seq, pt->nfull};
    return 0;
}

static void settle_if_final(PoolObject *pool, Pattern *pt) {
    if (is_final(pool, pt)) {
        pt->settled = 1;
        PyMem_Free(pt->shorts);
        pt->shorts = NULL;
        pt->nshort = pt->cap_short = 0;
    }
}

/* One TensorRT-LLM insertion of match m into pattern pi's S (the rule in pool.py). */
static int insert_match(PoolObject *pool, int32_t pi, Ref m) {
    Pattern *pt = &pool->pats[pi];
    if (pt->settled) return 0;
    if (pt->nshort + pt->nfull == 0 || (!pool->keep_all && m.len > first_of(pt).len)) {
        pt->gen++; /* S = [m]: forget every full match at once */
        pt->nfull = 0;
        pt->nshort = 0;
        pt->nkeep = 0;
        if (append_match(pool, pi, m) < 0) return -1;
        settle_if_final(pool, &pool->pats[pi]);
        return 0;
    }
    if (m.len == pool->k) {
        if (pt->nfull && fullset_contains(pool, pi, pt->gen, m)) return 0;
    } else {
        for (int32_t i = 0; i < pt->nshort; i++)
            if (ref_eq(pool, pt->shorts[i].m, m)) return 0;
    }
    if (pt->nshort) { /* remove shorter matches, skipping the one after each removal */
        int32_t w = 0;
        int prev_removed = 0;
        int64_t prev_nfull = -1;
        for (int32_t i = 0; i < pt->nshort; i++) {
            Short e = pt->shorts[i];
            if (prev_removed && e.nfull == prev_nfull) {
                pt->shorts[w++] = e;
                prev_removed = 0;
            } else if (e.m.len < m.len) {
                prev_removed = 1;
            } else {
                pt->shorts[w++] = e;
                prev_removed = 0;
            }
            prev_nfull = e.nfull;
        }
        pt->nshort = w;
    }
    if (append_match(pool, pi, m) < 0) return -1;
    settle_if_final(pool, &pool->pats[pi]);
    return 0;
}

/* ---------------------------------------------------------------- NGramPool */

static void pool_dealloc(PoolObject *self) {
    for (int32_t i = 0; i < self->ntexts; i++) PyMem_Free(self->texts[i].data);
    for (int32_t i = 0; i < self->npats; i++) {
        PyMem_Free(self->pats[i].shorts);
        PyMem_Free(self->pats[i].keep);
    }
    PyMem_Free(self->texts);
    PyMem_Free(self->free_texts);
    PyMem_Free(self->pats);
    PyMem_Free(self->index);
    PyMem_Free(self->fullset);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pool_init(PoolObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"k", "n", "is_keep_all", "is_use_oldest", "max_candidates", "max_patterns", NULL};
    int k, n, keep_all, use_oldest, cand = 1;
    PyObject *limit = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iipp|iO", kwlist, &k, &n, &keep_all, &use_oldest, &cand, &limit))
        return -1;
    long long max_patterns = 0;
    if (limit != Py_None) {
        if (PyBool_Check(limit) || !PyLong_Check(limit)) {
            PyErr_Format(PyExc_ValueError, "max_patterns must be a positive integer or None, got %R", limit);
            return -1;
        }
        int overflow;
        max_patterns = PyLong_AsLongLongAndOverflow(limit, &overflow);
        if (max_patterns == -1 && PyErr_Occurred()) return -1;
        if (overflow > 0 || max_patterns > INT32_MAX) max_patterns = INT32_MAX; /* no pool gets that far */
        if (overflow < 0 || max_patterns < 1) {
            PyErr_Format(PyExc_ValueError, "max_patterns must be a positive integer or None, got %R", limit);
            return -1;
        }
    }
    if (k < 1 || n < 1) {
        PyErr_Format(PyExc_ValueError, "k and n must be >= 1, got k=%d n=%d", k, n);
        return -1;
    }
    if (cand < 1 || cand > MAX_CANDIDATES) {
        PyErr_Format(PyExc_ValueError, "max_candidates must be in 1..%d, got %d", MAX_CANDIDATES, cand);
        return -1;
    }
    if (self->index) {
        PyErr_SetString(PyExc_RuntimeError, "NGramPool is already initialised");
        return -1;
    }
    self->k = k;
    self->n = n;
    self->keep_all = keep_all;
    self->use_oldest = use_oldest;
    self->cand = cand;
    self->max_patterns = max_patterns;
    self->lru_head = self->lru_tail = self->free_head = -1;
    self->next_uid = 1;
    if (index_rebuild(self, 64) < 0) return -1;
    self->fullset = PyMem_Malloc(64 * sizeof(FullEntry));
    if (!self->fullset) { PyErr_NoMemory(); return -1; }
    for (int j = 0; j < 64; j++) self->fullset[j].pat = -1;
    self->fullset_mask = 63;
    return 0;
}

/* ---------------------------------------------------------------- compaction of dead texts */

static inline int text_dead(const PoolObject *pool, int32_t t, int32_t arena) {
    return t != arena && pool->texts[t].state == TEXT_DEAD;
}

static inline int64_t dead_len(const PoolObject *pool, Ref r, int32_t arena) {
    return text_dead(pool, r.text, arena) ? r.len : 0;
}

static inline Ref move_ref(PoolObject *pool, Ref r, int32_t arena) {
    if (!text_dead(pool, r.text, arena) || r.len == 0) return r;
    Text *a = &pool->texts[arena];
    memcpy(a->data + a->len, ref_data(pool, r), (size_t)r.len * sizeof(tok_t));
    Ref out = {arena, (int32_t)a->len, r.len};
    a->len += r.len;
    return out;
}

/* A text slot for a new text (reused or appended), TEXT_FREE and empty; -1 on error. */
static int32_t new_text_slot(PoolObject *pool) {
    if (pool->nfree_texts) return pool->free_texts[--pool->nfree_texts];
    if (pool->ntexts == INT32_MAX) { PyErr_NoMemory(); return -1; }
    if (grow((void **)&pool->texts, &pool->cap_texts, (int64_t)pool->ntexts + 1, sizeof(Text)) < 0) return -1;
    pool->texts[pool->ntexts] = (Text){NULL, 0, 0, TEXT_FREE};
    return pool->ntexts++;
}

/* Copy every reference into a dead text into one new arena text, then free the dead texts
 * (see the top of the file). 0, or -1 with an exception set (nothing is then changed). */
static int compact_texts(PoolObject *pool) {
    if (pool->nfree_texts == 0 && pool->ntexts == INT32_MAX) return 0;
    /* tokens to copy: references that must survive */
    int64_t need = 0;
    for (int32_t i = 0; i < pool->npats; i++) {
        const Pattern *pt = &pool->pats[i];
        if (pt->uid == 0) continue;
        if (text_dead(pool, pt->key_text, -1)) need += pt->size;
        if (pt->nfull) need += dead_len(pool, pt->full_first, -1) + dead_len(pool, pt->full_last, -1);
        for (int32_t j = 0; j < pt->nshort; j++) need += dead_len(pool, pt->shorts[j].m, -1);
        for (int32_t j = 0; j < pt->nkeep; j++) need += dead_len(pool, pt->keep[j].m, -1);
    }
    uint64_t live = 0;
    for (uint64_t j = 0; j <= pool->fullset_mask; j++) {
        const FullEntry *e = &pool->fullset[j];
        if (e->pat >= 0 && fullset_live(pool, e)) {
            live++;
            need += dead_len(pool, e->m, -1);
        }
    }
    if (need > INT32_MAX - 1) return 0; /* an arena that large cannot be referenced: keep the texts */
    uint64_t slots = 64;
    while ((live + 1) * 4 > slots) slots *= 2;
    FullEntry *fs = PyMem_Malloc((size_t)slots * sizeof(FullEntry));
    tok_t *data = PyMem_Malloc(need > 0 ? (size_t)need * sizeof(tok_t) : 1);
    if (!fs || !data) { PyMem_Free(fs); PyMem_Free(data); PyErr_NoMemory(); return -1; }
    int32_t arena = new_text_slot(pool);
    if (arena < 0) { PyMem_Free(fs); PyMem_Free(data); return -1; }
    pool->texts[arena] = (Text){data, 0, need, TEXT_DEAD};
    for (int32_t i = 0; i < pool->npats; i++) {
        Pattern *pt = &pool->pats[i];
        if (pt->uid == 0) continue;
        if (text_dead(pool, pt->key_text, arena)) {
            Ref k = move_ref(pool, (Ref){pt->key_text, pt->key_off, pt->size}, arena);
            pt->key_text = k.text;
            pt->key_off = k.off;
        }
        if (pt->nfull) {
            pt->full_first = move_ref(pool, pt->full_first, arena);
            pt->full_last = move_ref(pool, pt->full_last, arena);
        }
        for (int32_t j = 0; j < pt->nshort; j++) pt->shorts[j].m = move_ref(pool, pt->shorts[j].m, arena);
        for (int32_t j = 0; j < pt->nkeep; j++) pt->keep[j].m = move_ref(pool, pt->keep[j].m, arena);
    }
    uint64_t mask = slots - 1;
    for (uint64_t j = 0; j < slots; j++) fs[j].pat = -1;
    for (uint64_t i = 0; i <= pool->fullset_mask; i++) {
        FullEntry e = pool->fullset[i];
        if (e.pat < 0 || !fullset_live(pool, &e)) continue;
        e.m = move_ref(pool, e.m, arena); /* same tokens: same hash */
        uint64_t j = e.hash & mask;
        while (fs[j].pat >= 0) j = (j + 1) & mask;
        fs[j] = e;
    }
    PyMem_Free(pool->fullset);
    pool->fullset = fs;
    pool->fullset_mask = mask;
    pool->fullset_used = live;
    /* free the dead texts (every reference now points elsewhere) */
    for (int32_t t = 0; t < pool->ntexts; t++) {
        if (!text_dead(pool, t, arena)) continue;
        if (grow((void **)&pool->free_texts, &pool->cap_free_texts, pool->nfree_texts + 1, sizeof(int32_t)) < 0) {
            PyErr_Clear(); /* the slot stays dead and empty; nothing refers to it */
        } else {
            pool->free_texts[pool->nfree_texts++] = t;
        }
        PyMem_Free(pool->texts[t].data);
        pool->texts[t] = (Text){NULL, 0, 0, TEXT_FREE};
    }
    pool->dead_tokens = pool->arena_tokens = need;
    return 0;
}

static PyObject *pool_num_patterns(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(self->live);
}

/* Bytes the pool's own allocations hold (capacities, not lengths): texts, pattern slots,
 * their truncated and kept matches, the index and the full-match set. O(pattern slots). */
static PyObject *pool_nbytes(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
    size_t b = sizeof(PoolObject) + (size_t)self->cap_texts * sizeof(Text) + (size_t)self->cap_pats * sizeof(Pattern);
    for (int32_t i = 0; i < self->ntexts; i++) b += (size_t)self->texts[i].cap * sizeof(tok_t);
    for (int32_t i = 0; i < self->npats; i++) {
        b += (size_t)self->pats[i].cap_short * sizeof(Short);
        if (self->pats[i].keep) b += (size_t)self->cand * sizeof(Kept);
    }
    b += (size_t)(self->index_mask + 1) * sizeof(int32_t) + (size_t)(self->fullset_mask + 1) * sizeof(FullEntry);
    return PyLong_FromSize_t(b);
}

static PyMethodDef pool_methods[] = {
    {"num_patterns", (PyCFunction)pool_num_patterns, METH_NOARGS, "Number of distinct n-grams indexed (all sizes)."},
    {"nbytes", (PyCFunction)pool_nbytes, METH_NOARGS, "Bytes held by the pool's own allocations."},
    {NULL, NULL, 0, NULL},
};

static PyObject *pool_get_k(PoolObject *s, void *c) { return PyLong_FromLong(s->k); }
static PyObject *pool_get_n(PoolObject *s, void *c) { return PyLong_FromLong(s->n); }
static PyObject *pool_get_keep_all(PoolObject *s, void *c) { return PyBool_FromLong(s->keep_all); }
static PyObject *pool_get_use_oldest(PoolObject *s, void *c) { return PyBool_FromLong(s->use_oldest); }
static PyObject *pool_get_cand(PoolObject *s, void *c) { return PyLong_FromLong(s->cand); }
static PyObject *pool_get_max_patterns(PoolObject *s, void *c) {
    if (!s->max_patterns) Py_RETURN_NONE;
    return PyLong_FromLongLong(s->max_patterns);
}
static PyObject *pool_get_evictions(PoolObject *s, void *c) { return PyLong_FromLongLong(s->evictions); }

static PyGetSetDef pool_getset[] = {
    {"k", (getter)pool_get_k, NULL, "prompt_lookup_num_tokens", NULL},
    {"n", (getter)pool_get_n, NULL, "max_matching_ngram_size", NULL},
    {"is_keep_all", (getter)pool_get_keep_all, NULL, NULL, NULL},
    {"is_use_oldest", (getter)pool_get_use_oldest, NULL, NULL, NULL},
    {"max_candidates", (getter)pool_get_cand, NULL, "matches kept per pattern for candidates()", NULL},
    {"max_patterns", (getter)pool_get_max_patterns, NULL, "the most patterns kept (None: unbounded)", NULL},
    {"evictions", (getter)pool_get_evictions, NULL, "patterns evicted so far (least recently used first)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "promptlookup.drafting.native._pool.NGramPool",
    .tp_doc = "NGramPool(k, n, is_keep_all, is_use_oldest): TensorRT-LLM's n-gram pool (see pool.py).",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pool_init,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};

/* ---------------------------------------------------------------- PoolCursor */

static void cursor_dealloc(CursorObject *self) {
    if (self->pool && self->tails) { /* the text stays until the next compaction (refs into it) */
        Text *t = &self->pool->texts[self->text];
        t->state = TEXT_DEAD;
        self->pool->dead_tokens += t->len;
    }
    if (self->tails) {
        for (int s = 0; self->pool && s <= self->pool->n; s++) PyMem_Free(self->tails[s].items);
        PyMem_Free(self->tails);
    }
    Py_XDECREF(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int cursor_init(CursorObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pool", NULL};
    PyObject *pool;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", kwlist, &PoolType, &pool)) return -1;
    PoolObject *p = (PoolObject *)pool;
    if (self->pool) {
        PyErr_SetString(PyExc_RuntimeError, "PoolCursor is already initialised");
        return -1;
    }
    if (!p->index) {
        PyErr_SetString(PyExc_ValueError, "the NGramPool is not initialised");
        return -1;
    }
    if (p->dead_tokens > 2 * p->arena_tokens + COMPACT_MIN_TOKENS && compact_texts(p) < 0) return -1;
    int32_t text = new_text_slot(p);
    if (text < 0) return -1;
    self->tails = PyMem_Calloc((size_t)p->n + 1, sizeof(TailList));
    if (!self->tails) {  /* the slot goes back to the free list when it can */
        if (grow((void **)&p->free_texts, &p->cap_free_texts, p->nfree_texts + 1, sizeof(int32_t)) == 0)
            p->free_texts[p->nfree_texts++] = text;
        PyErr_NoMemory();
        return -1;
    }
    self->text = text;
    p->texts[text] = (Text){NULL, 0, 0, TEXT_OWNED};
    Py_INCREF(pool);
    self->pool = p;
    self->prev_len = -1;
    return 0;
}

static inline int push_tail(TailList *t, int64_t p, int32_t pat, int64_t uid) {
    if (t->len == t->cap && grow((void **)&t->items, &t->cap, t->len + 1, sizeof(Tail)) < 0) return -1;
    t->items[t->len++] = (Tail){p, pat, uid};
    return 0;
}

/* Append the new tokens (`tail`, a private snapshot of text[have:] from private_tokens) to
 * the cursor's text, which then has `len` tokens. The tokens are converted into a local
 * buffer first: converting may run Python code (__index__), which could create cursors
 * (moving pool->texts) or call propose re-entrantly, so the text is only looked up, and
 * changed, afterwards. On error nothing is changed. */
static int sync_text(CursorObject *self, PyObject *tail, Py_ssize_t len) {
    const Py_ssize_t have = self->pool->texts[self->text].len;
    if (len < have) {
        PyErr_Format(PyExc_ValueError, "the text shrank from %zd to %zd tokens; a cursor's text may only grow",
                     have, len);
        return -1;
    }
    if (len > INT32_MAX - 1) {
        PyErr_SetString(PyExc_OverflowError, "texts longer than 2**31 - 2 tokens are not supported");
        return -1;
    }
    Py_ssize_t n;
    tok_t *buf = tokens_to_buffer(tail, &n);
    if (!buf) return -1;
    Text *t = &self->pool->texts[self->text];
    if (t->len != have || have + n != len) {
        PyMem_Free(buf);
        PyErr_SetString(PyExc_RuntimeError, "the cursor's text changed while its tokens were read");
        return -1;
    }
    if (grow((void **)&t->data, &t->cap, len, sizeof(tok_t)) < 0) { PyMem_Free(buf); return -1; }
    if (n) memcpy(t->data + have, buf, (size_t)n * sizeof(tok_t));
    PyMem_Free(buf);
    t->len = len;
    return 0;
}

static PyObject *empty_answer(void) { return Py_BuildValue("([]i)", 0); }

/* Check the argument count of `signature`, then parse (text, max_seq_len, ...): the text's
 * length and the room left for a draft, max_seq_len - 1 - length. -1 on error. */
static int parse_room(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, const char *signature,
                      Py_ssize_t *length, long long *budget) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", signature, expected);
        return -1;
    }
    *length = PySequence_Length(args[0]);
    if (*length < 0) return -1;
    long long limit = PyLong_AsLongLong(args[1]);
    if (limit == -1 && PyErr_Occurred()) return -1;
    *budget = limit - 1 - (long long)*length;
    return 0;
}

static PyObject *cursor_propose(CursorObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PoolObject *pool = self->pool;
    if (!pool) {
        PyErr_SetString(PyExc_ValueError, "the PoolCursor is not initialised; create it as PoolCursor(pool)");
        return NULL;
    }
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "propose(text, max_seq_len) takes 2 arguments");
        return NULL;
    }
    long long max_seq_len = PyLong_AsLongLong(args[1]); /* before the text: may run Python code */
    if (max_seq_len == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t length;
    PyObject *tail = private_tokens(args[0], pool->texts[self->text].len, &length,
                                    "text must be a sequence of int token ids");
    if (!tail) return NULL;
    long long budget = max_seq_len - 1 - (long long)length;
    if (budget <= 0) { /* TensorRT-LLM updates nothing either */
        Py_DECREF(tail);
        return empty_answer();
    }
    int synced = sync_text(self, tail, length);
    Py_DECREF(tail);
    if (synced < 0) return NULL;

    const int32_t text = self->text;
    const int64_t L = length, k = pool->k, prev = self->prev_len;
    const int top = (int)(pool->n < L - 1 ? pool->n : L - 1);
    for (int s = top; s >= 1; s--) {
        const int64_t keep_from = L - s - k + 1; /* positions from here on stay truncated */
        TailList *tl = &self->tails[s];
        int64_t w = 0;
        for (int64_t i = 0; i < tl->len; i++) { /* positions truncated at the previous call */
            Tail t = tl->items[i];
            if (pool->pats[t.pat].uid != t.uid || pool->pats[t.pat].settled) continue; /* evicted or settled */
            int64_t q = t.p + s, r = q + k < L ? q + k : L;
            if (insert_match(pool, t.pat, (Ref){text, (int32_t)q, (int32_t)(r - q)}) < 0) return NULL;
            if (t.p >= keep_from && !pool->pats[t.pat].settled && pool->pats[t.pat].uid == t.uid) tl->items[w++] = t;
        }
        tl->len = w;
        int64_t from = prev < 0 ? 0 : (prev - s > 0 ? prev - s : 0);
        for (int64_t p = from; p < L - s; p++) { /* positions new since the previous call */
            int created;
            int32_t pi = find_pattern(pool, text, p, s, 1, &created);
            if (pi < -1) return NULL;
            if (!created) touch(pool, pi); /* a new occurrence: the pattern is used */
            if (pool->pats[pi].settled) continue;
            int64_t q = p + s, r = q + k < L ? q + k : L;
            if (insert_match(pool, pi, (Ref){text, (int32_t)q, (int32_t)(r - q)}) < 0) return NULL;
            if (p >= keep_from && !pool->pats[pi].settled && push_tail(tl, p, pi, pool->pats[pi].uid) < 0)
                return NULL;
        }
    }
    self->prev_len = L;

    for (int s = top; s >= 1; s--) {
        int created;
        int32_t pi = find_pattern(pool, text, L - s, s, 0, &created);
        if (pi < 0) continue;
        touch(pool, pi); /* the hit that gives the draft */
        Pattern *pt = &pool->pats[pi];
        Ref m = pool->use_oldest ? first_of(pt) : last_of(pt);
        int64_t n = m.len < budget ? m.len : budget;
        PyObject *draft = PyList_New((Py_ssize_t)n);
        if (!draft) return NULL;
        const tok_t *d = ref_data(pool, m);
        for (int64_t i = 0; i < n; i++) {
            PyObject *v = PyLong_FromLongLong(d[i]);
            if (!v) { Py_DECREF(draft); return NULL; }
            PyList_SET_ITEM(draft, (Py_ssize_t)i, v);
        }
        return Py_BuildValue("(Ni)", draft, s);
    }
    return empty_answer();
}

static PyObject *ref_list(const PoolObject *pool, Ref m) {
    PyObject *list = PyList_New((Py_ssize_t)m.len);
    if (!list) return NULL;
    const tok_t *d = ref_data(pool, m);
    for (int32_t i = 0; i < m.len; i++) {
        PyObject *v = PyLong_FromLongLong(d[i]);
        if (!v) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

/* m (already cut) is empty, or equal to or a prefix of one of chosen[0:nchosen]. */
static int covered(const PoolObject *pool, Ref m, const Ref *chosen, int nchosen) {
    if (m.len == 0) return 1;
    for (int i = 0; i < nchosen; i++)
        if (chosen[i].len >= m.len &&
            memcmp(ref_data(pool, chosen[i]), ref_data(pool, m), (size_t)m.len * sizeof(tok_t)) == 0)
            return 1;
    return 0;
}

/* candidates(text, max_seq_len, max_candidates): pool.py's PoolCursor.candidates. */
static PyObject *cursor_candidates(CursorObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PoolObject *pool = self->pool;
    if (!pool) {
        PyErr_SetString(PyExc_ValueError, "the PoolCursor is not initialised; create it as PoolCursor(pool)");
        return NULL;
    }
    Py_ssize_t length;
    long long budget;
    if (parse_room(args, nargs, 3, "candidates(text, max_seq_len, max_candidates)", &length, &budget) < 0)
        return NULL;
    long long want = PyLong_AsLongLong(args[2]);
    if (want == -1 && PyErr_Occurred()) return NULL;
    PyObject *out = PyList_New(0);
    if (!out || budget <= 0 || want < 1) return out;
    if (self->prev_len != length || pool->texts[self->text].len != length) {
        Py_DECREF(out);
        PyErr_Format(PyExc_ValueError, "candidates() needs propose() for the same text first "
                     "(text has %zd tokens, the last proposal saw %lld)", length, (long long)self->prev_len);
        return NULL;
    }
    if (want > MAX_CANDIDATES) {
        Py_DECREF(out);
        PyErr_Format(PyExc_ValueError, "max_candidates must be <= %d, got %lld", MAX_CANDIDATES, want);
        return NULL;
    }
    Ref chosen[MAX_CANDIDATES];
    int nchosen = 0;
    const int64_t per = want < pool->cand ? want : pool->cand;
    const int top = (int)(pool->n < length - 1 ? pool->n : length - 1);
    for (int s = top; s >= 1 && nchosen < want; s--) {
        int created;
        int32_t pi = find_pattern(pool, self->text, length - s, s, 0, &created);
        if (pi < 0) continue;
        const Pattern *pt = &pool->pats[pi];
        Ref ms[MAX_CANDIDATES];
        int nm = 0;
        if (per <= 1) {
            ms[nm++] = pool->use_oldest ? first_of(pt) : last_of(pt);
        } else if (pool->use_oldest) { /* S[0], S[1], ...: merge by sequence number */
            int32_t i = 0, j = 0;
            while (nm < per && (i < pt->nshort || j < pt->nkeep)) {
                if (j == pt->nkeep || (i < pt->nshort && pt->shorts[i].seq < pt->keep[j].seq))
                    ms[nm++] = pt->shorts[i++].m;
                else
                    ms[nm++] = pt->keep[j++].m;
            }
        } else { /* S[-1], S[-2], ... */
            int32_t i = pt->nshort - 1, j = pt->nkeep - 1;
            while (nm < per && (i >= 0 || j >= 0)) {
                if (j < 0 || (i >= 0 && pt->shorts[i].seq > pt->keep[j].seq))
                    ms[nm++] = pt->shorts[i--].m;
                else
                    ms[nm++] = pt->keep[j--].m;
            }
        }
        for (int t = 0; t < nm && nchosen < want; t++) {
            Ref m = ms[t];
            if (m.len > budget) m.len = (int32_t)budget;
            if (covered(pool, m, chosen, nchosen)) continue;
            chosen[nchosen++] = m;
            PyObject *draft = ref_list(pool, m);
            PyObject *item = draft ? Py_BuildValue("(Ni)", draft, s) : NULL;
            if (!item || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(item);
        }
    }
    return out;
}

static PyMethodDef cursor_methods[] = {
    {"candidates", (PyCFunction)(void (*)(void))cursor_candidates, METH_FASTCALL,
     "candidates(text, max_seq_len, max_candidates) -> [(draft, n-gram size)], after propose(text, ...): "
     "see pool.py. Reads the pool, never changes it."},
    {"propose", (PyCFunction)(void (*)(void))cursor_propose, METH_FASTCALL,
     "propose(text, max_seq_len) -> (draft, matched n-gram size; 0 on no hit): TensorRT-LLM's get_draft_tokens."},
    {NULL, NULL, 0, NULL},
};

static PyObject *cursor_get_pool(CursorObject *s, void *c) {
    PyObject *pool = s->pool ? (PyObject *)s->pool : Py_None;
    Py_INCREF(pool);
    return pool;
}
static PyObject *cursor_get_prev_len(CursorObject *s, void *c) { return PyLong_FromLongLong(s->prev_len); }

static PyGetSetDef cursor_getset[] = {
    {"pool", (getter)cursor_get_pool, NULL, "the NGramPool this cursor updates", NULL},
    {"prev_len", (getter)cursor_get_prev_len, NULL, "text length at the previous updating call (-1: none)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CursorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "promptlookup.drafting.native._pool.PoolCursor",
    .tp_doc = "PoolCursor(pool): one request's view of an NGramPool (see pool.py).",
    .tp_basicsize = sizeof(CursorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)cursor_init,
    .tp_dealloc = (destructor)cursor_dealloc,
    .tp_methods = cursor_methods,
    .tp_getset = cursor_getset,
};

static struct PyModuleDef pool_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_pool",
    .m_doc = "TensorRT-LLM's n-gram pool in C (see promptlookup/drafting/pool.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__pool(void) {
    if (PyType_Ready(&PoolType) < 0 || PyType_Ready(&CursorType) < 0) return NULL;
    PyObject *m = PyModule_Create(&pool_module);
    if (!m) return NULL;
    Py_INCREF(&PoolType);
    Py_INCREF(&CursorType);
    if (PyModule_AddObject(m, "NGramPool", (PyObject *)&PoolType) < 0 ||
        PyModule_AddObject(m, "PoolCursor", (PyObject *)&CursorType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
