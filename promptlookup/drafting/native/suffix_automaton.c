/* C implementation of promptlookup/drafting/suffix_automaton.py (same classes, same results).
 *
 * SuffixAutomaton(max_len) indexes a growing stream of int64 tokens with the online suffix
 * automaton construction (Blumer et al.): a state is an endpos class, `link` its suffix link,
 * `len` the length of its longest string. After every append it knows the longest suffix of
 * the stream that also ended earlier, capped at max_len tokens (`match_len`), and the most
 * recent such earlier end (`match_end`, -1 when match_len == 0). For that, each state v keeps
 * recent[v] = max(endpos(v)), maintained only for the states whose shortest string has at
 * most max_len tokens: a new position i refreshes the suffix-link chain from the `window`
 * state (the one holding the min(max_len, L)-token suffix) to the root. Lengths strictly
 * decrease along that chain, so it has at most max_len + 1 states, in practice a handful.
 * The window state is advanced by one transition per token (after stepping up once or
 * more if a split moved its string into a new clone), never found by walking from `last`.
 *
 * Matcher(sam) walks an automaton that may keep growing with a query stream and tracks the
 * longest suffix of the query (capped at max_len) found in the automaton's text. States only
 * split by inserting a clone as the suffix link of the split state, so before each use the
 * matcher re-points itself by going up suffix links while the parent still holds strings of
 * `matched` tokens (settle). Its continuation is cut before the first negative token (the
 * separators between texts).
 *
 * Candidates (SuffixAutomaton(max_len, occurrences=True)): the refresh at position i also
 * records, per chain state v, (shortest length of v, previous recent[v] or -1) in occ_lo[],
 * occ_prev[] (position i's records: occ_start[i] .. occ_start[i + 1] - 1, longest first), so
 * every occurrence of a suffix links to the one before it. candidates(k, max_candidates,
 * max_scan) on both classes walks those links exactly as suffix_automaton.py does, reading
 * and never changing the automaton: O(max_scan * (d + max_candidates * k)).
 *
 * Data layout (no dense per-state arrays: the vocabulary is large):
 * - tok[]:   the tokens, int64, and obj[]: the same tokens as Python ints (strong
 *            references), so a continuation is a list of INCREFs, not of new ints.
 * - st[]:    per state {len, link, recent, head, tok0, to0}, 32 bytes. (tok0 -> to0) is the
 *            state's first transition, stored inline (to0 == -1: no transitions): most
 *            states have exactly one, so most lookups touch only the state record.
 * - slot[]:  the other transitions, in one open-addressing table (linear probing,
 *            power-of-two capacity, load <= 1/2) keyed by (state, token) holding the target
 *            state; from == -1 marks an empty slot.
 * - edge[]:  per state a singly linked list (head -> next) of the tokens of its transitions
 *            in slot[], used only to copy a state's transitions when it is cloned.
 * Invariants: transitions are only added or redirected, never removed; every transition
 * (v, t) is either v's inline one or in slot[] exactly once with t once in v's edge list;
 * v has table transitions only if it has an inline one; nedge <= capacity/2; state and
 * token counts fit int32.
 *
 * Cost: append is O(1) amortised for the automaton plus O(d) for the recent refresh
 * (d <= max_len + 1, the short chain); a transition lookup reads the state record and, if
 * the inline transition is not the one, probes the table (expected O(1)).
 * Before touching anything, append counts the edges it will add and reserves all memory,
 * so a MemoryError leaves the automaton unchanged. continuation(k) builds one list.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

#define MAX_TOKENS ((Py_ssize_t)1 << 29) /* keeps states (<= 2n) and edges (<= 3n) in int32 */
#define STACK_TOKENS 64

typedef struct { int32_t len, link, recent, head; int64_t tok0; int32_t to0, unused; } State;
typedef struct { int64_t tok; int32_t next, unused; } Edge;
typedef struct { int64_t tok; int32_t from, to; } Slot;

typedef struct {
    PyObject_HEAD
    int max_len, match_len, match_end;
    int32_t last, window;
    int64_t *tok;
    PyObject **obj;
    Py_ssize_t ntok, cap_tok, cap_obj;
    State *st;
    Py_ssize_t nst, cap_st;
    Edge *edge;
    Py_ssize_t nedge, cap_edge;
    Slot *slot;
    size_t mask;  /* table capacity - 1 */
    int shift;    /* 64 - log2(capacity) */
    int occurrences;         /* keep the occurrence records below */
    int32_t *occ_lo, *occ_prev;
    Py_ssize_t nocc, cap_lo, cap_prev;
    int32_t *occ_start;      /* ntok + 1 entries */
    Py_ssize_t cap_start;
} SamObject;

typedef struct {
    PyObject_HEAD
    SamObject *sam;
    int state, matched;
} MatcherObject;

static PyTypeObject SamType, MatcherType;

/* ---- storage ---------------------------------------------------------------------- */

static inline size_t slot_of(const SamObject *s, int32_t from, int64_t tok) {
    uint64_t h = (uint64_t)tok * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uint32_t)from * 0xC2B2AE3D27D4EB4FULL;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ULL;
    return (size_t)(h >> s->shift);
}

/* The slot holding (from, tok), or the empty slot where it would go. */
static inline size_t probe(const SamObject *s, int32_t from, int64_t tok) {
    size_t i = slot_of(s, from, tok);
    for (;;) {
        const Slot *sl = &s->slot[i];
        if (sl->from < 0 || (sl->from == from && sl->tok == tok)) return i;
        i = (i + 1) & s->mask;
    }
}

static inline int32_t get(const SamObject *s, int32_t from, int64_t tok) {
    const State *v = &s->st[from];
    if (v->to0 < 0) return -1;  /* no transitions (e.g. `last`) */
    if (v->tok0 == tok) return v->to0;
    if (v->head < 0) return -1;
    const Slot *sl = &s->slot[probe(s, from, tok)];
    return sl->from < 0 ? -1 : sl->to;
}

/* Make room for `extra` more edges in edge[] and slot[] (load <= 1/2); rehashes if needed. */
static int reserve_edges(SamObject *s, Py_ssize_t extra) {
    Py_ssize_t need = s->nedge + extra;
    if (grow((void **)&s->edge, &s->cap_edge, need, sizeof(Edge)) < 0) return -1;
    size_t cap = s->mask + 1;
    if ((size_t)need <= cap / 2) return 0;
    int bits = 64 - s->shift;
    while ((size_t)need > cap / 2) {
        if (bits >= 40) { PyErr_NoMemory(); return -1; }
        cap <<= 1;
        bits++;
    }
    if (cap > (size_t)PY_SSIZE_T_MAX / sizeof(Slot)) { PyErr_NoMemory(); return -1; }
    Slot *fresh = PyMem_Malloc(cap * sizeof(Slot));
    if (fresh == NULL) { PyErr_NoMemory(); return -1; }
    memset(fresh, 0xff, cap * sizeof(Slot));  /* from == -1 everywhere */
    Slot *old = s->slot;
    size_t old_cap = s->mask + 1;
    s->slot = fresh;
    s->mask = cap - 1;
    s->shift = 64 - bits;
    for (size_t j = 0; j < old_cap; j++)
        if (old[j].from >= 0) s->slot[probe(s, old[j].from, old[j].tok)] = old[j];
    PyMem_Free(old);
    return 0;
}

/* Add the transition (from, tok) -> to, known to be absent; memory already reserved. */
static inline void add_edge(SamObject *s, int32_t from, int64_t tok, int32_t to) {
    State *v = &s->st[from];
    if (v->to0 < 0) {
        v->tok0 = tok;
        v->to0 = to;
        return;
    }
    Slot *sl = &s->slot[probe(s, from, tok)];
    sl->tok = tok;
    sl->from = from;
    sl->to = to;
    Py_ssize_t e = s->nedge++;
    s->edge[e].tok = tok;
    s->edge[e].next = v->head;
    s->edge[e].unused = 0;
    v->head = (int32_t)e;
}

/* ---- SuffixAutomaton ---------------------------------------------------------------- */

/* Append token c; `o` is c as an exact int (borrowed; the automaton takes a reference). */
static int sam_append(SamObject *s, int64_t c, PyObject *o) {
    Py_ssize_t i = s->ntok;
    if (i >= MAX_TOKENS) {
        PyErr_SetString(PyExc_OverflowError, "SuffixAutomaton is full (2**29 tokens)");
        return -1;
    }
    if (grow((void **)&s->tok, &s->cap_tok, i + 1, sizeof(int64_t)) < 0) return -1;
    if (grow((void **)&s->obj, &s->cap_obj, i + 1, sizeof(PyObject *)) < 0) return -1;
    if (grow((void **)&s->st, &s->cap_st, s->nst + 2, sizeof(State)) < 0) return -1;
    if (s->occurrences) { /* the chain refreshed below has at most min(max_len, i + 1) states */
        Py_ssize_t d = (Py_ssize_t)s->max_len < i + 1 ? (Py_ssize_t)s->max_len : i + 1;
        if (grow((void **)&s->occ_lo, &s->cap_lo, s->nocc + d, sizeof(int32_t)) < 0) return -1;
        if (grow((void **)&s->occ_prev, &s->cap_prev, s->nocc + d, sizeof(int32_t)) < 0) return -1;
        if (grow((void **)&s->occ_start, &s->cap_start, i + 2, sizeof(int32_t)) < 0) return -1;
    }

    /* dry run: where the walk up from `last` stops (p, q), and a bound on the edges added
     * to the table (the clone copies q's, plus (q, c) if q is on the walked chain) */
    State *st = s->st;
    Py_ssize_t extra = 0;
    int32_t prev = s->last, p = prev, q = -1;
    while (p != -1) {
        q = get(s, p, c);
        if (q >= 0) break;
        extra++;
        p = st[p].link;
    }
    int split = p != -1 && st[p].len + 1 != st[q].len;
    if (split) {
        extra += 2;
        for (int32_t e = st[q].head; e >= 0; e = s->edge[e].next) extra++;
    }
    if (reserve_edges(s, extra) < 0) return -1;

    /* from here on nothing can fail */
    Py_INCREF(o);
    s->obj[i] = o;
    s->tok[s->ntok++] = c;
    int32_t cur = (int32_t)s->nst++;
    st[cur] = (State){st[s->last].len + 1, 0, (int32_t)i, -1, 0, -1, 0};
    for (int32_t v = s->last; v != p; v = st[v].link) add_edge(s, v, c, cur);
    if (p != -1) {
        if (!split) {
            st[cur].link = q;
        } else {
            int32_t clone = (int32_t)s->nst++;
            st[clone] = (State){st[p].len + 1, st[q].link, st[q].recent, -1, 0, -1, 0};
            if (st[q].to0 >= 0) add_edge(s, clone, st[q].tok0, st[q].to0);
            for (int32_t e = st[q].head; e >= 0; e = s->edge[e].next) {
                int64_t t = s->edge[e].tok;
                add_edge(s, clone, t, s->slot[probe(s, q, t)].to);
            }
            while (p != -1) {  /* redirect p's transitions on c from q to the clone */
                State *sp = &st[p];
                if (sp->to0 >= 0 && sp->tok0 == c) {
                    if (sp->to0 != q) break;
                    sp->to0 = clone;
                } else {
                    if (sp->head < 0) break;
                    Slot *sl = &s->slot[probe(s, p, c)];
                    if (sl->from < 0 || sl->to != q) break;
                    sl->to = clone;
                }
                p = sp->link;
            }
            st[q].link = clone;
            st[cur].link = clone;
        }
    }
    s->last = cur;

    /* the state holding the min(max_len, L)-token suffix, by one transition from the old one */
    int max_len = s->max_len;
    int32_t w;
    if (i + 1 <= max_len) {
        w = cur;
    } else {
        w = s->window;
        while (st[st[w].link].len >= max_len) w = st[w].link;  /* it may have been split */
        w = w == prev ? cur : get(s, w, c);
        if (w < 0) {  /* cannot happen; recover the window from `cur` rather than crash */
            w = cur;
            while (st[w].link > 0 && st[st[w].link].len >= max_len) w = st[w].link;
        } else if (st[st[w].link].len >= max_len) {
            w = st[w].link;
        }
    }
    s->window = w;

    /* longest earlier match of the tail, and its most recent occurrence (before i) */
    int32_t lk = st[cur].link, repeated = st[lk].len;
    if (repeated == 0) {
        s->match_len = 0;
        s->match_end = -1;
    } else if (repeated < max_len) {
        s->match_len = repeated;
        s->match_end = st[lk].recent;
    } else {
        s->match_len = max_len;
        s->match_end = st[w].recent;
    }
    if (s->occurrences) {
        for (int32_t v = w; v > 0; v = st[v].link) {
            s->occ_lo[s->nocc] = st[st[v].link].len + 1;
            s->occ_prev[s->nocc++] = st[v].recent == (int32_t)i ? -1 : st[v].recent; /* i: a new state */
            st[v].recent = (int32_t)i;
        }
        s->occ_start[i + 1] = (int32_t)s->nocc;
    } else {
        for (int32_t v = w; v > 0; v = st[v].link) st[v].recent = (int32_t)i;
    }
    return 0;
}

/* Parse one token and append it (an int subclass is stored as a plain int). */
static int append_object(SamObject *s, PyObject *o) {
    int64_t c;
    if (as_token(o, &c) < 0) return -1;
    if (PyLong_CheckExact(o)) return sam_append(s, c, o);
    PyObject *plain = PyLong_FromLongLong((long long)c);
    if (plain == NULL) return -1;
    int r = sam_append(s, c, plain);
    Py_DECREF(plain);
    return r;
}

/* obj[start:start+k] as a new list, with Python's slice rules (0 <= start <= n); with
 * cut_negative, ends before the first negative token. */
static PyObject *slice_list(const SamObject *s, Py_ssize_t start, Py_ssize_t k, int cut_negative) {
    Py_ssize_t n = s->ntok;
    if (k > n) k = n;
    if (k < -2 * n - 1) k = -2 * n - 1;
    Py_ssize_t stop = start + k;
    if (stop < 0) stop = stop + n < 0 ? 0 : stop + n;
    if (stop > n) stop = n;
    Py_ssize_t count = stop > start ? stop - start : 0;
    if (cut_negative)
        for (Py_ssize_t j = 0; j < count; j++)
            if (s->tok[start + j] < 0) { count = j; break; }
    PyObject *list = PyList_New(count);
    if (list == NULL) return NULL;
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *x = s->obj[start + j];
        Py_INCREF(x);
        PyList_SET_ITEM(list, j, x);
    }
    return list;
}

static PyObject *sam_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"max_len", "occurrences", NULL};
    Py_ssize_t max_len;
    int occurrences = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|p:SuffixAutomaton", kwlist, &max_len, &occurrences)) return NULL;
    if (max_len < 1) { PyErr_SetString(PyExc_ValueError, "max_len must be >= 1"); return NULL; }
    if (max_len > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "max_len too large"); return NULL; }
    SamObject *s = (SamObject *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->max_len = (int)max_len;
    s->occurrences = occurrences;
    if (occurrences) {
        s->occ_start = PyMem_Malloc(16 * sizeof(int32_t));
        if (s->occ_start == NULL) { Py_DECREF(s); return PyErr_NoMemory(); }
        s->cap_start = 16;
        s->occ_start[0] = 0;
    }
    s->match_len = 0;
    s->match_end = -1;
    s->last = s->window = 0;
    s->st = PyMem_Malloc(16 * sizeof(State));
    s->slot = PyMem_Malloc(64 * sizeof(Slot));
    if (s->st == NULL || s->slot == NULL) { Py_DECREF(s); return PyErr_NoMemory(); }
    s->cap_st = 16;
    s->nst = 1;
    s->st[0] = (State){0, -1, -1, -1, 0, -1, 0};
    memset(s->slot, 0xff, 64 * sizeof(Slot));
    s->mask = 63;
    s->shift = 64 - 6;
    return (PyObject *)s;
}

static void sam_dealloc(SamObject *s) {
    for (Py_ssize_t j = 0; j < s->ntok; j++) Py_DECREF(s->obj[j]);
    PyMem_Free(s->obj);
    PyMem_Free(s->tok);
    PyMem_Free(s->st);
    PyMem_Free(s->edge);
    PyMem_Free(s->slot);
    PyMem_Free(s->occ_lo);
    PyMem_Free(s->occ_prev);
    PyMem_Free(s->occ_start);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *sam_append_py(SamObject *s, PyObject *arg) {
    if (append_object(s, arg) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *sam_extend(SamObject *s, PyObject *arg) {
    if (PyList_CheckExact(arg) || PyTuple_CheckExact(arg)) {
        /* re-read the size each time: an __index__ could shrink the list */
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(arg); j++) {
            PyObject *item = PySequence_Fast_GET_ITEM(arg, j);
            Py_INCREF(item);
            int bad = append_object(s, item);
            Py_DECREF(item);
            if (bad < 0) return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *it = PyObject_GetIter(arg), *item;
    if (it == NULL) return NULL;
    while ((item = PyIter_Next(it)) != NULL) {
        int bad = append_object(s, item);
        Py_DECREF(item);
        if (bad < 0) { Py_DECREF(it); return NULL; }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *sam_continuation(SamObject *s, PyObject *arg) {
    Py_ssize_t k = PyNumber_AsSsize_t(arg, NULL);  /* clamps huge values, like slicing */
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (s->match_len == 0) return PyList_New(0);
    return slice_list(s, (Py_ssize_t)s->match_end + 1, k, 0);
}

/* ---- candidates ---------------------------------------------------------------------- */

#define MAX_CANDIDATES 64 /* base.py's MAX_CANDIDATES */

/* The end before `end` of the `length`-token string ending at `end` (-1: none). */
static inline int32_t previous_end(const SamObject *s, int32_t end, int32_t length) {
    for (int32_t j = s->occ_start[end]; j < s->occ_start[end + 1]; j++)
        if (s->occ_lo[j] <= length) return s->occ_prev[j];
    return -1;
}

typedef struct { int32_t len, end; } Group; /* a suffix length and its most recent end */

static int parse_candidate_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t *k, Py_ssize_t *want,
                                Py_ssize_t *scan) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "candidates(k, max_candidates, max_scan) takes 3 arguments");
        return -1;
    }
    Py_ssize_t *outs[3] = {k, want, scan};
    for (int j = 0; j < 3; j++) {
        *outs[j] = PyNumber_AsSsize_t(args[j], NULL);
        if (*outs[j] == -1 && PyErr_Occurred()) return -1;
    }
    if (*want > MAX_CANDIDATES) {
        PyErr_Format(PyExc_ValueError, "max_candidates must be <= %d, got %zd", MAX_CANDIDATES, *want);
        return -1;
    }
    return 0;
}

/* suffix_automaton.py's _walk: follow each group's occurrences backwards, keep the
 * continuations that are not equal to or a prefix of a kept one. */
static PyObject *walk(const SamObject *s, const Group *groups, int ngroups, Py_ssize_t k, Py_ssize_t want,
                      Py_ssize_t scan, int cut_negative) {
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t start[MAX_CANDIDATES], len[MAX_CANDIDATES], nout = 0, steps = 0;
    for (int g = 0; g < ngroups; g++) {
        int32_t length = groups[g].len;
        for (int32_t end = groups[g].end; end >= 0; end = previous_end(s, end, length)) {
            if (steps >= scan || nout >= want) return out;
            steps++;
            Py_ssize_t a = (Py_ssize_t)end + 1, n = s->ntok - a < k ? s->ntok - a : k;
            if (cut_negative)
                for (Py_ssize_t j = 0; j < n; j++)
                    if (s->tok[a + j] < 0) { n = j; break; }
            if (n <= 0) continue;
            int dup = 0;
            for (Py_ssize_t c = 0; c < nout && !dup; c++)
                dup = len[c] >= n && memcmp(s->tok + start[c], s->tok + a, (size_t)n * sizeof(int64_t)) == 0;
            if (dup) continue;
            start[nout] = a;
            len[nout++] = n;
            PyObject *cont = slice_list(s, a, n, 0);
            PyObject *item = cont ? Py_BuildValue("(iN)", (int)length, cont) : NULL;
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(item);
        }
    }
    return out;
}

static PyObject *sam_candidates(SamObject *s, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t k, want, scan;
    if (parse_candidate_args(args, nargs, &k, &want, &scan) < 0) return NULL;
    if (!s->occurrences) {
        PyErr_SetString(PyExc_ValueError, "candidates() needs a SuffixAutomaton built with occurrences=True");
        return NULL;
    }
    if (s->match_len == 0 || k < 1) return PyList_New(0);
    int32_t end = (int32_t)(s->ntok - 1);
    Group groups[64];
    Group *gs = groups;
    int32_t nrec = s->occ_start[end + 1] - s->occ_start[end];
    if (nrec > 64 && (gs = PyMem_Malloc((size_t)nrec * sizeof(Group))) == NULL) return PyErr_NoMemory();
    int ng = 0;
    int32_t hi = s->max_len < end + 1 ? s->max_len : end + 1;
    for (int32_t j = s->occ_start[end]; j < s->occ_start[end + 1]; j++) {
        if (s->occ_prev[j] >= 0) gs[ng++] = (Group){hi, s->occ_prev[j]};
        hi = s->occ_lo[j] - 1;
    }
    PyObject *out = walk(s, gs, ng, k, want, scan, 0);
    if (gs != groups) PyMem_Free(gs);
    return out;
}

static Py_ssize_t sam_len(SamObject *s) { return s->ntok; }

static PyObject *sam_num_states(SamObject *s, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(s->nst);
}

static PyObject *sam_tokens(SamObject *s, void *closure) {
    (void)closure;
    return slice_list(s, 0, s->ntok, 0);
}

static PyMethodDef sam_methods[] = {
    {"append", (PyCFunction)sam_append_py, METH_O, "append(token): index one more token."},
    {"extend", (PyCFunction)sam_extend, METH_O, "extend(tokens): append each token."},
    {"continuation", (PyCFunction)sam_continuation, METH_O,
     "continuation(k): up to k tokens that followed the most recent earlier occurrence of the match."},
    {"candidates", (PyCFunction)(void (*)(void))sam_candidates, METH_FASTCALL,
     "candidates(k, max_candidates, max_scan) -> [(match length, continuation)]: see suffix_automaton.py."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sam_members[] = {
    {"max_len", T_INT, offsetof(SamObject, max_len), READONLY, "cap on the match length"},
    {"match_len", T_INT, offsetof(SamObject, match_len), READONLY, "longest earlier match of the tail"},
    {"match_end", T_INT, offsetof(SamObject, match_end), READONLY, "end of its most recent occurrence (-1: none)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef sam_getset[] = {
    {"num_states", (getter)sam_num_states, NULL, "number of automaton states", NULL},
    {"tokens", (getter)sam_tokens, NULL, "a new list of the tokens so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods sam_as_sequence = {.sq_length = (lenfunc)sam_len};

static PyTypeObject SamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "promptlookup.drafting.native._suffix_automaton.SuffixAutomaton",
    .tp_doc = "SuffixAutomaton(max_len): online suffix automaton tracking the longest earlier match of the tail.",
    .tp_basicsize = sizeof(SamObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = sam_new,
    .tp_dealloc = (destructor)sam_dealloc,
    .tp_methods = sam_methods,
    .tp_members = sam_members,
    .tp_getset = sam_getset,
    .tp_as_sequence = &sam_as_sequence,
};

/* ---- Matcher ------------------------------------------------------------------------ */

/* Re-point `state` at the state holding the matched string (states may have split). */
static int32_t settle(MatcherObject *m) {
    const State *st = m->sam->st;
    int32_t v = m->state;
    while (v > 0 && st[st[v].link].len >= m->matched) v = st[v].link;
    m->state = v;
    return v;
}

static PyObject *matcher_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"sam", NULL};
    PyObject *sam;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:Matcher", kwlist, &SamType, &sam)) return NULL;
    MatcherObject *m = (MatcherObject *)type->tp_alloc(type, 0);
    if (m == NULL) return NULL;
    Py_INCREF(sam);
    m->sam = (SamObject *)sam;
    m->state = m->matched = 0;
    return (PyObject *)m;
}

static void matcher_dealloc(MatcherObject *m) {
    Py_XDECREF(m->sam);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *matcher_feed(MatcherObject *m, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "feed() needs an iterable of ints");
    if (seq == NULL) return NULL;
    int64_t stack[STACK_TOKENS], *buf = stack;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), count = 0;
    if (n > STACK_TOKENS) {
        buf = PyMem_Malloc((size_t)n * sizeof(int64_t));
        if (buf == NULL) { Py_DECREF(seq); return PyErr_NoMemory(); }
    }
    /* convert everything first: no Python code runs during the walk, and a bad token
     * leaves the matcher as it was */
    for (; count < n && count < PySequence_Fast_GET_SIZE(seq); count++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, count);
        Py_INCREF(item);
        int bad = as_token(item, &buf[count]);
        Py_DECREF(item);
        if (bad < 0) {
            if (buf != stack) PyMem_Free(buf);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);

    const SamObject *s = m->sam;
    const State *st = s->st;
    int32_t v = settle(m), matched = m->matched, cap = s->max_len;
    for (Py_ssize_t j = 0; j < count; j++) {
        int64_t c = buf[j];
        int32_t nxt;
        for (;;) {
            nxt = get(s, v, c);
            if (nxt >= 0 || v == 0) break;
            v = st[v].link;
            matched = st[v].len;
        }
        if (nxt < 0) {
            v = matched = 0;
            continue;
        }
        v = nxt;
        if (++matched > cap) {
            matched = cap;
            if (st[st[v].link].len >= cap) v = st[v].link;
        }
    }
    m->state = v;
    m->matched = matched;
    if (buf != stack) PyMem_Free(buf);
    Py_RETURN_NONE;
}

static PyObject *matcher_continuation(MatcherObject *m, PyObject *arg) {
    Py_ssize_t k = PyNumber_AsSsize_t(arg, NULL);
    if (k == -1 && PyErr_Occurred()) return NULL;
    PyObject *list;
    if (m->matched == 0) {
        list = PyList_New(0);
    } else {
        int32_t v = settle(m);
        list = slice_list(m->sam, (Py_ssize_t)m->sam->st[v].recent + 1, k, 1);
    }
    if (list == NULL) return NULL;
    PyObject *len = PyLong_FromLong(m->matched);
    if (len == NULL) { Py_DECREF(list); return NULL; }
    PyObject *out = PyTuple_New(2);
    if (out == NULL) { Py_DECREF(len); Py_DECREF(list); return NULL; }
    PyTuple_SET_ITEM(out, 0, len);
    PyTuple_SET_ITEM(out, 1, list);
    return out;
}

static PyObject *matcher_candidates(MatcherObject *m, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t k, want, scan;
    if (parse_candidate_args(args, nargs, &k, &want, &scan) < 0) return NULL;
    const SamObject *s = m->sam;
    if (!s->occurrences) {
        PyErr_SetString(PyExc_ValueError, "candidates() needs a SuffixAutomaton built with occurrences=True");
        return NULL;
    }
    if (m->matched == 0 || k < 1) return PyList_New(0);
    /* the chain from the matched state has at most `matched` states (distinct shortest lengths) */
    Group groups[64];
    Group *gs = groups;
    if (m->matched > 64 && (gs = PyMem_Malloc((size_t)m->matched * sizeof(Group))) == NULL) return PyErr_NoMemory();
    int ng = 0;
    int32_t hi = m->matched;
    for (int32_t v = settle(m); v > 0; v = s->st[v].link) {
        gs[ng++] = (Group){hi, s->st[v].recent};
        hi = s->st[s->st[v].link].len;
    }
    PyObject *out = walk(s, gs, ng, k, want, scan, 1);
    if (gs != groups) PyMem_Free(gs);
    return out;
}

static PyMethodDef matcher_methods[] = {
    {"candidates", (PyCFunction)(void (*)(void))matcher_candidates, METH_FASTCALL,
     "candidates(k, max_candidates, max_scan) -> [(match length, continuation)]: see suffix_automaton.py."},
    {"feed", (PyCFunction)matcher_feed, METH_O, "feed(tokens): extend the query stream."},
    {"continuation", (PyCFunction)matcher_continuation, METH_O,
     "continuation(k) -> (match length, up to k tokens after the most recent occurrence of the match, "
     "cut before the first negative token)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef matcher_members[] = {
    {"sam", T_OBJECT, offsetof(MatcherObject, sam), READONLY, "the automaton walked"},
    {"state", T_INT, offsetof(MatcherObject, state), READONLY, "state of the matched suffix"},
    {"matched", T_INT, offsetof(MatcherObject, matched), READONLY, "length of the matched suffix"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "promptlookup.drafting.native._suffix_automaton.Matcher",
    .tp_doc = "Matcher(sam): longest suffix of a growing query stream that occurs in sam's text.",
    .tp_basicsize = sizeof(MatcherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = matcher_new,
    .tp_dealloc = (destructor)matcher_dealloc,
    .tp_methods = matcher_methods,
    .tp_members = matcher_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_suffix_automaton",
    .m_doc = "C implementation of promptlookup.drafting.suffix_automaton.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__suffix_automaton(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    if (PyModule_AddType(mod, &SamType) < 0 || PyModule_AddType(mod, &MatcherType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
