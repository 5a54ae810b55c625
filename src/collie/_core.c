/* collie._core: the compiled per-message core (see src/collie/core.py).
 *
 * It runs the steps of a bound engine.Program over the shared-memory rings
 * of transports/ring.py (the same layout, so a Python end and a C end of a
 * ring interoperate): local copies, reductions, sends and receives of one
 * slot or of several (a fragment at a time), and single-copy messages (the
 * rendezvous of ring.py: the writer's slot says where its bytes are, the
 * reader copies them with process_vm_readv and acknowledges; a large
 * combining one it shares with the writer, read_shared), with
 * acquire/release atomics on the ring heads, tails and acknowledgement
 * words and a full fence before deciding whether to wake a peer. Whatever
 * it cannot do (a tcp peer, a ring whose Python end has work in flight, a
 * message that is not the expected one, a read that fails, a peer slower
 * than the spin) it hands back to Python at that point of the step:
 * Python's executor finishes the step (a message still under way, a
 * single-copy send waiting for its acknowledgement, a message half written
 * or half taken, a shared combining whose writer is not done, is handed
 * over as a request in the transport's books, where it stands), so every
 * error surfaces where it always did.
 *
 * The combine kernels reproduce NumPy's results bit for bit (ties and NaNs
 * of minimum/maximum included) and collie's bfloat16 rounding (ops.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>  /* T_OBJECT_EX: the ring ends' __slots__ (set_ring_ends) */
#include <limits.h>
#include <math.h>
#include <errno.h>
#include <semaphore.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ kernels */

enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_BAND, OP_BOR, OP_BXOR, NOPS };
enum { DT_F32, DT_F64, DT_I8, DT_I16, DT_I32, DT_I64, DT_U8, DT_U16, DT_U32, DT_U64, DT_F16, DT_BF16, NDTYPES };

static const int itemsizes[NDTYPES] = {4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2};

/* The combine loops are compiled twice where the compiler can pick at load
 * time (GCC's target_clones on x86-64): for AVX2, which most x86-64 CPUs
 * have, and for the baseline the rest of the file targets (SSE2). Summing
 * 16 MiB blocks from three sources onto a fourth (SUM_MANY's seed), one
 * process of an AMD EPYC VM: 1.70 ms with AVX2 against 1.89. NumPy
 * dispatches its loops the same way. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* NumPy's float minimum/maximum: a NaN wins (the first one), ties give the second. */
#define FMIN(a, b) (isnan(a) ? (a) : isnan(b) ? (b) : (a) < (b) ? (a) : (b))
#define FMAX(a, b) (isnan(a) ? (a) : isnan(b) ? (b) : (a) > (b) ? (a) : (b))

#define FLOAT_KERNEL(T, NAME)                                                        \
    static VECTOR_CLONES int NAME(char *dst, const char *src, Py_ssize_t n, int op) {\
        T *d = (T *)dst; const T *s = (const T *)src;                                \
        switch (op) {                                                                \
        case OP_SUM: for (Py_ssize_t i = 0; i < n; i++) d[i] = d[i] + s[i]; return 0; \
        case OP_PROD: for (Py_ssize_t i = 0; i < n; i++) d[i] = d[i] * s[i]; return 0; \
        case OP_MIN: for (Py_ssize_t i = 0; i < n; i++) d[i] = FMIN(d[i], s[i]); return 0; \
        case OP_MAX: for (Py_ssize_t i = 0; i < n; i++) d[i] = FMAX(d[i], s[i]); return 0; \
        }                                                                            \
        return -1;                                                                   \
    }

/* Integers wrap (as NumPy's): the sum and product are computed unsigned. */
#define INT_KERNEL(T, U, NAME)                                                       \
    static VECTOR_CLONES int NAME(char *dst, const char *src, Py_ssize_t n, int op) {\
        T *d = (T *)dst; const T *s = (const T *)src;                                \
        switch (op) {                                                                \
        case OP_SUM: for (Py_ssize_t i = 0; i < n; i++) d[i] = (T)((U)d[i] + (U)s[i]); return 0; \
        case OP_PROD: for (Py_ssize_t i = 0; i < n; i++) d[i] = (T)((U)d[i] * (U)s[i]); return 0; \
        case OP_MIN: for (Py_ssize_t i = 0; i < n; i++) d[i] = s[i] < d[i] ? s[i] : d[i]; return 0; \
        case OP_MAX: for (Py_ssize_t i = 0; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i]; return 0; \
        case OP_BAND: for (Py_ssize_t i = 0; i < n; i++) d[i] &= s[i]; return 0;     \
        case OP_BOR: for (Py_ssize_t i = 0; i < n; i++) d[i] |= s[i]; return 0;      \
        case OP_BXOR: for (Py_ssize_t i = 0; i < n; i++) d[i] ^= s[i]; return 0;     \
        }                                                                            \
        return -1;                                                                   \
    }

FLOAT_KERNEL(float, k_f32)
FLOAT_KERNEL(double, k_f64)
INT_KERNEL(int8_t, uint8_t, k_i8)
INT_KERNEL(int16_t, uint16_t, k_i16)
INT_KERNEL(int32_t, uint32_t, k_i32)
INT_KERNEL(int64_t, uint64_t, k_i64)
INT_KERNEL(uint8_t, uint8_t, k_u8)
INT_KERNEL(uint16_t, uint16_t, k_u16)
INT_KERNEL(uint32_t, uint32_t, k_u32)
INT_KERNEL(uint64_t, uint64_t, k_u64)

/* IEEE half <-> float. Half to float is exact; float to half rounds to
 * nearest, ties to even, as NumPy does (a NaN keeps its sign and top
 * payload bits, and stays a NaN). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    uint32_t exp = (bits >> 23) & 0xff, man = bits & 0x7fffff;
    if (exp == 0xff) {
        if (man == 0) return sign | 0x7c00;
        uint16_t h = (uint16_t)(man >> 13);
        return sign | 0x7c00 | (h ? h : 1);  /* the payload's top bits, never zero: still a NaN */
    }
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00;  /* overflow: infinity */
    if (e <= 0) {  /* subnormal half (or zero) */
        if (e < -10) return sign;
        man |= 0x800000;
        int shift = 14 - e;  /* bits dropped */
        uint32_t h = man >> shift, rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) h++;
        return sign | (uint16_t)h;
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;  /* may carry into the exponent: right */
    return sign | (uint16_t)h;
}

/* NumPy's half minimum/maximum: a NaN wins (the first one), ties give the first. */
static int k_f16(char *dst, const char *src, Py_ssize_t n, int op) {
    uint16_t *d = (uint16_t *)dst; const uint16_t *s = (const uint16_t *)src;
    for (Py_ssize_t i = 0; i < n; i++) {
        float a = half_to_float(d[i]), b = half_to_float(s[i]);
        switch (op) {
        case OP_SUM: d[i] = float_to_half(a + b); break;
        case OP_PROD: d[i] = float_to_half(a * b); break;
        case OP_MIN: d[i] = isnan(a) ? d[i] : isnan(b) ? s[i] : a <= b ? d[i] : s[i]; break;
        case OP_MAX: d[i] = isnan(a) ? d[i] : isnan(b) ? s[i] : a >= b ? d[i] : s[i]; break;
        default: return -1;
        }
    }
    return 0;
}

/* bfloat16 as ops.py computes it: in float32, rounded back by adding
 * 0x7fff plus the lowest kept bit (ties to even), in uint32 arithmetic. */
static int k_bf16(char *dst, const char *src, Py_ssize_t n, int op) {
    uint16_t *d = (uint16_t *)dst; const uint16_t *s = (const uint16_t *)src;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t ab = (uint32_t)d[i] << 16, bb = (uint32_t)s[i] << 16, rb;
        float a, b, r;
        memcpy(&a, &ab, 4);
        memcpy(&b, &bb, 4);
        switch (op) {
        case OP_SUM: r = a + b; break;
        case OP_PROD: r = a * b; break;
        case OP_MIN: r = FMIN(a, b); break;
        case OP_MAX: r = FMAX(a, b); break;
        default: return -1;
        }
        memcpy(&rb, &r, 4);
        d[i] = (uint16_t)((rb + (((rb >> 16) & 1) + 0x7fff)) >> 16);
    }
    return 0;
}

typedef int (*kernel_t)(char *, const char *, Py_ssize_t, int);
static const kernel_t kernels[NDTYPES] = {k_f32, k_f64, k_i8, k_i16, k_i32, k_i64,
                                          k_u8, k_u16, k_u32, k_u64, k_f16, k_bf16};

/* A combining group's sum of up to three sources into dst in one loop
 * (_core.c's take_group): ((d + a) + b) + c, element by element, as three
 * passes of the kernel above would round it, but each element loaded and
 * stored once. A C model of a 4-rank reduce_scatter's combining on 2 cores
 * took 8.4-9.0 ms so, against 13-15 with one source a pass over the same
 * 64 KiB chunks. With a ``seed`` (a group's seed, find_seeds), the sum
 * starts from it in place of d: ((seed + a) + b) + c, which spares copying
 * it into d first (16 MiB blocks from three sources, one process of an AMD
 * EPYC VM: 1.89 ms against 2.33 copying each chunk first; two processes at
 * once, with AVX2: 2.1-2.3 against 2.4-3.3 copying first without it). */
#define SUM_MANY(T, U, NAME)                                                          \
    static VECTOR_CLONES void NAME(char *dst, const char *seed, const char *const *src, int k, Py_ssize_t n) { \
        T *d = (T *)dst;                                                             \
        const T *a = (const T *)src[0], *b = (const T *)src[k > 1], *c = (const T *)src[k > 2 ? 2 : 0]; \
        const T *f = (const T *)seed;                                                \
        if (!f && k == 1) for (Py_ssize_t i = 0; i < n; i++) d[i] = (T)((U)d[i] + (U)a[i]); \
        else if (!f && k == 2) for (Py_ssize_t i = 0; i < n; i++) d[i] = (T)((U)(T)((U)d[i] + (U)a[i]) + (U)b[i]); \
        else if (!f) for (Py_ssize_t i = 0; i < n; i++)                              \
            d[i] = (T)((U)(T)((U)(T)((U)d[i] + (U)a[i]) + (U)b[i]) + (U)c[i]);       \
        else if (k == 1) for (Py_ssize_t i = 0; i < n; i++) d[i] = (T)((U)f[i] + (U)a[i]); \
        else if (k == 2) for (Py_ssize_t i = 0; i < n; i++) d[i] = (T)((U)(T)((U)f[i] + (U)a[i]) + (U)b[i]); \
        else for (Py_ssize_t i = 0; i < n; i++)                                      \
            d[i] = (T)((U)(T)((U)(T)((U)f[i] + (U)a[i]) + (U)b[i]) + (U)c[i]);       \
    }

SUM_MANY(float, float, sum_many_f32)
SUM_MANY(double, double, sum_many_f64)
SUM_MANY(int32_t, uint32_t, sum_many_i32)
SUM_MANY(int64_t, uint64_t, sum_many_i64)

typedef void (*many_t)(char *, const char *, const char *const *, int, Py_ssize_t);

/* Combine ``k`` sources into dst (n elements each), in their order, onto
 * ``seed`` where given (else onto dst): three at a time where a loop over
 * several is compiled (sums of the common dtypes), else one at a time
 * with the kernel. */
static void combine_many(char *dst, const char *seed, const char *const *src, int k, Py_ssize_t n, int dtype,
                         int op) {
    many_t many = op != OP_SUM ? NULL : dtype == DT_F32 ? sum_many_f32 : dtype == DT_F64 ? sum_many_f64
                : dtype == DT_I32 ? sum_many_i32 : dtype == DT_I64 ? sum_many_i64 : NULL;
    if (seed && (!many || !k)) memcpy(dst, seed, n * itemsizes[dtype]);
    for (int i = 0; i < k; i += many ? 3 : 1) {
        if (many) many(dst, i ? NULL : seed, src + i, k - i < 3 ? k - i : 3, n);
        else kernels[dtype](dst, src[i], n, op);
    }
}

static int supported(int dtype, int op) {
    if (dtype < 0 || dtype >= NDTYPES || op < 0 || op >= NOPS) return 0;
    int floating = dtype == DT_F32 || dtype == DT_F64 || dtype == DT_F16 || dtype == DT_BF16;
    return !(floating && op >= OP_BAND);
}

/* combine(dst, src, dtype, op): dst = dst op src, elementwise, in place. */
static PyObject *py_combine(PyObject *self, PyObject *args) {
    Py_buffer dst, src;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "w*y*ii", &dst, &src, &dtype, &op)) return NULL;
    PyObject *result = NULL;
    if (!supported(dtype, op)) {
        PyErr_Format(PyExc_ValueError, "no compiled kernel for dtype code %d and op code %d", dtype, op);
    } else if (dst.len != src.len || dst.len % itemsizes[dtype]) {
        PyErr_Format(PyExc_ValueError, "combine: %zd and %zd bytes are not two arrays of one size",
                     dst.len, src.len);
    } else {
        kernels[dtype](dst.buf, src.buf, dst.len / itemsizes[dtype], op);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return result;
}

/* ------------------------------------------------------------------ rings */

/* Letting the GIL go and taking it back costs about as much as a small
 * call's whole exchange with a peer that is already there, so a run of a
 * small program keeps it while it waits, for at most GIL_HOLD seconds, and
 * lets it go only for longer waits (and for the whole of a larger run, whose
 * copies and reductions other threads should not wait on). */
#define SMALL_BYTES (64 * 1024)
#define GIL_HOLD 20e-6
typedef struct { PyThreadState *saved; int hold, failed; } gil_t;  /* failed: envelope_aside's error */

#define LINE 64
#define RDV (-1)
#define RDV_WORDS 2             /* a single-copy slot's body: address, rendezvous id (ring.RDV_BODY) */
#define RDV_WORDS_REGISTERED 6  /* and where it was sent from a registered buffer: fd, inode, base, serial */
#define REGISTERED_SINGLE_COPY_BYTES (64 * 1024)  /* shm.REGISTERED_SINGLE_COPY_BYTES: see goes_single_copy */
#define ACKS 64             /* acknowledgement words per ring (ring.ACKS) */
#define NEVER (1LL << 62)   /* Out.cma_bytes of a peer that cannot read us: never single copy */
#define READ_CHUNK (64 * 1024)  /* a combining single-copy read: this much at a time, then combine */

typedef struct {
    int64_t *head, *tail;   /* in shared memory */
    char *headers;          /* slot k's header at headers + k * LINE */
    char *payload;          /* slot k's payload at payload + k * slot_bytes */
    int64_t *acks;          /* the single-copy acknowledgement words, after the headers */
    int64_t slots, slot_bytes;
} ring_t;

typedef struct {            /* a slot header, as ring.HEADER packs it */
    int64_t tag;
    uint64_t meta;
    int64_t nbytes, offset, frag;
} header_t;

typedef struct {
    int shm;                /* 0: another transport's peer (handed back) */
    ring_t out, in;         /* ours to it (in its segment), its to us (in ours) */
    sem_t *bell;            /* its doorbell */
    int64_t *sleepers;      /* its sleepers word */
    PyObject *out_obj, *in_obj;  /* ring.Out and ring.In: the Python ends' books (see slot_attr) */
    int pid;                /* its process, for single-copy reads (0: none) */
    int64_t cma_bytes;      /* our sends to it of at least this size go single copy (Out.cma_bytes) */
    int64_t next_id;        /* the last rendezvous id used (Out.next_id) */
    int64_t head0, tail0, next_id0;  /* when a run began (to update the books) */
    int rdv;                /* the program may send it single-copy messages */
    int sends, recvs;       /* the program sends to it, receives from it (in its own steps) */
    int64_t behind;         /* the last pass of a receive loop (CoreProgram.passes)
                               in which an earlier receive from it stayed open */
    int64_t sharing[2];     /* the single-copy receive whose shared combining (read_shared) Python
                               takes over: its id and the SHARE_DONE that completes it */
    int64_t full;           /* the last pass (CoreProgram.passes) of post_sends in which a send to
                               it found its ring full: the step's later sends to it wait too
                               (for a later pass, or for Python, which posts them in order) */
} peer_t;

static int ends_known(PyObject *out, PyObject *in);  /* see set_ring_ends() */
static PyTypeObject *shm_type;                        /* see set_hot_slots() */
static int hot_known(PyObject *obj, PyTypeObject *type, const char *what);

/* Wake a peer that may sleep: Dekker's pattern of doorbell.py. */
static void wake(peer_t *p) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(p->sleepers, __ATOMIC_RELAXED)) sem_post(p->bell);
}

/* The payload of the next slot to write, or NULL if the ring is full;
 * publish_slot() then makes it the reader's. */
static char *next_slot(peer_t *p) {
    ring_t *r = &p->out;
    int64_t head = *r->head;  /* only we store it */
    if (head - __atomic_load_n(r->tail, __ATOMIC_ACQUIRE) >= r->slots) return NULL;
    return r->payload + head % r->slots * r->slot_bytes;
}

/* Give the next slot, its payload written, header h, publish it and wake the reader. */
static void publish_slot(peer_t *p, header_t h) {
    ring_t *r = &p->out;
    int64_t head = *r->head;
    memcpy(r->headers + head % r->slots * LINE, &h, sizeof h);
    __atomic_store_n(r->head, head + 1, __ATOMIC_RELEASE);
    wake(p);
}

/* Fill the next slot with header h and ``len`` payload bytes, publish it
 * and wake the reader; 0 if the ring is full. */
static inline __attribute__((always_inline)) int write_slot(peer_t *p, header_t h, const void *payload, int64_t len) {
    char *slot = next_slot(p);
    if (!slot) return 0;
    if (len) memcpy(slot, payload, len);
    publish_slot(p, h);
    return 1;
}

/* Write a whole message into the next slot; 0 if the ring is full. */
static int put(peer_t *p, int64_t tag, uint64_t meta, const char *data, int64_t n) {
    return write_slot(p, (header_t){tag, meta, n, 0, n}, data, n);
}

/* Write the fragments of a message of several slots (n bytes at data)
 * from byte *at on, each published as it is written (the reader may take
 * it meanwhile), for as long as the ring has room; *at counts. */
static void write_fragments(peer_t *p, int64_t tag, uint64_t meta, const char *data, int64_t n, int64_t *at) {
    int64_t size = p->out.slot_bytes;
    char *slot;
    while (*at < n && (slot = next_slot(p))) {
        int64_t len = n - *at < size ? n - *at : size;
        memcpy(slot, data + *at, len);
        publish_slot(p, (header_t){tag, meta, n, *at, len});
        *at += len;
    }
}

static int registered_body(const char *data, int64_t n, int64_t *words);

/* Post a single-copy send: one slot saying where its n bytes are (ring.py's
 * RDV slot; from a registered buffer, which one too). Returns its
 * rendezvous id, whose acknowledgement word says when the reader has
 * copied them; 0 if the ring is full. */
static int64_t rendezvous(peer_t *p, int64_t tag, uint64_t meta, const char *data, int64_t n) {
    int64_t body[RDV_WORDS_REGISTERED] = {(int64_t)(uintptr_t)data, p->next_id + 1};
    int64_t len = (registered_body(data, n, body + RDV_WORDS) ? RDV_WORDS_REGISTERED : RDV_WORDS) * sizeof(int64_t);
    if (!write_slot(p, (header_t){tag, meta, n, RDV, len}, body, len)) return 0;
    return ++p->next_id;
}

/* ---- registered buffers (collie.empty)
 *
 * A buffer collie.empty made lies in a memfd of its own, which a peer on
 * the host may map: it opens /proc/<pid>/fd/<fd> (which asks less of the
 * kernel's permission checks than process_vm_readv does). A single-copy
 * send from such a buffer says so in its rendezvous body, after the
 * address and the id: the memfd's fd, its inode, the buffer's start and a
 * number this registration alone has. A reader that can map it reads the
 * bytes with memcpy, or combines them straight from the mapping, at the
 * memory's speed: process_vm_readv pins and copies a page at a time, about
 * 4 GB/s against 10 for 32 MiB on the test VM, so a 2-rank 64 MiB
 * all_reduce takes 10 ms this way and 18 by process_vm_readv. A reader
 * that cannot reads as before.
 *
 * The writer's table (registry) is behind a mutex: buffers come and go in
 * Python while a core run, the GIL let go, looks up its sends. A reader
 * keeps its mappings (views) while they are in use and at most MAX_VIEWS of
 * them, the least recently used going first; each is known by all of the
 * body's words but the address, so a buffer freed and another made in its
 * place (the same fd, even the same inode) is never read through the old
 * mapping. */
typedef struct { int64_t base, nbytes, fd, ino, serial; } registered_t;
static registered_t *registry;
static Py_ssize_t nregistry, registry_room;
static int64_t registry_serial;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

/* Whether ``n`` bytes at ``data`` lie in one registered buffer; then its
 * four words of the rendezvous body go to ``words``. */
static int registered_body(const char *data, int64_t n, int64_t *words) {
    int64_t at = (int64_t)(uintptr_t)data, found = 0;
    if (!__atomic_load_n(&nregistry, __ATOMIC_ACQUIRE)) return 0;  /* (a plain array's send: no lock) */
    pthread_mutex_lock(&registry_lock);
    for (Py_ssize_t i = 0; i < nregistry && !found; i++) {
        const registered_t *b = &registry[i];
        if (at >= b->base && at + n <= b->base + b->nbytes) {
            words[0] = b->fd, words[1] = b->ino, words[2] = b->base, words[3] = b->serial;
            found = 1;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

/* Register (or, with nbytes 0, forget) the buffer at base. */
static int registry_set(int64_t base, int64_t nbytes, int64_t fd, int64_t ino) {
    int ok = 1;
    pthread_mutex_lock(&registry_lock);
    if (!nbytes) {
        for (Py_ssize_t i = 0; i < nregistry; i++)
            if (registry[i].base == base) {
                registry[i] = registry[nregistry - 1];
                __atomic_store_n(&nregistry, nregistry - 1, __ATOMIC_RELEASE);
                break;
            }
    } else {
        if (nregistry == registry_room) {
            Py_ssize_t room = registry_room ? 2 * registry_room : 16;
            registered_t *grown = realloc(registry, room * sizeof *grown);
            if (grown) registry = grown, registry_room = room;
        }
        if ((ok = nregistry < registry_room)) {
            registry[nregistry] = (registered_t){base, nbytes, fd, ino, ++registry_serial};
            __atomic_store_n(&nregistry, nregistry + 1, __ATOMIC_RELEASE);  /* (read unlocked: registered_body) */
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return ok;
}

/* SharedMemory(nbytes): ``nbytes`` of memory in a memfd of their own,
 * registered while the object lives (it exports them by the buffer
 * protocol; collie.empty makes its arrays of one). */
typedef struct {
    PyObject_HEAD
    char *map;
    Py_ssize_t nbytes;
    int fd;
} SharedMemory;

static PyObject *shared_memory_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "n", &nbytes)) return NULL;
    if (nbytes <= 0) {
        PyErr_Format(PyExc_ValueError, "SharedMemory takes a positive size, not %zd", nbytes);
        return NULL;
    }
    SharedMemory *self = (SharedMemory *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->fd = memfd_create("collie-buffer", MFD_CLOEXEC);
    struct stat st;
    if (self->fd < 0 || ftruncate(self->fd, nbytes) || fstat(self->fd, &st)) goto failed;
    void *map = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, 0);
    if (map == MAP_FAILED) goto failed;
    self->map = map, self->nbytes = nbytes;
    if (!registry_set((int64_t)(uintptr_t)map, nbytes, self->fd, (int64_t)st.st_ino)) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
failed:
    PyErr_SetFromErrno(PyExc_OSError);
    Py_DECREF(self);
    return NULL;
}

static void shared_memory_dealloc(SharedMemory *self) {
    if (self->map) {
        registry_set((int64_t)(uintptr_t)self->map, 0, 0, 0);
        munmap(self->map, self->nbytes);
    }
    if (self->fd >= 0) close(self->fd);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int shared_memory_getbuffer(SharedMemory *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->map, self->nbytes, 0, flags);
}

static PyBufferProcs shared_memory_as_buffer = {(getbufferproc)shared_memory_getbuffer, NULL};

static PyTypeObject SharedMemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collie._core.SharedMemory",
    .tp_basicsize = sizeof(SharedMemory),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SharedMemory(nbytes): memory in a memfd of its own that peers on the host may map (collie.empty).",
    .tp_new = shared_memory_new,
    .tp_dealloc = (destructor)shared_memory_dealloc,
    .tp_as_buffer = &shared_memory_as_buffer,
};

/* registered_words(buffer) -> the four words registered_body gives the
 * buffer's bytes (fd, inode, start, serial), or zeros. */
static PyObject *py_registered_words(PyObject *self, PyObject *obj) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    int64_t w[RDV_WORDS_REGISTERED - RDV_WORDS] = {0};
    registered_body(view.buf, view.len, w);
    PyBuffer_Release(&view);
    return Py_BuildValue("(LLLL)", (long long)w[0], (long long)w[1], (long long)w[2], (long long)w[3]);
}

#define MAX_VIEWS 16
typedef struct {
    int pid, failed;        /* failed: it could not be mapped (then it is not tried again) */
    int64_t key[RDV_WORDS_REGISTERED - RDV_WORDS];  /* the body's fd, inode, base, serial */
    char *map;              /* the whole memfd, mapped here */
    int64_t nbytes;
    uint64_t used;          /* when it was last used (views_clock) */
    int busy;               /* moves under way through it (it is not unmapped meanwhile) */
} view_t;
static view_t views[MAX_VIEWS];
static uint64_t views_clock;
static int64_t views_moved;  /* moves through a view, by this process (registered_moves()) */
static pthread_mutex_t views_lock = PTHREAD_MUTEX_INITIALIZER;  /* over the table, not the moves */

static int view_free(const view_t *v) { return !v->map && !v->failed; }

/* Unmap v (not busy), leaving it free. */
static void drop_view(view_t *v) {
    if (v->map) munmap(v->map, v->nbytes);
    *v = (view_t){0};
}

/* Map the registered buffer ``key`` (a body's last four words) of process pid into v. */
static void map_view(view_t *v, int pid, const int64_t *key) {
    drop_view(v);
    *v = (view_t){.pid = pid, .failed = 1};
    memcpy(v->key, key, sizeof v->key);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%lld", pid, (long long)key[0]);
    int fd = open(path, O_RDWR | O_CLOEXEC);  /* (a writer helping its reader writes into it) */
    if (fd < 0) return;
    struct stat st;
    if (!fstat(fd, &st) && (int64_t)st.st_ino == key[1] && st.st_size > 0) {
        void *map = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (map != MAP_FAILED) v->map = map, v->nbytes = st.st_size, v->failed = 0;
    }
    close(fd);
}

/* Where the ``n`` bytes at ``address`` in process pid's registered buffer
 * ``key`` are mapped here, or NULL: move them the other way. The caller
 * moves them, then lets go of *held (view_done). A buffer's owner keeps its
 * fd open while it lives, so a new buffer of pid's with the fd of one
 * mapped here means that one is gone: its mapping goes too (else it waits
 * for the least recently used turn, or destroy_process_group). */
static char *view_of(int pid, const int64_t *key, int64_t address, int64_t n, view_t **held) {
    pthread_mutex_lock(&views_lock);
    view_t *v = NULL, *spare = NULL;
    for (int i = 0; i < MAX_VIEWS && !v; i++) {
        view_t *w = &views[i];
        int same_fd = !view_free(w) && w->pid == pid && w->key[0] == key[0];
        if (same_fd && !memcmp(w->key, key, sizeof w->key)) v = w;
        else if (same_fd && !w->busy) drop_view(w);  /* the fd is another buffer's now: the one it mapped is gone */
        if (!v && !w->busy && (!spare || (!view_free(spare) && (view_free(w) || w->used < spare->used)))) spare = w;
    }
    if (!v && spare) map_view(v = spare, pid, key);  /* (none spare: every view is in use) */
    int64_t at = address - key[2];
    char *where = NULL;
    if (v && !v->failed && at >= 0 && at + n <= v->nbytes) {
        v->used = ++views_clock;
        v->busy++;
        views_moved++;
        *held = v;
        where = v->map + at;
    }
    pthread_mutex_unlock(&views_lock);
    return where;
}

static void view_done(view_t *v) {
    pthread_mutex_lock(&views_lock);
    v->busy--;
    pthread_mutex_unlock(&views_lock);
}

/* registered_moves() -> (moves through a view, views mapped now) */
static PyObject *py_registered_moves(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&views_lock);
    int64_t n = views_moved, mapped = 0;
    for (int i = 0; i < MAX_VIEWS; i++) mapped += views[i].map != NULL;
    pthread_mutex_unlock(&views_lock);
    return Py_BuildValue("(LL)", (long long)n, (long long)mapped);
}

/* n bytes between ``local`` and ``address`` in process pid (process_vm_readv,
 * or _writev when ``write``); -1 with errno set if they cannot all move. */
static int vm_move(int pid, char *local, int64_t address, int64_t n, int write) {
    while (n > 0) {
        struct iovec here = {local, (size_t)n}, there = {(void *)(uintptr_t)address, (size_t)n};
        ssize_t got = write ? process_vm_writev(pid, &here, 1, &there, 1, 0)
                            : process_vm_readv(pid, &here, 1, &there, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got == 0) errno = EFAULT;
            return -1;
        }
        local += got;
        address += got;
        n -= got;
    }
    return 0;
}

/* vm_move(), through the mapping of process pid's registered buffer
 * ``key`` (a rendezvous body's or an offer's four words) where it has
 * one and this process can map it. */
static int move_registered(int pid, const int64_t *key, char *local, int64_t address, int64_t n, int write) {
    view_t *held = NULL;
    char *mapped = key && key[3] ? view_of(pid, key, address, n, &held) : NULL;
    if (!mapped) return vm_move(pid, local, address, n, write);
    if (write) memcpy(mapped, local, n);
    else memcpy(local, mapped, n);
    view_done(held);
    return 0;
}

/* This thread's scratch for a chunk of a combining single-copy message. */
static char *chunk_scratch(void) {
    static __thread char *scratch;
    if (!scratch && !(scratch = malloc(READ_CHUNK))) errno = ENOMEM;
    return scratch;
}

/* Chunk k of a combining single-copy message of n bytes at ``address`` in
 * process pid: read into this thread's scratch, then combined into dst's
 * chunk k while it is in cache. */
static int combine_chunk(int pid, char *dst, int64_t address, int64_t k, int64_t n, kernel_t kernel, int op,
                         int itemsize) {
    int64_t at = k * READ_CHUNK, len = n - at < READ_CHUNK ? n - at : READ_CHUNK;
    char *scratch = chunk_scratch();
    if (!scratch || vm_move(pid, scratch, address + at, len, 0)) return -1;
    kernel(dst + at, scratch, len / itemsize, op);
    return 0;
}

/* A single-copy message into dst: read whole, or (combining) a chunk at a time. */
static int read_remote(int pid, char *dst, int64_t address, int64_t n, kernel_t kernel, int op, int itemsize) {
    if (!kernel) return vm_move(pid, dst, address, n, 0);
    for (int64_t k = 0; k * READ_CHUNK < n; k++)
        if (combine_chunk(pid, dst, address, k, n, kernel, op, itemsize)) return -1;
    return 0;
}

/* ---- the shared combining read
 *
 * A combining single-copy read costs its reader three streams (the writer's
 * bytes, its own buffer read and written back) while the writer's core
 * idles until the acknowledgement: a 2-rank reduce is the root's work
 * alone. So the reader of a large one offers its chunks to the writer, in
 * the ring's offer line after the shared copy's four words (ring.py):
 *
 *     SHARE_RID    the rendezvous id of the message on offer
 *     SHARE_ADDR   where the reader's buffer is (the reader's address)
 *     SHARE_CLAIM  the chunks not taken yet, [lo, hi), the id's low bits and the combine
 *     SHARE_DONE   id << 24 | chunks the writer has combined (SHARE_FAILED: it could not)
 *
 * The reader takes chunks from the bottom and the writer from the top, each
 * by a compare-and-swap of SHARE_CLAIM, until they meet: neither waits for
 * the other to start, a busy writer only means no help, and each side's
 * share follows its speed. The writer reads a chunk of the reader's buffer,
 * combines its own bytes into it (in the order the reader would: the
 * reader's value first), writes it back, and counts it in SHARE_DONE; the
 * reader acknowledges the message once the count is all the writer took.
 * The id's bits in SHARE_CLAIM keep a late writer off a later offer. A
 * writer that stalls mid-chunk (descheduled, stopped, dead) leaves the
 * reader waiting, which the core does only for as long as it spins: then
 * it hands the receive to Python as a request in the transport's books
 * (adopt_sharing), where timeouts and dead peers are watched. */
enum { SHARE_RID, SHARE_ADDR, SHARE_CLAIM, SHARE_DONE };
static double now_seconds(void);
#define SHARE_CHUNKS 4                 /* a combining read of fewer chunks is not offered */
#define SHARE_FAILED 0xffffff          /* SHARE_DONE's count when the writer could not */
/* SHARE_CLAIM: lo and hi (24 bits each), the id's low 8 bits, and the
 * combine (dtype << 3 | op), so that a writer needs nothing of its own
 * program (shm.py's _help takes offers through help_combine() too). */
#define CLAIM(lo, hi, rid, kind) \
    ((int64_t)((uint64_t)(lo) | (uint64_t)(hi) << 24 | ((uint64_t)(rid) & 0xff) << 48 | (uint64_t)(kind) << 56))
#define CLAIM_LO(c) ((int64_t)((uint64_t)(c) & 0xffffff))
#define CLAIM_HI(c) ((int64_t)((uint64_t)(c) >> 24 & 0xffffff))
#define CLAIM_RID(c) ((uint64_t)(c) >> 48 & 0xff)
#define CLAIM_KIND(c) ((int)((uint64_t)(c) >> 56))

/* The ring's four share words (after the shared copy's in its offer line). */
static int64_t *share_words(ring_t *r) { return r->acks + ACKS + 4; }
/* The reader's buffer, where a registered one receives the message on offer
 * (shared copy or shared combining): the four words of registered_body
 * (zeros: not registered), which the reader stores before the offer's id;
 * after the token, in the offer's second line (ring.py's Ring.offer_key). */
static int64_t *key_after_share(int64_t *share) { return share + 8; }
static int64_t *offer_key(ring_t *r) { return key_after_share(share_words(r)); }

/* Publish (before an offer) whether the n bytes at dst, ours, are registered. */
static void publish_offer_key(ring_t *r, const char *dst, int64_t n) {
    int64_t key[RDV_WORDS_REGISTERED - RDV_WORDS] = {0};
    registered_body(dst, n, key);
    for (int i = 0; i < RDV_WORDS_REGISTERED - RDV_WORDS; i++)
        __atomic_store_n(&offer_key(r)[i], key[i], __ATOMIC_RELAXED);
}

/* The reader's buffer on offer: ``words`` (an offer_key) into key. */
static void load_offer_key(const int64_t *words, int64_t *key) {
    for (int i = 0; i < RDV_WORDS_REGISTERED - RDV_WORDS; i++) key[i] = __atomic_load_n(&words[i], __ATOMIC_RELAXED);
}

static int shareable(int64_t n) { return n >= SHARE_CHUNKS * READ_CHUNK && n / READ_CHUNK < SHARE_FAILED; }

/* The reader's chunk k: combined straight from ``mapped`` (a registered
 * buffer's mapping, at the message's start) or read by combine_chunk. */
static int reader_chunk(int pid, char *dst, int64_t address, const char *mapped, int64_t k, int64_t n, kernel_t kernel,
                        int op, int itemsize) {
    if (!mapped) return combine_chunk(pid, dst, address, k, n, kernel, op, itemsize);
    int64_t at = k * READ_CHUNK, len = n - at < READ_CHUNK ? n - at : READ_CHUNK;
    kernel(dst + at, mapped + at, len / itemsize, op);
    return 0;
}

/* The reader's side: combine single-copy message ``rid`` (n bytes at
 * ``address`` in the writer) into dst with kernels[dtype] and ``op``
 * (straight from ``mapped`` where the writer's buffer is registered),
 * offering the writer its chunks. 0: all combined; 1: the writer's last
 * chunks are still under way after ``spin`` seconds without progress, or
 * it failed (*expect: the SHARE_DONE that will say they are in); -1 (errno
 * set): a read failed. The first chunk is read before anything is
 * offered, so a message that cannot be read at all leaves nothing shared
 * (Python reads it again and says why). */
static __attribute__((noinline)) int read_shared(peer_t *p, char *dst, int64_t address, const char *mapped, int64_t n,
                       int64_t rid, int dtype, int op, double spin, int64_t *expect) {
    kernel_t kernel = kernels[dtype];
    int itemsize = itemsizes[dtype], kind = dtype << 3 | op;
    int64_t chunks = (n + READ_CHUNK - 1) / READ_CHUNK, *w = share_words(&p->in);
    if (reader_chunk(p->pid, dst, address, mapped, 0, n, kernel, op, itemsize)) return -1;
    publish_offer_key(&p->in, dst, n);
    __atomic_store_n(&w[SHARE_ADDR], (int64_t)(uintptr_t)dst, __ATOMIC_RELAXED);
    __atomic_store_n(&w[SHARE_CLAIM], CLAIM(1, chunks, rid, kind), __ATOMIC_RELAXED);
    __atomic_store_n(&w[SHARE_RID], rid, __ATOMIC_RELEASE);
    wake(p);  /* a writer asleep in Python takes offers too */
    int64_t c = __atomic_load_n(&w[SHARE_CLAIM], __ATOMIC_ACQUIRE);
    while (CLAIM_LO(c) < CLAIM_HI(c)) {
        int64_t lo = CLAIM_LO(c);
        if (!__atomic_compare_exchange_n(&w[SHARE_CLAIM], &c, CLAIM(lo + 1, CLAIM_HI(c), rid, kind), 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;  /* c is the word now */
        if (reader_chunk(p->pid, dst, address, mapped, lo, n, kernel, op, itemsize)) return -1;
        c = __atomic_load_n(&w[SHARE_CLAIM], __ATOMIC_ACQUIRE);
    }
    int64_t theirs = chunks - CLAIM_HI(c);
    *expect = rid << 24 | theirs;
    if (!theirs) return 0;
    int64_t seen = -1;
    double deadline = 0;
    for (;;) {
        int64_t done = __atomic_load_n(&w[SHARE_DONE], __ATOMIC_ACQUIRE);
        if (done == *expect) return 0;
        if (done == (rid << 24 | SHARE_FAILED)) return 1;  /* Python says why */
        double t = now_seconds();
        if (done != seen) { seen = done; deadline = t + spin; }
        else if (t >= deadline) return 1;
        __builtin_ia32_pause();
    }
}

static int64_t chunks_helped;  /* by this process (shared_chunks()) */

/* The writer's side: take the chunks that the reader of our single-copy
 * send ``rid`` (the n bytes at ``ours``) offers in share words w, from the
 * top, until none is left; each is read from the reader's buffer (process
 * pid), our bytes combined into it (the reader's value first, as the
 * reader would) and written back. Whether it took any (then wake the
 * reader: one that handed its wait to Python sleeps on its doorbell). */
static int combine_for_reader(int pid, int64_t *w, int64_t rid, const char *ours, int64_t n) {
    if (__atomic_load_n(&w[SHARE_RID], __ATOMIC_ACQUIRE) != rid) return 0;
    int64_t address = __atomic_load_n(&w[SHARE_ADDR], __ATOMIC_RELAXED);
    int64_t done = __atomic_load_n(&w[SHARE_DONE], __ATOMIC_RELAXED);
    int64_t count = done >> 24 == rid ? done & SHARE_FAILED : 0;
    int64_t c = __atomic_load_n(&w[SHARE_CLAIM], __ATOMIC_ACQUIRE);
    int dtype = CLAIM_KIND(c) >> 3, op = CLAIM_KIND(c) & 7, took = 0;
    char *scratch = chunk_scratch();
    if (count == SHARE_FAILED || !scratch || dtype >= NDTYPES || !supported(dtype, op)) return 0;
    int64_t key[RDV_WORDS_REGISTERED - RDV_WORDS];
    view_t *held = NULL;
    load_offer_key(key_after_share(w), key);
    char *theirs = key[3] ? view_of(pid, key, address, n, &held) : NULL;  /* the reader's registered buffer */
    while (CLAIM_RID(c) == ((uint64_t)rid & 0xff) && CLAIM_LO(c) < CLAIM_HI(c)) {
        int64_t hi = CLAIM_HI(c) - 1;
        if (!__atomic_compare_exchange_n(&w[SHARE_CLAIM], &c, CLAIM(CLAIM_LO(c), hi, rid, CLAIM_KIND(c)), 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;  /* c is the word now */
        int64_t at = hi * READ_CHUNK, len = n - at < READ_CHUNK ? n - at : READ_CHUNK;
        int failed = 0;
        if (theirs) {
            kernels[dtype](theirs + at, ours + at, len / itemsizes[dtype], op);
        } else if (!(failed = vm_move(pid, scratch, address + at, len, 0))) {
            kernels[dtype](scratch, ours + at, len / itemsizes[dtype], op);
            failed = vm_move(pid, scratch, address + at, len, 1);
        }
        count = failed ? SHARE_FAILED : count + 1;
        chunks_helped += !failed;
        __atomic_store_n(&w[SHARE_DONE], rid << 24 | count, __ATOMIC_RELEASE);
        took = 1;
        if (failed) break;
        c = __atomic_load_n(&w[SHARE_CLAIM], __ATOMIC_ACQUIRE);
    }
    if (theirs) view_done(held);
    return took;
}

/* A message of a program's step: ``nbytes`` at ``off`` in buffer ``buf``
 * (-1 and no pieces: an empty message), or gathered from (scattered to)
 * its ``npieces`` pieces, in order, where it is one slot (engine's staged
 * message: several pieces of the arrays travel as one). ``reduce``: a
 * receive combines. ``single_copy``: a send goes single copy at any size,
 * where the peer can read this process (core.compile's exchanges,
 * core.batch_program's sends of 64 KiB or more); -1: through the slots at
 * any size, unless it lies in a registered buffer (core._exchanges where
 * single copy is slow). */
typedef struct { int buf; int64_t off, nbytes; } piece_t;
typedef struct {
    int peer, buf, reduce, single_copy, npieces;
    int64_t off, nbytes;
    piece_t *pieces;
    int after, next;  /* a combining group's receives (schedule.py): the one before and after it (-1: none) */
    int seed;         /* the step's local copy that starts its group's sum (find_seeds; -1: none) */
} msg_t;

/* Whether send m (of ``data``; NULL: whether it may) to p goes single copy:
 * from p's threshold; at any size where m says so and p can read this
 * process; and, where ``registered`` allows, from REGISTERED_SINGLE_COPY_BYTES
 * where data lies in a registered buffer (its reader copies it once,
 * straight from the mapping, where the slots take two copies: a 2-rank
 * broadcast of 256 KiB took 9-10 us against 19-23, a reduce of 1 MiB 25
 * against 87-132). A program allows it where it said it may (p->rdv), not
 * core.p2p_program's (slots_only). */
static int goes_single_copy(const peer_t *p, const msg_t *m, const char *data, int registered) {
    if (!p->shm || m->npieces) return 0;
    if (m->single_copy >= 0 && (m->nbytes >= p->cma_bytes || (m->single_copy && p->cma_bytes < INT64_MAX)))
        return 1;  /* (-1: through the slots at any size, unless registered: core._exchanges) */
    int64_t words[RDV_WORDS_REGISTERED - RDV_WORDS];
    return registered && p->cma_bytes < INT64_MAX && m->nbytes >= REGISTERED_SINGLE_COPY_BYTES
           && (!data || registered_body(data, m->nbytes, words));
}

/* Where the bytes of message m are in the call's buffers (NULL: none, or in pieces). */
static char *msg_bytes(const msg_t *m, Py_buffer *bufs) {
    return m->buf < 0 ? NULL : (char *)bufs[m->buf].buf + m->off;
}

/* The pieces of m, gathered into ``slot`` in order. */
static void gather_pieces(const msg_t *m, Py_buffer *bufs, char *slot) {
    for (int j = 0; j < m->npieces; j++) {
        const piece_t *c = &m->pieces[j];
        memcpy(slot, (char *)bufs[c->buf].buf + c->off, c->nbytes);
        slot += c->nbytes;
    }
}

/* ``src`` scattered to the pieces of m in order, copied or combined in. */
static void scatter_pieces(const msg_t *m, Py_buffer *bufs, const char *src, kernel_t kernel, int op,
                           int itemsize) {
    for (int j = 0; j < m->npieces; j++) {
        const piece_t *c = &m->pieces[j];
        char *dst = (char *)bufs[c->buf].buf + c->off;
        if (kernel) kernel(dst, src, c->nbytes / itemsize, op);
        else memcpy(dst, src, c->nbytes);
        src += c->nbytes;
    }
}

enum { TAKEN, EMPTY, FOREIGN, SHARING, PARTIAL };  /* what take() found */

/* Free the ``count`` slots at the head of ``p``'s ring (from its
 * ``tail``), as ring.freed() does: wake the writer if it may have found the
 * ring full. */
static void free_slots(peer_t *p, int64_t tail, int64_t count) {
    ring_t *r = &p->in;
    __atomic_store_n(r->tail, tail + count, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(r->head, __ATOMIC_RELAXED) - tail >= r->slots) sem_post(p->bell);
}

/* Whether the slot with header h is a single-copy message's (ring.py's RDV
 * slot): its body the address and id, and where the bytes lie in a
 * registered buffer, that buffer's four words. */
static int is_rendezvous(const header_t *h) {
    return h->offset == RDV && (h->frag == (int64_t)(RDV_WORDS * sizeof(int64_t))
                                || h->frag == (int64_t)(RDV_WORDS_REGISTERED * sizeof(int64_t)));
}

/* Where the n bytes of a rendezvous ``body`` (of ``frag`` bytes) from
 * process pid are mapped here (view_of), or NULL: not registered, or not
 * mappable. */
static const char *rendezvous_view(int pid, const int64_t *body, int64_t frag, int64_t n, view_t **held) {
    return frag > (int64_t)(RDV_WORDS * sizeof(int64_t)) ? view_of(pid, body + RDV_WORDS, body[0], n, held) : NULL;
}

/* ring.acknowledge(): single-copy send ``rid`` from p is read, its writer's send done. */
static void acknowledge(peer_t *p, int64_t rid) {
    __atomic_store_n(&p->in.acks[rid % ACKS], rid, __ATOMIC_RELEASE);
    wake(p);
}

/* Take the message at the ring's head if it is m, whole in one slot or
 * single copy: copy or combine it into its place (a single-copy one is
 * then acknowledged). With ``got`` (else FOREIGN), a message of several
 * slots is taken a fragment at a time, in order (a writer writes a
 * message's fragments one after the other): *got counts its bytes taken,
 * and PARTIAL says that more are to come. FOREIGN: something else is there
 * (another tag, a mismatch, a single copy of pieces), or its read failed:
 * Python's turn. With ``share`` >= 0 a large combining single copy is
 * shared with its writer (read_shared); SHARING: the writer's part is still
 * under way after ``share`` seconds without progress, and p->sharing says
 * which (the slot is freed, the acknowledgement is not sent). */
static inline __attribute__((always_inline)) int take(peer_t *p, int64_t tag, uint64_t meta, const msg_t *m, Py_buffer *bufs, kernel_t kernel, int op,
                int itemsize, int dtype, double share, int64_t *got) {
    char *dst = msg_bytes(m, bufs);
    int64_t n = m->nbytes;
    ring_t *r = &p->in;
    int64_t tail = *r->tail;  /* only we store it */
    if (__atomic_load_n(r->head, __ATOMIC_ACQUIRE) == tail) return EMPTY;
    int64_t k = tail % r->slots;
    header_t h;
    memcpy(&h, r->headers + k * LINE, sizeof h);
    if (h.tag != tag || h.meta != meta || h.nbytes != n) return FOREIGN;
    const char *src = r->payload + k * r->slot_bytes;
    int64_t rid = 0;
    if (is_rendezvous(&h) && p->pid && !m->npieces) {
        int64_t body[RDV_WORDS_REGISTERED];
        memcpy(body, src, h.frag);
        rid = body[1];
        view_t *held = NULL;
        const char *mapped = rendezvous_view(p->pid, body, h.frag, n, &held);
        if (kernel && share >= 0 && shareable(n)) {
            int left = read_shared(p, dst, body[0], mapped, n, rid, dtype, op, share, &p->sharing[1]);
            if (mapped) view_done(held);
            if (left < 0) return FOREIGN;
            if (left) {
                p->sharing[0] = rid;
                free_slots(p, tail, 1);
                return SHARING;
            }
        } else if (mapped) {  /* a registered buffer: straight from its mapping */
            if (kernel) kernel(dst, mapped, n / itemsize, op);
            else memcpy(dst, mapped, n);
            view_done(held);
        } else if (read_remote(p->pid, dst, body[0], n, kernel, op, itemsize)) return FOREIGN;
    } else if (got && n > r->slot_bytes && !m->npieces && h.offset == *got
               && h.frag == (n - *got < r->slot_bytes ? n - *got : r->slot_bytes)) {
        if (kernel) kernel(dst + *got, src, h.frag / itemsize, op);
        else memcpy(dst + *got, src, h.frag);
        *got += h.frag;
        free_slots(p, tail, 1);
        return *got == n ? TAKEN : PARTIAL;
    } else if (h.offset != 0 || h.frag != n) {
        return FOREIGN;
    } else if (m->npieces) {
        scatter_pieces(m, bufs, src, kernel, op, itemsize);
    } else if (kernel) {
        kernel(dst, src, n / itemsize, op);
    } else if (n) {
        memcpy(dst, src, n);
    }
    free_slots(p, tail, 1);
    if (rid) acknowledge(p, rid);
    return TAKEN;
}

/* ------------------------------------------------------------------ programs */

typedef struct {
    int reduce, sbuf, dbuf;
    int64_t soff, doff, nbytes;
    int seeds;  /* it copies into exactly a combining group's bytes: it runs with the group (seed_group) */
} local_t;
typedef struct {
    int python;             /* Python runs this step whole */
    int sends_first;        /* its sends neither read what its local operations write nor announce
                               those writes (core.compile): post them first */
    int nlocal, nsend, nrecv;
    local_t *local;
    msg_t *send, *recv;     /* buf -1: an empty message */
} step_t;

typedef struct {
    PyObject_HEAD
    int nbufs, nsteps, npeers, dtype, op, itemsize, crowded, maxsend, maxrecv;
    int small;              /* it moves few bytes: a run keeps the GIL while it is short (see gil_t) */
    double spin;            /* seconds a receive spins before Python takes over */
    int64_t *need;          /* bytes each buffer must have */
    char *writes;           /* whether the program writes each buffer */
    step_t *steps;
    peer_t *peers;
    PyObject *transport;    /* the ShmTransport (None without shm peers) */
    int64_t passes;         /* passes of the receive loops so far (see peer_t.behind) */
    int64_t *rids;          /* the step's single-copy sends in flight: rids[j] for send j (0: none) */
    int64_t *sent, *got;    /* the step's messages of several slots: bytes of send j written into
                               the ring, of receive j taken from it, so far */
    char *envelope;         /* a one-message program's own copy of its message (send_envelope) */
    int sharing;            /* the step's receive whose shared combining Python takes over (-1: none) */
    int wrote;              /* post_sends wrote fragments of a message of several slots */
    int whole;              /* a batch's program (core.batch_program): its messages of several slots
                               move whole or not at all, so that it can pause (see batch()) */
    int timed_out;          /* run_steps stopped because its spin ran out (else: Python must act) */
    uint64_t paused_mask;   /* a paused batch's mask (see batch()) */
    uint64_t seeded;        /* the step's seeds (local_t.seeds) that have run: bit j, local j */
} CoreProgram;

/* A combining group's receives at most (step_t's done mask holds 62 messages). */
#define MAX_GROUP 16
#define GROUP_WAITS (MAX_GROUP + 1)  /* take_group: not yet */

/* Where ranks share cores (crowded), a combining group reads this much of
 * each message at a time, else READ_CHUNK. Each read is a system call that
 * looks up the peer and pins its pages anew, and a rank that shares its
 * core is best off making few: a 4-rank direct reduce_scatter on 2 cores
 * took 0.72-0.91 of the time at 4-64 MiB with it (AMD EPYC VM, plain
 * arrays, four alternating runs of each size), where a 2-rank one took
 * 1.08-1.14 at 16 MiB (three). */
#define GROUP_CHUNK (256 * 1024)

/* This thread's scratch for a chunk of each of a group's messages. */
static char *group_scratch(void) {
    static __thread char *scratch;
    if (!scratch && !(scratch = malloc(MAX_GROUP * GROUP_CHUNK))) errno = ENOMEM;
    return scratch;
}

/* How long a receive loop waits, at least, for a combining group's last
 * messages once the others are there, before Python takes the step over
 * (Python stages all but the first and combines them after, one pass over
 * the destination each). On ranks that share cores the program's own spin
 * is 10 us: a 4-rank direct reduce_scatter on 2 cores (plain arrays,
 * medians of three alternating runs) took 10.8 ms at 16 MiB and 41.3 at 64
 * MiB with that, 8.6 and 34.6 with 10 ms, where one message per step took
 * 8.3 and 39.0. Taking the messages there without waiting for the rest
 * (fused as far as they go) took 10.8 and 42.1. */
#define GROUP_SPIN 10e-3

/* Run seed ``j`` of step s (find_seeds) unless it has run: before anything
 * else combines into its group's bytes, and before Python takes the step. */
static void seed_group(CoreProgram *self, step_t *s, Py_buffer *bufs, int j) {
    if (j < 0 || (self->seeded >> j & 1)) return;
    local_t *l = &s->local[j];
    memmove((char *)bufs[l->dbuf].buf + l->doff, (char *)bufs[l->sbuf].buf + l->soff, l->nbytes);
    self->seeded |= 1ull << j;
}

/* The receives of the combining group whose first open one is recv[j] (the
 * ones before it done), taken at once where every one's message is single
 * copy and at its ring's head: a chunk at a time, every message's chunk
 * combined into dst's in the group's order while dst's is in cache. Taken
 * one by one, each streams the whole of dst through memory again (on 4
 * ranks, 3 passes over each rank's block in a direct reduce_scatter). Sets
 * their bits in *mask (bit ``first`` + k: receive k) and returns how many
 * it took; GROUP_WAITS where some are there, all single copy, and one is
 * not there yet (the step cannot end before it comes, and taking the
 * others one by one meanwhile costs the passes this saves); 0 where one is
 * not single copy or cannot be read (take() takes them one by one, as they
 * come); -1 (errno set) where a read failed midway (Python's turn, as
 * take()'s FOREIGN). */
static int take_group(CoreProgram *self, step_t *s, int j, Py_buffer *bufs, int64_t tag, uint64_t meta,
                      int64_t pass, uint64_t *mask, int first) {
    struct { int k; peer_t *p; int64_t tail, address, rid; const char *mapped; view_t *held; } g[MAX_GROUP];
    const msg_t *lead = &s->recv[j];
    int64_t n = lead->nbytes;
    int count = 0, ok = !lead->npieces && !self->got[j], missing = 0;
    for (int k = j; ok && k >= 0; k = s->recv[k].next) {
        peer_t *p = &self->peers[s->recv[k].peer];
        ring_t *r = &p->in;
        ok = count < MAX_GROUP && p->shm && p->pid && p->behind != pass;
        for (int i = 0; ok && i < count; i++) ok = g[i].p != p;  /* its second message is not at the head */
        int64_t tail = ok ? *r->tail : 0;
        if (ok && __atomic_load_n(r->head, __ATOMIC_ACQUIRE) == tail) {
            missing = 1;
            continue;
        }
        header_t h;
        if (ok) memcpy(&h, r->headers + tail % r->slots * LINE, sizeof h);
        ok = ok && h.tag == tag && h.meta == meta && h.nbytes == n && is_rendezvous(&h);
        if (!ok) break;
        int64_t body[RDV_WORDS_REGISTERED];
        memcpy(body, r->payload + tail % r->slots * r->slot_bytes, h.frag);
        g[count].k = k, g[count].p = p, g[count].tail = tail, g[count].address = body[0], g[count].rid = body[1];
        g[count].held = NULL;
        g[count].mapped = rendezvous_view(p->pid, body, h.frag, n, &g[count].held);
        count++;
    }
    if (ok && missing) {
        for (int i = 0; i < count; i++)
            if (g[i].held) view_done(g[i].held);
        return count ? GROUP_WAITS : 0;
    }
    char *scratch = group_scratch();
    /* Each one that is not mapped is read once first, so that a message that
     * cannot be read leaves dst as it was (take() reads it and says why). */
    for (int i = 0; ok && i < count; i++)
        ok = g[i].mapped || (scratch && !vm_move(g[i].p->pid, scratch, g[i].address, n < 64 ? n : 64, 0));
    int rc = ok ? count : 0;
    char *dst = ok ? msg_bytes(lead, bufs) : NULL, *seed = NULL;
    if (rc > 0 && lead->seed >= 0 && !(self->seeded >> lead->seed & 1)) {  /* summed onto, a chunk at a time */
        local_t *l = &s->local[lead->seed];
        seed = (char *)bufs[l->sbuf].buf + l->soff;
        if (seed < dst + n && dst < seed + n) {  /* the same memory under two names: not here */
            seed_group(self, s, bufs, lead->seed);
            seed = NULL;
        } else self->seeded |= 1ull << lead->seed;
    }
    const char *src[MAX_GROUP];
    int64_t at = 0;
    int64_t chunk = self->crowded ? GROUP_CHUNK : READ_CHUNK;
    for (; rc > 0 && at < n; at += chunk) {
        int64_t len = n - at < chunk ? n - at : chunk;
        for (int i = 0; rc > 0 && i < count; i++) {  /* every message's chunk, read where not mapped */
            src[i] = g[i].mapped ? g[i].mapped + at : scratch + i * chunk;
            if (!g[i].mapped && vm_move(g[i].p->pid, scratch + i * chunk, g[i].address + at, len, 0)) rc = -1;
        }
        if (rc < 0) break;
        combine_many(dst + at, seed ? seed + at : NULL, src, count, len / self->itemsize, self->dtype, self->op);
    }
    if (seed && rc < 0) memcpy(dst + at, seed + at, n - at);  /* the seed's part not summed yet, as Python expects */
    for (int i = 0; i < count; i++) {
        if (g[i].held) view_done(g[i].held);
        if (rc <= 0) continue;
        free_slots(g[i].p, g[i].tail, 1);
        acknowledge(g[i].p, g[i].rid);
        *mask |= 1ull << (first + g[i].k);
    }
    return rc;
}

/* A program refers to the rings' Python ends and their transport, which may
 * lead back to it (the transport's callbacks into its Network, whose p2p
 * programs these are): the cycle collector must see those references. (No
 * tp_clear: the dicts and instances in such a cycle break it.) */
static int program_traverse(CoreProgram *self, visitproc visit, void *arg) {
    for (int i = 0; self->peers && i < self->npeers; i++) {
        Py_VISIT(self->peers[i].out_obj);
        Py_VISIT(self->peers[i].in_obj);
    }
    Py_VISIT(self->transport);
    return 0;
}

static void program_dealloc(CoreProgram *self) {
    PyObject_GC_UnTrack(self);
    if (self->steps) {
        for (int i = 0; i < self->nsteps; i++) {
            step_t *s = &self->steps[i];
            for (int j = 0; s->send && j < s->nsend; j++) PyMem_Free(s->send[j].pieces);
            for (int j = 0; s->recv && j < s->nrecv; j++) PyMem_Free(s->recv[j].pieces);
            PyMem_Free(s->local);
            PyMem_Free(s->send);
            PyMem_Free(s->recv);
        }
        PyMem_Free(self->steps);
    }
    if (self->peers) {
        for (int i = 0; i < self->npeers; i++) {
            Py_XDECREF(self->peers[i].out_obj);
            Py_XDECREF(self->peers[i].in_obj);
        }
        PyMem_Free(self->peers);
    }
    PyMem_Free(self->need);
    PyMem_Free(self->writes);
    PyMem_Free(self->rids);
    PyMem_Free(self->sent);
    PyMem_Free(self->got);
    PyMem_Free(self->envelope);
    Py_XDECREF(self->transport);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int parse_ring(PyObject *t, ring_t *r) {
    unsigned long long head, tail, headers, payload;
    long long slots, slot_bytes;
    if (!PyArg_ParseTuple(t, "KKKKLL", &head, &tail, &headers, &payload, &slots, &slot_bytes)) return -1;
    r->head = (int64_t *)(uintptr_t)head;
    r->tail = (int64_t *)(uintptr_t)tail;
    r->headers = (char *)(uintptr_t)headers;
    r->payload = (char *)(uintptr_t)payload;
    r->slots = slots;
    r->slot_bytes = slot_bytes;
    r->acks = (int64_t *)(r->headers + slots * LINE);
    return slots > 0 ? 0 : -1;
}

/* A message's pieces: a sequence of (buf, off, nbytes). */
static int parse_pieces(PyObject *seq, msg_t *m, int nbufs) {
    PyObject *fast = PySequence_Fast(seq, "pieces must be a sequence");
    if (!fast) return -1;
    m->npieces = (int)PySequence_Fast_GET_SIZE(fast);
    m->pieces = PyMem_Calloc(m->npieces ? m->npieces : 1, sizeof(piece_t));
    int rc = m->pieces ? 0 : -1;
    for (int j = 0; rc == 0 && j < m->npieces; j++) {
        piece_t *c = &m->pieces[j];
        long long off, nbytes;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, j), "iLL", &c->buf, &off, &nbytes)) rc = -1;
        else if (c->buf < 0 || c->buf >= nbufs || off < 0 || nbytes < 0) {
            PyErr_SetString(PyExc_ValueError, "a message's piece names no buffer of the program");
            rc = -1;
        }
        c->off = off;
        c->nbytes = nbytes;
    }
    Py_DECREF(fast);
    if (rc && !PyErr_Occurred()) PyErr_NoMemory();
    return rc;
}

static int parse_msgs(PyObject *seq, msg_t **out, int *count, int recv, int npeers, int nbufs) {
    PyObject *fast = PySequence_Fast(seq, "messages must be a sequence");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    *count = (int)n;
    *out = PyMem_Calloc(n ? n : 1, sizeof(msg_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        msg_t *m = &(*out)[i];
        long long off, nbytes;
        int flag;
        PyObject *pieces = NULL;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iiLLi|O", &m->peer, &m->buf, &off, &nbytes,
                              &flag, &pieces)
            || (pieces && parse_pieces(pieces, m, nbufs))) {
            Py_DECREF(fast);
            return -1;
        }
        m->off = off;
        m->nbytes = nbytes;
        if (recv) m->reduce = flag;
        else m->single_copy = flag;
        int64_t total = 0;
        for (int j = 0; j < m->npieces; j++) total += m->pieces[j].nbytes;
        if (m->peer < 0 || m->peer >= npeers || m->buf < -1 || m->buf >= nbufs
            || (m->npieces && (m->buf != -1 || total != m->nbytes || m->single_copy))) {
            PyErr_SetString(PyExc_ValueError, "a message names no peer or buffer of the program");
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

/* Whether receives a and b combine into the same bytes. */
static int same_place(const msg_t *a, const msg_t *b) {
    if (a->buf != b->buf || a->off != b->off || a->nbytes != b->nbytes || a->npieces != b->npieces) return 0;
    for (int k = 0; k < a->npieces; k++)
        if (a->pieces[k].buf != b->pieces[k].buf || a->pieces[k].off != b->pieces[k].off
            || a->pieces[k].nbytes != b->pieces[k].nbytes) return 0;
    return 1;
}

/* Chain each combining group of step s (reducing receives into the same
 * bytes, schedule.py): each member's after and next. */
static void chain_groups(step_t *s) {
    for (int j = 0; j < s->nrecv; j++) s->recv[j].after = s->recv[j].next = -1;
    for (int j = 0; j < s->nrecv; j++) {
        msg_t *m = &s->recv[j];
        for (int k = j - 1; m->reduce && m->nbytes && k >= 0; k--)
            if (s->recv[k].reduce && same_place(&s->recv[k], m)) {
                m->after = k;
                s->recv[k].next = j;
                break;
            }
    }
}

/* Whether [a, a + an) and [b, b + bn) of buffers abuf and bbuf overlap. */
static int overlaps(int abuf, int64_t a, int64_t an, int bbuf, int64_t b, int64_t bn) {
    return abuf == bbuf && a < b + bn && b < a + an;
}

/* Whether message m reads or writes any of [off, off + n) of buffer buf. */
static int msg_touches(const msg_t *m, int buf, int64_t off, int64_t n) {
    if (!m->npieces) return m->buf >= 0 && overlaps(m->buf, m->off, m->nbytes, buf, off, n);
    for (int k = 0; k < m->npieces; k++)
        if (overlaps(m->pieces[k].buf, m->pieces[k].off, m->pieces[k].nbytes, buf, off, n)) return 1;
    return 0;
}

/* A step's local copy into exactly the bytes of a combining group, which
 * nothing else of the step reads or writes, is the group's seed: the sum
 * starts from it. A step's locals run before its receives, so running the
 * seed with the group (take_group: each chunk of the messages summed onto
 * the seed's, combine_many) gives the same bytes and spares a pass over
 * the destination: in a 4-rank direct reduce_scatter of 64 MiB the rank's
 * own block copied alone took 25% of the samples, the combining 47%.
 * Anything else that combines into the group's bytes first runs the seed
 * (seed_group). Not in a batch's program (whole), which may pause. */
static void find_seeds(step_t *s, int whole) {
    for (int j = 0; j < s->nrecv; j++) s->recv[j].seed = -1;
    for (int j = 0; !whole && j < s->nrecv; j++) {
        msg_t *m = &s->recv[j];
        if (m->after >= 0 || m->next < 0 || m->npieces) continue;  /* a group's first receive */
        int seed = -1, clash = 0;
        for (int i = 0; i < s->nlocal && i < 64; i++) {
            local_t *l = &s->local[i];
            int exact = !l->reduce && l->dbuf == m->buf && l->doff == m->off && l->nbytes == m->nbytes;
            if (exact && seed < 0 && !overlaps(l->sbuf, l->soff, l->nbytes, m->buf, m->off, m->nbytes)) seed = i;
            else clash |= overlaps(l->dbuf, l->doff, l->nbytes, m->buf, m->off, m->nbytes)
                          || overlaps(l->sbuf, l->soff, l->nbytes, m->buf, m->off, m->nbytes);
        }
        for (int k = 0; seed >= 0 && k < s->nsend; k++) clash |= msg_touches(&s->send[k], m->buf, m->off, m->nbytes);
        if (seed < 0 || clash) continue;
        s->local[seed].seeds = 1;
        for (int k = j; k >= 0; k = s->recv[k].next) s->recv[k].seed = seed;
    }
}

/* Program(need, writes, steps, peers, dtype, op, transport, spin, crowded[, whole]): see core.compile()
 * (and core.batch_program for ``whole``). */
static PyObject *program_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *need, *writes, *steps, *peers, *transport;
    int dtype, op, crowded;
    double spin;
    int whole = 0, slots_only = 0;  /* slots_only: never single copy (core.p2p_program's) */
    if (!PyArg_ParseTuple(args, "OOOOiiOdp|pp", &need, &writes, &steps, &peers, &dtype, &op, &transport, &spin,
                          &crowded, &whole, &slots_only)) return NULL;
    if (dtype < 0 || dtype >= NDTYPES || (op >= 0 && !supported(dtype, op))) {
        PyErr_Format(PyExc_ValueError, "no compiled kernel for dtype code %d and op code %d", dtype, op);
        return NULL;
    }
    CoreProgram *self = (CoreProgram *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->dtype = dtype;
    self->op = op;
    self->itemsize = itemsizes[dtype];
    self->spin = spin;
    self->crowded = crowded;
    self->whole = whole;
    self->transport = Py_NewRef(transport);
    if (transport != Py_None && !hot_known(transport, shm_type, "transport")) {
        Py_DECREF(self);
        return NULL;
    }
    self->nbufs = (int)PySequence_Size(need);
    self->need = PyMem_Calloc(self->nbufs + 1, sizeof(int64_t));
    self->writes = PyMem_Calloc(self->nbufs + 1, 1);
    for (int i = 0; i < self->nbufs; i++) {
        PyObject *v = PySequence_GetItem(need, i), *w = PySequence_GetItem(writes, i);
        self->need[i] = v ? PyLong_AsLongLong(v) : -1;
        self->writes[i] = w ? (char)PyObject_IsTrue(w) : 0;
        Py_XDECREF(v);
        Py_XDECREF(w);
    }
    self->npeers = (int)PySequence_Size(peers);
    self->peers = PyMem_Calloc(self->npeers + 1, sizeof(peer_t));
    for (int i = 0; i < self->npeers; i++) {
        PyObject *t = PySequence_GetItem(peers, i);
        if (!t) goto fail;
        if (t != Py_None) {
            peer_t *p = &self->peers[i];
            PyObject *out_ring, *in_ring;
            unsigned long long bell;
            long long cma_bytes;
            if (!PyArg_ParseTuple(t, "OOOOKiL", &p->out_obj, &p->in_obj, &out_ring, &in_ring, &bell, &p->pid,
                                  &cma_bytes)
                || parse_ring(out_ring, &p->out) || parse_ring(in_ring, &p->in)) {
                p->out_obj = p->in_obj = NULL;
                Py_DECREF(t);
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad ring");
                goto fail;
            }
            Py_INCREF(p->out_obj);
            Py_INCREF(p->in_obj);
            if (!ends_known(p->out_obj, p->in_obj)) { Py_DECREF(t); goto fail; }
            p->bell = (sem_t *)(uintptr_t)bell;
            p->sleepers = (int64_t *)(uintptr_t)(bell + 64);
            p->cma_bytes = cma_bytes > 0 && cma_bytes < NEVER && p->pid ? cma_bytes : INT64_MAX;
            p->shm = 1;
        }
        Py_DECREF(t);
    }
    self->nsteps = (int)PySequence_Size(steps);
    self->steps = PyMem_Calloc(self->nsteps + 1, sizeof(step_t));
    for (int i = 0; i < self->nsteps; i++) {
        step_t *s = &self->steps[i];
        PyObject *t = PySequence_GetItem(steps, i), *locals, *sends, *recvs;
        if (!t) goto fail;
        if (!PyArg_ParseTuple(t, "iOOOp", &s->python, &locals, &sends, &recvs, &s->sends_first)) {
            Py_DECREF(t);
            goto fail;
        }
        PyObject *fast = PySequence_Fast(locals, "locals must be a sequence");
        if (!fast) { Py_DECREF(t); goto fail; }
        s->nlocal = (int)PySequence_Fast_GET_SIZE(fast);
        s->local = PyMem_Calloc(s->nlocal + 1, sizeof(local_t));
        for (int j = 0; j < s->nlocal; j++) {
            local_t *l = &s->local[j];
            long long soff, doff, nbytes;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, j), "iiLiLL", &l->reduce, &l->sbuf, &soff,
                                  &l->dbuf, &doff, &nbytes)) { Py_DECREF(fast); Py_DECREF(t); goto fail; }
            l->soff = soff; l->doff = doff; l->nbytes = nbytes;
            if (l->sbuf < 0 || l->sbuf >= self->nbufs || l->dbuf < 0 || l->dbuf >= self->nbufs
                || (l->reduce && op < 0)) {
                PyErr_SetString(PyExc_ValueError, "a local operation names no buffer of the program");
                Py_DECREF(fast); Py_DECREF(t); goto fail;
            }
        }
        Py_DECREF(fast);
        if (parse_msgs(sends, &s->send, &s->nsend, 0, self->npeers, self->nbufs)
            || parse_msgs(recvs, &s->recv, &s->nrecv, 1, self->npeers, self->nbufs)) { Py_DECREF(t); goto fail; }
        Py_DECREF(t);
        if (s->nsend + s->nrecv > 62) s->python = 1;  /* the done mask is one int64 */
        if (s->nsend > self->maxsend) self->maxsend = s->nsend;
        if (s->nrecv > self->maxrecv) self->maxrecv = s->nrecv;
        for (int j = 0; j < s->nsend; j++) {
            peer_t *p = &self->peers[s->send[j].peer];
            msg_t *m = &s->send[j];
            if (m->npieces && (!p->shm || m->nbytes > p->out.slot_bytes || m->nbytes >= p->cma_bytes))
                s->python = 1;  /* pieces travel in one slot only (core.compile sends no others) */
            else if (goes_single_copy(p, m, NULL, !slots_only)) p->rdv = 1;
            p->sends = 1;
        }
        chain_groups(s);
        find_seeds(s, whole);
        for (int j = 0; j < s->nrecv; j++) {
            if (s->recv[j].reduce && op < 0) { PyErr_SetString(PyExc_ValueError, "a reduction needs an op"); goto fail; }
            peer_t *p = &self->peers[s->recv[j].peer];
            if (s->recv[j].npieces && (!p->shm || s->recv[j].nbytes > p->in.slot_bytes)) s->python = 1;
            self->peers[s->recv[j].peer].recvs = 1;
        }
    }
    int64_t moved = 0;
    for (int i = 0; i < self->nsteps; i++) {
        step_t *s = &self->steps[i];
        for (int j = 0; j < s->nlocal; j++) moved += s->local[j].nbytes;
        for (int j = 0; j < s->nsend; j++) moved += s->send[j].nbytes;
        for (int j = 0; j < s->nrecv; j++) moved += s->recv[j].nbytes;
    }
    self->small = moved <= SMALL_BYTES;
    self->rids = PyMem_Calloc(self->maxsend + 1, sizeof(int64_t));
    self->sent = PyMem_Calloc(self->maxsend + 1, sizeof(int64_t));
    self->got = PyMem_Calloc(self->maxrecv + 1, sizeof(int64_t));
    if (!self->rids || !self->sent || !self->got) goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* The Python ends' attribute names, interned once at import: the checks
 * below run on every call, and a name made from a C string each time cost
 * a good part of a small call. */
enum { N_CLOSED, N_STASH, N_ERROR, N_CURRENT, N_QUEUE, N_PENDING, N_NPOSTED, N_CLAIMS, N_SHARED, N_STASH_IN,
       N_UNEXPECTED, N_HEAD, N_TAIL, N_NEXT_ID, N_SEQ, N_ABORT, N_LOST, N_TRACE, N_LOCK, N_DONE, N_WORLD, N_GROUP, N_NETWORK, N_LANES, N_BACKGROUND,
       N_DRAIN, N_RANK, N_RANKS, N_INDEX, N_DTYPE, N_SIZE, N_CODE, N_SUM, N_P2P, N_PROGRAMS, N_DEFERRED,
       N_CONTEXT, N_P2P_OPS, N_RESULT, N_SHAPE, N_ACQUIRE, N_RELEASE, N_MINE, N_EVERY, N_OUTGOING,
       N_ETAG, N_POSTED, N_UNMATCHED, N_ENVELOPES, N_PROBES, N_M_LOST, N_CORE_SENDS, N_CORE_RECVS, N_ENVELOPE_IN,
       N_ENVELOPE, N_CORE_PROGRAM, N_COMM_GROUP, N_GET_RANK, N_GET_SIZE, N_SOURCE, N_TAG, N_DST, N_MSG,
       N_CANCELLED, N_TIMEOUT, N_INTER, N_POST, N_NBYTES, N_DATA, N_REQ, N_MATCHED, N_SYNC_ID, N_LOADS, N_PEER,
       N_WAIT_REST, N_WAIT_OBJECT, N_COMM_MATCHER, N_DUMPS, N_RECV_REST, N_PY, N_OBJECT_SLOTS, N_OP, N_TENSOR,
       N_GROUP_PEER, NNAMES };
static const char *name_strings[NNAMES] = {"_closed", "_stash", "error", "current", "queue", "pending",
                                           "nposted", "claims", "shared", "stash", "unexpected", "head",
                                           "tail", "next_id", "seq", "_abort", "_lost", "TRACE", "lock",
                                           "done", "_world", "group", "network", "lanes", "background",
                                           "drain", "rank", "ranks", "_index", "dtype", "size", "code", "SUM",
                                           "p2p", "programs", "deferred", "context", "p2p_ops", "_result", "shape",
                                           "acquire", "release", "mine", "every", "outgoing",
                                           "etag", "posted", "unmatched", "envelopes", "probes", "lost",
                                           "core_sends", "core_recvs", "envelope_in", "_envelope", "_core_program",
                                           "_group", "Get_rank", "Get_size", "source", "tag", "dst", "msg",
                                           "cancelled", "timeout", "inter", "post", "nbytes",
                                           "data", "req", "matched", "sync", "loads", "peer",
                                           "_Wait", "_wait", "_matcher", "dumps", "_recv_rest", "_py", "object_slots", "op",
                                           "tensor", "group_peer"};
static PyObject *names[NNAMES];
static PyObject *no_requests;  /* the empty tuple: what run() hands over most of the time */
static PyObject *zero;         /* the int 0: a finished call's network.current */

/* The attributes the core reads and writes on every call live at fixed
 * offsets of their objects: their classes declare them as __slots__ (the
 * ring ends ring.Out and ring.In; ProcessGroup's sequence, the Network's
 * current call and broken state, the shm transport's busy flags, the
 * world's thread of async calls), and
 * set_ring_ends() and set_hot_slots() (core.py, at import) find where, so
 * that a look costs a load instead of a dict lookup by name (a fifth of a
 * small broadcast's time, when they were looked up). Indexed by name. */
static Py_ssize_t out_at[NNAMES], in_at[NNAMES], group_at[NNAMES], network_at[NNAMES], shm_at[NNAMES],
                  world_at[NNAMES];
static PyTypeObject *out_type, *in_type, *hot_group_type, *network_type, *shm_type, *world_type;
static const int out_names[] = {N_ERROR, N_QUEUE, N_PENDING, N_HEAD, N_TAIL, N_NEXT_ID, -1};
static const int in_names[] = {N_ERROR, N_CURRENT, N_NPOSTED, N_CLAIMS, N_SHARED, N_STASH_IN, N_UNEXPECTED, N_TAIL, -1};
static const int group_names[] = {N_SEQ, N_P2P_OPS, N_NETWORK, N_RANK, N_SIZE, N_TIMEOUT, N_LANES, N_OBJECT_SLOTS, -1};
static const int network_names[] = {N_CURRENT, N_ABORT, N_LOST, -1};
static const int shm_names[] = {N_CLOSED, N_STASH, -1};
static const int world_names[] = {N_BACKGROUND, N_NETWORK, -1};

static int slot_offsets(PyObject *type, const int *which, Py_ssize_t *at) {
    for (int j = 0; which[j] >= 0; j++) {
        PyObject *d = PyObject_GetAttr(type, names[which[j]]);  /* a class's slot: its member descriptor */
        if (!d) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
            PyErr_Clear();
        }
        int ok = d && Py_IS_TYPE(d, &PyMemberDescr_Type)
                 && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (ok) at[which[j]] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_XDECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%R.%U must be a slot (the core reads it by offset)", type,
                         names[which[j]]);
            return -1;
        }
    }
    return 0;
}

static PyObject *py_set_ring_ends(PyObject *self, PyObject *args) {
    PyObject *out, *in;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &out, &PyType_Type, &in)) return NULL;
    if (slot_offsets(out, out_names, out_at) < 0 || slot_offsets(in, in_names, in_at) < 0) return NULL;
    Py_XSETREF(out_type, (PyTypeObject *)Py_NewRef(out));
    Py_XSETREF(in_type, (PyTypeObject *)Py_NewRef(in));
    Py_RETURN_NONE;
}

/* set_hot_slots(ProcessGroup, Network, ShmTransport, World): see above. */
static PyObject *py_set_hot_slots(PyObject *self, PyObject *args) {
    PyObject *group, *network, *shm, *world;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyType_Type, &group, &PyType_Type, &network, &PyType_Type, &shm,
                          &PyType_Type, &world))
        return NULL;
    if (slot_offsets(group, group_names, group_at) < 0 || slot_offsets(network, network_names, network_at) < 0
        || slot_offsets(shm, shm_names, shm_at) < 0 || slot_offsets(world, world_names, world_at) < 0) return NULL;
    Py_XSETREF(hot_group_type, (PyTypeObject *)Py_NewRef(group));
    Py_XSETREF(network_type, (PyTypeObject *)Py_NewRef(network));
    Py_XSETREF(shm_type, (PyTypeObject *)Py_NewRef(shm));
    Py_XSETREF(world_type, (PyTypeObject *)Py_NewRef(world));
    Py_RETURN_NONE;
}

/* Attribute ``name`` of group ``g``, a new reference: at its slot's offset
 * for a ProcessGroup (one of group_names), else by name. */
static PyObject *group_attr(PyObject *g, int name) {
    if (hot_group_type && Py_IS_TYPE(g, hot_group_type) && group_at[name]) {
        PyObject *v = *(PyObject **)((char *)g + group_at[name]);
        if (v) return Py_NewRef(v);
    }
    return PyObject_GetAttr(g, names[name]);
}

/* Whether ``obj`` is exactly of ``type`` (whose slots set_hot_slots measured). */
static int hot_known(PyObject *obj, PyTypeObject *type, const char *what) {
    if (type && Py_IS_TYPE(obj, type)) return 1;
    PyErr_Format(PyExc_TypeError, "the core does not know this %s (set_hot_slots): %R", what, obj);
    return 0;
}

/* Whether these are ring ends of the types set_ring_ends() measured. */
static int ends_known(PyObject *out, PyObject *in) {
    if (out_type && Py_IS_TYPE(out, out_type) && in_type && Py_IS_TYPE(in, in_type)) return 1;
    PyErr_SetString(PyExc_TypeError, "a ring end the core does not know (set_ring_ends)");
    return 0;
}

/* Slot ``name`` of ``obj`` (``at``: its type's offsets), borrowed. */
static PyObject *slot_attr(PyObject *obj, const Py_ssize_t *at, int name) {
    PyObject *v = *(PyObject **)((char *)obj + at[name]);
    if (!v) PyErr_Format(PyExc_AttributeError, "%R has no attribute %R", obj, names[name]);
    return v;
}

static int slot_is(PyObject *obj, const Py_ssize_t *at, int name, PyObject *value) {
    PyObject *v = slot_attr(obj, at, name);
    return v ? v == value : -1;
}

static int slot_empty(PyObject *obj, const Py_ssize_t *at, int name) {
    PyObject *v = slot_attr(obj, at, name);
    if (!v) return -1;
    /* the books are mostly lists and dicts: their size at once */
    if (PyList_CheckExact(v)) return PyList_GET_SIZE(v) == 0;
    if (PyDict_CheckExact(v)) return PyDict_GET_SIZE(v) == 0;
    int full = PyObject_IsTrue(v);
    return full < 0 ? -1 : !full;
}

/* Set slot ``name`` of ``obj`` to ``v`` (stolen; NULL: -1). */
static int slot_set(PyObject *obj, const Py_ssize_t *at, int name, PyObject *v) {
    if (!v) return -1;
    Py_XSETREF(*(PyObject **)((char *)obj + at[name]), v);
    return 0;
}

/* Whether the Python end of every shm ring this program uses has nothing
 * in flight, so that the core may use the rings directly: -1 on error, 0
 * no, 1 yes. Only the directions it uses count: a program that only sends
 * to a peer may run while a receive from that peer waits in Python (an
 * MPI Irecv's envelope receive, posted before its Isend). */
static int rings_free(CoreProgram *self) {
    if (self->transport == Py_None) return 1;
    int ok = slot_is(self->transport, shm_at, N_CLOSED, Py_False);
    if (ok == 1) ok = slot_is(self->transport, shm_at, N_STASH, Py_False);
    for (int i = 0; ok == 1 && i < self->npeers; i++) {
        peer_t *p = &self->peers[i];
        if (!p->shm) continue;
        static const int out_empty[] = {N_QUEUE, N_PENDING, -1};
        static const int in_empty[] = {N_NPOSTED, N_CLAIMS, N_SHARED, N_STASH_IN, N_UNEXPECTED, -1};
        if (p->sends) {
            ok = slot_is(p->out_obj, out_at, N_ERROR, Py_None);
            for (int j = 0; ok == 1 && out_empty[j] >= 0; j++) ok = slot_empty(p->out_obj, out_at, out_empty[j]);
        }
        if (p->recvs && ok == 1) {
            ok = slot_is(p->in_obj, in_at, N_ERROR, Py_None);
            if (ok == 1) ok = slot_is(p->in_obj, in_at, N_CURRENT, Py_None);
            for (int j = 0; ok == 1 && in_empty[j] >= 0; j++) ok = slot_empty(p->in_obj, in_at, in_empty[j]);
        }
    }
    return ok;
}

/* Where a run starts, for update_books to tell what moved. */
static inline void note_books(peer_t *p) {
    p->head0 = *p->out.head;
    p->tail0 = *p->in.tail;
    p->next_id0 = p->next_id;
}

/* Tell the Python books where the rings are now (head and tail they cache). */
static inline __attribute__((always_inline)) int update_books(CoreProgram *self) {
    for (int i = 0; i < self->npeers; i++) {
        peer_t *p = &self->peers[i];
        if (!p->shm) continue;
        int64_t head = *p->out.head, tail = *p->in.tail;
        if (head != p->head0
            && (slot_set(p->out_obj, out_at, N_HEAD, PyLong_FromLongLong(head)) < 0
                || slot_set(p->out_obj, out_at, N_TAIL,
                           PyLong_FromLongLong(__atomic_load_n(p->out.tail, __ATOMIC_ACQUIRE))) < 0)) return -1;
        if (tail != p->tail0 && slot_set(p->in_obj, in_at, N_TAIL, PyLong_FromLongLong(tail)) < 0) return -1;
        if (p->next_id != p->next_id0 && slot_set(p->out_obj, out_at, N_NEXT_ID, PyLong_FromLongLong(p->next_id)) < 0)
            return -1;
    }
    return 0;
}

/* Add to ``inflight`` (a list, or NULL after an error; its reference is
 * taken and returned, NULL on error) the request that the transport's
 * ``method`` (shm.py's adopt_...) returns for ``format``'s arguments,
 * which are built in any case (so that "N" takes its reference). */
static PyObject *adopt(PyObject *transport, PyObject *inflight, const char *method, const char *format, ...) {
    va_list va;
    va_start(va, format);
    PyObject *args = Py_VaBuildValue(format, va);
    va_end(va);
    PyObject *fn = args && inflight ? PyObject_GetAttrString(transport, method) : NULL;
    PyObject *req = fn ? PyObject_Call(fn, args, NULL) : NULL;
    Py_XDECREF(fn);
    Py_XDECREF(args);
    if (inflight && (!req || PyList_Append(inflight, req) < 0)) Py_CLEAR(inflight);
    Py_XDECREF(req);
    return inflight;
}

/* The messages of ``step`` still under way when the core hands back, put
 * in the transport's books where they stand, their requests in a list
 * that Python's executor waits on with the rest of the step (or the empty
 * tuple; NULL on error): single-copy sends waiting for their
 * acknowledgement (adopt_rendezvous), the receive whose writer was still
 * combining its chunks (read_shared; adopt_sharing), and messages of
 * several slots half written or half taken (adopt_partial_send,
 * adopt_partial_recv: their bits set in *mask, so that Python does not
 * post them again). */
static PyObject *adopt_under_way(CoreProgram *self, Py_buffer *bufs, int step, int64_t tag, uint64_t meta,
                                 uint64_t *mask) {
#define VIEW(m, flags) PyMemoryView_FromMemory(msg_bytes(m, bufs), (m)->nbytes, flags)
    step_t *s = &self->steps[step];
    int any = self->sharing >= 0;
    for (int j = 0; !any && j < s->nsend; j++) any = self->rids[j] || (self->sent[j] && self->sent[j] != s->send[j].nbytes);
    for (int j = 0; !any && j < s->nrecv; j++) any = self->got[j] && self->got[j] != s->recv[j].nbytes;
    if (!any) return Py_NewRef(no_requests);
    PyObject *inflight = PyList_New(0);
    long long t = (long long)tag;
    unsigned long long mt = (unsigned long long)meta;
    for (int j = 0; j < s->nsend; j++) {
        msg_t *m = &s->send[j];
        peer_t *p = &self->peers[m->peer];
        if (self->rids[j])
            inflight = adopt(self->transport, inflight, "adopt_rendezvous", "(OOLNLK)", p->out_obj, p->in_obj,
                             (long long)self->rids[j], VIEW(m, PyBUF_READ), t, mt);
        if (self->sent[j] && self->sent[j] != m->nbytes) {
            inflight = adopt(self->transport, inflight, "adopt_partial_send", "(OOLKNL)", p->out_obj, p->in_obj,
                             t, mt, VIEW(m, PyBUF_READ), (long long)self->sent[j]);
            *mask |= 1ull << j;
        }
        self->rids[j] = self->sent[j] = 0;
    }
    for (int j = 0; j < s->nrecv; j++) {
        msg_t *m = &s->recv[j];
        peer_t *p = &self->peers[m->peer];
        if (j == self->sharing)
            inflight = adopt(self->transport, inflight, "adopt_sharing", "(OLLNLK)", p->in_obj,
                             (long long)p->sharing[0], (long long)p->sharing[1], VIEW(m, PyBUF_WRITE), t, mt);
        if (self->got[j] && self->got[j] != m->nbytes) {
            inflight = adopt(self->transport, inflight, "adopt_partial_recv", "(OLKNLii)", p->in_obj, t, mt,
                             VIEW(m, PyBUF_WRITE), (long long)self->got[j], self->dtype, m->reduce ? self->op : -1);
            *mask |= 1ull << (s->nsend + j);
        }
        self->got[j] = 0;
    }
#undef VIEW
    self->sharing = -1;
    return inflight;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A step's local copies and reductions. */
static void run_locals(CoreProgram *self, step_t *s, Py_buffer *bufs, kernel_t kernel) {
    self->seeded = 0;
    for (int j = 0; j < s->nlocal; j++) {
        local_t *l = &s->local[j];
        if (l->seeds) continue;  /* with its group (find_seeds) */
        char *src = (char *)bufs[l->sbuf].buf + l->soff, *dst = (char *)bufs[l->dbuf].buf + l->doff;
        if (l->reduce) kernel(dst, src, l->nbytes / self->itemsize, self->op);
        else if (src != dst) memmove(dst, src, l->nbytes);
    }
}

static int put_whole(peer_t *p, int64_t tag, const char *data, int64_t n);
static int take_whole(peer_t *p, int64_t tag, char *dst, int64_t n, kernel_t kernel, int op, int itemsize);

/* Post the step's shm sends not posted yet (``unsent`` of them: bit j of
 * *mask clear), in order: each into its peer's ring (a message of several
 * slots as far as there is room, self->sent[j] counting), or as a
 * single-copy offer (counted in *unacked until the reader acknowledges
 * it). A send whose peer's ring is full stays unsent, and so does every later one to that
 * peer, which must not overtake it; run_steps tries them again while it
 * waits, as a receive waits for its message. (Handed back to Python in
 * order the same way, where the core gives up.) A batch's message of several
 * slots goes whole or not at all (put_whole). Returns how many are left. */
static int post_sends(CoreProgram *self, step_t *s, Py_buffer *bufs, int64_t tag, uint64_t meta, uint64_t *mask,
                      int *unacked, int unsent) {
    int64_t pass = ++self->passes;
    for (int j = 0; unsent && j < s->nsend; j++) {
        msg_t *m = &s->send[j];
        peer_t *p = &self->peers[m->peer];
        if ((*mask >> j) & 1 || !p->shm || p->full == pass) continue;
        const char *data = m->buf < 0 ? "" : msg_bytes(m, bufs);
        int posted;
        if (m->npieces) {  /* (one slot: see program_new) */
            char *slot = next_slot(p);
            if ((posted = slot != NULL)) {
                gather_pieces(m, bufs, slot);
                publish_slot(p, (header_t){tag, meta, m->nbytes, 0, m->nbytes});
            }
        } else if (goes_single_copy(p, m, data, p->rdv)) {
            /* Posted (its bit set, so Python never posts it again), done once acknowledged. */
            posted = (self->rids[j] = rendezvous(p, tag, meta, data, m->nbytes)) != 0;
            *unacked += posted;
        } else if (m->nbytes > p->out.slot_bytes && self->whole) {  /* a batch's: whole or not at all */
            posted = put_whole(p, tag, data, m->nbytes);
        } else if (m->nbytes > p->out.slot_bytes) {  /* several slots: as many fragments as there is room for */
            int64_t before = self->sent[j];
            write_fragments(p, tag, meta, data, m->nbytes, &self->sent[j]);
            self->wrote |= self->sent[j] != before;
            posted = self->sent[j] == m->nbytes;
        } else {
            posted = put(p, tag, meta, data, m->nbytes);
        }
        if (!posted) {
            p->full = pass;  /* its ring is full: later sends to it wait too */
            continue;
        }
        *mask |= 1ull << j;
        unsent--;
    }
    return unsent;
}

static int envelope_aside(peer_t *p, gil_t *gil);  /* (the MPI layer's, below) */

/* The writer's side of shm.py's shared copy (a plain single-copy read,
 * done by Python's executor): if the reader offers the second half of one
 * of our sends to that peer still in flight, and we take its token first,
 * write that half into the reader's buffer (shm.py's _help). 1 if it took
 * the offer. */
static int help_copy(CoreProgram *self, step_t *s, int j, Py_buffer *bufs) {
    peer_t *p = &self->peers[s->send[j].peer];
    int64_t *offer = p->out.acks + ACKS;  /* id, address, split, done word; the token on the next line */
    if (__atomic_load_n(&offer[0], __ATOMIC_ACQUIRE) != self->rids[j]) return 0;
    if (sem_trywait((sem_t *)(offer + LINE / 8))) return 0;
    int64_t rid = __atomic_load_n(&offer[0], __ATOMIC_ACQUIRE);  /* read after the take */
    int64_t address = offer[1], split = offer[2];
    int k = 0;
    while (k < s->nsend && !(self->rids[k] == rid && s->send[k].peer == s->send[j].peer)) k++;
    int64_t key[RDV_WORDS_REGISTERED - RDV_WORDS];
    load_offer_key(offer_key(&p->out), key);  /* (the reader's buffer, where registered) */
    int ok = k < s->nsend && split >= 0 && split <= s->send[k].nbytes
             && !move_registered(p->pid, key, msg_bytes(&s->send[k], bufs) + split, address + split,
                                 s->send[k].nbytes - split, 1);
    __atomic_store_n(&offer[3], ok ? rid : -rid, __ATOMIC_RELEASE);  /* -rid: the reader copies it itself */
    wake(p);
    return 1;
}

/* combine_for_reader() for our single-copy send m, whose id is ``rid``. */
static int help_combine(CoreProgram *self, const msg_t *m, Py_buffer *bufs, int64_t rid) {
    peer_t *p = &self->peers[m->peer];
    if (!combine_for_reader(p->pid, share_words(&p->out), rid, msg_bytes(m, bufs), m->nbytes)) return 0;
    wake(p);
    return 1;
}

/* This thread's own bound on a receive's spin (seconds; < 0: none): see
 * set_thread_spin(). */
static __thread double thread_spin = -1;

/* How long a receive spins on this thread before Python takes over: ``spin``
 * (a program's, or a batch's own), within this thread's bound. */
static double spin_here(double spin) {
    return thread_spin >= 0 && thread_spin < spin ? thread_spin : spin;
}

/* Whether the message at the head of p's ring is a single-copy one. */
static int head_is_rendezvous(peer_t *p) {
    ring_t *r = &p->in;
    int64_t tail = *r->tail;
    if (__atomic_load_n(r->head, __ATOMIC_ACQUIRE) == tail) return 0;
    header_t h;
    memcpy(&h, r->headers + tail % r->slots * LINE, sizeof h);
    return h.offset == RDV;
}

/* Whether single-copy send ``rid``'s acknowledgement word says it was
 * read: its id, or a later one of the same word (readers take a writer's
 * messages in order, so a later one's reader took ours before; only a
 * paused batch's send waits long enough to see that). */
static int acknowledged(int64_t got, int64_t rid) {
    return got == rid || (got > rid && (got - rid) % ACKS == 0);
}

/* Run steps from ``start`` until one needs Python. Returns the step it
 * stopped at (nsteps: all done), and sets *locals_done and *mask (bit j:
 * send j done, bit nsend + j: receive j done). With ``times``, step i's
 * start and end (seconds since the epoch, as time.time()) go to
 * times[2i] and times[2i + 1]: what a trace records. A ``spin`` of 0 or
 * more bounds the receives' spin in place of the program's. ``resume``:
 * step ``start`` goes on from where a paused batch left it (*mask says
 * what was done; self->rids the sends awaiting their acknowledgement).
 * self->timed_out says whether it stopped for its spin alone. */
static int run_steps_here(CoreProgram *self, Py_buffer *bufs, int start, int64_t tag, uint64_t meta,
                          int *locals_done, uint64_t *mask, double *times, gil_t *gil, double spin, int resume);

/* run_steps_here, and where Python takes a step over after its locals, the
 * seeds (find_seeds) that have not run yet: Python counts them as done. */
static int run_steps(CoreProgram *self, Py_buffer *bufs, int start, int64_t tag, uint64_t meta,
                     int *locals_done, uint64_t *mask, double *times, gil_t *gil, double spin, int resume) {
    int i = run_steps_here(self, bufs, start, tag, meta, locals_done, mask, times, gil, spin, resume);
    if (i < self->nsteps && *locals_done)
        for (int j = 0; j < self->steps[i].nlocal && j < 64; j++)
            if (self->steps[i].local[j].seeds) seed_group(self, &self->steps[i], bufs, j);
    return i;
}

static int run_steps_here(CoreProgram *self, Py_buffer *bufs, int start, int64_t tag, uint64_t meta,
                          int *locals_done, uint64_t *mask, double *times, gil_t *gil, double spin, int resume) {
    spin = spin_here(spin < 0 ? self->spin : spin);
    self->timed_out = 0;
    int crowded = self->crowded;
    kernel_t kernel = self->op >= 0 ? kernels[self->dtype] : NULL;
    /* Large combining reads are shared with their writers (read_shared)
     * where each rank has a core: where ranks share cores the writer's
     * core is not idle, it is the reader's. */
    double share = crowded ? -1 : spin;
    for (int i = start; i < self->nsteps; i++) {
        step_t *s = &self->steps[i];
        int going_on = resume && i == start;
        *locals_done = going_on;
        if (!going_on) *mask = 0;
        if (times && !going_on) times[2 * i] = wall_seconds();
        if (s->python) return i;
        if (!going_on) {
            memset(self->sent, 0, s->nsend * sizeof(int64_t));
            memset(self->got, 0, s->nrecv * sizeof(int64_t));
            if (!s->sends_first) run_locals(self, s, bufs, kernel);
        }
        int open = 0, handback = 0, unacked = 0, unsent = 0;
        for (int j = 0; j < s->nsend; j++) {
            if (!going_on) self->rids[j] = 0;
            unacked += self->rids[j] != 0;
            if (!self->peers[s->send[j].peer].shm) handback = 1;  /* another transport's */
            else if (!((*mask >> j) & 1)) unsent++;
        }
        unsent = post_sends(self, s, bufs, tag, meta, mask, &unacked, unsent);
        if (s->sends_first && !going_on) run_locals(self, s, bufs, kernel);
        *locals_done = 1;
        for (int j = 0; j < s->nrecv; j++) {
            if (!self->peers[s->recv[j].peer].shm) handback = 1;
            else if (!((*mask >> (s->nsend + j)) & 1)) open++;
        }
        double deadline = 0, started = 0;
        int spun = 0, group_waits = 0, extended = 0;
        while (open || unacked || unsent) {
            int moved = 0;
            group_waits = 0;
            if (unsent) {  /* a ring that was full: the reader may have made room */
                self->wrote = 0;
                int left = post_sends(self, s, bufs, tag, meta, mask, &unacked, unsent);
                moved = left < unsent || self->wrote;
                unsent = left;
            }
            int64_t pass = ++self->passes;
            for (int j = 0; unacked && j < s->nsend; j++) {
                int64_t rid = self->rids[j];
                if (!rid) continue;
                if ((share >= 0 && help_combine(self, &s->send[j], bufs, rid))
                    || help_copy(self, s, j, bufs)) moved = 1;
                int64_t got = __atomic_load_n(&self->peers[s->send[j].peer].out.acks[rid % ACKS], __ATOMIC_ACQUIRE);
                if (acknowledged(got, rid)) { self->rids[j] = 0; unacked--; moved = 1; }
                else if (got == -rid) return i;  /* the reader could not: Python says why */
            }
            for (int j = 0; j < s->nrecv; j++) {
                uint64_t bit = 1ull << (s->nsend + j);
                msg_t *m = &s->recv[j];
                peer_t *p = &self->peers[m->peer];
                if (!p->shm || (*mask & bit)) continue;
                if (m->after >= 0 && !((*mask >> (s->nsend + m->after)) & 1)) continue;  /* its group's order */
                if (m->next >= 0 && kernel && !self->whole) {
                    int took = take_group(self, s, j, bufs, tag, meta, pass, mask, s->nsend);
                    if (took < 0) return i;
                    if (took == GROUP_WAITS) { group_waits = 1; continue; }
                    if (took) { open -= took; moved = 1; continue; }
                }
                /* A peer's messages come in the order it sent them, the order of
                 * these receives: while an earlier one from it is open, a later
                 * one must not take the message meant for the earlier (two
                 * halves of one size would land swapped). */
                if (p->behind == pass) continue;
                seed_group(self, s, bufs, m->seed);
                int got;
                if (self->whole && m->nbytes > p->in.slot_bytes && !head_is_rendezvous(p))
                    got = take_whole(p, tag, msg_bytes(m, bufs), m->nbytes, m->reduce ? kernel : NULL, self->op,
                                     self->itemsize) ? TAKEN : EMPTY;  /* (meta 0: a batch's) */
                else
                    got = take(p, tag, meta, m, bufs, m->reduce ? kernel : NULL, self->op, self->itemsize, self->dtype,
                               share, &self->got[j]);
                if (got == TAKEN) { *mask |= bit; open--; moved = 1; }
                else if (got == PARTIAL) { moved = 1; p->behind = pass; }  /* later ones from it wait */
                else if (got == SHARING) {  /* Python waits for the writer's part (adopt_under_way) */
                    *mask |= bit;
                    self->sharing = j;
                    return i;
                }
                else if (got == FOREIGN) {  /* an MPI envelope goes to its matcher; anything else is Python's */
                    if (envelope_aside(p, gil) <= 0) return i;
                    moved = 1;
                }
                else p->behind = pass;
            }
            if ((!open && !unacked && !unsent) || handback) break;  /* a handback: Python waits on everything left */
            if (moved) { spun = 0; continue; }
            double t = now_seconds();
            if (spun && group_waits && !extended && spin < GROUP_SPIN) { deadline += GROUP_SPIN - spin; extended = 1; }
            if (!spun) { started = t; deadline = t + spin; spun = 1; extended = 0; }
            else if (t >= deadline) {  /* Python sleeps on the doorbell and watches for faults */
                self->timed_out = 1;
                return i;
            }
            else if (!gil->saved && t - started > GIL_HOLD) gil->saved = PyEval_SaveThread();
            if (crowded) sched_yield();
            else __builtin_ia32_pause();
        }
        if (handback || open || unacked || unsent) return i;
        if (times) times[2 * i + 1] = wall_seconds();
    }
    return self->nsteps;
}

/* What one run of the core ended with: see run(). */
typedef struct { int step, locals_done; uint64_t mask; PyObject *inflight; } outcome_t;

/* Run the program on ``objs`` (its nbufs buffers, in compile()'s order) from
 * step ``start``: fills *out (a new reference in out->inflight) and returns
 * 0, or -1 with an exception set. ``times_obj``: None, or a writable
 * float64 buffer of 2 x nsteps (see run()). */
/* How batch() runs a batch's program: its receives' spin, and whether it
 * goes on from a pause. */
typedef struct { double spin; int resume; } batch_run_t;

/* run_core() once the buffers are in hand (the rings already found free).
 * A ``batch``'s run (else NULL) hands nothing over to Python: batch() does. */
static int run_buffers(CoreProgram *self, Py_buffer *bufs, int start, int64_t tag, uint64_t meta, double *times,
                       outcome_t *out, const batch_run_t *batch) {
    for (int i = 0; i < self->npeers; i++) {
        peer_t *p = &self->peers[i];
        if (!p->shm) continue;
        if (p->rdv) {
            PyObject *v = slot_attr(p->out_obj, out_at, N_NEXT_ID);
            p->next_id = v ? PyLong_AsLongLong(v) : -1;
            if (PyErr_Occurred()) return -1;
        }
        note_books(p);
    }
    int resume = batch && batch->resume;
    if (!resume) memset(self->rids, 0, (self->maxsend + 1) * sizeof(int64_t));
    self->sharing = -1;
    int locals_done = 0, step;
    uint64_t mask = resume ? self->paused_mask : 0;
    /* The caller holds the network's lock: no Python end moves meanwhile.
     * A thread running asynchronous calls (its own spin bound set) always
     * lets the GIL go: its process computes beside it. */
    gil_t gil = {NULL, self->small && thread_spin < 0, 0};
    if (!gil.hold) gil.saved = PyEval_SaveThread();
    step = run_steps(self, bufs, start, tag, meta, &locals_done, &mask, times, &gil, batch ? batch->spin : -1, resume);
    if (gil.saved) PyEval_RestoreThread(gil.saved);
    PyObject *exc_type = NULL, *exc = NULL, *tb = NULL;
    if (gil.failed) PyErr_Fetch(&exc_type, &exc, &tb);  /* raised once the books are right */
    if (update_books(self) < 0) {
        Py_XDECREF(exc_type); Py_XDECREF(exc); Py_XDECREF(tb);
        return -1;
    }
    PyObject *inflight = step < self->nsteps && !batch ? adopt_under_way(self, bufs, step, tag, meta, &mask)
                                                       : Py_NewRef(no_requests);
    if (gil.failed) {
        Py_XDECREF(inflight);
        PyErr_Restore(exc_type, exc, tb);
        return -1;
    }
    if (!inflight) return -1;
    *out = (outcome_t){step, locals_done, mask, inflight};
    return 0;
}

static int run_core(CoreProgram *self, PyObject *const *objs, int start, int64_t tag, uint64_t meta,
                    PyObject *times_obj, outcome_t *out, const batch_run_t *batch) {
    if (start < 0 || start > self->nsteps) {
        PyErr_SetString(PyExc_ValueError, "run(): no such step");
        return -1;
    }
    int free_ = rings_free(self);
    if (free_ < 0) return -1;
    if (!free_) {
        *out = (outcome_t){start, 0, batch && batch->resume ? self->paused_mask : 0, Py_NewRef(no_requests)};
        return 0;
    }
    Py_buffer bufs[self->nbufs + 1], times = {0};
    int got = 0, rc = -1;
    if (times_obj != Py_None) {
        if (PyObject_GetBuffer(times_obj, &times, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
        if (times.len < (Py_ssize_t)(2 * self->nsteps * sizeof(double))) {
            PyErr_Format(PyExc_ValueError, "run(): times needs %d float64s", 2 * self->nsteps);
            goto done;
        }
    }
    for (; got < self->nbufs; got++) {
        if (PyObject_GetBuffer(objs[got], &bufs[got], self->writes[got] ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS
                                                                     : PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (bufs[got].len < self->need[got]) {
            PyErr_Format(PyExc_ValueError, "buffer %d has %zd bytes; the program needs %lld", got,
                         bufs[got].len, (long long)self->need[got]);
            got++;
            goto done;
        }
    }
    rc = run_buffers(self, bufs, start, tag, meta, times.buf, out, batch);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    if (times.obj) PyBuffer_Release(&times);
    return rc;
}

static PyObject *outcome_tuple(outcome_t *o) {
    PyObject *t = o->inflight ? Py_BuildValue("iiKO", o->step, o->locals_done, (unsigned long long)o->mask, o->inflight) : NULL;
    Py_XDECREF(o->inflight);
    return t;
}

/* run(buffers, start, tag, meta[, times]) -> (step, locals_done, mask, inflight):
 * the step it stopped at (len(steps): the call is done); bit j of mask: send
 * j posted, bit nsend + j: receive j done; inflight: the requests of that
 * step's messages still under way (see adopt_under_way). ``times``: a
 * writable float64 buffer of 2 x len(steps) for each step's start and end. */
static PyObject *program_run(CoreProgram *self, PyObject *args) {
    PyObject *buffers;
    int start;
    long long tag;
    unsigned long long meta;
    PyObject *times_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OiLK|O", &buffers, &start, &tag, &meta, &times_obj)) return NULL;
    if (!PyTuple_Check(buffers) || PyTuple_GET_SIZE(buffers) != self->nbufs) {
        PyErr_Format(PyExc_ValueError, "run() needs a tuple of %d buffers", self->nbufs);
        return NULL;
    }
    outcome_t o;
    if (run_core(self, ((PyTupleObject *)buffers)->ob_item, start, tag, meta, times_obj, &o, NULL) < 0) return NULL;
    return outcome_tuple(&o);
}

/* ---- batches (collie.p2p.batch_isend_irecv): one step of sends and
 * receives, started by the call and finished when one of its Works is
 * waited on, without the transport's Python in between.
 *
 * batch(buffers, tag, resume, spin, final) -> (done, mask, rids) runs the
 * one step of a program made ``whole`` (core.batch_program), with meta 0:
 * from the start (sends posted, receives taken where their messages are
 * there), or with ``resume`` from where the last call paused; receives spin
 * at most ``spin`` seconds. done: everything moved, sends acknowledged.
 * Else, where only the spin ran out and not ``final``, it pauses: the
 * program keeps what is under way for the next call, rids is None, and
 * mask says what is done (bit j: send j posted; bit nsend + j: receive j
 * taken). Nothing it leaves is half moved (hence ``whole``), so any other
 * use of the rings may come between. Else it hands back: rids is a tuple
 * of (j, id), the single-copy sends posted and not acknowledged, which
 * Python enters in its books (shm.adopt_rendezvous), and Python posts
 * what mask says is not done. */
static PyObject *batch_step(CoreProgram *self, PyObject *const *objs, int64_t tag, int resume, double spin, int final) {
    batch_run_t how = {spin, resume};
    outcome_t o;
    self->timed_out = 0;  /* (stays so where the rings are not free and nothing runs) */
    if (run_core(self, objs, 0, tag, 0, Py_None, &o, &how) < 0) return NULL;
    Py_DECREF(o.inflight);
    unsigned long long mask = o.mask;
    if (o.step == self->nsteps) return Py_BuildValue("OKO", Py_True, mask, Py_None);
    if (self->timed_out && !final) {
        self->paused_mask = o.mask;
        return Py_BuildValue("OKO", Py_False, mask, Py_None);
    }
    step_t *s = &self->steps[0];
    PyObject *rids = PyList_New(0);
    for (int j = 0; rids && j < s->nsend; j++) {
        PyObject *pair = self->rids[j] ? Py_BuildValue("(iL)", j, (long long)self->rids[j]) : NULL;
        if (self->rids[j] && (!pair || PyList_Append(rids, pair) < 0)) Py_CLEAR(rids);
        Py_XDECREF(pair);
        self->rids[j] = 0;
    }
    PyObject *result = rids ? Py_BuildValue("OKN", Py_False, mask, PyList_AsTuple(rids)) : NULL;
    Py_XDECREF(rids);
    return result;
}

static PyObject *program_batch(CoreProgram *self, PyObject *args) {
    PyObject *buffers;
    long long tag;
    int resume, final;
    double spin;
    if (!PyArg_ParseTuple(args, "OLpdp", &buffers, &tag, &resume, &spin, &final)) return NULL;
    if (!self->whole || self->nsteps != 1) {
        PyErr_SetString(PyExc_ValueError, "batch(): not a batch's program (core.batch_program)");
        return NULL;
    }
    if (!PyTuple_Check(buffers) || PyTuple_GET_SIZE(buffers) != self->nbufs) {
        PyErr_Format(PyExc_ValueError, "batch() needs a tuple of %d buffers", self->nbufs);
        return NULL;
    }
    return batch_step(self, ((PyTupleObject *)buffers)->ob_item, tag, resume, spin, final);
}

/* For the peers of ``g`` (all on shared
 * memory): whether the sweep for stale data at the end of collective ``tag``
 * would find nothing: no Python end busy or holding messages, and each ring
 * empty or holding at its head a later call of the same group (the common
 * end of a repeated rooted call, whose root is already sending the next) or
 * a point-to-point message (an MPI envelope sent before the call), which
 * the sweep leaves where it is (network._unexpected).
 * -1 on error, 0 when a closer look is needed, 1 when nothing is stale. */
static int nothing_stale(CoreProgram *g, int64_t tag, int64_t max_tag) {
    int64_t call = tag & ~max_tag, seq = tag & max_tag;
    for (int i = 0; i < g->npeers; i++) {
        peer_t *p = &g->peers[i];
        if (!p->shm) return 0;
        int ok = slot_is(p->in_obj, in_at, N_ERROR, Py_None);
        if (ok == 1) ok = slot_is(p->in_obj, in_at, N_CURRENT, Py_None);
        if (ok == 1) ok = slot_empty(p->in_obj, in_at, N_UNEXPECTED);
        if (ok != 1) return ok;
        ring_t *r = &p->in;
        int64_t tail = __atomic_load_n(r->tail, __ATOMIC_RELAXED);
        if (__atomic_load_n(r->head, __ATOMIC_ACQUIRE) != tail) {
            int64_t head_tag;
            memcpy(&head_tag, r->headers + tail % r->slots * LINE, sizeof head_tag);
            int p2p = !(head_tag & (max_tag + 1));  /* (no collective bit: a receive may come any time) */
            if (!p2p && ((head_tag & ~max_tag) != call || (head_tag & max_tag) <= seq)) return 0;
        }
    }
    return 1;
}

/* ---- one-message programs (core.p2p_program): point to point, and the
 * MPI layer's envelopes, without run()'s tuples */

/* A point-to-point message of several slots (at most as many as the ring
 * has): written whole into ``p``'s ring if there is room for all of it
 * (1), else nothing (0). */
static int put_whole(peer_t *p, int64_t tag, const char *data, int64_t n) {
    ring_t *r = &p->out;
    int64_t size = r->slot_bytes, at = 0;
    if (*r->head + (n + size - 1) / size - __atomic_load_n(r->tail, __ATOMIC_ACQUIRE) > r->slots) return 0;
    write_fragments(p, tag, 0, data, n, &at);  /* all of it: the room was there */
    return 1;
}

/* Its receive: taken whole (copied or combined into dst) if every one of
 * its fragments is in the ring (1), else nothing (0: not all there yet,
 * or something else at the head, which the full path sorts out). */
static int take_whole(peer_t *p, int64_t tag, char *dst, int64_t n, kernel_t kernel, int op, int itemsize) {
    ring_t *r = &p->in;
    int64_t size = r->slot_bytes, frags = (n + size - 1) / size, tail = *r->tail;  /* only we store tail */
    if (__atomic_load_n(r->head, __ATOMIC_ACQUIRE) - tail < frags) return 0;
    for (int64_t f = 0; f < frags; f++) {
        header_t h;
        memcpy(&h, r->headers + (tail + f) % r->slots * LINE, sizeof h);
        int64_t at = f * size, len = n - at < size ? n - at : size;
        if (h.tag != tag || h.meta != 0 || h.nbytes != n || h.offset != at || h.frag != len) return 0;
    }
    for (int64_t at = 0, k = tail; at < n; at += size, k++) {
        int64_t len = n - at < size ? n - at : size;
        const char *src = r->payload + k % r->slots * size;
        if (kernel) kernel(dst + at, src, len / itemsize, op);
        else memcpy(dst + at, src, len);
    }
    free_slots(p, tail, frags);
    return 1;
}

/* move_bytes() of a message of several slots: whole or not at all, so that
 * nothing is ever left half moved for the caller's full path; a receive
 * waits (the GIL let go) for as long as its program spins. */
static int move_whole(CoreProgram *self, peer_t *p, const msg_t *m, char *data, int64_t tag) {
    kernel_t kernel = m->reduce && self->op >= 0 ? kernels[self->dtype] : NULL;
    double spin = spin_here(self->spin), deadline = 0;
    PyThreadState *saved = NULL;
    int done;
    note_books(p);
    while (!(done = self->steps[0].nsend ? put_whole(p, tag, data, m->nbytes)
                                          : take_whole(p, tag, data, m->nbytes, kernel, self->op, self->itemsize))
           && spin > 0) {
        double t = now_seconds();
        if (!deadline) deadline = t + spin;
        else if (t >= deadline) break;
        if (!saved) saved = PyEval_SaveThread();
        __builtin_ia32_pause();
    }
    if (saved) PyEval_RestoreThread(saved);
    return done && update_books(self) < 0 ? -1 : done;
}

/* Move the program's one message (a send from, or a receive into, the
 * need[0] bytes at ``data``) with ``tag``: 1 moved, 0 not (a Python end
 * busy, a peer late: the caller's full path goes on), -1 on error. */
static int move_bytes(CoreProgram *self, char *data, int64_t tag) {
    int free_ = rings_free(self);
    if (free_ <= 0) return free_;
    Py_buffer b = {0};
    b.buf = data;
    b.len = self->need[0];
    step_t *s = &self->steps[0];
    msg_t *m = s->nsend ? &s->send[0] : &s->recv[0];
    peer_t *p = &self->peers[m->peer];
    if (p->shm && m->nbytes > (s->nsend ? p->out.slot_bytes : p->in.slot_bytes))
        return move_whole(self, p, m, data, tag);
    if (p->shm) {
        /* A send straight into the ring where it has room, a receive
         * straight from it where its message is at the head: run()'s way,
         * below, cost a small message a third more (it also waits: for
         * room, for the message, and hands anything else at the head on) */
        note_books(p);
        int done = s->nsend ? put(p, tag, 0, msg_bytes(m, &b), m->nbytes)
                            : take(p, tag, 0, m, &b, m->reduce && self->op >= 0 ? kernels[self->dtype] : NULL, self->op,
                                   self->itemsize, self->dtype, -1, NULL) == TAKEN;
        if (done) return update_books(self) < 0 ? -1 : 1;
    }
    outcome_t o;
    if (run_buffers(self, &b, 0, tag, 0, NULL, &o, NULL) < 0) return -1;
    Py_DECREF(o.inflight);  /* (): one slot, never single copy (p2p_program) */
    return o.step == self->nsteps;
}

static int one_message(CoreProgram *self) {
    step_t *s = self->nsteps == 1 && self->nbufs == 1 ? &self->steps[0] : NULL;
    if (s && !s->python && !s->nlocal && s->nsend + s->nrecv == 1 && !self->peers[0].rdv) return 1;
    PyErr_SetString(PyExc_ValueError, "not a program of one message (core.p2p_program)");
    return 0;
}

/* move(buf, tag) -> whether the message went (see move_bytes). */
static PyObject *program_move(CoreProgram *self, PyObject *const *args, Py_ssize_t nargs) {
    long long tag;
    if (nargs != 2 || ((tag = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "move(buf, tag)");
        return NULL;
    }
    if (!one_message(self)) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, self->writes[0] ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS
                                                        : PyBUF_C_CONTIGUOUS) < 0) return NULL;
    int moved = -1;
    if (b.len < self->need[0])
        PyErr_Format(PyExc_ValueError, "move(): the buffer has %zd bytes, the message %lld", b.len,
                     (long long)self->need[0]);
    else
        moved = move_bytes(self, b.buf, tag);
    PyBuffer_Release(&b);
    return moved < 0 ? NULL : PyBool_FromLong(moved);
}

/* The MPI layer's envelope (compat/mpi/p2p.py): three int64 words (the MPI
 * tag, the payload's size, a sync id), then a payload of up to need[0] - 24
 * bytes in place. */
#define ENVELOPE_HEAD 24

static char *envelope_of(CoreProgram *self) {
    if (!self->envelope && !(self->envelope = PyMem_Calloc(1, self->need[0] > ENVELOPE_HEAD ? self->need[0] : ENVELOPE_HEAD)))
        PyErr_NoMemory();
    return self->envelope;
}

/* The envelope of a standard send of the ``len`` bytes at ``data`` with MPI
 * tag ``tag``, the payload in place: 1 it went, 0 not (a payload too large
 * for it, a ring busy or full: the full path sends it), -1 on error. */
static int envelope_send(CoreProgram *self, int64_t etag, int64_t tag, const void *data, Py_ssize_t len) {
    char *env = one_message(self) ? envelope_of(self) : NULL;
    if (!env) return -1;
    if (len > self->need[0] - ENVELOPE_HEAD) return 0;
    int64_t head[3] = {tag, len, 0};
    memcpy(env, head, sizeof head);
    memcpy(env + ENVELOPE_HEAD, data, len);
    return move_bytes(self, env, etag);
}

/* Take the program's peer's next envelope. ENVELOPE_WANTED: a standard
 * send's envelope whose MPI tag is ``want`` (any tag >= 0 where ``want`` is
 * -1; none where ``every`` is set) with its payload in place and fitting
 * ``dst``: *tag and *size set, the payload copied into ``dst``'s bytes, or
 * made the bytes *payload where ``dst`` is NULL (an object's receive). ENVELOPE_OTHER: any other envelope,
 * copied whole into ``spill`` for the matcher. ENVELOPE_NONE: none came. */
enum { ENVELOPE_ERROR = -1, ENVELOPE_NONE, ENVELOPE_WANTED, ENVELOPE_OTHER };

/* Whether a receive for tag ``want`` (-1: MPI.ANY_TAG, which takes any
 * tag >= 0) takes a message with tag ``tag`` (_Recv.matches' tag half). */
static int tag_matches(long long want, long long tag) {
    return tag == want || (want == -1 && tag >= 0);
}

static int envelope_recv(CoreProgram *self, int64_t etag, int every, long long want, Py_buffer *dst, PyObject *spill,
                         int64_t *tag, int64_t *size, PyObject **payload) {
    char *env = one_message(self) ? envelope_of(self) : NULL;
    if (!env) return ENVELOPE_ERROR;
    int moved = move_bytes(self, env, etag);
    if (moved <= 0) return moved < 0 ? ENVELOPE_ERROR : ENVELOPE_NONE;
    int64_t head[3];
    memcpy(head, env, sizeof head);
    *payload = NULL;
    int wanted = !every && tag_matches(want, head[0]);
    if (wanted && !head[2] && head[1] >= 0 && head[1] <= self->need[0] - ENVELOPE_HEAD) {
        *tag = head[0];
        *size = head[1];
        if (!dst)
            return (*payload = PyBytes_FromStringAndSize(env + ENVELOPE_HEAD, head[1])) ? ENVELOPE_WANTED
                                                                                       : ENVELOPE_ERROR;
        if (head[1] <= dst->len) {
            memcpy(dst->buf, env + ENVELOPE_HEAD, head[1]);
            return ENVELOPE_WANTED;
        }
    }
    Py_buffer sp;
    if (PyObject_GetBuffer(spill, &sp, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return ENVELOPE_ERROR;
    int fits = sp.len >= self->need[0];
    if (fits) memcpy(sp.buf, env, self->need[0]);
    PyBuffer_Release(&sp);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "an envelope's spill buffer is smaller than an envelope");
        return ENVELOPE_ERROR;
    }
    return ENVELOPE_OTHER;
}

/* nothing_stale(tag, max_tag): see nothing_stale() (a program of no steps, core.glance). */
static PyObject *program_nothing_stale(CoreProgram *self, PyObject *args) {
    long long tag, max_tag;
    if (!PyArg_ParseTuple(args, "LL", &tag, &max_tag)) return NULL;
    int clean = nothing_stale(self, tag, max_tag);
    return clean < 0 ? NULL : PyBool_FromLong(clean);
}

/* python_steps() -> the steps Python's executor runs whole (what the core cannot). */
static PyObject *program_python_steps(CoreProgram *self, PyObject *unused) {
    PyObject *steps = PyList_New(0);
    for (int i = 0; steps && i < self->nsteps; i++) {
        PyObject *k = self->steps[i].python ? PyLong_FromLong(i) : NULL;
        if (self->steps[i].python && (!k || PyList_Append(steps, k) < 0)) Py_CLEAR(steps);
        Py_XDECREF(k);
    }
    return steps;
}

static PyMethodDef program_methods[] = {
    {"run", (PyCFunction)program_run, METH_VARARGS, "Run steps until one needs Python."},
    {"batch", (PyCFunction)program_batch, METH_VARARGS,
     "batch(buffers, tag, resume, spin, final) -> (done, mask, rids): run or go on with a batch's step."},
    {"python_steps", (PyCFunction)program_python_steps, METH_NOARGS,
     "python_steps() -> the steps Python's executor runs whole (what the core cannot)."},
    {"move", (PyCFunction)(void (*)(void))program_move, METH_FASTCALL,
     "move(buf, tag) -> whether a one-message program's message went."},
    {"nothing_stale", (PyCFunction)program_nothing_stale, METH_VARARGS,
     "nothing_stale(tag, max_tag): whether the peers' rings hold nothing stale once call tag is over."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collie._core.Program",
    .tp_basicsize = sizeof(CoreProgram),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)program_traverse,
    .tp_doc = "A bound engine.Program, compiled for the core (see collie/core.py).",
    .tp_new = program_new,
    .tp_dealloc = (destructor)program_dealloc,
    .tp_methods = program_methods,
};

/* ------------------------------------------------------------------ the network's lock */

/* RLock(): threading.RLock's re-entrant lock, for the Network's lock
 * (network.py uses it where the core is built). Every call the core runs
 * takes the network's lock; threading.RLock's acquire and release, called
 * as methods (acquire parses its arguments each time), cost about 0.1 us of
 * an 8-byte call's 0.6, where this one is taken in a few instructions
 * (lock_take). It is a pthread mutex rather than Python's lock: that one
 * reads the clock on every acquire, even one that does not wait (a twentieth
 * of a small broadcast's time). The owner and count change only under the
 * GIL, as in CPython's own RLock. */
typedef struct {
    PyObject_HEAD
    pthread_mutex_t mutex;
    unsigned long owner;    /* the holding thread's ident (while count > 0) */
    unsigned long count;
} RLock;

static PyTypeObject RLockType;

/* Take ``l``, waiting (without the GIL) until ``timeout`` seconds passed
 * (< 0: for ever; 0: not at all): 1 taken, 0 not, -1 on a signal's error. */
static int rlock_take(RLock *l, double timeout) {
    unsigned long me = PyThread_get_thread_ident();
    if (l->count && l->owner == me) {
        l->count++;
        return 1;
    }
    if (pthread_mutex_trylock(&l->mutex)) {
        if (timeout == 0) return 0;
        double deadline = now_seconds() + timeout;
        for (;;) {  /* slices of at most 50 ms, so that a signal (Ctrl-C) is seen */
            int rc;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);  /* what pthread_mutex_timedlock counts in */
            until.tv_nsec += 50000000;
            if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
            Py_BEGIN_ALLOW_THREADS
            rc = pthread_mutex_timedlock(&l->mutex, &until);
            Py_END_ALLOW_THREADS
            if (rc == 0) break;
            if (PyErr_CheckSignals() < 0) return -1;
            if (timeout > 0 && now_seconds() >= deadline) return 0;
        }
    }
    l->owner = me;
    l->count = 1;
    return 1;
}

static int rlock_give(RLock *l) {
    if (!l->count || l->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    if (--l->count == 0) pthread_mutex_unlock(&l->mutex);
    return 0;
}

/* The network's lock, whichever it is: ours directly, another through its methods. */
static int lock_take(PyObject *lock) {
    if (Py_IS_TYPE(lock, &RLockType)) return rlock_take((RLock *)lock, -1) < 0 ? -1 : 0;
    PyObject *held = PyObject_CallMethodNoArgs(lock, names[N_ACQUIRE]);
    Py_XDECREF(held);
    return held ? 0 : -1;
}

/* Give the lock back, keeping an error already set (the lock goes back whatever happened). */
static int lock_give(PyObject *lock) {
    if (Py_IS_TYPE(lock, &RLockType) && !PyErr_Occurred()) return rlock_give((RLock *)lock);  /* (the common case) */
    PyObject *exc_type, *exc, *tb;
    PyErr_Fetch(&exc_type, &exc, &tb);
    int rc;
    if (Py_IS_TYPE(lock, &RLockType)) {
        rc = rlock_give((RLock *)lock);
    } else {
        PyObject *released = PyObject_CallMethodNoArgs(lock, names[N_RELEASE]);
        Py_XDECREF(released);
        rc = released ? 0 : -1;
    }
    if (rc < 0) {
        Py_XDECREF(exc_type); Py_XDECREF(exc); Py_XDECREF(tb);
        return -1;
    }
    PyErr_Restore(exc_type, exc, tb);
    return 0;
}

static PyObject *rlock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "RLock() takes no arguments");
        return NULL;
    }
    RLock *self = (RLock *)type->tp_alloc(type, 0);
    if (self) pthread_mutex_init(&self->mutex, NULL);
    return (PyObject *)self;
}

static void rlock_dealloc(RLock *self) {
    if (!self->count) pthread_mutex_destroy(&self->mutex);  /* a held one goes with its memory */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* acquire(blocking=True, timeout=-1) -> bool, as threading.RLock's. */
static PyObject *rlock_acquire(RLock *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd:acquire", kwlist, &blocking, &timeout)) return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    int got = rlock_take(self, blocking ? timeout : 0);
    return got < 0 ? NULL : PyBool_FromLong(got);
}

static PyObject *rlock_enter(RLock *self, PyObject *unused) {
    return rlock_take(self, -1) < 0 ? NULL : Py_NewRef(Py_True);
}

static PyObject *rlock_release(RLock *self, PyObject *unused) {
    return rlock_give(self) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *rlock_exit(RLock *self, PyObject *args) {
    return rlock_release(self, NULL);
}

static PyObject *rlock_is_owned(RLock *self, PyObject *unused) {
    return PyBool_FromLong(self->count && self->owner == PyThread_get_thread_ident());
}

static PyMethodDef rlock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))rlock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> whether it was taken."},
    {"release", (PyCFunction)rlock_release, METH_NOARGS, "Give it back (once per acquire)."},
    {"__enter__", (PyCFunction)rlock_enter, METH_NOARGS, "acquire()"},
    {"__exit__", (PyCFunction)rlock_exit, METH_VARARGS, "release()"},
    {"_is_owned", (PyCFunction)rlock_is_owned, METH_NOARGS, "Whether this thread holds it."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collie._core.RLock",
    .tp_basicsize = sizeof(RLock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A re-entrant lock, as threading.RLock, that the core takes without a Python call (the Network's).",
    .tp_new = rlock_new,
    .tp_dealloc = (destructor)rlock_dealloc,
    .tp_methods = rlock_methods,
};

/* ------------------------------------------------------------------ lanes */

/* A lane: a repeated blocking collective of one shape on one group, run
 * from its first step to its last without Python (collectives._lane says
 * when a call may take one). Per call it does what the Python end of a call
 * would: the group's sequence number, the call's tag as the network's
 * current one, the core's run under the network's lock, and the books of a
 * finished call. Anything else (a trace on, an abort or a lost peer, a step
 * the core hands back) goes to ``slow(seq, resume, *arrays)``, Python's
 * full path, with ``resume`` None (from the start, as a first call) or the
 * run's (step, locals_done, mask, inflight). */
typedef struct {
    PyObject_HEAD
    CoreProgram *core;
    PyObject *group, *network, *lock, *done, *context, *meta_obj, *module_dict;
    PyObject *extra;        /* the buffers after the call's arrays: a tuple, or a function giving them */
    PyObject *slow, *end;   /* end(seq, tag): a rooted call's books (None: the plain ones, here) */
    PyObject *glance;       /* a rooted call's: a program whose peers are the group's others (see
                               nothing_stale), or None */
    int64_t fixed, max_tag;
    uint64_t meta;
    int narrays;            /* the call's arrays, as it passes them */
    int used;               /* those the program takes: narrays, or 0 for a program of no buffers
                               (a group of one, whose call moves nothing) */
} Lane;

/* A lane and its group refer to each other (group.lanes, and the group a
 * lane numbers its calls on): the cycle collector must see lanes. */
static int lane_traverse(Lane *self, visitproc visit, void *arg) {
    Py_VISIT(self->core);
    Py_VISIT(self->group);
    Py_VISIT(self->network);
    Py_VISIT(self->lock);
    Py_VISIT(self->done);
    Py_VISIT(self->context);
    Py_VISIT(self->meta_obj);
    Py_VISIT(self->module_dict);
    Py_VISIT(self->extra);
    Py_VISIT(self->slow);
    Py_VISIT(self->end);
    Py_VISIT(self->glance);
    return 0;
}

static int lane_clear(Lane *self) {
    Py_CLEAR(self->core);
    Py_CLEAR(self->group);
    Py_CLEAR(self->network);
    Py_CLEAR(self->lock);
    Py_CLEAR(self->done);
    Py_CLEAR(self->context);
    Py_CLEAR(self->meta_obj);
    Py_CLEAR(self->module_dict);
    Py_CLEAR(self->extra);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->end);
    Py_CLEAR(self->glance);
    return 0;
}

static void lane_dealloc(Lane *self) {
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Lane(program, narrays, group, network, context, fixed, max_tag, meta, extra, slow, end, glance,
 * module_dict): see collectives._lane. */
static PyObject *lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *core, *group, *network, *context, *extra, *slow, *end, *glance, *module_dict;
    int narrays;
    long long fixed, max_tag;
    unsigned long long meta;
    if (!PyArg_ParseTuple(args, "O!iOOOLLKOOOOO!", &ProgramType, &core, &narrays, &group, &network, &context, &fixed,
                          &max_tag, &meta, &extra, &slow, &end, &glance, &PyDict_Type, &module_dict)) return NULL;
    if (!hot_known(group, hot_group_type, "group") || !hot_known(network, network_type, "network")) return NULL;
    if (glance != Py_None && !PyObject_TypeCheck(glance, &ProgramType)) {
        PyErr_SetString(PyExc_TypeError, "Lane: glance must be a Program or None");
        return NULL;
    }
    int nextra = PyTuple_Check(extra) ? (int)PyTuple_GET_SIZE(extra) : -1;
    int used = nextra == 0 && ((CoreProgram *)core)->nbufs == 0 ? 0 : narrays;
    if (narrays < 0 || (nextra >= 0 && used + nextra != ((CoreProgram *)core)->nbufs)) {
        PyErr_SetString(PyExc_ValueError, "Lane: the arrays and extra buffers must be the program's buffers");
        return NULL;
    }
    Lane *self = (Lane *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->core = (CoreProgram *)Py_NewRef(core);
    self->narrays = narrays;
    self->used = used;
    self->group = Py_NewRef(group);
    self->network = Py_NewRef(network);
    self->context = Py_NewRef(context);
    self->fixed = fixed;
    self->max_tag = max_tag;
    self->meta = meta;
    self->extra = Py_NewRef(extra);
    self->slow = Py_NewRef(slow);
    self->end = Py_NewRef(end);
    self->glance = Py_NewRef(glance);
    self->module_dict = Py_NewRef(module_dict);
    self->lock = PyObject_GetAttr(network, names[N_LOCK]);
    self->done = PyObject_GetAttr(network, names[N_DONE]);
    self->meta_obj = PyLong_FromUnsignedLongLong(meta);
    if (!self->lock || !self->done || !self->meta_obj) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* slow(seq, resume, *arrays); steals ``resume``. */
static PyObject *lane_slow(Lane *self, PyObject *seq, PyObject *resume, PyObject *args) {
    if (!resume) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *call = PyTuple_New(n + 2);
    if (!call) { Py_DECREF(resume); return NULL; }
    PyTuple_SET_ITEM(call, 0, Py_NewRef(seq));
    PyTuple_SET_ITEM(call, 1, resume);
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(call, i + 2, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    PyObject *result = PyObject_Call(self->slow, call, NULL);
    Py_DECREF(call);
    return result;
}

/* Whether ``network`` is broken (an abort, a lost peer): -1 on error. */
static int network_broken(PyObject *network) {
    PyObject *abort = slot_attr(network, network_at, N_ABORT);
    if (!abort) return -1;
    if (abort != Py_None) return 1;
    PyObject *lost = slot_attr(network, network_at, N_LOST);
    return lost ? PyObject_IsTrue(lost) : -1;
}

/* The core's run of a lane's call, and its end (see lane_run). */
static PyObject *lane_core(Lane *self, PyObject *seq, int64_t tag, PyObject *tag_obj, PyObject *args) {
    PyObject *result = NULL;
    int quiet = 0;
    CoreProgram *core = self->core;
    PyObject *objs[core->nbufs + 1];
    PyObject *extra = PyTuple_Check(self->extra) ? Py_NewRef(self->extra) : PyObject_CallNoArgs(self->extra);
    if (!extra) goto out;
    if (!PyTuple_Check(extra) || self->used + PyTuple_GET_SIZE(extra) != core->nbufs) {
        PyErr_SetString(PyExc_ValueError, "a lane's extra buffers do not fit its program");
        Py_DECREF(extra);
        goto out;
    }
    for (int i = 0; i < self->used; i++) objs[i] = PyTuple_GET_ITEM(args, i);
    for (int i = self->used; i < core->nbufs; i++) objs[i] = PyTuple_GET_ITEM(extra, i - self->used);
    if (lock_take(self->lock) < 0) { Py_DECREF(extra); goto out; }
    outcome_t o;
    int rc = run_core(core, objs, 0, tag, self->meta, Py_None, &o, NULL);
    Py_DECREF(extra);
    if (lock_give(self->lock) < 0) {
        if (rc == 0) Py_DECREF(o.inflight);
        goto out;
    }
    if (rc < 0) goto out;
    if (o.step == core->nsteps && (quiet = slot_is(self->network, network_at, N_ABORT, Py_None)) == 1) {
        Py_DECREF(o.inflight);
        int clean = self->end == Py_None ? 1 : self->glance == Py_None ? 0
                    : nothing_stale((CoreProgram *)self->glance, tag, self->max_tag);
        if (clean < 0) goto out;
        if (!clean) {
            result = PyObject_CallFunctionObjArgs(self->end, seq, tag_obj, NULL);
            goto out;
        }
        PyObject *entry = PyTuple_Pack(2, seq, self->meta_obj);
        if (entry && PyDict_SetItem(self->done, self->context, entry) == 0
            && slot_set(self->network, network_at, N_CURRENT, Py_NewRef(zero)) == 0) result = Py_NewRef(Py_None);
        Py_XDECREF(entry);
        goto out;
    }
    if (quiet < 0) { Py_DECREF(o.inflight); goto out; }
    result = lane_slow(self, seq, outcome_tuple(&o), args);
out:
    return result;
}

static PyObject *lane_run(Lane *self, PyObject *seq, long long s, PyObject *args) {
    PyObject *trace = PyDict_GetItemWithError(self->module_dict, names[N_TRACE]);
    if (!trace && PyErr_Occurred()) return NULL;
    if (trace && trace != Py_None)  /* traced: the tracer runs it */
        return lane_slow(self, seq, Py_NewRef(Py_None), args);
    int64_t tag = self->fixed | (s & self->max_tag);
    PyObject *tag_obj = PyLong_FromLongLong(tag);
    if (!tag_obj || slot_set(self->network, network_at, N_CURRENT, Py_NewRef(tag_obj)) < 0) {
        Py_XDECREF(tag_obj);
        return NULL;
    }
    PyObject *result = NULL;
    int broken = network_broken(self->network);
    if (broken < 0) goto out;
    if (broken) {  /* Python's checks, step by step */
        result = lane_slow(self, seq, Py_BuildValue("iiiO", 0, 0, 0, no_requests), args);
        goto out;
    }
    result = lane_core(self, seq, tag, tag_obj, args);
out:
    Py_DECREF(tag_obj);
    return result;
}

static PyObject *lane_call(Lane *self, PyObject *args, PyObject *kwds) {
    if (!self->core) {
        PyErr_SetString(PyExc_RuntimeError, "a lane whose group is gone");
        return NULL;
    }
    if ((kwds && PyDict_GET_SIZE(kwds)) || PyTuple_GET_SIZE(args) != self->narrays) {
        PyErr_Format(PyExc_TypeError, "a lane takes its call's %d arrays", self->narrays);
        return NULL;
    }
    PyObject *seq = slot_attr(self->group, group_at, N_SEQ);
    if (!seq) return NULL;
    Py_INCREF(seq);
    long long s = PyLong_AsLongLong(seq);
    PyObject *next = s == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(s + 1);
    PyObject *result = NULL;
    if (next && slot_set(self->group, group_at, N_SEQ, Py_NewRef(next)) == 0) result = lane_run(self, seq, s, args);
    Py_XDECREF(next);
    Py_DECREF(seq);
    return result;
}

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collie._core.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_doc = "A repeated collective of one shape, run whole by the core (see collectives._lane).",
    .tp_new = lane_new,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_call = (ternaryfunc)lane_call,
};

/* What the look-ups below need from the Python side, set once by
 * set_context() (collectives.py, at import): the collie.group module's
 * dict (its _world), the ProcessGroup class, numpy.ndarray, arrays.numpy_view,
 * the dtypes collie moves (arrays._NAMES) and the largest tag. */
static PyObject *group_module_dict, *group_type, *ndarray_type, *numpy_view, *dtype_names;
static long long max_tag_value;

/* Whether core.select() chose the core (COLLIE_EXECUTOR): set_executor(). */
static int core_chosen;

static PyObject *py_set_executor(PyObject *self, PyObject *arg) {
    int chosen = PyObject_IsTrue(arg);
    if (chosen < 0) return NULL;
    core_chosen = chosen;
    Py_RETURN_NONE;
}

static PyObject *py_set_context(PyObject *self, PyObject *args) {
    PyObject *dict, *type, *ndarray, *view, *dtypes;
    long long max_tag;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!L", &PyDict_Type, &dict, &PyType_Type, &type, &PyType_Type, &ndarray,
                          &view, &PyDict_Type, &dtypes, &max_tag)) return NULL;
    Py_XSETREF(group_module_dict, Py_NewRef(dict));
    Py_XSETREF(group_type, Py_NewRef(type));
    Py_XSETREF(ndarray_type, Py_NewRef(ndarray));
    Py_XSETREF(numpy_view, Py_NewRef(view));
    Py_XSETREF(dtype_names, Py_NewRef(dtypes));
    max_tag_value = max_tag;
    Py_RETURN_NONE;
}

/* The live world (collie.group._world; NULL where there is none, or
 * where its look-up failed, with that error), borrowed. Every entry asks,
 * and the dict look-up was a tenth of a small receive's C: on Pythons with
 * dict versions (PEP 509), the last answer stands while the group module's
 * dict is unchanged (it holds the world, so the borrowed one lives). */
static PyObject *the_world(void) {
    if (!group_module_dict) return NULL;
#if PY_VERSION_HEX < 0x030C0000
    static uint64_t seen_version;
    static PyObject *seen_world;
    uint64_t version = ((PyDictObject *)group_module_dict)->ma_version_tag;
    if (version && version == seen_version) return seen_world;
#endif
    PyObject *w = PyDict_GetItemWithError(group_module_dict, names[N_WORLD]);
    if (w == Py_None) w = NULL;
#if PY_VERSION_HEX < 0x030C0000
    if (w || !PyErr_Occurred()) {
        seen_version = version;
        seen_world = w;
    }
#endif
    return w;
}

/* The live world's group ``group`` (None: its default group), a new
 * reference; NULL with no error where there is none (no world, another
 * world's group, not a ProcessGroup), with one for a world of a type the
 * core does not know; ``world`` gets the world (borrowed). */
static PyObject *live_group(PyObject *group, PyObject **world) {
    PyObject *w = the_world();
    if (!w) return NULL;
    *world = w;
    if (group == Py_None) return PyObject_GetAttr(w, names[N_GROUP]);
    if ((PyObject *)Py_TYPE(group) != group_type || !hot_known(w, world_type, "world")) return NULL;
    PyObject *mine = group_attr(group, N_NETWORK), *its = slot_attr(w, world_at, N_NETWORK);
    int same = mine && its && mine == its;
    Py_XDECREF(mine);
    return same ? Py_NewRef(group) : NULL;
}

/* The async_op=True calls before a blocking one finish first: 0, or -1 on error. */
static int drain_background(PyObject *world) {
    PyObject *background = hot_known(world, world_type, "world") ? slot_attr(world, world_at, N_BACKGROUND) : NULL;
    if (!background) return -1;
    Py_INCREF(background);
    PyObject *drained = background == Py_None ? Py_NewRef(Py_None)
                                              : PyObject_CallMethodNoArgs(background, names[N_DRAIN]);
    Py_DECREF(background);
    Py_XDECREF(drained);
    return drained ? 0 : -1;
}

/* find_lane(group, key, tensor) -> the lane of a blocking call of shape
 * ``key`` on ``tensor`` (a NumPy array), with this process's async calls
 * done, or None: the caller takes the full path. ``group``: a ProcessGroup
 * of the live world, or None for its default group. (What every repeated
 * call looks up first, so it is here rather than in collectives.py.) */
static PyObject *lane_of(PyObject *group, PyObject *key, PyObject *tensor) {
    PyObject *world = NULL, *lane = NULL, *result = NULL;
    PyObject *g = live_group(group, &world);
    if (!g) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    PyObject *lanes = group_attr(g, N_LANES);
    Py_DECREF(g);
    if (!lanes) return NULL;
    lane = PyDict_Check(lanes) ? PyDict_GetItemWithError(lanes, key) : NULL;
    Py_XINCREF(lane);
    Py_DECREF(lanes);
    if (!lane || lane == Py_None) {
        Py_XDECREF(lane);
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    Py_buffer view;  /* a lane writes its arrays in place: C-contiguous and writable, or no lane */
    if (tensor && PyObject_GetBuffer(tensor, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        Py_DECREF(lane);
        Py_RETURN_NONE;
    }
    if (tensor) PyBuffer_Release(&view);
    if (drain_background(world) == 0) result = lane;
    else Py_DECREF(lane);
    return result;
}

static PyObject *py_find_lane(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "find_lane(group, key, tensor)");
        return NULL;
    }
    return lane_of(args[0], args[1], args[2]);
}

/* p2p_target(tensor, rank, group_rank, group, tag, writable) -> (group,
 * peer, array) for a point-to-point call the core may run (collie.p2p's
 * _on_core): a live world's group this rank is in, a peer of it other than
 * this rank (by global ``rank`` or ``group_rank``), a tag in range, an
 * array (a NumPy array, or the view numpy_view gives of a torch tensor)
 * C-contiguous (and writable, to receive into) of a dtype collie moves.
 * Else None: the full path checks and explains. */
static PyObject *p2p_target(PyObject *tensor, PyObject *rank, PyObject *group_rank, PyObject *group,
                            PyObject *tag, int writable) {
    PyObject *world = NULL;
    if (!PyLong_CheckExact(tag)) Py_RETURN_NONE;
    long long t = PyLong_AsLongLong(tag);
    if (t < 0 || t > max_tag_value) {
        PyErr_Clear();  /* too large for a long long: out of range all the same */
        Py_RETURN_NONE;
    }
    PyObject *g = live_group(group, &world);
    if (!g) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    PyObject *peer = NULL, *arr = NULL, *result = NULL, *index = NULL, *me = NULL, *network = NULL, *ranks = NULL;
    PyObject *member = group_attr(g, N_RANK);
    long long mine = member ? PyLong_AsLongLong(member) : -1;
    Py_XDECREF(member);
    if (mine < 0) goto out;  /* not in the group */
    if (group_rank != Py_None) {
        if (rank != Py_None || !PyLong_CheckExact(group_rank) || !(ranks = PyObject_GetAttr(g, names[N_RANKS])))
            goto out;
        Py_ssize_t i = PyLong_AsSsize_t(group_rank);
        if (i < 0 || !PyTuple_Check(ranks) || i >= PyTuple_GET_SIZE(ranks)) goto out;
        peer = Py_NewRef(PyTuple_GET_ITEM(ranks, i));
    } else {
        peer = Py_NewRef(rank);
    }
    if (!PyLong_CheckExact(peer) || !(index = PyObject_GetAttr(g, names[N_INDEX]))) goto out;
    if ((PyDict_Check(index) ? PyDict_Contains(index, peer) : 0) <= 0) goto out;
    if (!(network = PyObject_GetAttr(world, names[N_NETWORK])) || !(me = PyObject_GetAttr(network, names[N_RANK])))
        goto out;
    if (PyObject_RichCompareBool(peer, me, Py_EQ) != 0) goto out;  /* itself (or an error) */
    arr = (PyObject *)Py_TYPE(tensor) == ndarray_type ? Py_NewRef(tensor) : PyObject_CallOneArg(numpy_view, tensor);
    if (!arr || arr == Py_None) goto out;
    Py_buffer view;  /* C-contiguous, and writable where it receives */
    if (PyObject_GetBuffer(arr, &view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0)
        goto out;
    PyBuffer_Release(&view);
    PyObject *dtype = PyObject_GetAttr(arr, names[N_DTYPE]);
    int moved = dtype ? PyDict_Contains(dtype_names, dtype) : -1;
    Py_XDECREF(dtype);
    if (moved > 0) result = PyTuple_Pack(3, g, peer, arr);
out:
    /* An error here the full path finds again and explains (an interrupt stays). */
    if (!result && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    Py_XDECREF(index);
    Py_XDECREF(me);
    Py_XDECREF(network);
    Py_XDECREF(ranks);
    Py_XDECREF(peer);
    Py_XDECREF(arr);
    Py_DECREF(g);
    return result ? result : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

static PyObject *py_p2p_target(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "p2p_target(tensor, rank, group_rank, group, tag, writable)");
        return NULL;
    }
    int writable = PyObject_IsTrue(args[5]);
    return writable < 0 ? NULL : p2p_target(args[0], args[1], args[2], args[3], args[4], writable);
}

/* ---- batch_isend_irecv through the core, in C: a batch with a message of
 * at least the threshold, all of whose messages the core can move, with
 * one tag (collie.p2p._prepare_batch makes its program, the first time). */
#define MAX_BATCH 62  /* messages: the done mask is one int64 */
static struct {
    PyObject *op_type, *irecv, *completed;  /* P2POp, collie.irecv, CompletedWork */
    long long threshold;                     /* core.BATCH_SINGLE_COPY_BYTES */
    double spin_per_byte;                    /* the call's own wait (p2p._FIRST_SPIN_PER_BYTE) */
    int context_shift;
} batching;

static PyObject *py_set_batching(PyObject *self, PyObject *args) {
    PyObject *op_type, *irecv, *completed;
    if (!PyArg_ParseTuple(args, "O!OO!Ldi", &PyType_Type, &op_type, &irecv, &PyType_Type, &completed,
                          &batching.threshold, &batching.spin_per_byte, &batching.context_shift)) return NULL;
    Py_XSETREF(batching.op_type, Py_NewRef(op_type));
    Py_XSETREF(batching.irecv, Py_NewRef(irecv));
    Py_XSETREF(batching.completed, Py_NewRef(completed));
    Py_RETURN_NONE;
}

/* Whether one of the ops' tensors has at least the threshold's bytes (-1: error). */
static int batch_is_large(PyObject **ops, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (Py_TYPE(ops[i]) != (PyTypeObject *)batching.op_type) return 0;
        PyObject *tensor = PyObject_GetAttr(ops[i], names[N_TENSOR]);
        PyObject *nbytes = tensor ? PyObject_GetAttr(tensor, names[N_NBYTES]) : NULL;
        long long v = nbytes && PyLong_Check(nbytes) ? PyLong_AsLongLong(nbytes) : -1;
        Py_XDECREF(tensor);
        Py_XDECREF(nbytes);
        if (v < 0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
            PyErr_Clear();  /* no nbytes: the full path explains */
            return 0;
        }
        if (v >= batching.threshold) return 1;
    }
    return 0;
}

/* The op's target (p2p_target's (group, peer, array), or None) and wire tag. */
static PyObject *batch_target(PyObject *op, int64_t *wire, int *receiving) {
    PyObject *v[6] = {NULL};
    static const int at[6] = {N_OP, N_TENSOR, N_PEER, N_GROUP_PEER, N_GROUP, N_TAG};
    PyObject *target = NULL, *context = NULL;
    for (int k = 0; k < 6; k++)
        if (!(v[k] = PyObject_GetAttr(op, names[at[k]]))) goto out;
    *receiving = v[0] == batching.irecv;
    target = p2p_target(v[1], v[2], v[3], v[4], v[5], *receiving);
    if (target && target != Py_None) {
        context = PyObject_GetAttr(PyTuple_GET_ITEM(target, 0), names[N_CONTEXT]);
        long long c = context ? PyLong_AsLongLong(context) : -1, t = PyLong_AsLongLong(v[5]);  /* (checked) */
        *wire = (int64_t)((c << batching.context_shift) | t);
        if (PyErr_Occurred()) Py_CLEAR(target);
    }
out:
    for (int k = 0; k < 6; k++) Py_XDECREF(v[k]);
    Py_XDECREF(context);
    return target;
}

/* batch_fast(ops[, handed_over]) -> the Works of a batch the core ended in
 * the call (a list); or (program, key, arrays, targets, tag, mask, rids)
 * for one it paused (rids None; the program is out of the cache) or handed
 * back, whose Works Python makes (p2p._under_way); or False where Python
 * must first make its program or hand over receives deferred before it
 * (p2p._prepare_batch; ``handed_over``: it did, those from other peers may
 * stay); or None: not the core's batch, call by call. */
static PyObject *py_batch_fast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "batch_fast(ops[, handed_over])");
        return NULL;
    }
    PyObject *ops = args[0];
    int handed_over = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
    if (handed_over < 0) return NULL;
    if (!core_chosen || !batching.op_type || !(PyList_CheckExact(ops) || PyTuple_CheckExact(ops))) Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ops);
    PyObject **items = PySequence_Fast_ITEMS(ops);
    if (n < 1 || n > MAX_BATCH) Py_RETURN_NONE;
    int large = batch_is_large(items, n);
    if (large <= 0) return large < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *targets = PyTuple_New(n), *key = PyTuple_New(n), *arrays = PyTuple_New(n);
    PyObject *network = NULL, *state = NULL, *programs = NULL, *deferred = NULL, *lock = NULL, *result = NULL;
    CoreProgram *program = NULL;
    int64_t tag = -1, total = 0;
    if (!targets || !key || !arrays) goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t wire = 0;
        int receiving;
        PyObject *target = batch_target(items[i], &wire, &receiving);
        if (!target || target == Py_None) { Py_XDECREF(target); goto out; }
        PyTuple_SET_ITEM(targets, i, target);
        PyObject *arr = PyTuple_GET_ITEM(target, 2), *nbytes = PyObject_GetAttr(arr, names[N_NBYTES]);
        if (!nbytes) goto out;
        total += PyLong_AsLongLong(nbytes);
        PyObject *entry = PyTuple_Pack(3, receiving ? Py_True : Py_False, PyTuple_GET_ITEM(target, 1), nbytes);
        Py_DECREF(nbytes);
        if (!entry) goto out;
        PyTuple_SET_ITEM(key, i, entry);
        PyTuple_SET_ITEM(arrays, i, Py_NewRef(arr));
        if (i == 0) {
            tag = wire;
            if (!(network = PyObject_GetAttr(PyTuple_GET_ITEM(target, 0), names[N_NETWORK]))) goto out;
        } else if (wire != tag) {
            goto out;
        }
    }
    if (!(state = PyObject_GetAttr(network, names[N_P2P]))) goto out;
    if (state == Py_None) {
        result = Py_NewRef(Py_False);  /* no program made yet */
        goto out;
    }
    if (!(programs = PyObject_GetAttr(state, names[N_PROGRAMS])) || !PyDict_Check(programs)
        || !(deferred = PyObject_GetAttr(state, names[N_DEFERRED])) || !PyList_Check(deferred))
        goto out;
    PyObject *found = PyDict_GetItemWithError(programs, key);
    if ((!found && !PyErr_Occurred()) || (PyList_GET_SIZE(deferred) && !handed_over)) {
        result = Py_NewRef(Py_False);  /* none made yet (or a paused batch holds it), or receives deferred */
        goto out;
    }
    if (!found || !PyObject_TypeCheck(found, &ProgramType) || !((CoreProgram *)found)->whole) goto out;
    if (!hot_known(network, network_type, "network") || network_broken(network)
        || !(lock = PyObject_GetAttr(network, names[N_LOCK])))
        goto out;
    program = (CoreProgram *)Py_NewRef(found);
    if (PyDict_DelItem(programs, key) < 0) goto out;  /* this batch's until it ends */
    double spin = total * batching.spin_per_byte;
    if (lock_take(lock) < 0) goto out;
    PyObject *step = batch_step(program, PySequence_Fast_ITEMS(arrays), tag, 0,
                                spin < program->spin ? spin : program->spin, 0);
    if (lock_give(lock) < 0) { Py_XDECREF(step); step = NULL; }
    if (!step) goto out;
    int done = PyTuple_GET_ITEM(step, 0) == Py_True, paused = !done && PyTuple_GET_ITEM(step, 2) == Py_None;
    if (!paused && PyDict_SetItem(programs, key, (PyObject *)program) < 0) { Py_DECREF(step); goto out; }
    if (!done) {
        result = Py_BuildValue("(OOOOLOO)", program, key, arrays, targets, (long long)tag, PyTuple_GET_ITEM(step, 1),
                               PyTuple_GET_ITEM(step, 2));
        Py_DECREF(step);
        goto out;
    }
    Py_DECREF(step);
    /* CompletedWorks, made as the entries make them: a receive's result() is its sender */
    PyTypeObject *type = (PyTypeObject *)batching.completed;
    if (!(result = PyList_New(n))) goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *work = type->tp_new(type, no_requests, NULL);
        if (work && PyTuple_GET_ITEM(PyTuple_GET_ITEM(key, i), 0) == Py_True
            && PyObject_SetAttr(work, names[N_RESULT], PyTuple_GET_ITEM(PyTuple_GET_ITEM(targets, i), 1)) < 0)
            Py_CLEAR(work);
        if (!work) { Py_CLEAR(result); goto out; }
        PyList_SET_ITEM(result, i, work);
    }
out:
    Py_XDECREF(targets);
    Py_XDECREF(key);
    Py_XDECREF(arrays);
    Py_XDECREF(network);
    Py_XDECREF(state);
    Py_XDECREF(programs);
    Py_XDECREF(deferred);
    Py_XDECREF(lock);
    Py_XDECREF(program);
    if (!result && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception) && !program) PyErr_Clear();
    return result ? result : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

/* ------------------------------------------------------------ entries */

/* Entry(kind, function, name, reduce_op_type[, full, completed,
 * tag_shift]): a public function with a way through C for its repeated
 * calls; every other call goes to ``function``, the Python function, as it
 * was.
 *  - collectives.py's all_reduce, broadcast, reduce, all_gather_into_tensor,
 *    reduce_scatter_tensor and all_to_all_single: a call on plain NumPy
 *    arrays whose shape already has a lane goes to it from here (found in
 *    the entry's memo, or by its key; no Python frame). laned() runs such a
 *    call in its lane or does nothing (the MPI layer's hot paths).
 *  - collie.p2p's send, recv, isend and irecv: a message the core's program
 *    made before moves from here (see p2p_fast); where the core tried and
 *    could not, the call goes on in ``full``, the Python function's path
 *    after its own try (an irecv's: the function itself, which defers the
 *    receive its first look did not find). */
enum { ENTRY_ALL_REDUCE, ENTRY_BROADCAST, ENTRY_REDUCE, ENTRY_ALL_GATHER, ENTRY_REDUCE_SCATTER, ENTRY_ALL_TO_ALL,
       ENTRY_SEND, ENTRY_RECV, ENTRY_ISEND, ENTRY_IRECV, NENTRIES };
#define ENTRY_TWO_ARRAYS ENTRY_ALL_GATHER  /* from here on: calls from an input into an output */
#define ENTRY_P2P ENTRY_SEND               /* from here on: point to point */
#define ENTRY_ARGS 7
static const char *entry_params[NENTRIES][ENTRY_ARGS + 1] = {
    {"tensor", "op", "group", "async_op", "algorithm", NULL},
    {"tensor", "src", "group", "async_op", "group_src", "algorithm", NULL},
    {"tensor", "dst", "op", "group", "async_op", "group_dst", "algorithm", NULL},
    {"output_tensor", "input_tensor", "group", "async_op", "algorithm", NULL},
    {"output", "input", "op", "group", "async_op", "algorithm", NULL},
    {"output", "input", "output_split_sizes", "input_split_sizes", "group", "async_op", "algorithm", NULL},
    {"tensor", "dst", "group", "tag", "group_dst", NULL},
    {"tensor", "src", "group", "tag", "group_src", NULL},
    {"tensor", "dst", "group", "tag", "group_dst", NULL},
    {"tensor", "src", "group", "tag", "group_src", NULL},
};
static PyObject *entry_param_names[NENTRIES][ENTRY_ARGS];  /* interned at import */
static int entry_nparams[NENTRIES];                          /* counted then */

/* Each parameter's default (see place_args): the tensors (both of the
 * two-array kinds) required, None, False (async_op), ReduceOp.SUM (op), 0 (tag). */
enum { IS_REQUIRED, IS_NONE, IS_FALSE, IS_SUM, IS_ZERO, IS_ANY };
static const char entry_defaults[NENTRIES][ENTRY_ARGS] = {
    {IS_REQUIRED, IS_SUM, IS_NONE, IS_FALSE, IS_NONE},
    {IS_REQUIRED, IS_NONE, IS_NONE, IS_FALSE, IS_NONE, IS_NONE},
    {IS_REQUIRED, IS_NONE, IS_SUM, IS_NONE, IS_FALSE, IS_NONE, IS_NONE},
    {IS_REQUIRED, IS_REQUIRED, IS_NONE, IS_FALSE, IS_NONE},
    {IS_REQUIRED, IS_REQUIRED, IS_SUM, IS_NONE, IS_FALSE, IS_NONE},
    {IS_REQUIRED, IS_REQUIRED, IS_NONE, IS_NONE, IS_NONE, IS_FALSE, IS_NONE},
    {IS_REQUIRED, IS_NONE, IS_NONE, IS_ZERO, IS_NONE},
    {IS_REQUIRED, IS_NONE, IS_NONE, IS_ZERO, IS_NONE},
    {IS_REQUIRED, IS_NONE, IS_NONE, IS_ZERO, IS_NONE},
    {IS_REQUIRED, IS_NONE, IS_NONE, IS_ZERO, IS_NONE},
};
static PyObject *minus_one;  /* the int -1: MPI.ANY_SOURCE and MPI.ANY_TAG */

/* A call's arguments into v[0..count) by a signature of ``count``
 * interned parameter names: given positionally or by keyword (each once,
 * known by identity: the keywords of a call in code are interned), else
 * its default (``defaults``: IS_NONE, IS_FALSE, IS_SUM: ``sum``, IS_ZERO,
 * IS_ANY: -1). 1, or 0 where the call does not fit (too many arguments, a
 * keyword it does not know, a required one missing): then the caller's
 * Python function takes the call, and explains. */
static int place_args(PyObject *const *params, const char *defaults, int count, PyObject *sum,
                      PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **v) {
    if (nargs > count) return 0;
    for (int i = 0; i < count; i++) v[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, j);
        int at = -1;
        for (int i = 0; i < count && at < 0; i++)
            if (kw == params[i]) at = i;
        if (at < 0 || v[at]) return 0;
        v[at] = args[nargs + j];
    }
    for (int i = 0; i < count; i++) {
        if (v[i]) continue;
        char d = defaults[i];
        v[i] = d == IS_NONE ? Py_None : d == IS_FALSE ? Py_False : d == IS_SUM ? sum : d == IS_ZERO ? zero
             : d == IS_ANY ? minus_one : NULL;
        if (!v[i]) return 0;  /* (required, or SUM not known yet) */
    }
    return 1;
}

/* Where each collective kind has its op (-1: none), group and async_op,
 * and the name its lanes are registered under (collectives.py's keys). */
static const int entry_op_at[ENTRY_P2P] = {1, -1, 2, -1, 2, -1}, entry_group_at[ENTRY_P2P] = {2, 2, 3, 2, 3, 4},
                 entry_async_at[ENTRY_P2P] = {3, 3, 4, 3, 4, 5};
static const char *entry_lane_names[ENTRY_P2P] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                                  "all_to_all"};
static PyObject *entry_lane_name[ENTRY_P2P];  /* interned at import */

/* ---- point to point's routes
 *
 * What a point-to-point entry finds for a call (the group, the peer, the
 * core's program, the network's books and lock: about two thirds of a small
 * send's time, when looked up each time), kept as a route for the next
 * calls with the same arguments, which then check their array and move. A
 * route holds while the world it was found in is the live one: the group's
 * members and context, the peer and the program (which lives as long as its
 * network) are then what they were; whatever can change (an abort, a lost
 * peer, receives waiting in Python) is checked on every call.
 * destroy_process_group forgets them (forget_world). */
#define ROUTES 4
typedef struct {
    PyObject *world, *group_arg, *dtype;  /* the key: the world, the call's group, its array's dtype */
    long long rank, group_rank, tag;      /* ... its ints (-1: None) */
    Py_ssize_t nbytes;                    /* ... and its array's size */
    PyObject *group, *peer, *network, *deferred, *lock;
    CoreProgram *program;
    int64_t wire_tag;
} route_t;

/* A collective entry's memo: the lane a call took, for the next calls with
 * the very same arguments (ops, ranks, groups and algorithms are the same
 * objects call after call) on an array of the same dtype and size, which
 * then skip the key and the look-up. A lane stays right for its calls: a
 * new world clears the memos (forget_world); a lane that left its group's
 * lanes (they are bounded) still runs them as it did. */
typedef struct {
    PyObject *world, *dtype, *args[ENTRY_ARGS], *lane;  /* NULL lane: an empty memo */
    PyObject *shapes[2];    /* a call from an input into an output: their shapes (the key has them) */
    Py_ssize_t nbytes;      /* the (output) array's */
} memo_t;

static void memo_clear(memo_t *m) {
    Py_CLEAR(m->world);
    Py_CLEAR(m->dtype);
    Py_CLEAR(m->lane);
    Py_CLEAR(m->shapes[0]);
    Py_CLEAR(m->shapes[1]);
    for (int i = 0; i < ENTRY_ARGS; i++) Py_CLEAR(m->args[i]);
}

static int memo_traverse(memo_t *m, visitproc visit, void *arg) {
    Py_VISIT(m->world);
    Py_VISIT(m->dtype);
    Py_VISIT(m->lane);
    Py_VISIT(m->shapes[0]);
    Py_VISIT(m->shapes[1]);
    for (int i = 0; i < ENTRY_ARGS; i++) Py_VISIT(m->args[i]);
    return 0;
}

typedef struct {
    PyObject_HEAD
    PyObject *function, *name, *op_type, *sum, *dict;
    PyObject *full, *completed;  /* point to point's: see above; CompletedWork */
    int kind, tag_shift;
    vectorcallfunc vectorcall;
    route_t routes[ROUTES]; /* point to point's last calls */
    memo_t memos[ROUTES];   /* a collective's */
    unsigned next_route;    /* the one the next new route or memo replaces */
} Entry;

static void route_clear(route_t *r) {
    PyObject **refs[] = {&r->world, &r->group_arg, &r->dtype, &r->group, &r->peer, &r->network, &r->deferred,
                         &r->lock, (PyObject **)&r->program};
    for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++) Py_CLEAR(*refs[i]);
}

static int route_traverse(route_t *r, visitproc visit, void *arg) {
    PyObject *refs[] = {r->world, r->group_arg, r->dtype, r->group, r->peer, r->network, r->deferred, r->lock,
                        (PyObject *)r->program};
    for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++) Py_VISIT(refs[i]);
    return 0;
}

/* The entries alive (a few: the collectives' and point to point's), whose
 * routes and memos forget_world() drops. */
#define MAX_ENTRIES 16
static Entry *entries[MAX_ENTRIES];

static void entry_register(Entry *e, int on) {
    for (int i = 0; i < MAX_ENTRIES; i++)
        if (entries[i] == (on ? NULL : e)) { entries[i] = on ? e : NULL; return; }
}

/* forget_world(): drop every route and memo (destroy_process_group: the
 * world they lead into is gone, and they would keep it alive). */
static PyObject *py_forget_world(PyObject *self, PyObject *unused) {
    for (int i = 0; i < MAX_ENTRIES; i++)
        for (int j = 0; entries[i] && j < ROUTES; j++) {
            route_clear(&entries[i]->routes[j]);
            memo_clear(&entries[i]->memos[j]);
        }
    pthread_mutex_lock(&views_lock);  /* and the peers' buffers mapped here */
    for (int i = 0; i < MAX_VIEWS; i++)
        if (!views[i].busy) drop_view(&views[i]);
    pthread_mutex_unlock(&views_lock);
    Py_RETURN_NONE;
}

static int entry_traverse(Entry *self, visitproc visit, void *arg) {
    Py_VISIT(self->function);
    Py_VISIT(self->name);
    Py_VISIT(self->op_type);
    Py_VISIT(self->sum);
    Py_VISIT(self->dict);
    Py_VISIT(self->full);
    Py_VISIT(self->completed);
    for (int i = 0; i < ROUTES; i++)
        if (route_traverse(&self->routes[i], visit, arg) || memo_traverse(&self->memos[i], visit, arg)) return -1;
    return 0;
}

static int entry_clear(Entry *self) {
    Py_CLEAR(self->function);
    Py_CLEAR(self->name);
    Py_CLEAR(self->op_type);
    Py_CLEAR(self->sum);
    Py_CLEAR(self->dict);
    Py_CLEAR(self->full);
    Py_CLEAR(self->completed);
    for (int i = 0; i < ROUTES; i++) {
        route_clear(&self->routes[i]);
        memo_clear(&self->memos[i]);
    }
    return 0;
}

static void entry_dealloc(Entry *self) {
    PyObject_GC_UnTrack(self);
    entry_register(self, 0);
    entry_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The lane key of a call whose arguments are ``v`` (in entry_params'
 * order), as collectives.py builds it; NULL with no error where the call
 * cannot take a lane. */
static PyObject *entry_key(Entry *self, PyObject **v) {
    int two = self->kind >= ENTRY_TWO_ARRAYS;
    PyObject *tensor = v[0], *name = entry_lane_name[self->kind];
    if (!Py_IS_TYPE(tensor, (PyTypeObject *)ndarray_type) || (two && !Py_IS_TYPE(v[1], (PyTypeObject *)ndarray_type)))
        return NULL;
    PyObject *op = entry_op_at[self->kind] < 0 ? NULL : v[entry_op_at[self->kind]];
    if (v[entry_async_at[self->kind]] != Py_False || (op && (PyObject *)Py_TYPE(op) != self->op_type)) return NULL;
    if (self->kind == ENTRY_ALL_TO_ALL && (v[2] != Py_None || v[3] != Py_None)) return NULL;  /* even splits only */
    PyObject *dtype = PyObject_GetAttr(tensor, names[N_DTYPE]), *code = op ? PyObject_GetAttr(op, names[N_CODE]) : NULL;
    PyObject *size = NULL, *in_dtype = NULL, *in_shape = NULL, *out_shape = NULL, *key = NULL;
    if (!dtype || (op && !code)) goto out;
    if (two) {  /* collectives._two_array_key: the same dtype in and out, and both shapes */
        if (!(in_dtype = PyObject_GetAttr(v[1], names[N_DTYPE]))) goto out;
        int same = in_dtype == dtype ? 1 : PyObject_RichCompareBool(in_dtype, dtype, Py_EQ);
        if (same <= 0 || !(in_shape = PyObject_GetAttr(v[1], names[N_SHAPE]))
            || !(out_shape = PyObject_GetAttr(tensor, names[N_SHAPE])))
            goto out;
    } else if (!(size = PyObject_GetAttr(tensor, names[N_SIZE]))) {
        goto out;
    }
    switch (self->kind) {
    case ENTRY_ALL_REDUCE: key = PyTuple_Pack(5, name, dtype, size, code, v[4]); break;
    case ENTRY_BROADCAST: key = PyTuple_Pack(6, name, dtype, size, v[1], v[4], v[5]); break;
    case ENTRY_REDUCE: key = PyTuple_Pack(7, name, dtype, size, v[1], v[5], code, v[6]); break;
    case ENTRY_REDUCE_SCATTER: key = PyTuple_Pack(6, name, dtype, in_shape, out_shape, code, v[5]); break;
    default: key = PyTuple_Pack(5, name, dtype, in_shape, out_shape, v[entry_async_at[self->kind] + 1]); break;
    }
out:
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();  /* the full path explains */
    Py_XDECREF(dtype);
    Py_XDECREF(code);
    Py_XDECREF(size);
    Py_XDECREF(in_dtype);
    Py_XDECREF(in_shape);
    Py_XDECREF(out_shape);
    return key;
}


/* A call's int argument as a route's key: None is -1; 0 where it is
 * neither None nor a plain int >= 0 (no route: the full path checks it). */
static int route_int(PyObject *o, long long *out) {
    if (o == Py_None) { *out = -1; return 1; }
    if (!PyLong_CheckExact(o)) return 0;
    *out = PyLong_AsLongLong(o);
    if (*out < 0) PyErr_Clear();  /* negative, or too large: the full path says what is wrong */
    return *out >= 0;
}

/* Find what a call needs into ``r`` (its references new), as collie.p2p
 * does before its own core_run, with ``b`` the array's buffer (filled here
 * where ``b->obj`` is NULL): 1 found, 0 the call goes to Python, 2 it goes
 * to Python's full path (collie.p2p found before that the core cannot move
 * such a message: a tcp peer, a message larger than its ring), -1 error. */
static int route_find(Entry *self, PyObject **v, route_t *r, Py_buffer *b, int receiving) {
    PyObject *target = p2p_target(v[0], v[1], v[4], v[2], v[3], receiving);
    if (!target || target == Py_None) {
        Py_XDECREF(target);
        return target ? 0 : -1;
    }
    PyObject *state = NULL, *programs = NULL, *key = NULL, *size = NULL, *context = NULL;
    int found = -1;
    r->group = Py_NewRef(PyTuple_GET_ITEM(target, 0));
    r->peer = Py_NewRef(PyTuple_GET_ITEM(target, 1));
    if (!b->obj && PyObject_GetBuffer(PyTuple_GET_ITEM(target, 2), b, receiving ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS
                                                                               : PyBUF_C_CONTIGUOUS) < 0) {
        b->obj = NULL;
        goto out;
    }
    if (!(r->network = PyObject_GetAttr(r->group, names[N_NETWORK]))
        || !(state = PyObject_GetAttr(r->network, names[N_P2P])))
        goto out;
    found = 0;
    if (state == Py_None) goto out;  /* no program made yet: Python makes the first */
    found = -1;
    if (!(programs = PyObject_GetAttr(state, names[N_PROGRAMS]))
        || !(r->deferred = PyObject_GetAttr(state, names[N_DEFERRED])) || !(size = PyLong_FromSsize_t(b->len)))
        goto out;
    /* (peer, bytes, receiving, blocking), as p2p._CoreP2P keeps them: an irecv looks once */
    PyObject *flag = receiving ? Py_True : Py_False, *blocking = self->kind == ENTRY_RECV ? Py_True : Py_False;
    if (!(key = PyTuple_Pack(4, r->peer, size, flag, blocking))) goto out;
    PyObject *program = PyDict_Check(programs) ? PyDict_GetItemWithError(programs, key) : NULL;
    if (PyErr_Occurred()) goto out;
    found = program == Py_None ? 2 : 0;
    if (!program || !PyObject_TypeCheck(program, &ProgramType) || ((CoreProgram *)program)->need[0] != b->len
        || !PyList_Check(r->deferred))
        goto out;
    found = -1;
    r->program = (CoreProgram *)Py_NewRef(program);
    if (!one_message(r->program) || !hot_known(r->network, network_type, "network")
        || !hot_known(r->group, hot_group_type, "group")
        || !(context = PyObject_GetAttr(r->group, names[N_CONTEXT]))
        || !(r->lock = PyObject_GetAttr(r->network, names[N_LOCK])))
        goto out;
    long long c = PyLong_AsLongLong(context), t = PyLong_AsLongLong(v[3]);  /* p2p_target checked the tag */
    if (PyErr_Occurred()) goto out;
    r->wire_tag = (int64_t)((c << self->tag_shift) | t);
    found = 1;
out:
    Py_XDECREF(state);
    Py_XDECREF(programs);
    Py_XDECREF(key);
    Py_XDECREF(size);
    Py_XDECREF(context);
    Py_DECREF(target);
    return found;
}

/* Move the call's message on route ``r`` (``b``: its array): see p2p_fast. */
static PyObject *route_move(Entry *self, route_t *r, Py_buffer *b, int *tried) {
    if ((self->kind == ENTRY_RECV || self->kind == ENTRY_IRECV) && PyList_GET_SIZE(r->deferred))
        return NULL;  /* receives posted before this one take their messages first: Python sorts that out */
    int quiet = slot_is(r->network, network_at, N_ABORT, Py_None);
    if (quiet == 1) {
        PyObject *lost = slot_attr(r->network, network_at, N_LOST);
        quiet = lost ? !PyObject_IsTrue(lost) : -1;  /* (IsTrue's -1 comes out as 0: an error, found below) */
    }
    if (quiet != 1) return NULL;  /* something broke: Python's checks */
    if (lock_take(r->lock) < 0) return NULL;
    int moved = move_bytes(r->program, b->buf, r->wire_tag);
    if (lock_give(r->lock) < 0) return NULL;
    if (moved <= 0) {
        *tried = moved == 0;
        return NULL;
    }
    PyObject *ops = slot_attr(r->group, group_at, N_P2P_OPS);
    long long count = ops ? PyLong_AsLongLong(ops) : -1;
    if ((count == -1 && PyErr_Occurred())
        || slot_set(r->group, group_at, N_P2P_OPS, PyLong_FromLongLong(count + 1)) < 0) return NULL;
    if (self->kind == ENTRY_SEND) return Py_NewRef(Py_None);
    if (self->kind == ENTRY_RECV) return Py_NewRef(r->peer);
    /* A CompletedWork, made as object() would (its state is its class's): an irecv's result() is the sender. */
    PyTypeObject *type = (PyTypeObject *)self->completed;
    PyObject *work = type->tp_new(type, no_requests, NULL);
    if (work && self->kind == ENTRY_IRECV && PyObject_SetAttr(work, names[N_RESULT], r->peer) < 0) Py_CLEAR(work);
    return work;
}

/* The core's move of a point-to-point call (send, recv, isend or irecv,
 * its arguments ``v``) whose program collie.p2p made on an earlier call:
 * what the call returns (None, the sender's rank, a CompletedWork); or
 * NULL, on an error, or with no error where the call goes to Python,
 * ``*tried`` saying whether the core already tried to move it (a full
 * ring, a peer slower than the spin...) or knows it cannot: then the call
 * goes on in ``full``, which does not try again. */
static PyObject *p2p_fast(Entry *self, PyObject **v, int *tried) {
    int receiving = self->kind == ENTRY_RECV || self->kind == ENTRY_IRECV;
    if (!core_chosen) return NULL;
    PyObject *world = the_world();
    if (!world) return NULL;
    route_t fresh = {0}, *r = NULL;
    Py_buffer b = {0};
    PyObject *dtype = NULL, *result = NULL;
    long long rank = -1, group_rank = -1, tag = -1;
    int keyed = Py_IS_TYPE(v[0], (PyTypeObject *)ndarray_type) && route_int(v[1], &rank)
                && route_int(v[4], &group_rank) && route_int(v[3], &tag);
    if (PyErr_Occurred()) return NULL;
    if (keyed) {
        if (PyObject_GetBuffer(v[0], &b, receiving ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();  /* a read-only array to receive into, say: the full path explains */
            return NULL;
        }
        if (!(dtype = PyObject_GetAttr(v[0], names[N_DTYPE]))) goto out;
        for (int i = 0; i < ROUTES && !r; i++) {
            route_t *c = &self->routes[i];
            if (c->world == world && c->group_arg == v[2] && c->dtype == dtype && c->nbytes == b.len
                && c->rank == rank && c->group_rank == group_rank && c->tag == tag)
                r = c;
        }
    }
    if (!r) {
        int found = route_find(self, v, &fresh, &b, receiving);
        *tried = found == 2;  /* the core cannot: its own try in Python is not worth making */
        if (found != 1) goto out;
        r = &fresh;
    }
    result = route_move(self, r, &b, tried);
    if (r == &fresh && keyed && (result || !PyErr_Occurred())) {  /* kept for the next such call */
        route_t *slot = &self->routes[self->next_route++ % ROUTES];
        route_clear(slot);
        *slot = fresh;
        memset(&fresh, 0, sizeof fresh);
        slot->world = Py_NewRef(world);
        slot->group_arg = Py_NewRef(v[2]);
        slot->dtype = Py_NewRef(dtype);
        slot->rank = rank;
        slot->group_rank = group_rank;
        slot->tag = tag;
        slot->nbytes = b.len;
    }
out:
    route_clear(&fresh);
    Py_XDECREF(dtype);
    if (b.obj) PyBuffer_Release(&b);
    return result;
}

/* The lane of a collective's call whose arguments are ``v`` (a new
 * reference), or NULL (with an error, or none: no lane): from a memo, or
 * found by its key and then remembered. */
static PyObject *entry_lane(Entry *self, PyObject **v, int count) {
    int two = self->kind >= ENTRY_TWO_ARRAYS;
    PyObject *world = NULL, *dtype = NULL, *lane = NULL, *shapes[2] = {NULL, NULL};
    Py_ssize_t nbytes = -1;
    if (Py_IS_TYPE(v[0], (PyTypeObject *)ndarray_type) && (!two || Py_IS_TYPE(v[1], (PyTypeObject *)ndarray_type))
        && v[entry_async_at[self->kind]] == Py_False && group_module_dict) {
        if (!(world = the_world())) return NULL;
        /* A lane writes its output in place (C-contiguous and writable) and reads its input whole. */
        Py_buffer view;
        for (int i = 0; i <= two; i++) {
            if (PyObject_GetBuffer(v[i], &view, i ? PyBUF_C_CONTIGUOUS : PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
                PyErr_Clear();
                return NULL;
            }
            if (!i) nbytes = view.len;
            PyBuffer_Release(&view);
        }
        if (!(dtype = PyObject_GetAttr(v[0], names[N_DTYPE]))) return NULL;
        int known = 1;  /* whether a memo may hold it: for two arrays, the same dtype object in and out */
        if (two) {
            PyObject *in_dtype = PyObject_GetAttr(v[1], names[N_DTYPE]);
            known = in_dtype == dtype;
            Py_XDECREF(in_dtype);
            if (!in_dtype || !(shapes[0] = PyObject_GetAttr(v[1], names[N_SHAPE]))
                || !(shapes[1] = PyObject_GetAttr(v[0], names[N_SHAPE])))
                goto out;
        }
        for (int i = 0; known && i < ROUTES && !lane; i++) {
            memo_t *m = &self->memos[i];
            int same = m->lane && m->world == world && m->dtype == dtype && m->nbytes == nbytes;
            for (int j = 1 + two; same && j < count; j++) same = m->args[j] == v[j];
            for (int j = 0; same && two && j < 2; j++) same = PyObject_RichCompareBool(m->shapes[j], shapes[j], Py_EQ);
            if (same < 0) goto out;
            if (same) lane = Py_NewRef(m->lane);
        }
        if (lane) {
            if (drain_background(world) < 0) Py_CLEAR(lane);
            goto out;
        }
        if (!known) Py_CLEAR(dtype);  /* no memo for it */
    }
    PyObject *key = entry_key(self, v);
    if (key) {
        lane = lane_of(v[entry_group_at[self->kind]], key, v[0]);
        Py_DECREF(key);
    }
    if (dtype && lane && Py_IS_TYPE(lane, &LaneType)) {  /* remembered for the next such call */
        memo_t *m = &self->memos[self->next_route++ % ROUTES];
        memo_clear(m);
        m->world = Py_NewRef(world);
        m->dtype = Py_NewRef(dtype);
        m->nbytes = nbytes;
        m->lane = Py_NewRef(lane);
        for (int j = 1 + two; j < count; j++) m->args[j] = Py_NewRef(v[j]);
        for (int j = 0; two && j < 2; j++) m->shapes[j] = Py_NewRef(shapes[j]);
    }
out:
    Py_XDECREF(dtype);
    Py_XDECREF(shapes[0]);
    Py_XDECREF(shapes[1]);
    return lane;
}

/* The call's arguments into ``v`` (in entry_params' order, defaults filled
 * in): 1, or 0 where the entry leaves the call to the Python function (an
 * unknown or repeated keyword, a missing array...: it says what is wrong). */
static int entry_parse(Entry *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **v) {
    return nargs >= 1 && place_args(entry_param_names[self->kind], entry_defaults[self->kind],
                                    entry_nparams[self->kind], self->sum, args, nargs, kwnames, v);
}

/* Run a collective's call (arguments ``v``) in its lane: 1 it ran (or
 * failed: -1, with its error), 0 it has none. */
static int entry_run_lane(Entry *self, PyObject **v, PyObject **result) {
    PyObject *lane = entry_lane(self, v, entry_nparams[self->kind]);
    *result = NULL;
    if (PyErr_Occurred()) {
        Py_XDECREF(lane);
        return -1;
    }
    if (!lane || !Py_IS_TYPE(lane, &LaneType)) {
        Py_XDECREF(lane);
        return 0;
    }
    /* A lane takes (input, output). */
    PyObject *arrays = self->kind >= ENTRY_TWO_ARRAYS ? PyTuple_Pack(2, v[1], v[0]) : PyTuple_Pack(1, v[0]);
    *result = arrays ? lane_call((Lane *)lane, arrays, NULL) : NULL;
    Py_XDECREF(arrays);
    Py_DECREF(lane);
    return *result ? 1 : -1;
}

static PyObject *entry_vectorcall(Entry *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *v[ENTRY_ARGS] = {NULL}, *result = NULL;
    if (entry_parse(self, args, PyVectorcall_NARGS(nargsf), kwnames, v)) {
        if (self->kind >= ENTRY_P2P) {
            int tried = 0;
            result = p2p_fast(self, v, &tried);
            if (result || PyErr_Occurred()) return result;
            return PyObject_Vectorcall(tried ? self->full : self->function, args, nargsf, kwnames);
        }
        if (entry_run_lane(self, v, &result)) return result;
    }
    return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
}

/* entry.laned(...): a collective's call, with its arguments, run in its
 * lane: True; or False, having done nothing, where it has none (the MPI
 * layer's hot paths: they fall back to their own full paths). */
static PyObject *entry_laned(Entry *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *v[ENTRY_ARGS] = {NULL}, *result = NULL;
    if (self->kind >= ENTRY_P2P || !entry_parse(self, args, nargs, kwnames, v)) Py_RETURN_FALSE;
    int ran = entry_run_lane(self, v, &result);
    if (ran < 0) return NULL;
    Py_XDECREF(result);
    return PyBool_FromLong(ran);
}

static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int kind, tag_shift = 0;
    PyObject *function, *name, *op_type, *full = Py_None, *completed = Py_None;
    if (!PyArg_ParseTuple(args, "iOUO!|OOi", &kind, &function, &name, &PyType_Type, &op_type, &full, &completed,
                          &tag_shift)) return NULL;
    int p2p = kind >= ENTRY_P2P;
    if (kind < 0 || kind >= NENTRIES || !PyCallable_Check(function)
        || (p2p && (!PyCallable_Check(full) || !PyType_Check(completed)
                    || tag_shift <= 0 || tag_shift >= 63))) {
        PyErr_SetString(PyExc_ValueError, "Entry(kind, function, name, ReduceOp[, full, completed, "
                        "tag_shift]): no such kind, not callable, or a point-to-point kind without the rest");
        return NULL;
    }
    Entry *self = (Entry *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->kind = kind;
    self->tag_shift = tag_shift;
    self->full = Py_NewRef(full);
    self->completed = Py_NewRef(completed);
    entry_register(self, 1);  /* (past MAX_ENTRIES, its routes and memos stay until it goes) */
    self->function = Py_NewRef(function);
    self->name = Py_NewRef(name);
    self->op_type = Py_NewRef(op_type);
    self->vectorcall = (vectorcallfunc)entry_vectorcall;
    if (!(self->sum = PyObject_GetAttr(op_type, names[N_SUM]))) { Py_DECREF(self); return NULL; }
    /* What inspect, help() and pickle see: the Python function's. */
    if (!(self->dict = PyDict_New())) { Py_DECREF(self); return NULL; }
    static const char *copied[] = {"__doc__", "__name__", "__qualname__", "__module__", NULL};
    for (int i = 0; copied[i]; i++) {
        PyObject *value = PyObject_GetAttrString(function, copied[i]);
        if (!value || PyDict_SetItemString(self->dict, copied[i], value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(self);
            return NULL;
        }
        Py_DECREF(value);
    }
    if (PyDict_SetItemString(self->dict, "__wrapped__", function) < 0) { Py_DECREF(self); return NULL; }
    return (PyObject *)self;
}

/* Pickled by name, as the function it stands for. */
static PyObject *entry_reduce(Entry *self, PyObject *unused) {
    return PyObject_GetAttrString(self->function, "__qualname__");
}

static PyObject *entry_repr(Entry *self) {
    return PyUnicode_FromFormat("<collie entry %R>", self->function);
}

static PyMethodDef entry_methods[] = {
    {"__reduce__", (PyCFunction)entry_reduce, METH_NOARGS, "Pickled by name."},
    {"laned", (PyCFunction)(void (*)(void))entry_laned, METH_FASTCALL | METH_KEYWORDS,
     "laned(...) -> whether the call ran in its lane (False: nothing was done)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collie._core.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A public function with a way through C for its repeated calls (collectives.py, p2p.py).",
    .tp_new = entry_new,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Entry, vectorcall),
    .tp_dictoffset = offsetof(Entry, dict),
    .tp_methods = entry_methods,
    .tp_repr = (reprfunc)entry_repr,
};

/* set_thread_spin(seconds) -> the bound it had: from now on this thread's
 * receives spin at most that long before handing back (a negative value:
 * the programs' own spin). For a thread that runs asynchronous calls beside
 * its process's compute. */
static PyObject *py_set_thread_spin(PyObject *self, PyObject *args) {
    double seconds, before = thread_spin;
    if (!PyArg_ParseTuple(args, "d", &seconds)) return NULL;
    thread_spin = seconds;
    return PyFloat_FromDouble(before);
}

/* vm_read(pid, dst, address) / vm_write(pid, address, src): transports/cma.py's
 * read and write, as one call (the GIL let go) instead of ctypes'. */
static PyObject *vm_call(PyObject *args, int write) {
    int pid, rc, err = 0;
    Py_buffer buf;
    unsigned long long address;
    long long key[RDV_WORDS_REGISTERED - RDV_WORDS] = {0};
    int keyed = PyTuple_GET_SIZE(args) > 3;
    if (write ? !PyArg_ParseTuple(args, "iKy*|LLLL", &pid, &address, &buf, &key[0], &key[1], &key[2], &key[3])
              : !PyArg_ParseTuple(args, "iw*K|LLLL", &pid, &buf, &address, &key[0], &key[1], &key[2], &key[3]))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    int64_t words[RDV_WORDS_REGISTERED - RDV_WORDS] = {key[0], key[1], key[2], key[3]};
    rc = move_registered(pid, keyed ? words : NULL, buf.buf, (int64_t)address, buf.len, write);
    if (rc) err = errno;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (rc) {
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "is", err, strerror(err));
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_vm_read(PyObject *self, PyObject *args) { return vm_call(args, 0); }
static PyObject *py_vm_write(PyObject *self, PyObject *args) { return vm_call(args, 1); }

/* ------------------------------------------------------------ object slots */

/* The object collectives' first rounds (objects.py) move a slot of
 * ``slot`` bytes per rank: the pickle's size as a little-endian int64, then
 * the pickle itself when it fits. Packing and reading them here keeps a
 * small object's call to its pickling and one collective. */

static void put_le64(unsigned char *at, int64_t v) {
    for (int i = 0; i < 8; i++) at[i] = (unsigned char)((uint64_t)v >> (8 * i));
}

static int64_t get_le64(const unsigned char *at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)at[i] << (8 * i);
    return (int64_t)v;
}

/* Slot i of the ``len`` bytes at ``buf`` gets payloads[i]'s size, then
 * payloads[i] (bytes-like) if it fits: 1 all fit, 0 not all, -1 on error. */
static int pack_into(char *buf, Py_ssize_t len, PyObject *payloads, Py_ssize_t slot) {
    PyObject *fast = PySequence_Fast(payloads, "pack_slots: payloads must be a sequence");
    if (!fast) return -1;
    int fits = 1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (slot < 8 || n * slot > len) {
        PyErr_Format(PyExc_ValueError, "pack_slots: %zd slots of %zd bytes do not fit in %zd bytes", n, slot, len);
        fits = -1;
    }
    for (Py_ssize_t i = 0; fits >= 0 && i < n; i++) {
        Py_buffer src;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &src, PyBUF_SIMPLE) < 0) {
            fits = -1;
            break;
        }
        unsigned char *at = (unsigned char *)buf + i * slot;
        put_le64(at, src.len);
        if (src.len <= slot - 8) memcpy(at + 8, src.buf, src.len);
        else fits = 0;
        PyBuffer_Release(&src);
    }
    Py_DECREF(fast);
    return fits;
}

/* (items, large) from the first ``n`` slots of the ``len`` bytes at
 * ``buf``: items[i] is loads(slot i's pickle) (its bytes where ``loads``
 * is None), or None where the pickle did not fit; ``large`` lists those as
 * (i, size) pairs, or is None when all fit. */
static PyObject *unpack_from(const char *buf, Py_ssize_t len, Py_ssize_t n, Py_ssize_t slot, PyObject *loads) {
    PyObject *items = NULL, *large = NULL, *result = NULL;
    if (n < 0 || slot < 8 || n * slot > len) {
        PyErr_Format(PyExc_ValueError, "unpack_slots: %zd slots of %zd bytes are not in %zd bytes", n, slot, len);
        return NULL;
    }
    if (!(items = PyList_New(n))) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *at = buf + i * slot;
        int64_t size = get_le64((const unsigned char *)at);
        PyObject *item;
        if (size < 0 || size > slot - 8) {
            PyObject *pair = Py_BuildValue("nL", i, (long long)size);
            if (!pair || (!large && !(large = PyList_New(0))) || PyList_Append(large, pair) < 0) {
                Py_XDECREF(pair);
                goto out;
            }
            Py_DECREF(pair);
            item = Py_NewRef(Py_None);
        } else {  /* bytes: a slot's few hundred cost less to copy than pickle.loads pays for a view */
            item = PyBytes_FromStringAndSize(at + 8, size);
            if (item && loads != Py_None) Py_SETREF(item, PyObject_CallOneArg(loads, item));
        }
        if (!item) goto out;
        PyList_SET_ITEM(items, i, item);
    }
    result = PyTuple_Pack(2, items, large ? large : Py_None);
out:
    Py_XDECREF(items);
    Py_XDECREF(large);
    return result;
}

/* pack_slots(buffer, payloads, slot) -> whether every payload fit: slot i
 * of the writable ``buffer`` gets payloads[i] (bytes-like). */
static PyObject *py_pack_slots(PyObject *self, PyObject *args) {
    PyObject *seq;
    Py_buffer dst;
    Py_ssize_t slot;
    if (!PyArg_ParseTuple(args, "w*On", &dst, &seq, &slot)) return NULL;
    int fits = pack_into(dst.buf, dst.len, seq, slot);
    PyBuffer_Release(&dst);
    return fits < 0 ? NULL : PyBool_FromLong(fits);
}

/* unpack_slots(buffer, n, slot, loads) -> (items, large): see unpack_from. */
static PyObject *py_unpack_slots(PyObject *self, PyObject *args) {
    Py_buffer src;
    Py_ssize_t n, slot;
    PyObject *loads;
    if (!PyArg_ParseTuple(args, "y*nnO", &src, &n, &slot, &loads)) return NULL;
    PyObject *result = unpack_from(src.buf, src.len, n, slot, loads);
    PyBuffer_Release(&src);
    return result;
}

/* slots_round(name, group, root, slots, payloads, loads) -> (fits, items,
 * large), or None where the call has no lane yet (nothing done: the
 * caller's full path runs it, objects.py's, whose contract this is). The
 * first round of an object collective through a group's slots
 * (objects._Slots), in one call: ``payloads`` (pickles) packed into the
 * slots, the call's lane, then what came in unpacked through ``loads``
 * (items and large as unpack_slots gives them, else None). ``name``:
 * - "gather" on group rank ``root``: this rank's one payload into
 *   ``mine``; at the root, every rank's slot comes in (``every``);
 * - "scatter" from ``root``: the root's one payload per rank into
 *   ``outgoing`` (None on the other ranks, which get their own slot);
 * - "all_gather": this rank's payload; every rank's comes in (``root``
 *   None);
 * - "all_to_all": one payload per rank; every rank's for this one comes in.
 * ``fits``: whether the payloads fit their slots. A small object call
 * spent a third of its time in the Python between those steps when they
 * were separate calls. */
enum { ROUND_SCATTER, ROUND_GATHER, ROUND_ALL_GATHER, ROUND_ALL_TO_ALL, NROUNDS };
static const char *round_names[NROUNDS] = {"scatter", "gather", "all_gather", "all_to_all"};

/* The _Slots object of the last round, its arrays' buffers held (they are
 * made once and never change) and the lane key of its last call of each
 * kind: asking NumPy for three buffers and making the key cost a small
 * gather a quarter of its time. */
static struct {
    PyObject *slots;              /* a strong reference (so no other object takes its place), or NULL */
    PyObject *mine, *every, *outgoing;
    Py_buffer bm, be, bo;
    PyObject *keys[NROUNDS];      /* as collectives.py makes its lane's key, or NULL */
} rounds;

static void rounds_forget(void) {
    if (!rounds.slots) return;
    PyBuffer_Release(&rounds.bm);
    PyBuffer_Release(&rounds.be);
    PyBuffer_Release(&rounds.bo);
    Py_CLEAR(rounds.mine);
    Py_CLEAR(rounds.every);
    Py_CLEAR(rounds.outgoing);
    for (int k = 0; k < NROUNDS; k++) Py_CLEAR(rounds.keys[k]);
    Py_CLEAR(rounds.slots);
}

/* Make ``slots`` the one held (0), -1 on error (none held). */
static int rounds_hold(PyObject *slots) {
    if (rounds.slots == slots) return 0;
    rounds_forget();
    const int flags = PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS;
    int held = 0;
    if ((rounds.mine = PyObject_GetAttr(slots, names[N_MINE])) && PyObject_GetBuffer(rounds.mine, &rounds.bm, flags) == 0) {
        held = 1;
        if ((rounds.every = PyObject_GetAttr(slots, names[N_EVERY]))
            && PyObject_GetBuffer(rounds.every, &rounds.be, flags) == 0) {
            held = 2;
            if ((rounds.outgoing = PyObject_GetAttr(slots, names[N_OUTGOING]))
                && PyObject_GetBuffer(rounds.outgoing, &rounds.bo, flags) == 0)
                held = 3;
        }
    }
    if (held == 3) {
        rounds.slots = Py_NewRef(slots);
        return 0;
    }
    if (held > 0) PyBuffer_Release(&rounds.bm);
    if (held > 1) PyBuffer_Release(&rounds.be);
    Py_CLEAR(rounds.mine);
    Py_CLEAR(rounds.every);
    Py_CLEAR(rounds.outgoing);
    return -1;
}

/* The lane key of a round of kind ``kind`` on the held slots, as
 * collectives.py makes it (rooted_blocks': name, dtype, size, root;
 * _two_array_key's: name, dtype, the input's shape, the output's, no
 * algorithm), borrowed: the held one where it is for ``root``. NULL on error. */
static PyObject *rounds_key(PyObject *name, int kind, PyObject *root) {
    PyObject *key = rounds.keys[kind];
    if (key) {
        if (kind >= ROUND_ALL_GATHER) return key;
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(key, 3), root, Py_EQ);
        if (same) return same < 0 ? NULL : key;
    }
    PyObject *in = kind == ROUND_ALL_TO_ALL ? rounds.outgoing : rounds.mine;
    PyObject *dtype = PyObject_GetAttr(rounds.mine, names[N_DTYPE]), *a = NULL, *b = NULL;
    key = NULL;
    if (dtype && kind < ROUND_ALL_GATHER) {
        if ((a = PyObject_GetAttr(rounds.mine, names[N_SIZE]))) key = PyTuple_Pack(4, name, dtype, a, root);
    } else if (dtype && (a = PyObject_GetAttr(in, names[N_SHAPE])) && (b = PyObject_GetAttr(rounds.every, names[N_SHAPE]))) {
        key = PyTuple_Pack(5, name, dtype, a, b, Py_None);
    }
    Py_XDECREF(dtype);
    Py_XDECREF(a);
    Py_XDECREF(b);
    if (key) Py_XSETREF(rounds.keys[kind], key);
    return key;
}

static PyObject *py_slots_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "slots_round(name, group, root, slots, payloads, loads)");
        return NULL;
    }
    PyObject *name = args[0], *group = args[1], *root = args[2], *slots = args[3], *payloads = args[4];
    PyObject *loads = args[5];
    static PyObject *interned[NROUNDS];  /* the names, as Python's literals are: most often the same object */
    int kind = 0;
    for (; kind < NROUNDS; kind++) {
        if (!interned[kind] && !(interned[kind] = PyUnicode_InternFromString(round_names[kind]))) return NULL;
        if (name == interned[kind] || (PyUnicode_Check(name) && PyUnicode_Compare(name, interned[kind]) == 0)) break;
    }
    if (kind == NROUNDS) {
        PyErr_Format(PyExc_ValueError, "slots_round: name must be \"gather\", \"scatter\", \"all_gather\" or "
                                       "\"all_to_all\", not %R", name);
        return NULL;
    }
    PyObject *key, *lane = NULL, *rank = NULL, *arrays = NULL, *ran = NULL, *got = NULL, *result = NULL;
    PyObject *mine = NULL, *every = NULL, *outgoing = NULL;
    if (rounds_hold(slots) < 0 || !(key = rounds_key(name, kind, root))
        || !(lane = lane_of(group, key, NULL)))  /* (the slots' arrays: writable and C-contiguous, as held) */
        goto out;
    if (lane == Py_None) {
        result = Py_NewRef(Py_None);
        goto out;
    }
    /* (our own references: another thread's round may hold other slots by the time the lane returns) */
    mine = Py_NewRef(rounds.mine);
    every = Py_NewRef(rounds.every);
    outgoing = Py_NewRef(rounds.outgoing);
    Py_buffer bm = rounds.bm, be = rounds.be, bo = rounds.bo;  /* (copies of the held views: not released) */
    int is_root = 0;
    if (kind < ROUND_ALL_GATHER) {
        if (!(rank = group_attr(group, N_RANK))) goto out;
        if ((is_root = PyObject_RichCompareBool(rank, root, Py_EQ)) < 0) goto out;
    }
    int fits = 1, one = kind == ROUND_GATHER || kind == ROUND_ALL_GATHER;  /* this rank's one payload, or one per rank */
    if (payloads != Py_None) {
        fits = one ? pack_into(bm.buf, bm.len, payloads, bm.len) : pack_into(bo.buf, bo.len, payloads, bm.len);
        if (fits < 0) goto out;
    }
    /* the lane's arrays in sorted order, "in" then "out" */
    switch (kind) {
    case ROUND_GATHER: arrays = is_root ? PyTuple_Pack(2, mine, every) : PyTuple_Pack(1, mine); break;
    case ROUND_SCATTER: arrays = is_root ? PyTuple_Pack(2, outgoing, mine) : PyTuple_Pack(1, mine); break;
    case ROUND_ALL_GATHER: arrays = PyTuple_Pack(2, mine, every); break;
    default: arrays = PyTuple_Pack(2, outgoing, every);
    }
    if (!arrays) goto out;
    ran = Py_IS_TYPE(lane, &LaneType) ? lane_call((Lane *)lane, arrays, NULL) : PyObject_Call(lane, arrays, NULL);
    if (!ran) goto out;
    if (kind == ROUND_SCATTER ? !is_root : kind != ROUND_GATHER || is_root)  /* what came in: every slot, or its own */
        got = kind == ROUND_SCATTER ? unpack_from(bm.buf, bm.len, 1, bm.len, loads)
                                    : unpack_from(be.buf, be.len, be.len / bm.len, bm.len, loads);
    else
        got = PyTuple_Pack(2, Py_None, Py_None);
    if (got) result = PyTuple_Pack(3, fits ? Py_True : Py_False, PyTuple_GET_ITEM(got, 0), PyTuple_GET_ITEM(got, 1));
out:
    Py_XDECREF(mine);
    Py_XDECREF(every);
    Py_XDECREF(outgoing);
    Py_XDECREF(lane);
    Py_XDECREF(rank);
    Py_XDECREF(arrays);
    Py_XDECREF(ran);
    Py_XDECREF(got);
    return result;
}

/* ------------------------------------------------- the MPI layer's envelopes
 *
 * collie.MPI matches messages in Python (compat/mpi/p2p.py's _Matcher),
 * each message an envelope (the MPI tag, the payload's size, a sync id)
 * with a small payload in place. Its blocking calls come here first: a
 * send whose payload rides in its envelope (mpi_send, also for a small
 * isend), a receive from one rank or any while the communicator has
 * nothing else that could match (mpi_recv, also for a waited irecv that
 * is the only one posted), the two at once (mpi_exchange), and a waited
 * receive request's next envelope (mpi_envelope). Each checks what the matcher
 * would (the live world, nothing broken, the core chosen; a peer and a tag
 * it may take) and moves the envelope by the core's one-message program
 * for that peer, under the network's lock; whatever it does not do it
 * hands back untouched, and the full path does it. An envelope taken here
 * that the receive cannot have goes to the matcher's books
 * (_Matcher._envelope), as if progress had taken it in. A small sendrecv
 * was mostly the Python around those steps (eight calls). The matcher's
 * books are read at their slots' offsets (set_matcher). */

static Py_ssize_t matcher_at[NNAMES];
static PyTypeObject *matcher_type;
static const int matcher_names[] = {N_GROUP, N_NETWORK, N_LOCK, N_RANK, N_SIZE, N_ETAG, N_POSTED, N_UNMATCHED,
                                    N_ENVELOPES, N_PROBES, N_M_LOST, N_CORE_SENDS, N_CORE_RECVS, N_ENVELOPE_IN, N_INTER,
                                    -1};

/* p2p._by_etag: an intracommunicator's envelope tag -> a weak reference to
 * its matcher (see envelope_aside). */
static PyObject *envelope_matchers;

/* set_matcher(_Matcher, by_etag): where its books are (compat/mpi/p2p.py, at import). */
static PyObject *py_set_matcher(PyObject *self, PyObject *args) {
    PyObject *type, *by_etag;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &type, &PyDict_Type, &by_etag)) return NULL;
    if (slot_offsets(type, matcher_names, matcher_at) < 0) return NULL;
    Py_XSETREF(matcher_type, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(envelope_matchers, Py_NewRef(by_etag));
    Py_RETURN_NONE;
}

/* ---- Appended(func, last): func(*args, last), without a Python frame
 *
 * MPI.pickle's dumps, pickle.dumps(obj, protocol), is called by every
 * lowercase call; a Python function around it cost a third more than the
 * pickling of a small object. */
typedef struct {
    PyObject_HEAD
    PyObject *func, *last;
    vectorcallfunc vectorcall;
} Appended;

static PyObject *appended_call(Appended *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nkw) {
        PyErr_SetString(PyExc_TypeError, "takes positional arguments only");
        return NULL;
    }
    PyObject *small[4], **all = n < 4 ? small : PyMem_Malloc((n + 1) * sizeof(PyObject *));
    if (!all) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) all[i] = args[i];
    all[n] = self->last;
    PyObject *result = PyObject_Vectorcall(self->func, all, n + 1, NULL);
    if (all != small) PyMem_Free(all);
    return result;
}

static PyObject *appended_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *func, *last;
    if (!PyArg_ParseTuple(args, "OO:Appended", &func, &last)) return NULL;
    if (!PyCallable_Check(func)) {
        PyErr_SetString(PyExc_TypeError, "Appended(func, last): func must be callable");
        return NULL;
    }
    Appended *self = (Appended *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->func = Py_NewRef(func);
    self->last = Py_NewRef(last);
    self->vectorcall = (vectorcallfunc)appended_call;
    return (PyObject *)self;
}

static int appended_traverse(Appended *self, visitproc visit, void *arg) {
    Py_VISIT(self->func);
    Py_VISIT(self->last);
    return 0;
}

static int appended_clear(Appended *self) {
    Py_CLEAR(self->func);
    Py_CLEAR(self->last);
    return 0;
}

static void appended_dealloc(Appended *self) {
    PyObject_GC_UnTrack(self);
    appended_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *appended_repr(Appended *self) {
    return PyUnicode_FromFormat("Appended(%R, %R)", self->func, self->last);
}

static PyTypeObject AppendedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collie._core.Appended",
    .tp_basicsize = sizeof(Appended),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Appended(func, last): calling it calls func(*args, last).",
    .tp_new = appended_new,
    .tp_traverse = (traverseproc)appended_traverse,
    .tp_clear = (inquiry)appended_clear,
    .tp_dealloc = (destructor)appended_dealloc,
    .tp_repr = (reprfunc)appended_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Appended, vectorcall),
};

/* ---- a request's fields (RequestFields, the base of compat/mpi's Request)
 *
 * A request's state lives in C, where the core's waits read and write it
 * at once: as attributes of a Python instance they cost the core a look-up
 * by name each (a tenth of a microsecond, ten of them per completed
 * receive: a quarter of its time). Python reads and sets them as
 * attributes as before (getters and setters here). A copy
 * (MPI.Request(req): the same request) shares the original's fields: its
 * ``f`` points at them, and it keeps the original (``owner``) alive. */
enum { F_NETWORK, F_TIMEOUT, F_SENDS, F_RECV, F_MATCHER, F_WORK, F_KEEP, F_AFTER, F_SYNC, F_CANCELLED, F_PULLED,
       F_ERROR, F_RESULT, F_DONE, F_STATUS, NFIELDS };
static const char *field_names[NFIELDS] = {"_network", "_timeout", "_sends", "_recv", "_matcher", "_work", "_keep",
                                           "_after", "_sync", "_cancelled", "_pulled", "_error", "_result", "_done",
                                           "_status"};

typedef struct {
    PyObject_HEAD
    PyObject **f;             /* own, or the original's where this is a copy */
    PyObject *owner;          /* the original (NULL: this is one) */
    PyObject *own[NFIELDS];
} Fields;

static PyTypeObject FieldsType;
static PyObject *default_timeout;  /* 300.0: the MPI layer's timeout where none is given */
static PyObject *waitall_all, *waitall_rest, *waitall_pickle;  /* see set_waitall */

/* MPI.pickle's dumps and loads where they are plain functions (pickle's,
 * which Pickle sets on the instance: set_pickle, whenever they change);
 * NULL: its methods, looked up by name (a look-up was a tenth of a small
 * isend). */
static PyObject *pickle_dumps_fn, *pickle_loads_fn;

/* set_pickle(dumps, loads): see above (None: look them up). */
static PyObject *py_set_pickle(PyObject *self, PyObject *args) {
    PyObject *dumps, *loads;
    if (!PyArg_ParseTuple(args, "OO", &dumps, &loads)) return NULL;
    Py_CLEAR(pickle_dumps_fn);
    Py_CLEAR(pickle_loads_fn);
    if (dumps != Py_None) pickle_dumps_fn = Py_NewRef(dumps);
    if (loads != Py_None) pickle_loads_fn = Py_NewRef(loads);
    Py_RETURN_NONE;
}

/* MPI.pickle's dumps (N_DUMPS) or loads (N_LOADS) as it is now, a new reference. */
static PyObject *pickle_fn(int name) {
    PyObject *f = name == N_DUMPS ? pickle_dumps_fn : pickle_loads_fn;
    if (f) return Py_NewRef(f);
    if (!waitall_pickle) {
        PyErr_SetString(PyExc_RuntimeError, "MPI.pickle is not known to the core yet (set_waitall)");
        return NULL;
    }
    return PyObject_GetAttr(waitall_pickle, names[name]);
}

/* loads(data), ``loads`` NULL: MPI.pickle's loads as it is now. */
static PyObject *call_loads(PyObject *loads, PyObject *data) {
    if (loads) return PyObject_CallOneArg(loads, data);
    PyObject *now = pickle_fn(N_LOADS);
    PyObject *obj = now ? PyObject_CallOneArg(now, data) : NULL;
    Py_XDECREF(now);
    return obj;
}

/* field i of request ``r`` (a Fields), borrowed */
#define FIELD(r, i) (((Fields *)(r))->f[i])

/* Set field i of ``r`` to ``v`` (a new reference, stolen). */
static void field_put(PyObject *r, int i, PyObject *v) {
    Py_SETREF(((Fields *)r)->f[i], v);
}

/* A request of ``type`` (a subtype of RequestFields) as Request.__new__
 * makes one: active, nothing to do yet (the fields' defaults, which
 * request.py's pure-Python _Fields has as class attributes). */
static PyObject *fields_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Fields *self = (Fields *)PyBaseObject_Type.tp_new(type, no_requests, NULL);  /* (its __dict__ set up too) */
    if (!self) return NULL;
    self->f = self->own;
    for (int i = 0; i < NFIELDS; i++)
        self->own[i] = Py_NewRef(i == F_TIMEOUT ? default_timeout : i == F_SENDS ? no_requests
                                 : i == F_CANCELLED || i == F_PULLED || i == F_DONE ? Py_False : Py_None);
    return (PyObject *)self;
}

static int fields_traverse(Fields *self, visitproc visit, void *arg) {
    for (int i = 0; i < NFIELDS; i++) Py_VISIT(self->own[i]);
    Py_VISIT(self->owner);
    return 0;
}

/* (The cycle collector's: every field None from now on, never NULL, so
 * that a finalizer that still waits on the request reads Nones.) */
static int fields_clear(Fields *self) {
    for (int i = 0; i < NFIELDS; i++) Py_XSETREF(self->own[i], Py_NewRef(Py_None));
    self->f = self->own;
    Py_CLEAR(self->owner);
    return 0;
}

static void fields_dealloc(Fields *self) {
    PyObject_GC_UnTrack(self);
    for (int i = 0; i < NFIELDS; i++) Py_CLEAR(self->own[i]);
    Py_CLEAR(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *field_get(Fields *self, void *i) {
    PyObject *v = self->f[(intptr_t)i];
    return Py_NewRef(v ? v : Py_None);
}

static int field_set(Fields *self, PyObject *v, void *i) {
    if (!v) {
        PyErr_Format(PyExc_AttributeError, "a request's %s cannot be deleted", field_names[(intptr_t)i]);
        return -1;
    }
    Py_XSETREF(self->f[(intptr_t)i], Py_NewRef(v));
    return 0;
}

/* _adopt(original): this request becomes a copy of ``original`` (the
 * copy constructors, with the __dict__ shared by request.py's _share). */
static PyObject *fields_adopt(Fields *self, PyObject *original) {
    if (!PyObject_TypeCheck(original, &FieldsType)) {
        PyErr_SetString(PyExc_TypeError, "_adopt(original): not a request");
        return NULL;
    }
    Fields *o = (Fields *)original;
    PyObject *owner = Py_NewRef(o->owner ? o->owner : original);
    Py_XSETREF(self->owner, owner);
    self->f = o->f;
    Py_RETURN_NONE;
}

static PyGetSetDef fields_getset[NFIELDS + 1];  /* one per field (made at import) */

static PyObject *fields_Wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
static PyObject *fields_wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

static PyMethodDef fields_methods[] = {
    {"_adopt", (PyCFunction)fields_adopt, METH_O, "_adopt(original): share its fields (a copy of it)."},
    {"Wait", (PyCFunction)(void (*)(void))fields_Wait, METH_FASTCALL | METH_KEYWORDS,
     "Wait($self, /, status=None)\n--\n\nWait for the operation to complete; True."},
    {"wait", (PyCFunction)(void (*)(void))fields_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait($self, /, status=None)\n--\n\nWait for the operation to complete; the received object of an irecv "
     "(None for the others)."},
    {NULL},
};

static PyTypeObject FieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collie._core.RequestFields",
    .tp_basicsize = sizeof(Fields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A request's state, where the core reads it (the base of compat/mpi's Request).",
    .tp_new = fields_new,
    .tp_traverse = (traverseproc)fields_traverse,
    .tp_clear = (inquiry)fields_clear,
    .tp_dealloc = (destructor)fields_dealloc,
    .tp_getset = fields_getset,
    .tp_methods = fields_methods,
};

/* Ready RequestFields: a getter and setter per field. */
static int fields_ready(void) {
    for (intptr_t i = 0; i < NFIELDS; i++)
        fields_getset[i] = (PyGetSetDef){field_names[i], (getter)field_get, (setter)field_set, NULL, (void *)i};
    if (!default_timeout && !(default_timeout = PyFloat_FromDouble(300.0))) return -1;
    return PyType_Ready(&FieldsType);
}

/* The MPI layer's requests, made here for the plain nonblocking calls
 * (mpi_isend, mpi_irecv): a Request as request.py's _done_request and
 * _receive make one (object.__new__, then its attributes), and the posted
 * receive (_Recv, whose slots are at recv_at). Python's frames for an
 * irecv (its checks, the _Recv, the post, the Request) were two thirds
 * of its time. set_request_types(_Recv, Request, _Message), at
 * request.py's import; before it the calls take the full path. */
static PyTypeObject *recv_type, *request_type, *message_type;
static Py_ssize_t recv_at[NNAMES], message_at[NNAMES];
static const int recv_names[] = {N_SOURCE, N_TAG, N_DST, N_MSG, N_CANCELLED, N_ERROR, -1};
static const int message_names[] = {N_SOURCE, N_TAG, N_NBYTES, N_DATA, N_REQ, N_MATCHED, N_SYNC_ID, -1};

static PyObject *py_set_request_types(PyObject *self, PyObject *args) {
    PyObject *recv, *request, *message;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &recv, &PyType_Type, &request, &PyType_Type, &message))
        return NULL;
    if (slot_offsets(recv, recv_names, recv_at) < 0 || slot_offsets(message, message_names, message_at) < 0)
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)request, &FieldsType)) {
        PyErr_SetString(PyExc_TypeError, "set_request_types: the Request type must derive from RequestFields");
        return NULL;
    }
    Py_XSETREF(recv_type, (PyTypeObject *)Py_NewRef(recv));
    Py_XSETREF(request_type, (PyTypeObject *)Py_NewRef(request));
    Py_XSETREF(message_type, (PyTypeObject *)Py_NewRef(message));
    Py_RETURN_NONE;
}

/* A new instance of ``type`` as object.__new__(type) makes it. */
static PyObject *bare_instance(PyTypeObject *type) {
    return PyBaseObject_Type.tp_new(type, no_requests, NULL);
}

/* A new Request whose fields which[i] are values[i] (borrowed). */
static PyObject *request_with(const int *which, PyObject *const *values, int n) {
    PyObject *r = fields_new(request_type, NULL, NULL);
    for (int i = 0; r && i < n; i++) field_put(r, which[i], Py_NewRef(values[i]));
    return r;
}

/* ``o`` as a long long in [lo, hi), or LLONG_MIN where it is not a plain
 * int there (the full path checks it and explains). */
static long long plain_int(PyObject *o, long long lo, long long hi) {
    if (!PyLong_CheckExact(o)) return LLONG_MIN;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    return overflow || v < lo || v >= hi ? LLONG_MIN : v;
}

/* A matcher's int slot (rank, size, etag): LLONG_MIN with an error if unset. */
static long long matcher_int(PyObject *m, int name) {
    PyObject *v = slot_attr(m, matcher_at, name);
    int overflow = 0;  /* (AndOverflow: a loop over the digits, where PyLong_AsLongLong copies bytes for a large one) */
    long long x = v ? PyLong_AsLongLongAndOverflow(v, &overflow) : -1;
    if (overflow) PyErr_Format(PyExc_OverflowError, "the matcher's %U is out of range", names[name]);
    return (x == -1 && PyErr_Occurred()) || overflow ? LLONG_MIN : x;
}

/* Whether the core may move matcher ``m``'s envelopes: the core chosen,
 * the matcher's network the live world's, nothing broken. 1 yes, 0 no, -1
 * on error. */
static int matcher_live(PyObject *m) {
    if (!core_chosen) return 0;
    PyObject *w = the_world();
    if (!w) return PyErr_Occurred() ? -1 : 0;
    PyObject *net = slot_attr(m, matcher_at, N_NETWORK), *wnet;
    if (!net || !hot_known(w, world_type, "world") || !(wnet = slot_attr(w, world_at, N_NETWORK))) return -1;
    if (wnet != net) return 0;
    int broken = network_broken(net);
    return broken < 0 ? -1 : !broken;
}

/* The core's program for an envelope to (or, ``receiving``, from) group
 * rank ``rank`` of a live matcher ``m`` (see matcher_live): a new reference
 * (the matcher makes it on first use), or NULL, with an error or without
 * (the core can't: the full path). */
static CoreProgram *matcher_program(PyObject *m, long long rank, int receiving) {
    PyObject *programs = slot_attr(m, matcher_at, receiving ? N_CORE_RECVS : N_CORE_SENDS);
    if (!programs || !PyList_Check(programs) || rank >= PyList_GET_SIZE(programs)) return NULL;
    PyObject *p = PyList_GET_ITEM(programs, rank);
    if (p == Py_False) {  /* not made yet: the matcher makes it (into the list) */
        PyObject *r = PyLong_FromLongLong(rank);
        p = r ? PyObject_CallMethodObjArgs(m, names[N_CORE_PROGRAM], r, receiving ? Py_True : Py_False, NULL) : NULL;
        Py_XDECREF(r);
        if (!p) return NULL;
    } else {
        Py_INCREF(p);
    }
    if (PyObject_TypeCheck(p, &ProgramType)) return (CoreProgram *)p;
    Py_DECREF(p);
    return NULL;
}

/* ``obj``'s bytes in ``view`` (1: held, the caller releases it) where the
 * entries may move it as its raw bytes, 0 where they leave it to the full
 * path (nothing held), -1 on error: bytes (a pickle, to send), a
 * C-contiguous memoryview, or a bare NumPy array as
 * compat/mpi/buffers._bare_bytes takes one: C-contiguous, of a native plain
 * type (no objects, no swapped bytes, no fields); either writable, to
 * receive into. Any other buffer ([buf, MPI.INT], a strided or read-only
 * one...) is the full path's to read or refuse. So the buffer calls hand
 * their arrays over as they are, without making a byte view first (a
 * quarter microsecond), and each buffer is asked for once. */
#define PLAIN_DTYPES 32
static PyObject *plain_dtypes[PLAIN_DTYPES];  /* dtypes whose format plain_buffer took (held: never reused) */
static int nplain_dtypes;

static int plain_buffer(PyObject *obj, int writable, Py_buffer *view) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (ndarray_type && Py_IS_TYPE(obj, (PyTypeObject *)ndarray_type)) {
        /* An array of a dtype taken before: its bytes only (NumPy's format
         * string, made per call, was a fifth of a small send). */
        PyObject *dtype = PyObject_GetAttr(obj, names[N_DTYPE]);
        if (!dtype) {
            PyErr_Clear();
            return 0;
        }
        int known = 0;
        for (int i = 0; !known && i < nplain_dtypes; i++) known = plain_dtypes[i] == dtype;
        if (PyObject_GetBuffer(obj, view, flags | (known ? 0 : PyBUF_FORMAT)) < 0) {
            PyErr_Clear();
            Py_DECREF(dtype);
            return 0;
        }
        if (known) {
            Py_DECREF(dtype);
            return 1;
        }
        const char *f = view->format ? view->format : "B";
        if (*f == 'Z') f++;  /* complex: Zf, Zd, Zg */
        if (f[0] && !f[1] && strchr("?bBhHiIlLqQnNefdg", f[0])) {
            if (nplain_dtypes < PLAIN_DTYPES) plain_dtypes[nplain_dtypes++] = dtype;  /* (the reference kept) */
            else Py_DECREF(dtype);
            return 1;
        }
        Py_DECREF(dtype);
        PyBuffer_Release(view);
        return 0;
    }
    if (PyMemoryView_Check(obj)) {  /* (a released one: GetBuffer says so, as the full path would) */
        const Py_buffer *b = PyMemoryView_GET_BUFFER(obj);
        if (!PyBuffer_IsContiguous(b, 'C') || (writable && b->readonly)) return 0;
    } else if (!PyBytes_CheckExact(obj) || writable) {
        return 0;
    }
    return PyObject_GetBuffer(obj, view, flags) < 0 ? -1 : 1;
}

/* Messages a rank sends itself, and messages the matcher already holds.
 * A message to oneself crosses no ring: _Matcher.deliver_local copies it
 * into a _Message that the first posted receive it matches takes, or that
 * the matcher keeps unmatched, and a receive looks there before any ring
 * (_Matcher.post). The core does both as the matcher does: a message to
 * oneself took the full path, about fifty Python calls (5 us, against 0.5
 * for MPICH's), in the exchanges programs write over every rank,
 * themselves included. */

/* Whether a receive of (``source``, ``tag``) (-1: any) matches a message
 * from ``from`` with tag ``with`` (_Recv.matches). */
static int receive_matches(long long source, long long tag, long long from, long long with) {
    return (source == -1 || source == from) && tag_matches(tag, with);
}

/* An int slot (source, tag) of a _Recv or _Message: LLONG_MIN where it is
 * not a plain int (with an error where it is unset). */
static long long int_slot(PyObject *obj, const Py_ssize_t *at, int name) {
    PyObject *v = slot_attr(obj, at, name);
    return v ? plain_int(v, LLONG_MIN + 1, LLONG_MAX) : LLONG_MIN;
}

/* A standard send's message of ``d`` from group rank ``rank`` with MPI tag
 * ``tag``, all here, into an intracommunicator's matcher ``m``
 * (_Matcher._deliver): the first posted receive it matches takes it, or the
 * matcher holds it unmatched. 1 delivered, 0 left to the full path (books
 * the core does not know), -1 on error. A message to this rank itself
 * (mpi_send, mpi_exchange) and an envelope the core met in a ring
 * (envelope_aside). */
static int deliver(PyObject *m, long long rank, long long tag, const Py_buffer *d) {
    PyObject *posted = slot_attr(m, matcher_at, N_POSTED), *unmatched = slot_attr(m, matcher_at, N_UNMATCHED);
    PyObject *inter = slot_attr(m, matcher_at, N_INTER);
    if (!posted || !unmatched || !inter) return -1;
    if (!message_type || inter != Py_False || !PyList_CheckExact(posted) || !PyList_CheckExact(unmatched)) return 0;
    Py_ssize_t at = -1;  /* the posted receive that takes it */
    for (Py_ssize_t i = 0; at < 0 && i < PyList_GET_SIZE(posted); i++) {
        PyObject *op = PyList_GET_ITEM(posted, i);
        if (!Py_IS_TYPE(op, recv_type)) return 0;
        long long source = int_slot(op, recv_at, N_SOURCE), want = int_slot(op, recv_at, N_TAG);
        if (source == LLONG_MIN || want == LLONG_MIN) return PyErr_Occurred() ? -1 : 0;
        if (receive_matches(source, want, rank, tag)) at = i;
    }
    PyObject *msg = bare_instance(message_type);
    int ok = msg && slot_set(msg, message_at, N_SOURCE, PyLong_FromLongLong(rank)) == 0
             && slot_set(msg, message_at, N_TAG, PyLong_FromLongLong(tag)) == 0
             && slot_set(msg, message_at, N_NBYTES, PyLong_FromSsize_t(d->len)) == 0
             && slot_set(msg, message_at, N_DATA, PyByteArray_FromStringAndSize(d->buf, d->len)) == 0
             && slot_set(msg, message_at, N_REQ, Py_NewRef(Py_None)) == 0
             && slot_set(msg, message_at, N_MATCHED, Py_NewRef(at >= 0 ? Py_True : Py_False)) == 0
             && slot_set(msg, message_at, N_SYNC_ID, Py_NewRef(zero)) == 0;
    if (ok && at >= 0) {
        PyObject *op = Py_NewRef(PyList_GET_ITEM(posted, at));
        ok = PyList_SetSlice(posted, at, at + 1, NULL) == 0 && slot_set(op, recv_at, N_MSG, Py_NewRef(msg)) == 0;
        Py_DECREF(op);
    } else if (ok) {
        ok = PyList_Append(unmatched, msg) == 0;
    }
    Py_XDECREF(msg);
    return ok ? 1 : -1;
}

/* The envelope ``head`` (tag, size, sync id) with its payload after it at
 * ``env``, come from ``p`` with tag ``etag``, into its matcher's books
 * (deliver), as that matcher's progress would take it in: 1 delivered, 0
 * not (no such matcher, or one with an envelope of that peer's in
 * Python's hands, which comes first), -1 on error. */
static int deliver_aside(peer_t *p, int64_t etag, const int64_t *head, const char *env) {
    PyObject *key = PyLong_FromLongLong(etag);
    PyObject *ref = key ? PyDict_GetItemWithError(envelope_matchers, key) : NULL;  /* borrowed */
    Py_XDECREF(key);
    if (!ref) return PyErr_Occurred() ? -1 : 0;
    PyObject *m = PyWeakref_Check(ref) ? PyWeakref_GetObject(ref) : Py_None;
    if (!matcher_type || !Py_IS_TYPE(m, matcher_type)) return 0;
    int live = matcher_live(m);  /* (one of a world destroyed since, whose context this one reuses: not its) */
    if (live <= 0) return live;
    Py_INCREF(m);
    int rc = -1;
    PyObject *world = PyObject_GetAttr(p->in_obj, names[N_PEER]), *index = NULL, *rank;
    PyObject *group = slot_attr(m, matcher_at, N_GROUP), *envelopes = slot_attr(m, matcher_at, N_ENVELOPES);
    if (!world || !group || !envelopes || !(index = PyObject_GetAttr(group, names[N_INDEX]))) goto out;
    if (!PyDict_Check(index) || !PyDict_Check(envelopes) || !(rank = PyDict_GetItemWithError(index, world))) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto out;
    }
    rc = PyDict_Contains(envelopes, rank);  /* an envelope receive of Python's from that peer: it comes first */
    if (rc == 0) {
        long long from = plain_int(rank, 0, LLONG_MAX);
        Py_buffer d = {.buf = (void *)(env + ENVELOPE_HEAD), .len = head[1]};
        rc = from == LLONG_MIN ? 0 : deliver(m, from, head[0], &d);
    } else if (rc == 1) {
        rc = 0;
    }
out:
    Py_XDECREF(world);
    Py_XDECREF(index);
    Py_DECREF(m);
    return rc;
}

/* What run_steps does where a program finds something else than its own
 * message at the head of ``p``'s ring (FOREIGN): a standard send's MPI
 * envelope with its payload in place (the MPI layer's message, sent before
 * the call) goes to its communicator's matcher (deliver_aside) and its
 * slot is freed, so the program goes on in C: 1. Before, Python ran the
 * rest of the call, then the MPI wait found the envelope among the
 * transport's unexpected messages: 30-50 us each, where MPICH's take a
 * microsecond or two. 0: anything else (Python's turn, as before); -1 on
 * error (gil->failed). Takes the GIL back for the matcher's books where
 * the run let it go; the network's lock is held throughout. */
static int envelope_aside(peer_t *p, gil_t *gil) {
    ring_t *r = &p->in;
    int64_t tail = *r->tail;
    if (!envelope_matchers || __atomic_load_n(r->head, __ATOMIC_ACQUIRE) == tail) return 0;
    header_t h;
    memcpy(&h, r->headers + tail % r->slots * LINE, sizeof h);
    const char *env = r->payload + tail % r->slots * r->slot_bytes;
    int64_t head[3];
    if (h.meta != 0 || h.offset != 0 || h.frag != h.nbytes || h.nbytes < ENVELOPE_HEAD) return 0;
    memcpy(head, env, sizeof head);
    if (head[2] != 0 || head[1] < 0 || head[1] > h.nbytes - ENVELOPE_HEAD) return 0;  /* a sync send's; a payload apart */
    PyThreadState *saved = gil->saved;
    if (saved) PyEval_RestoreThread(saved);
    int rc = deliver_aside(p, h.tag, head, env);
    if (rc < 0) gil->failed = 1;
    if (saved) gil->saved = PyEval_SaveThread();
    if (rc == 1) free_slots(p, tail, 1);
    return rc;
}

/* The first message matcher ``m`` holds unmatched that a receive of
 * (``from``, ``want``) (-1: any) matches, as _Matcher.post looks: 1 and its
 * index in ``*at``, 0 none, 2 where the core cannot tell (the full path
 * looks), -1 on error. */
static int held_find(PyObject *m, long long from, long long want, Py_ssize_t *at) {
    PyObject *unmatched = slot_attr(m, matcher_at, N_UNMATCHED);
    if (!unmatched) return -1;
    if (!message_type || !PyList_CheckExact(unmatched)) return 2;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(unmatched); i++) {
        PyObject *msg = PyList_GET_ITEM(unmatched, i);
        if (!Py_IS_TYPE(msg, message_type)) return 2;
        long long source = int_slot(msg, message_at, N_SOURCE), tag = int_slot(msg, message_at, N_TAG);
        if (source == LLONG_MIN || tag == LLONG_MIN) return PyErr_Occurred() ? -1 : 2;
        if (receive_matches(from, want, source, tag)) {
            *at = i;
            return 1;
        }
    }
    return 0;
}

/* Take message ``at`` of the matcher's unmatched ones for a receive
 * (_Matcher.post's take and _matched, for a standard send's: nothing to
 * ack): a new reference to it, None where it is a synchronous send's
 * (the full path acks it), NULL on error. */
static PyObject *held_take(PyObject *m, Py_ssize_t at) {
    PyObject *unmatched = slot_attr(m, matcher_at, N_UNMATCHED);
    if (!unmatched) return NULL;
    PyObject *msg = PyList_GET_ITEM(unmatched, at), *sync = slot_attr(msg, message_at, N_SYNC_ID);
    if (!sync) return NULL;
    if (plain_int(sync, 0, 1) != 0) Py_RETURN_NONE;
    Py_INCREF(msg);
    if (PyList_SetSlice(unmatched, at, at + 1, NULL) < 0 || slot_set(msg, message_at, N_MATCHED, Py_NewRef(Py_True)) < 0)
        Py_CLEAR(msg);
    return msg;
}

/* A held message's payload where it is all here (no receive of it in
 * flight): its bytearray (borrowed), Py_None where it went straight into
 * the receive's buffer, NULL (no error) where it is not here or not plain;
 * its size in ``*n``. */
static PyObject *held_payload(PyObject *msg, long long *n) {
    PyObject *data = slot_attr(msg, message_at, N_DATA), *req = slot_attr(msg, message_at, N_REQ);
    PyObject *nbytes = slot_attr(msg, message_at, N_NBYTES);
    if (!data || !req || !nbytes) return NULL;
    *n = plain_int(nbytes, 0, LLONG_MAX);
    if (req != Py_None || *n == LLONG_MIN) return NULL;
    if (data == Py_None || (PyByteArray_CheckExact(data) && PyByteArray_GET_SIZE(data) == *n)) return data;
    return NULL;
}

/* A held message's status fields (source, tag, size, not cancelled), as
 * Request._finish makes them. */
static PyObject *message_fields(PyObject *msg) {
    return PyTuple_Pack(4, slot_attr(msg, message_at, N_SOURCE), slot_attr(msg, message_at, N_TAG),
                        slot_attr(msg, message_at, N_NBYTES), Py_False);
}

/* A blocking receive of (``source``, ``tag_obj``) from the messages the
 * matcher holds, first (Comm.Recv's post, then Request._finish): mpi_recv's
 * result where the core took the first one it matches (copied into
 * ``dst``; NULL: an object's, whose pickle is the payload), None where that
 * one is the full path's (its payload still coming, a synchronous send's,
 * too long for ``dst``), False where none matches (the rings are next),
 * NULL on error. */
static PyObject *held_recv(PyObject *m, PyObject *source, PyObject *tag_obj, Py_buffer *dst) {
    int empty = slot_empty(m, matcher_at, N_UNMATCHED);
    if (empty) return empty < 0 ? NULL : Py_NewRef(Py_False);
    long long size = matcher_int(m, N_SIZE);
    if (size == LLONG_MIN) return NULL;
    long long from = plain_int(source, -1, size), want = plain_int(tag_obj, -1, LLONG_MAX), n;
    Py_ssize_t at;
    int found = from == LLONG_MIN || want == LLONG_MIN ? 2 : held_find(m, from, want, &at);
    if (found != 1) return found < 0 ? NULL : Py_NewRef(found ? Py_None : Py_False);
    PyObject *msg = PyList_GET_ITEM(slot_attr(m, matcher_at, N_UNMATCHED), at);
    PyObject *data = held_payload(msg, &n);
    if (!data || data == Py_None || (dst && n > dst->len)) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    PyObject *fields = message_fields(msg);
    PyObject *taken = fields ? held_take(m, at) : NULL, *result = NULL;
    if (taken == Py_None) {
        result = Py_NewRef(Py_None);
    } else if (taken) {
        if (dst) memcpy(dst->buf, PyByteArray_AS_STRING(data), n);
        result = PyTuple_Pack(2, fields, dst ? Py_None : data);
    }
    Py_XDECREF(taken);
    Py_XDECREF(fields);
    return result;
}

/* The send half: 1 and ``data``'s buffer in ``d`` where mpi_send may send
 * ``data`` to ``dest`` with tag ``tag_obj`` (a rank of the communicator,
 * this one too, ``*me``: deliver; a tag >= 0); 0 not, -1 on error.
 * Whether the payload fits an envelope is envelope_send's to say. */
static int send_allowed(PyObject *m, PyObject *data, PyObject *dest, PyObject *tag_obj, long long *to,
                        long long *tag, long long *me, Py_buffer *d) {
    long long size = matcher_int(m, N_SIZE);
    *me = matcher_int(m, N_RANK);
    if (size == LLONG_MIN || *me == LLONG_MIN) return -1;
    *to = plain_int(dest, 0, size);
    *tag = plain_int(tag_obj, 0, LLONG_MAX);
    if (*to == LLONG_MIN || *tag == LLONG_MIN) return 0;
    return plain_buffer(data, 0, d);
}

/* The receive half: whether the core may take the next envelope for a
 * receive with tag ``tag_obj`` (``want``: it as a long long): a tag >= 0 or
 * ANY_TAG, and nothing else of the communicator that could match first
 * (posted receives, messages not yet matched, envelope receives in flight,
 * probes, lost peers); ``held_seen``: the messages not yet matched were
 * looked at, and none is this receive's (held_recv). 1 yes, 0 no, -1 on
 * error. */
static int recv_allowed(PyObject *m, PyObject *tag_obj, long long *want, int held_seen) {
    *want = plain_int(tag_obj, -1, LLONG_MAX);  /* -1: MPI.ANY_TAG */
    if (*want == LLONG_MIN) return 0;
    static const int books[] = {N_POSTED, N_ENVELOPES, N_PROBES, N_M_LOST, N_UNMATCHED};
    for (size_t i = 0; i < sizeof books / sizeof books[0] - (held_seen != 0); i++) {
        int empty = slot_empty(m, matcher_at, books[i]);
        if (empty != 1) return empty;
    }
    return 1;
}

/* The program for a receive from ``source`` (another rank) with tag
 * ``tag_obj`` where recv_allowed: NULL, with an error or without, otherwise. */
static CoreProgram *recv_program(PyObject *m, PyObject *source, PyObject *tag_obj, long long *from, long long *want,
                                 int held_seen) {
    long long size = matcher_int(m, N_SIZE), rank = matcher_int(m, N_RANK);
    if (size == LLONG_MIN || rank == LLONG_MIN) return NULL;
    *from = plain_int(source, 0, size);
    if (*from == LLONG_MIN || *from == rank || recv_allowed(m, tag_obj, want, held_seen) != 1) return NULL;
    return matcher_program(m, *from, 1);
}

/* Take ``from``'s next envelope by ``p``, under the lock: ((source, tag,
 * size, False), payload) for a receive into ``dst`` (None: an object, whose
 * pickle is the payload; else payload None), or None where the receive
 * did not complete (none came; or another envelope, now the matcher's). */
static PyObject *matcher_take(PyObject *m, CoreProgram *p, long long from, long long want, Py_buffer *dst) {
    long long etag = matcher_int(m, N_ETAG);
    PyObject *spill = slot_attr(m, matcher_at, N_ENVELOPE_IN), *payload = NULL;
    if (etag == LLONG_MIN || !spill) return NULL;
    int64_t tag = 0, size = 0;
    switch (envelope_recv(p, etag, 0, want, dst, spill, &tag, &size, &payload)) {
    case ENVELOPE_WANTED: {
        PyObject *fields = PyTuple_New(4), *result = fields ? PyTuple_New(2) : NULL;
        if (!result) {
            Py_XDECREF(fields);
            Py_XDECREF(payload);
            return NULL;
        }
        PyTuple_SET_ITEM(fields, 0, PyLong_FromLongLong(from));
        PyTuple_SET_ITEM(fields, 1, PyLong_FromLongLong(tag));
        PyTuple_SET_ITEM(fields, 2, PyLong_FromLongLong(size));
        PyTuple_SET_ITEM(fields, 3, Py_NewRef(Py_False));
        PyTuple_SET_ITEM(result, 0, fields);
        PyTuple_SET_ITEM(result, 1, payload ? payload : Py_NewRef(Py_None));
        for (int i = 0; i < 3; i++)
            if (!PyTuple_GET_ITEM(fields, i)) {
                Py_DECREF(result);
                return NULL;
            }
        return result;
    }
    case ENVELOPE_OTHER: {
        PyObject *r = PyLong_FromLongLong(from);
        PyObject *kept = r ? PyObject_CallMethodObjArgs(m, names[N_ENVELOPE], r, spill, NULL) : NULL;
        Py_XDECREF(r);
        if (!kept) return NULL;
        Py_DECREF(kept);
        Py_RETURN_NONE;
    }
    case ENVELOPE_NONE:
        Py_RETURN_NONE;
    default:
        return NULL;
    }
}

/* A receive from MPI.ANY_SOURCE by the core, under the lock: the first
 * envelope of this communicator (its envelope tag at a ring's head) from
 * any other rank, taken as matcher_take takes it, spinning at most as long
 * as a small program keeps the GIL (GIL_HOLD) for one to come. None: none
 * came, or a peer the core cannot take from (the full path receives). */
static PyObject *any_source_take(PyObject *m, long long want, Py_buffer *dst) {
    long long size = matcher_int(m, N_SIZE), rank = matcher_int(m, N_RANK), etag = matcher_int(m, N_ETAG);
    if (size == LLONG_MIN || rank == LLONG_MIN || etag == LLONG_MIN) return NULL;
    CoreProgram **from = PyMem_Calloc(size > 0 ? size : 1, sizeof *from);
    if (!from) return PyErr_NoMemory();
    PyObject *got = NULL;
    int every = 1, crowded = 0;
    double spin = GIL_HOLD;
    for (long long q = 0; q < size; q++) {
        if (q == rank) continue;
        from[q] = matcher_program(m, q, 1);
        every = from[q] && from[q]->peers[0].shm;
        if (!every) break;
        spin = fmin(spin, spin_here(from[q]->spin));
        crowded |= from[q]->crowded;
    }
    if (!every) {  /* a peer on another transport, or no program: Python's progress watches them all */
        if (!PyErr_Occurred()) got = Py_NewRef(Py_None);
        goto out;
    }
    double deadline = 0;
    for (int spun = 0;;) {
        for (long long q = 0; q < size; q++) {
            if (q == rank) continue;
            ring_t *r = &from[q]->peers[0].in;
            int64_t tail = *r->tail;
            if (__atomic_load_n(r->head, __ATOMIC_ACQUIRE) == tail) continue;
            int64_t head_tag;
            memcpy(&head_tag, r->headers + tail % r->slots * LINE, sizeof head_tag);
            if (head_tag != etag) continue;  /* another call's: not ours to take */
            got = matcher_take(m, from[q], q, want, dst);
            goto out;
        }
        double t = now_seconds();
        if (!spun) { deadline = t + spin; spun = 1; }
        else if (t >= deadline) break;
        if (crowded) sched_yield();  /* more ranks than cores: the sender may need this one */
        else __builtin_ia32_pause();
    }
    got = Py_NewRef(Py_None);
out:
    for (long long q = 0; q < size; q++) Py_XDECREF(from[q]);
    PyMem_Free(from);
    return got;
}

/* The matcher ``m`` (a communicator's, passed with its ``group``) where
 * the core may move its envelopes: made (not None), made for that group
 * (an intercommunicator's is its two groups', whose ranks it numbers
 * otherwise), and live (matcher_live). 1 yes, 0 no, -1 on error. */
static int matcher_usable(PyObject *m, PyObject *group) {
    if (m == Py_None) return 0;
    if (!matcher_type || !Py_IS_TYPE(m, matcher_type)) {
        PyErr_Format(PyExc_TypeError, "the core does not know this matcher (set_matcher): %R", m);
        return -1;
    }
    PyObject *mine = slot_attr(m, matcher_at, N_GROUP);
    if (!mine) return -1;
    return mine == group ? matcher_live(m) : 0;
}

/* mpi_send(matcher, group, data, dest, tag) -> whether the core sent
 * ``data`` (bytes, a blocking standard send's payload) to rank ``dest`` of
 * the communicator whose matcher and group these are (this rank itself
 * too: deliver): then the send is complete. False: the full path sends
 * it. */
static PyObject *py_mpi_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mpi_send(matcher, group, data, dest, tag)");
        return NULL;
    }
    PyObject *m = args[0], *lock;
    int usable = matcher_usable(m, args[1]);
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_False);
    long long to, tag, rank, etag = matcher_int(m, N_ETAG);
    if (etag == LLONG_MIN || !(lock = slot_attr(m, matcher_at, N_LOCK))) return NULL;
    Py_buffer d;
    int ok = send_allowed(m, args[2], args[3], args[4], &to, &tag, &rank, &d);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_False);
    if (rank == to) {  /* to this rank itself */
        int sent = deliver(m, rank, tag, &d);
        PyBuffer_Release(&d);
        return sent < 0 ? NULL : PyBool_FromLong(sent);
    }
    int sent = -1;
    CoreProgram *p = matcher_program(m, to, 0);
    if (p && lock_take(lock) == 0) {
        sent = envelope_send(p, etag, tag, d.buf, d.len);
        if (lock_give(lock) < 0) sent = -1;
    } else if (!p && !PyErr_Occurred()) {
        sent = 0;
    }
    Py_XDECREF(p);
    PyBuffer_Release(&d);
    return sent < 0 ? NULL : PyBool_FromLong(sent);
}

/* mpi_recv(matcher, group, dst, source, tag) -> ((source, tag, size,
 * False), payload) of a blocking receive from rank ``source`` (or
 * MPI.ANY_SOURCE, -1: any_source_take) that the core completed (into
 * ``dst``, bytes; or, ``dst`` None, an object: payload is its pickle), or
 * None: the full path receives (an envelope the core took that this
 * receive cannot have is the matcher's). A message the matcher holds
 * unmatched comes first (held_recv), as the full path's post takes it. */
static PyObject *py_mpi_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mpi_recv(matcher, group, dst, source, tag)");
        return NULL;
    }
    PyObject *m = args[0], *lock, *got = NULL;
    Py_buffer d = {0}, *dst = NULL;  /* NULL: an object's receive */
    if (args[2] != Py_None) {
        int ok = plain_buffer(args[2], 1, &d);
        if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
        dst = &d;
    }
    int usable = matcher_usable(m, args[1]);
    long long from, want;
    if (usable <= 0) {
        got = usable < 0 ? NULL : Py_NewRef(Py_None);
    } else if (!(got = held_recv(m, args[3], args[4], dst)) || got != Py_False) {
        /* a message the matcher held: taken, or the full path's */
    } else if (Py_DECREF(got), plain_int(args[3], -1, 0) == -1) {  /* MPI.ANY_SOURCE, from the rings */
        got = NULL;
        int allowed = recv_allowed(m, args[4], &want, 1);
        if (allowed <= 0) got = allowed < 0 ? NULL : Py_NewRef(Py_None);
        else if ((lock = slot_attr(m, matcher_at, N_LOCK)) && lock_take(lock) == 0) {
            got = any_source_take(m, want, dst);
            if (lock_give(lock) < 0) Py_CLEAR(got);
        }
    } else {
        got = NULL;
        CoreProgram *p = recv_program(m, args[3], args[4], &from, &want, 1);
        if (!p) got = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        else if ((lock = slot_attr(m, matcher_at, N_LOCK)) && lock_take(lock) == 0) {
            got = matcher_take(m, p, from, want, dst);
            if (lock_give(lock) < 0) Py_CLEAR(got);
        }
        Py_XDECREF(p);
    }
    if (dst) PyBuffer_Release(dst);
    return got;
}

/* mpi_exchange(matcher, group, data, dest, sendtag, source, recvtag) -> a
 * sendrecv of an object by the core: mpi_send's send, then, where the
 * core may take it, mpi_recv's receive (dst None), under one hold of the
 * lock (to this rank itself: deliver, then held_recv). None: nothing
 * went (the full path does both); False: sent, and the full path
 * receives; else mpi_recv's result. */
static PyObject *py_mpi_exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "mpi_exchange(matcher, group, data, dest, sendtag, source, recvtag[, dst])");
        return NULL;
    }
    PyObject *m = args[0], *lock, *result = NULL;
    Py_buffer d = {0}, r = {0}, *dst = NULL;  /* as mpi_recv's: NULL, an object's receive */
    if (nargs == 8 && args[7] != Py_None) {
        int ok = plain_buffer(args[7], 1, &r);
        if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
        dst = &r;
    }
    CoreProgram *send = NULL, *recv = NULL;
    int usable = matcher_usable(m, args[1]);
    if (usable <= 0) {
        if (usable == 0) result = Py_NewRef(Py_None);
        goto out;
    }
    long long to, tag, rank, from = 0, want = 0, etag = matcher_int(m, N_ETAG);
    if (etag == LLONG_MIN || !(lock = slot_attr(m, matcher_at, N_LOCK))) goto out;
    int ok = send_allowed(m, args[2], args[3], args[4], &to, &tag, &rank, &d);
    if (ok <= 0) {
        if (ok == 0) result = Py_NewRef(Py_None);
        goto out;
    }
    if (to == rank) {  /* to this rank itself; then the receive, from the messages held (or the full path's) */
        int sent = deliver(m, rank, tag, &d);
        PyObject *got = sent > 0 ? held_recv(m, args[5], args[6], dst) : NULL;
        if (sent == 0) result = Py_NewRef(Py_None);
        else if (got) result = got == Py_None || got == Py_False ? (Py_DECREF(got), Py_NewRef(Py_False)) : got;
        goto out;
    }
    send = matcher_program(m, to, 0);
    if (send && !(recv = recv_program(m, args[5], args[6], &from, &want, 0)) && PyErr_Occurred()) goto out;
    if (!send) {
        if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
        goto out;
    }
    if (lock_take(lock) < 0) goto out;
    int sent = envelope_send(send, etag, tag, d.buf, d.len);
    if (sent > 0) {
        PyObject *got = recv ? matcher_take(m, recv, from, want, dst) : Py_NewRef(Py_None);
        result = got && got == Py_None ? (Py_DECREF(got), Py_NewRef(Py_False)) : got;
    } else if (sent == 0) {
        result = Py_NewRef(Py_None);
    }
    if (lock_give(lock) < 0) Py_CLEAR(result);
out:
    Py_XDECREF(send);
    Py_XDECREF(recv);
    if (d.obj) PyBuffer_Release(&d);
    if (dst) PyBuffer_Release(dst);
    return result;
}

/* mpi_isend(matcher, group, data, dest, tag) -> where mpi_send sent
 * ``data``, its Request (nothing left to do: active until a Wait or Test
 * completes it, as request._done_request's); else None: the full path
 * sends it. */
static PyObject *py_mpi_isend(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!request_type) Py_RETURN_NONE;
    PyObject *sent = py_mpi_send(self, args, nargs);
    if (sent != Py_True) {
        if (!sent) return NULL;
        Py_DECREF(sent);
        Py_RETURN_NONE;
    }
    Py_DECREF(sent);
    return fields_new(request_type, NULL, NULL);  /* (active, no status yet: the defaults) */
}

/* What a posted receive keeps of ``buf`` (its _Recv.dst): a bare array
 * as plain_buffer takes one writable, as it is (the core receives into it;
 * _Recv.bytes() makes its byte view where Python moves the message: a
 * byte view cost an irecv a sixth of its time); None for anything else (a
 * memoryview, a buffer spec...: the full path reads or refuses it). A new
 * reference, NULL on error. */
static PyObject *receive_buffer(PyObject *buf) {
    if (!ndarray_type || !Py_IS_TYPE(buf, (PyTypeObject *)ndarray_type)) Py_RETURN_NONE;
    Py_buffer view;
    int ok = plain_buffer(buf, 1, &view);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
    PyBuffer_Release(&view);
    return Py_NewRef(buf);
}

/* mpi_irecv(matcher, group, buf, source, tag) -> the Request of a receive
 * posted to the matcher as Comm._recv posts it, into ``buf`` (a bare
 * array, as receive_buffer keeps one; None: an object),
 * where the call is plain: a live matcher for that group (matcher_usable)
 * of an intracommunicator, ``source`` a rank of it or MPI.ANY_SOURCE,
 * ``tag`` >= 0 or MPI.ANY_TAG. The first message held unmatched that it
 * matches (held_find) it takes at once, as the post does; else it is
 * appended to the posted receives. Else None: the full path posts it
 * (also where the message it takes is a synchronous send's, which the
 * full path acks), or explains what is wrong. */
static PyObject *py_mpi_irecv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mpi_irecv(matcher, group, buf, source, tag)");
        return NULL;
    }
    PyObject *m = args[0], *group = args[1], *source = args[3], *tag = args[4];
    if (!request_type) Py_RETURN_NONE;
    int usable = matcher_usable(m, group);
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_None);
    long long size = matcher_int(m, N_SIZE);
    if (size == LLONG_MIN) return NULL;
    long long from = plain_int(source, -1, size), want = plain_int(tag, -1, LLONG_MAX);
    if (from == LLONG_MIN || want == LLONG_MIN) Py_RETURN_NONE;
    PyObject *posted = slot_attr(m, matcher_at, N_POSTED), *network = slot_attr(m, matcher_at, N_NETWORK);
    PyObject *inter = slot_attr(m, matcher_at, N_INTER);  /* (an intercommunicator's ranks are the remote group's) */
    if (!posted || !network || !inter) return NULL;
    if (!PyList_CheckExact(posted) || inter != Py_False) Py_RETURN_NONE;
    Py_ssize_t at;
    int held = held_find(m, from, want, &at);  /* 1: a message it takes at once */
    if (held < 0 || held > 1) return held < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *dst = Py_None;  /* an object's receive */
    if (args[2] != Py_None && (!(dst = receive_buffer(args[2])) || dst == Py_None))
        return dst;  /* an error, or a buffer the full path reads */
    if (dst == Py_None) Py_INCREF(dst);
    PyObject *op = bare_instance(recv_type), *timeout = NULL, *r = NULL;
    if (!op || slot_set(op, recv_at, N_SOURCE, Py_NewRef(source)) < 0 || slot_set(op, recv_at, N_TAG, Py_NewRef(tag)) < 0
        || slot_set(op, recv_at, N_DST, Py_NewRef(dst)) < 0 || slot_set(op, recv_at, N_MSG, Py_NewRef(Py_None)) < 0
        || slot_set(op, recv_at, N_CANCELLED, Py_NewRef(Py_False)) < 0
        || slot_set(op, recv_at, N_ERROR, Py_NewRef(Py_None)) < 0 || !(timeout = group_attr(group, N_TIMEOUT)))
        goto out;
    static const int fields[] = {F_NETWORK, F_RECV, F_MATCHER, F_TIMEOUT};  /* (the rest: the defaults) */
    PyObject *values[] = {network, op, m, timeout};
    r = request_with(fields, values, 4);
    if (r && held) {  /* the post takes it (a synchronous send's: the full path, which acks it) */
        PyObject *msg = held_take(m, at);
        if (!msg || msg == Py_None) Py_SETREF(r, msg);
        else if (slot_set(op, recv_at, N_MSG, msg) < 0) Py_CLEAR(r);
    } else if (r && PyList_Append(posted, op) < 0) {
        Py_CLEAR(r);
    }
out:
    Py_XDECREF(op);
    Py_XDECREF(timeout);
    Py_XDECREF(dst);
    return r;
}

/* mpi_envelope(matcher, source) -> whether the core took group rank
 * ``source``'s next envelope (waiting for it as long as a wait spins) and
 * gave it to the matcher, as progress would: how a waited receive request
 * gets its envelope without Python's progress. False: none came, or the
 * core may not take it (any source, this rank, an envelope receive from it
 * already in flight, a lost peer): the full path waits. */
static PyObject *py_mpi_envelope(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpi_envelope(matcher, source)");
        return NULL;
    }
    PyObject *m = args[0], *lock, *envelopes, *spill, *result = NULL;
    int usable = matcher_usable(m, slot_attr(m, matcher_at, N_GROUP));  /* whichever group it is for */
    if (usable <= 0) return usable < 0 ? NULL : Py_NewRef(Py_False);
    long long size = matcher_int(m, N_SIZE), rank = matcher_int(m, N_RANK), etag = matcher_int(m, N_ETAG);
    if (size == LLONG_MIN || rank == LLONG_MIN || etag == LLONG_MIN || !(lock = slot_attr(m, matcher_at, N_LOCK))
        || !(envelopes = slot_attr(m, matcher_at, N_ENVELOPES)) || !(spill = slot_attr(m, matcher_at, N_ENVELOPE_IN)))
        return NULL;
    long long from = plain_int(args[1], 0, size);
    if (from == LLONG_MIN || from == rank) Py_RETURN_FALSE;
    int busy = PyDict_Check(envelopes) ? PyDict_Contains(envelopes, args[1]) : 1;
    int lost = busy ? 0 : slot_empty(m, matcher_at, N_M_LOST);
    if (busy < 0 || lost < 0) return NULL;
    if (busy || !lost) Py_RETURN_FALSE;
    CoreProgram *p = matcher_program(m, from, 1);
    if (!p) return PyErr_Occurred() ? NULL : Py_NewRef(Py_False);
    if (lock_take(lock) == 0) {
        int64_t tag, n;
        PyObject *payload = NULL;
        int got = envelope_recv(p, etag, 1, 0, NULL, spill, &tag, &n, &payload);
        PyObject *kept = got == ENVELOPE_OTHER ? PyObject_CallMethodObjArgs(m, names[N_ENVELOPE], args[1], spill, NULL)
                                               : NULL;
        if (got == ENVELOPE_NONE) result = Py_NewRef(Py_False);
        else if (kept) result = Py_NewRef(Py_True);
        Py_XDECREF(kept);
        if (lock_give(lock) < 0) Py_CLEAR(result);
    }
    Py_DECREF(p);
    return result;
}

/* Complete request ``r``: inactive from now, nothing kept for it. */
static PyObject *request_completed(PyObject *r) {
    field_put(r, F_DONE, Py_NewRef(Py_True));
    field_put(r, F_KEEP, Py_NewRef(Py_None));
    Py_RETURN_TRUE;
}

/* The receive half of mpi_complete, for a receive ``op`` still waiting
 * for its message (request._core_receive, then _at_once's use of it). */
static PyObject *complete_receive(PyObject *self, PyObject *r, PyObject *op, PyObject *m, PyObject *loads) {
    PyObject *posted = slot_attr(m, matcher_at, N_POSTED), *inter = slot_attr(m, matcher_at, N_INTER);
    PyObject *group = slot_attr(m, matcher_at, N_GROUP), *source = slot_attr(op, recv_at, N_SOURCE);
    if (!posted || !inter || !group || !source) return NULL;
    long long from = plain_int(source, -1, LLONG_MAX);
    int alone = PyList_CheckExact(posted) && PyList_GET_SIZE(posted) == 1 && PyList_GET_ITEM(posted, 0) == op
                && !(from < 0 && inter == Py_True);
    field_put(r, F_PULLED, Py_NewRef(Py_True));  /* asked once, whatever comes */
    if (!alone) {  /* others posted: the core takes the source's next envelope for the matcher */
        PyObject *args[] = {m, source};
        PyObject *took = py_mpi_envelope(self, args, 2);
        if (!took) return NULL;
        Py_DECREF(took);
        Py_RETURN_FALSE;
    }
    /* its communicator's only posted receive: the core receives it as a blocking receive would */
    if (PyList_SetSlice(posted, 0, 1, NULL) < 0) return NULL;
    PyObject *args[] = {m, group, slot_attr(op, recv_at, N_DST), source, slot_attr(op, recv_at, N_TAG)};
    PyObject *got = args[2] && args[4] ? py_mpi_recv(self, args, 5) : NULL;
    if (!got || got == Py_None) {  /* posted again (an error too, as _core_receive's finally does) */
        PyObject *exc_type, *exc, *tb;
        PyErr_Fetch(&exc_type, &exc, &tb);
        PyObject *again = PyObject_CallMethodOneArg(m, names[N_POST], op);
        if (!again) {
            Py_XDECREF(got);
            Py_XDECREF(exc_type);
            Py_XDECREF(exc);
            Py_XDECREF(tb);
            return NULL;
        }
        Py_DECREF(again);
        PyErr_Restore(exc_type, exc, tb);
        if (!got) return NULL;
        Py_DECREF(got);
        Py_RETURN_FALSE;
    }
    PyObject *payload = PyTuple_GET_ITEM(got, 1), *result = NULL;
    int ok = 1;
    field_put(r, F_STATUS, Py_NewRef(PyTuple_GET_ITEM(got, 0)));
    if (args[2] == Py_None) {  /* an object; an empty message is None, as in mpi4py */
        int some = PyObject_IsTrue(payload);
        PyObject *obj = some > 0 ? call_loads(loads, payload) : some == 0 ? Py_NewRef(Py_None) : NULL;
        if ((ok = obj != NULL)) field_put(r, F_RESULT, obj);
    }
    if (ok) result = request_completed(r);
    Py_DECREF(got);
    return result;
}

/* The rest of mpi_complete for a receive whose message has come (taken
 * at its post, or since): Request._finish's where the payload is all
 * here (copied into the receive's buffer, or unpickled through
 * ``loads``), True; False where the general path waits or explains (a
 * payload still coming, one too long, a buffer the core does not take). */
static PyObject *complete_arrived(PyObject *r, PyObject *op, PyObject *msg, PyObject *loads) {
    PyObject *dst = slot_attr(op, recv_at, N_DST), *obj = NULL, *fields, *result = NULL;
    long long n;
    PyObject *data = dst && message_type && Py_IS_TYPE(msg, message_type) ? held_payload(msg, &n) : NULL;
    if (!data) return PyErr_Occurred() ? NULL : Py_NewRef(Py_False);
    if (dst == Py_None) {  /* an object; an empty message is None, as in mpi4py */
        if (data == Py_None) Py_RETURN_FALSE;
        if (!(obj = n ? call_loads(loads, data) : Py_NewRef(Py_None))) return NULL;
    } else if (data != Py_None) {  /* (None: it went straight into dst) */
        Py_buffer view;
        int ok = plain_buffer(dst, 1, &view);
        if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_False);
        if (n <= view.len) memcpy(view.buf, PyByteArray_AS_STRING(data), n);
        PyBuffer_Release(&view);
        if (n > view.len) Py_RETURN_FALSE;  /* truncated: the general path says so */
    }
    if ((fields = message_fields(msg))) {
        field_put(r, F_STATUS, fields);
        if (obj) field_put(r, F_RESULT, Py_NewRef(obj));
        result = request_completed(r);
    }
    Py_XDECREF(obj);
    return result;
}

/* mpi_complete(request, loads) -> a wait's first look at a Request of the
 * class itself with nothing to run after it (Request._at_once's, in C):
 * True where it completed it here (a send with nothing in flight; a
 * receive the core took, or whose message is all here: complete_arrived;
 * an object's through ``loads``), False where the
 * general path waits for it (a receive the core was asked for once, as
 * _at_once asks), None where _at_once looks itself (a subclass's request,
 * one with something to run after it, no types set). */
static PyObject *py_mpi_complete(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpi_complete(request, loads)");
        return NULL;
    }
    PyObject *r = args[0], *loads = args[1];
    if (!request_type || !Py_IS_TYPE(r, request_type)) Py_RETURN_NONE;
    if (FIELD(r, F_AFTER) != Py_None) Py_RETURN_NONE;
    if (FIELD(r, F_DONE) != Py_False) Py_RETURN_FALSE;
    PyObject *op = Py_NewRef(FIELD(r, F_RECV)), *result = NULL;
    if (op == Py_None) {  /* a send (or nothing): complete if nothing is in flight or waited for */
        PyObject *sends = FIELD(r, F_SENDS);
        int idle = PyTuple_CheckExact(sends) && PyTuple_GET_SIZE(sends) == 0 && FIELD(r, F_WORK) == Py_None
                   && FIELD(r, F_SYNC) == Py_None;
        result = idle ? request_completed(r) : Py_NewRef(Py_False);
    } else if (Py_IS_TYPE(op, recv_type)) {
        PyObject *msg = slot_attr(op, recv_at, N_MSG), *error = slot_attr(op, recv_at, N_ERROR);
        PyObject *cancelled = slot_attr(op, recv_at, N_CANCELLED), *m = Py_NewRef(FIELD(r, F_MATCHER));
        int fresh = msg && error && cancelled && msg == Py_None && error == Py_None && cancelled == Py_False
                    && FIELD(r, F_PULLED) == Py_False;
        if (fresh && matcher_type && Py_IS_TYPE(m, matcher_type))
            result = complete_receive(self, r, op, m, loads);
        else if (core_chosen && msg && msg != Py_None && error == Py_None && cancelled == Py_False)
            result = complete_arrived(r, op, msg, loads);  /* (the reference executor: Python's way) */
        else if (!PyErr_Occurred())
            result = Py_NewRef(Py_False);
        Py_DECREF(m);
    } else {
        result = Py_NewRef(Py_None);
    }
    Py_DECREF(op);
    return result;
}

/* Request.Wait(status=None) and wait(status=None) (``object``): the
 * core's first look (mpi_complete) at a request of the class itself, then
 * where it did not complete it, or a status is to be filled, the
 * request's Python rest, _Wait(status, look) or _wait(status, look)
 * (request.py), told what the look said (None: it did not look). Without
 * the Python frame around the look, which was about half of a completed
 * send's Wait. */
static PyObject *wait_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                              int object) {
    static const char *what[] = {"Wait", "wait"};
    PyObject *status = nargs > 0 ? args[0] : Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1 || (nkw && !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)))
        || (nkw && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "status"))) {
        PyErr_Format(PyExc_TypeError, "%s() takes one argument, status=None", what[object]);
        return NULL;
    }
    if (nkw) status = args[nargs];
    PyObject *look = Py_None;
    if (status == Py_None) {
        PyObject *both[] = {self, NULL};  /* (loads: MPI.pickle's, read only where an object came) */
        if (!(look = py_mpi_complete(NULL, both, 2))) return NULL;
        if (look == Py_True) {
            Py_DECREF(look);
            return Py_NewRef(object ? FIELD(self, F_RESULT) : Py_True);
        }
    } else {
        Py_INCREF(look);
    }
    PyObject *result = PyObject_CallMethodObjArgs(self, names[object ? N_WAIT_OBJECT : N_WAIT_REST], status, look, NULL);
    Py_DECREF(look);
    return result;
}

static PyObject *fields_Wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return wait_request(self, args, nargs, kwnames, 0);
}

static PyObject *fields_wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return wait_request(self, args, nargs, kwnames, 1);
}

/* mpi_complete_all(requests, loads, results, statuses, fill) -> (looks,
 * waits): Waitall's first look at every request, in one call (its loop
 * in Python cost more than the looks), mpi_complete's for each. ``looks``:
 * the indices of the requests it left to _at_once (a subclass's, one with
 * something to run after it); ``waits``: those it looked at and the
 * general path must wait for; both in order. For each one completed, its
 * wait() result goes to ``results`` (a list, or None) at its index, and
 * fill(statuses[i], its status fields) runs where statuses[i] is not None. */
/* mpi_complete_all's loop: ``looks`` and ``waits`` made only where a
 * request is left (NULL otherwise); ``statuses`` NULL: none asked for. 0, or -1 on error. */
static int complete_each(PyObject *requests, PyObject *loads, PyObject *results, PyObject *statuses, PyObject *fill,
                         PyObject **looks, PyObject **waits) {
    *looks = *waits = NULL;
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(requests); i++) {
        PyObject *r = Py_NewRef(PyList_GET_ITEM(requests, i)), *look[] = {r, loads};
        PyObject *done = py_mpi_complete(NULL, look, 2), *got = NULL;
        ok = done != NULL;
        if (ok && done != Py_True) {
            PyObject **left = done == Py_None ? looks : waits;
            PyObject *at = PyLong_FromSsize_t(i);
            ok = at && (*left || (*left = PyList_New(0))) && PyList_Append(*left, at) == 0;
            Py_XDECREF(at);
        } else if (ok) {
            if (results != Py_None && i < PyList_GET_SIZE(results))
                ok = (got = Py_NewRef(FIELD(r, F_RESULT))) && PyList_SetItem(results, i, got) == 0;  /* (done: a Request) */
            PyObject *st = statuses && i < PyList_GET_SIZE(statuses) ? PyList_GET_ITEM(statuses, i) : Py_None;
            if (ok && st != Py_None) {
                PyObject *fields = Py_NewRef(FIELD(r, F_STATUS));
                PyObject *filled = PyObject_CallFunctionObjArgs(fill, st, fields, NULL);
                ok = filled != NULL;
                Py_DECREF(fields);
                Py_XDECREF(filled);
            }
        }
        Py_XDECREF(done);
        Py_DECREF(r);
    }
    if (!ok) {
        Py_CLEAR(*looks);
        Py_CLEAR(*waits);
    }
    return ok ? 0 : -1;
}

static PyObject *py_mpi_complete_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_CheckExact(args[0]) || (args[2] != Py_None && !PyList_CheckExact(args[2]))
        || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "mpi_complete_all(requests: list, loads, results: list or None, "
                                         "statuses: list, fill)");
        return NULL;
    }
    PyObject *looks, *waits;
    if (complete_each(args[0], args[1], args[2], args[3], args[4], &looks, &waits) < 0) return NULL;
    if ((!looks && !(looks = PyList_New(0))) || (!waits && !(waits = PyList_New(0)))) {
        Py_XDECREF(looks);
        Py_XDECREF(waits);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(2, looks, waits);
    Py_DECREF(looks);
    Py_DECREF(waits);
    return result;
}


/* Request.Waitall and Request.waitall themselves, where the core is
 * built: for the common call (no statuses asked for) mpi_complete_all's
 * look at every request without the two Python frames around it, which
 * cost a Waitall of two requests a third of its time (0.27 us of
 * interpreter for an empty list). What the look leaves, and a call with
 * statuses, is request.py's: set_waitall(Request._all, Request._rest,
 * MPI.pickle), at its import. (Declared with the request fields.) */

static PyObject *py_set_waitall(PyObject *self, PyObject *args) {
    PyObject *all, *rest, *pickle;
    if (!PyArg_ParseTuple(args, "OOO", &all, &rest, &pickle)) return NULL;
    Py_XSETREF(waitall_all, Py_NewRef(all));
    Py_XSETREF(waitall_rest, Py_NewRef(rest));
    Py_XSETREF(waitall_pickle, Py_NewRef(pickle));
    Py_RETURN_NONE;
}

/* Waitall(requests, statuses=None) -> True (``objects`` 0) and
 * waitall(requests, statuses=None) -> [each one's wait() result] (1), as
 * mpi4py's: the requests in a list (as list(requests)), mpi_complete_all's
 * look at each; what it leaves by Request._rest, or all by Request._all
 * where statuses are asked for. */
static PyObject *wait_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int objects) {
    PyObject *requests = nargs > 0 ? args[0] : NULL, *statuses = nargs > 1 ? args[1] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    const char *name = objects ? "waitall" : "Waitall";
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 2 arguments (requests, statuses), got %zd", name, nargs);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        if (!requests && PyUnicode_CompareWithASCIIString(key, "requests") == 0) requests = args[nargs + k];
        else if (!statuses && PyUnicode_CompareWithASCIIString(key, "statuses") == 0) statuses = args[nargs + k];
        else return PyErr_Format(PyExc_TypeError, "%s() got an unexpected or repeated argument %R", name, key);
    }
    if (!requests || !waitall_all) {
        PyErr_Format(PyExc_TypeError, "%s() missing its argument 'requests'%s", name,
                     waitall_all ? "" : " (and set_waitall was not called)");
        return NULL;
    }
    if (!statuses) statuses = Py_None;
    /* (the caller's list as it is: nothing here or in Request._rest changes it) */
    PyObject *list = PyList_CheckExact(requests) ? Py_NewRef(requests) : PySequence_List(requests), *results = NULL;
    PyObject *result = NULL;
    if (!list) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (objects) {
        if (!(results = PyList_New(n))) goto out;
        for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(results, i, Py_NewRef(Py_None));
    }
    PyObject *collect = objects ? results : Py_None;
    if (statuses != Py_None || !request_type) {  /* the general path, every request */
        result = PyObject_CallFunctionObjArgs(waitall_all, list, statuses, collect, NULL);
        goto out;
    }
    /* mpi_complete_all's look, no statuses asked for: the indices it left, to _rest
     * (loads NULL: MPI.pickle's, read only where an object came) */
    PyObject *looks, *waits;
    if (complete_each(list, NULL, collect, NULL, Py_None, &looks, &waits) < 0) goto out;
    if (looks || waits) {
        PyObject *sts = PyList_New(n);
        if (sts && (looks || (looks = PyList_New(0))) && (waits || (waits = PyList_New(0)))) {
            for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(sts, i, Py_NewRef(Py_None));
            result = PyObject_CallFunctionObjArgs(waitall_rest, list, sts, looks, waits, collect, NULL);
        }
        Py_XDECREF(sts);
        Py_XDECREF(looks);
        Py_XDECREF(waits);
    } else {
        result = Py_NewRef(Py_None);
    }
out:
    if (result) Py_SETREF(result, Py_NewRef(objects ? results : Py_True));
    Py_XDECREF(list);
    Py_XDECREF(results);
    return result;
}

static PyObject *py_mpi_Waitall(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return wait_all(self, args, nargs, kwnames, 0);
}

static PyObject *py_mpi_waitall(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return wait_all(self, args, nargs, kwnames, 1);
}

/* ---- CommMethod: collie.MPI's object calls without a Python frame
 *
 * Comm.send, isend, recv, irecv and sendrecv, and Intracomm.gather,
 * reduce, scatter, scan and exscan (compat/mpi/comm.py) are instances of
 * this type where the core is built: a method descriptor
 * (Py_TPFLAGS_METHOD_DESCRIPTOR: ``comm.isend(...)`` calls it with the
 * communicator first, making no bound method) that does what the Python
 * method's body does up to its core call (pickle, mpi_send, mpi_isend,
 * mpi_recv, mpi_irecv, mpi_exchange; the slot round: cm_rounds), then, where the core left the call,
 * the Python method's _..._rest. The Python frame and its argument
 * handling were a fifth of a small exchange. Anything unusual (arguments
 * it cannot place, PROC_NULL, a buffer given to recv, a subclass of Comm
 * that is not set up) goes to the Python method itself, ``full``, which
 * explains. */
enum { CM_SEND, CM_ISEND, CM_RECV, CM_IRECV, CM_SENDRECV, CM_GATHER, CM_REDUCE, CM_SCATTER, CM_SCAN, CM_EXSCAN, NCM };
#define CM_ARGS 7
static const char *cm_kinds[NCM] = {"send", "isend", "recv", "irecv", "sendrecv", "gather", "reduce", "scatter",
                                    "scan", "exscan"};
static const char *cm_params[NCM][CM_ARGS + 1] = {
    {"obj", "dest", "tag"},
    {"obj", "dest", "tag"},
    {"buf", "source", "tag", "status"},
    {"buf", "source", "tag"},
    {"sendobj", "dest", "sendtag", "recvbuf", "source", "recvtag", "status"},
    {"sendobj", "root"},
    {"sendobj", "op", "root"},
    {"sendobj", "root"},
    {"sendobj", "op"},
    {"sendobj", "op"},
};
/* (place_args' defaults: IS_ANY is MPI.ANY_SOURCE or ANY_TAG, IS_SUM MPI.SUM) */
#define R IS_REQUIRED
static const char cm_defaults[NCM][CM_ARGS] = {
    {R, R, IS_ZERO},
    {R, R, IS_ZERO},
    {IS_NONE, IS_ANY, IS_ANY, IS_NONE},
    {IS_NONE, IS_ANY, IS_ANY},
    {R, R, IS_ZERO, IS_NONE, IS_ANY, IS_ANY, IS_NONE},
    {R, IS_ZERO},
    {R, IS_SUM, IS_ZERO},
    {IS_NONE, IS_ZERO},
    {R, IS_SUM},
    {R, IS_SUM},
};
#undef R
static PyObject *cm_param_names[NCM][CM_ARGS];  /* interned at import */
static int cm_nparams[NCM];
static PyTypeObject *comm_type;               /* compat/mpi's Comm (set_comm) */
static Py_ssize_t comm_at[NNAMES];
static const int comm_names[] = {N_COMM_GROUP, N_COMM_MATCHER, -1};
static PyObject *status_fill;                 /* request._fill(status, fields) */
static PyTypeObject *refused_type;            /* comm._Refused: what a root that refused its items scatters */
static PyTypeObject *op_type;                 /* compat/mpi's Op, and its SUM (set_ops) */
static PyObject *op_sum;

typedef struct {
    PyObject_HEAD
    int kind;
    PyObject *full, *rest;  /* the Python method, and its _..._rest */
    vectorcallfunc vectorcall;
} CommMethod;

/* set_comm(Comm, fill, _Refused): where Comm's _group and _matcher slots
 * are, request._fill, and what a refusing root scatters. */
static PyObject *py_set_comm(PyObject *self, PyObject *args) {
    PyObject *type, *fill, *refused;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyType_Type, &type, &fill, &PyType_Type, &refused)) return NULL;
    if (slot_offsets(type, comm_names, comm_at) < 0) return NULL;
    Py_XSETREF(comm_type, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(status_fill, Py_NewRef(fill));
    Py_XSETREF(refused_type, (PyTypeObject *)Py_NewRef(refused));
    Py_RETURN_NONE;
}

/* set_ops(Op, SUM): the op type whose _py reduce folds with, and reduce's default. */
static PyObject *py_set_ops(PyObject *self, PyObject *args) {
    PyObject *type, *sum;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &type, &sum)) return NULL;
    Py_XSETREF(op_type, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(op_sum, Py_NewRef(sum));
    Py_RETURN_NONE;
}

/* A received object from mpi_recv's or mpi_exchange's ((fields), payload):
 * ``status`` filled, the payload unpickled (an empty one is None, as in mpi4py). */
static PyObject *cm_received(PyObject *got, PyObject *status) {
    if (status != Py_None) {
        PyObject *r = PyObject_CallFunctionObjArgs(status_fill, status, PyTuple_GET_ITEM(got, 0), NULL);
        if (!r) return NULL;
        Py_DECREF(r);
    }
    PyObject *payload = PyTuple_GET_ITEM(got, 1);
    int some = PyObject_IsTrue(payload);
    return some > 0 ? call_loads(NULL, payload) : some == 0 ? Py_NewRef(Py_None) : NULL;
}

/* self._rest(self, *v[:n]) */
static PyObject *cm_rest(CommMethod *self, PyObject *comm, PyObject *const *v, int n) {
    PyObject *all[CM_ARGS + 1];
    all[0] = comm;
    for (int i = 0; i < n; i++) all[i + 1] = v[i];
    return PyObject_Vectorcall(self->rest, all, n + 1, NULL);
}

/* ``items``[:upto] folded by ``fn`` in order (as functools.reduce folds). */
static PyObject *fold(PyObject *fn, PyObject *items, Py_ssize_t upto) {
    PyObject *acc = Py_NewRef(PyList_GET_ITEM(items, 0));
    for (Py_ssize_t i = 1; acc && i < upto; i++) {
        PyObject *pair[] = {acc, PyList_GET_ITEM(items, i)};
        Py_SETREF(acc, PyObject_Vectorcall(fn, pair, 2, NULL));
    }
    return acc;
}

/* The object collectives of one slot round on ``comm`` (whose group is
 * ``g``), v as cm_params says: gather and reduce (objects.gather_loads'
 * round), scatter (scatter_loads'), scan and exscan (all_gather_loads'):
 * the core's round (slots_round) in C, then, where every payload fitted
 * its slot, the result (reduce's, scan's and exscan's folded by op._py in
 * rank order); else the Python method's _..._rest, given the round's
 * result (False: it ran none). NULL with no error: the Python method
 * itself (COMM_NULL, a root that is not a rank, an op that is not a plain
 * Op, a root's scatter items that are not a list or tuple of one per rank,
 * the slots not made yet). */
static PyObject *cm_rounds(CommMethod *self, PyObject *comm, PyObject *g, PyObject **v) {
    static PyObject *round_name[3];
    static const char *round_str[3] = {"gather", "scatter", "all_gather"};
    for (int i = 0; i < 3; i++)
        if (!round_name[i] && !(round_name[i] = PyUnicode_InternFromString(round_str[i]))) return NULL;
    int k = self->kind, rooted = k == CM_GATHER || k == CM_REDUCE || k == CM_SCATTER;
    PyObject *root = k == CM_REDUCE ? v[2] : rooted ? v[1] : Py_None, *op = k == CM_GATHER || k == CM_SCATTER ? NULL : v[1];
    PyObject *world, *fn = NULL, *size = NULL, *rank = NULL, *slots = NULL, *dumps = NULL, *loads = NULL;
    PyObject *payload = NULL, *payloads = NULL, *got = NULL, *result = NULL;
    PyObject *live = live_group(g, &world);
    if (!live) goto out;
    if (op && (!op_type || !Py_IS_TYPE(op, op_type) || !(fn = PyObject_GetAttr(op, names[N_PY])) || fn == Py_None))
        goto out;
    long long n, r, at = -1;
    if (!(size = group_attr(g, N_SIZE)) || !(rank = group_attr(g, N_RANK))) goto out;
    if ((n = plain_int(size, 1, LLONG_MAX)) == LLONG_MIN || (r = plain_int(rank, 0, n)) == LLONG_MIN
        || (rooted && (at = plain_int(root, 0, n)) == LLONG_MIN))
        goto out;
    if (!(slots = group_attr(g, N_OBJECT_SLOTS)) || slots == Py_None) goto out;
    if (!(dumps = pickle_fn(N_DUMPS)) || !(loads = pickle_fn(N_LOADS))) goto out;
    if (k != CM_SCATTER) {
        if (!(payload = PyObject_CallOneArg(dumps, v[0])) || !(payloads = PyTuple_Pack(1, payload))) goto out;
    } else if (r == at) {  /* the root's items, pickled (a list, as the Python method's) */
        PyObject *items = v[0];
        if ((!PyList_CheckExact(items) && !PyTuple_CheckExact(items)) || PySequence_Fast_GET_SIZE(items) != n) goto out;
        if (!(payloads = PyList_New(n))) goto out;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *one = PyObject_CallOneArg(dumps, PySequence_Fast_GET_ITEM(items, i));
            if (!one) goto out;
            PyList_SET_ITEM(payloads, i, one);
        }
    } else {
        payloads = Py_NewRef(Py_None);
    }
    PyObject *a[] = {round_name[k == CM_SCATTER ? 1 : rooted ? 0 : 2], g, root, slots, payloads, loads};
    if (!(got = py_slots_round(NULL, a, 6))) goto out;
    PyObject *fits = got != Py_None ? PyTuple_GET_ITEM(got, 0) : NULL, *items = fits ? PyTuple_GET_ITEM(got, 1) : NULL;
    int whole = fits && PyTuple_GET_ITEM(got, 2) == Py_None;  /* every payload here, none larger than its slot */
    int listed = whole && PyList_CheckExact(items) && PyList_GET_SIZE(items) == n;
    switch (k) {
    case CM_GATHER:
    case CM_REDUCE:
        if (whole && fits == Py_True && r != at) result = Py_NewRef(Py_None);
        else if (whole && fits == Py_True && listed) result = k == CM_GATHER ? Py_NewRef(items) : fold(fn, items, n);
        break;
    case CM_SCATTER:
        if (r == at && fits == Py_True) {
            result = PyObject_CallOneArg(loads, PyList_GET_ITEM(payloads, at));
        } else if (r != at && whole && PyList_CheckExact(items) && PyList_GET_SIZE(items) == 1) {
            PyObject *item = PyList_GET_ITEM(items, 0);
            if (!refused_type || !Py_IS_TYPE(item, refused_type)) result = Py_NewRef(item);
        }
        break;
    default:  /* scan, exscan: the fold of those up to this rank, or before it (exscan's rank 0: None) */
        if (listed) {
            Py_ssize_t upto = k == CM_SCAN ? r + 1 : r;
            result = upto ? fold(fn, items, upto) : Py_NewRef(Py_None);
        }
    }
    if (!result && !PyErr_Occurred()) {  /* (a payload larger than its slot, no lane, a refusal: the Python rest) */
        PyObject *given = got == Py_None ? Py_False : got;
        PyObject *rooted_rest[] = {comm, g, k == CM_SCATTER ? payloads : payload, root, given, fn};  /* (fn: reduce's) */
        PyObject *scan_rest[] = {comm, g, payload, given, fn};
        result = rooted ? PyObject_Vectorcall(self->rest, rooted_rest, k == CM_REDUCE ? 6 : 5, NULL)
                        : PyObject_Vectorcall(self->rest, scan_rest, 5, NULL);
    }
out:
    Py_XDECREF(live);
    Py_XDECREF(fn);
    Py_XDECREF(size);
    Py_XDECREF(rank);
    Py_XDECREF(slots);
    Py_XDECREF(dumps);
    Py_XDECREF(loads);
    Py_XDECREF(payload);
    Py_XDECREF(payloads);
    Py_XDECREF(got);
    return result;
}

static PyObject *cm_call(CommMethod *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *v[CM_ARGS], *comm = nargs ? args[0] : NULL, *m = NULL, *g = NULL;
    int k = self->kind;
    if (comm && comm_type && PyObject_TypeCheck(comm, comm_type)
        && place_args(cm_param_names[k], cm_defaults[k], cm_nparams[k], op_sum, args + 1, nargs - 1, kwnames, v)) {
        m = *(PyObject **)((char *)comm + comm_at[N_COMM_MATCHER]);
        g = *(PyObject **)((char *)comm + comm_at[N_COMM_GROUP]);
    }
    if (k >= CM_GATHER && g) {
        PyObject *done = cm_rounds(self, args[0], g, v);
        if (done || PyErr_Occurred()) return done;
        return PyObject_Vectorcall(self->full, args, nargs, kwnames);
    }
    int sending = k == CM_SEND || k == CM_ISEND || k == CM_SENDRECV;
    /* (a dest that is not a rank, PROC_NULL included, and recv's buf: the Python method's) */
    if (!m || !g || (sending && plain_int(v[1], 0, LLONG_MAX) == LLONG_MIN) || (k == CM_RECV && v[0] != Py_None)) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(self->full, args, nargs, kwnames);
    }
    PyObject *data = NULL, *got = NULL, *result = NULL;
    if (sending) {
        PyObject *dumps = pickle_fn(N_DUMPS);
        data = dumps ? PyObject_CallOneArg(dumps, v[0]) : NULL;
        Py_XDECREF(dumps);
        if (!data) return NULL;
    }
    switch (k) {
    case CM_SEND:
    case CM_ISEND: {
        PyObject *a[] = {m, g, data, v[1], v[2]};
        got = k == CM_SEND ? py_mpi_send(NULL, a, 5) : py_mpi_isend(NULL, a, 5);
        if (got == Py_True) result = Py_NewRef(Py_None);  /* sent */
        else if (got == Py_False || got == Py_None) result = cm_rest(self, comm, a + 2, 3);
        else result = Py_XNewRef(got);  /* the isend's Request, or an error */
        break;
    }
    case CM_RECV:
    case CM_IRECV: {
        PyObject *a[] = {m, g, Py_None, v[1], v[2]};
        got = k == CM_RECV ? py_mpi_recv(NULL, a, 5) : py_mpi_irecv(NULL, a, 5);
        if (got == Py_None) result = k == CM_RECV ? cm_rest(self, comm, v + 1, 3) : cm_rest(self, comm, v + 1, 2);
        else if (got) result = k == CM_RECV ? cm_received(got, v[3]) : Py_NewRef(got);
        break;
    }
    case CM_SENDRECV: {
        PyObject *a[] = {m, g, data, v[1], v[2], v[4], v[5]};
        got = py_mpi_exchange(NULL, a, 7);
        if (got == Py_False) {  /* sent: the receive may block (recv's rest) */
            PyObject *r[] = {comm, v[4], v[5], v[6]};
            result = PyObject_VectorcallMethod(names[N_RECV_REST], r, 4, NULL);
        } else if (got == Py_None) {
            PyObject *r[] = {data, v[1], v[2], v[3], v[4], v[5], v[6]};
            result = cm_rest(self, comm, r, 7);
        } else if (got) {
            result = cm_received(got, v[6]);
        }
        break;
    }
    }
    Py_XDECREF(got);
    Py_XDECREF(data);
    return result;
}

static PyObject *cm_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    const char *kind;
    PyObject *full, *rest;
    if (!PyArg_ParseTuple(args, "sOO:CommMethod", &kind, &full, &rest)) return NULL;
    int k = 0;
    while (k < NCM && strcmp(kind, cm_kinds[k])) k++;
    if (k == NCM) return PyErr_Format(PyExc_ValueError, "CommMethod: no such method %s", kind);
    if (!PyCallable_Check(full) || !PyCallable_Check(rest)) {
        PyErr_SetString(PyExc_TypeError, "CommMethod(kind, full, rest): full and rest must be callable");
        return NULL;
    }
    CommMethod *self = (CommMethod *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->kind = k;
    self->full = Py_NewRef(full);
    self->rest = Py_NewRef(rest);
    self->vectorcall = (vectorcallfunc)cm_call;
    return (PyObject *)self;
}

/* As a function's: the method itself from the class, bound to an instance. */
static PyObject *cm_get(PyObject *self, PyObject *obj, PyObject *type) {
    return obj == NULL || obj == Py_None ? Py_NewRef(self) : PyMethod_New(self, obj);
}

/* __doc__, __name__, __qualname__, __module__, __wrapped__ (inspect's
 * signature): the Python method's. */
static PyObject *cm_getattro(CommMethod *self, PyObject *name) {
    if (PyUnicode_Check(name) && (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0))
        return Py_NewRef(self->full);
    static const char *own[] = {"__doc__", "__name__", "__qualname__", "__module__", "__annotations__", NULL};
    for (int i = 0; own[i]; i++)
        if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, own[i]) == 0)
            return PyObject_GetAttr(self->full, name);
    return PyObject_GenericGetAttr((PyObject *)self, name);
}

static int cm_traverse(CommMethod *self, visitproc visit, void *arg) {
    Py_VISIT(self->full);
    Py_VISIT(self->rest);
    return 0;
}

static int cm_clear(CommMethod *self) {
    Py_CLEAR(self->full);
    Py_CLEAR(self->rest);
    return 0;
}

static void cm_dealloc(CommMethod *self) {
    PyObject_GC_UnTrack(self);
    cm_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *cm_repr(CommMethod *self) {
    PyObject *name = PyObject_GetAttrString(self->full, "__qualname__");
    PyObject *r = name ? PyUnicode_FromFormat("<compiled method %S of collie.MPI>", name) : NULL;
    Py_XDECREF(name);
    return r;
}

static PyTypeObject CommMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collie._core.CommMethod",
    .tp_basicsize = sizeof(CommMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "CommMethod(kind, full, rest): an object call of collie.MPI's Comm (send, recv, gather...) in C; "
              "see _core.c.",
    .tp_new = cm_new,
    .tp_traverse = (traverseproc)cm_traverse,
    .tp_clear = (inquiry)cm_clear,
    .tp_dealloc = (destructor)cm_dealloc,
    .tp_repr = (reprfunc)cm_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(CommMethod, vectorcall),
    .tp_descr_get = cm_get,
    .tp_getattro = (getattrofunc)cm_getattro,
};

/* comm_rank(comm), comm_size(comm): an MPI communicator's rank and size
 * (collie.MPI's Comm.rank and .size, which programs read all the time), at
 * once where its group is a group of the live world; else its Get_rank()
 * or Get_size(), which explain. */
static PyObject *comm_attr(PyObject *comm, int name, int method) {
    PyObject *g = PyObject_GetAttr(comm, names[N_COMM_GROUP]), *result = NULL, *world;
    if (!g) return NULL;
    PyObject *live = g != Py_None ? live_group(g, &world) : NULL;  /* (None: COMM_NULL, whose method explains) */
    if (live) result = group_attr(live, name);
    Py_XDECREF(live);
    Py_DECREF(g);
    if (result || PyErr_Occurred()) return result;
    return PyObject_CallMethodNoArgs(comm, names[method]);
}

static PyObject *py_comm_rank(PyObject *self, PyObject *comm) { return comm_attr(comm, N_RANK, N_GET_RANK); }
static PyObject *py_comm_size(PyObject *self, PyObject *comm) { return comm_attr(comm, N_SIZE, N_GET_SIZE); }

static PyObject *py_shared_chunks(PyObject *self, PyObject *unused) { return PyLong_FromLongLong(chunks_helped); }

/* help_combine(pid, share, rid, data) -> whether it took chunks: shm.py's
 * writer taking a shared combining offer (combine_for_reader; ``share``:
 * the address of the ring's share words). */
static PyObject *py_help_combine(PyObject *self, PyObject *args) {
    int pid;
    unsigned long long share;
    long long rid;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "iKLy*", &pid, &share, &rid, &data)) return NULL;
    int took;
    Py_BEGIN_ALLOW_THREADS
    took = combine_for_reader(pid, (int64_t *)(uintptr_t)share, rid, data.buf, data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyBool_FromLong(took);
}

static PyMethodDef methods[] = {
    {"help_combine", py_help_combine, METH_VARARGS,
     "help_combine(pid, share, rid, data) -> whether it combined chunks of send rid's reader (read_shared)."},
    {"shared_chunks", py_shared_chunks, METH_NOARGS,
     "shared_chunks() -> the chunks this process combined into its readers' buffers (read_shared)."},
    {"vm_read", py_vm_read, METH_VARARGS,
     "vm_read(pid, dst, address[, fd, inode, base, serial]): fill dst from address in process pid "
     "(from the mapping of its registered buffer, given the last four words of its rendezvous body)."},
    {"vm_write", py_vm_write, METH_VARARGS,
     "vm_write(pid, address, src[, fd, inode, base, serial]): all of src to address in process pid (through the "
     "mapping of its registered buffer, given its four words)."},
    {"pack_slots", py_pack_slots, METH_VARARGS,
     "pack_slots(buffer, payloads, slot) -> whether all fit: each payload's size, then it, in its slot."},
    {"unpack_slots", py_unpack_slots, METH_VARARGS,
     "unpack_slots(buffer, n, slot, loads) -> (items, [(i, size) of those that did not fit] or None)."},
    {"comm_rank", py_comm_rank, METH_O, "comm_rank(comm) -> an MPI communicator's rank (Comm.rank; see _core.c)."},
    {"comm_size", py_comm_size, METH_O, "comm_size(comm) -> an MPI communicator's size (Comm.size; see _core.c)."},
    {"set_pickle", py_set_pickle, METH_VARARGS,
     "set_pickle(dumps, loads): MPI.pickle's functions where they are plain (None: its methods; pickling.py)."},
    {"set_ops", py_set_ops, METH_VARARGS, "set_ops(Op, SUM): reduce's op type and default (CommMethod)."},
    {"set_comm", py_set_comm, METH_VARARGS,
     "set_comm(Comm, fill, _Refused): where Comm's _group and _matcher slots are, and more (CommMethod)."},
    {"set_matcher", py_set_matcher, METH_VARARGS,
     "set_matcher(_Matcher, by_etag): where its books are, and each intracommunicator's matcher by its envelope "
     "tag (compat/mpi/p2p.py)."},
    {"mpi_send", (PyCFunction)(void (*)(void))py_mpi_send, METH_FASTCALL,
     "mpi_send(matcher, group, data, dest, tag) -> whether the core sent it (see _core.c)."},
    {"mpi_recv", (PyCFunction)(void (*)(void))py_mpi_recv, METH_FASTCALL,
     "mpi_recv(matcher, group, dst, source, tag) -> ((source, tag, size, False), payload) or None."},
    {"mpi_exchange", (PyCFunction)(void (*)(void))py_mpi_exchange, METH_FASTCALL,
     "mpi_exchange(matcher, group, data, dest, sendtag, source, recvtag[, dst]) -> None, False or mpi_recv's."},
    {"set_request_types", py_set_request_types, METH_VARARGS,
     "set_request_types(_Recv, Request, _Message): the types the MPI entries make (request.py)."},
    {"mpi_isend", (PyCFunction)(void (*)(void))py_mpi_isend, METH_FASTCALL,
     "mpi_isend(matcher, group, data, dest, tag) -> the Request of a send mpi_send made, or None."},
    {"mpi_irecv", (PyCFunction)(void (*)(void))py_mpi_irecv, METH_FASTCALL,
     "mpi_irecv(matcher, group, buf, source, tag) -> the Request of a receive posted at once, or None."},
    {"mpi_complete", (PyCFunction)(void (*)(void))py_mpi_complete, METH_FASTCALL,
     "mpi_complete(request, loads) -> True (completed), False (the general path waits) or None (see _core.c)."},
    {"mpi_complete_all", (PyCFunction)(void (*)(void))py_mpi_complete_all, METH_FASTCALL,
     "mpi_complete_all(requests, loads, results, statuses, fill) -> (looks, waits): the indices left (_core.c)."},
    {"set_waitall", py_set_waitall, METH_VARARGS,
     "set_waitall(Request._all, Request._rest, MPI.pickle): what Waitall and waitall leave (request.py)."},
    {"Waitall", (PyCFunction)(void (*)(void))py_mpi_Waitall, METH_FASTCALL | METH_KEYWORDS,
     "Waitall($module, /, requests, statuses=None)\n--\n\n"
     "Wait for every request; True (collie.MPI's Request.Waitall)."},
    {"waitall", (PyCFunction)(void (*)(void))py_mpi_waitall, METH_FASTCALL | METH_KEYWORDS,
     "waitall($module, /, requests, statuses=None)\n--\n\n"
     "Wait for every request; each one's wait() result (collie.MPI's Request.waitall)."},
    {"mpi_envelope", (PyCFunction)(void (*)(void))py_mpi_envelope, METH_FASTCALL,
     "mpi_envelope(matcher, source) -> whether the core took source's next envelope for the matcher."},
    {"slots_round", (PyCFunction)(void (*)(void))py_slots_round, METH_FASTCALL,
     "slots_round(name, group, root, slots, payloads, loads) -> (fits, items, large), or None (objects.py)."},
    {"combine", py_combine, METH_VARARGS, "combine(dst, src, dtype, op): dst = dst op src in place."},
    {"find_lane", (PyCFunction)(void (*)(void))py_find_lane, METH_FASTCALL,
     "find_lane(group, key, tensor) -> the lane of a repeated call, or None (collectives._find_lane)."},
    {"set_batching", py_set_batching, METH_VARARGS,
     "set_batching(P2POp, irecv, CompletedWork, threshold, spin_per_byte, context_shift): what batch_fast needs."},
    {"batch_fast", (PyCFunction)(void (*)(void))py_batch_fast, METH_FASTCALL,
     "batch_fast(ops[, handed_over]) -> batch_isend_irecv's Works, what Python makes them of, False or None "
     "(see _core.c)."},
    {"p2p_target", (PyCFunction)(void (*)(void))py_p2p_target, METH_FASTCALL,
     "p2p_target(tensor, rank, group_rank, group, tag, writable) -> (group, peer, array) or None (collie.p2p)."},
    {"set_ring_ends", py_set_ring_ends, METH_VARARGS,
     "set_ring_ends(Out, In): where the ring ends' slots are (core.py, at import)."},
    {"set_hot_slots", py_set_hot_slots, METH_VARARGS,
     "set_hot_slots(ProcessGroup, Network, ShmTransport, World): where their hot slots are (core.py, at import)."},
    {"set_context", py_set_context, METH_VARARGS,
     "set_context(group module's dict, ProcessGroup, ndarray, numpy_view, dtype names, max tag): see _core.c."},
    {"set_executor", py_set_executor, METH_O,
     "set_executor(core_chosen): whether the entries may run the core (core.select)."},
    {"forget_world", py_forget_world, METH_NOARGS,
     "forget_world(): drop the entries' routes and memos (destroy_process_group)."},
    {"registered_words", py_registered_words, METH_O,
     "registered_words(buffer) -> (fd, inode, start, serial) of the registered buffer it lies in, or zeros."},
    {"registered_moves", py_registered_moves, METH_NOARGS,
     "registered_moves() -> (moves this process made through peers' registered buffers' mappings, "
     "how many it has mapped now)."},
    {"set_thread_spin", py_set_thread_spin, METH_VARARGS,
     "set_thread_spin(seconds) -> previous: bound this thread's receive spin (negative: none)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "collie._core", NULL, -1, methods};

PyMODINIT_FUNC PyInit__core(void) {
    for (int i = 0; i < NNAMES; i++)
        if (!names[i] && !(names[i] = PyUnicode_InternFromString(name_strings[i]))) return NULL;
    if (!no_requests && !(no_requests = PyTuple_New(0))) return NULL;
    if (!zero && !(zero = PyLong_FromLong(0))) return NULL;
    if (PyType_Ready(&ProgramType) < 0 || PyType_Ready(&LaneType) < 0 || PyType_Ready(&EntryType) < 0
        || PyType_Ready(&RLockType) < 0 || fields_ready() < 0 || PyType_Ready(&AppendedType) < 0
        || PyType_Ready(&CommMethodType) < 0 || PyType_Ready(&SharedMemoryType) < 0) return NULL;
    if (!minus_one && !(minus_one = PyLong_FromLong(-1))) return NULL;
    for (int k = 0; k < NCM; k++) {
        int i = 0;
        for (; cm_params[k][i]; i++)
            if (!(cm_param_names[k][i] = PyUnicode_InternFromString(cm_params[k][i]))) return NULL;
        cm_nparams[k] = i;
    }
    for (int k = 0; k < ENTRY_P2P; k++)
        if (!(entry_lane_name[k] = PyUnicode_InternFromString(entry_lane_names[k]))) return NULL;
    for (int k = 0; k < NENTRIES; k++) {
        int i = 0;
        for (; entry_params[k][i]; i++)
            if (!(entry_param_names[k][i] = PyUnicode_InternFromString(entry_params[k][i]))) return NULL;
        entry_nparams[k] = i;
    }
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ProgramType);
    if (PyModule_AddObject(m, "Program", (PyObject *)&ProgramType) < 0) return NULL;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(m, "Lane", (PyObject *)&LaneType) < 0) return NULL;
    Py_INCREF(&EntryType);
    if (PyModule_AddObject(m, "Entry", (PyObject *)&EntryType) < 0) return NULL;
    Py_INCREF(&RLockType);
    if (PyModule_AddObject(m, "RLock", (PyObject *)&RLockType) < 0) return NULL;
    Py_INCREF(&FieldsType);
    if (PyModule_AddObject(m, "RequestFields", (PyObject *)&FieldsType) < 0) return NULL;
    Py_INCREF(&AppendedType);
    if (PyModule_AddObject(m, "Appended", (PyObject *)&AppendedType) < 0) return NULL;
    Py_INCREF(&CommMethodType);
    if (PyModule_AddObject(m, "CommMethod", (PyObject *)&CommMethodType) < 0) return NULL;
    Py_INCREF(&SharedMemoryType);
    if (PyModule_AddObject(m, "SharedMemory", (PyObject *)&SharedMemoryType) < 0) return NULL;
    return m;
}
