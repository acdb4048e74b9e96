/* gpufeed._native.ranges: the fast path's batch of checked range reads in one
 * call, with the interpreter lock released once for the whole batch.
 *
 * Why native code: a batch of small reads in Python pays the interpreter for
 * every range (a pread call, CRC calls, a lookup of the chunk, the lock handed
 * over and back around each pread), tens of microseconds each, which caps
 * batched small reads well under what the page cache gives
 * (docs/small-reads.md). This loop does only the reads and the comparisons;
 * the CRC32C itself is the kept library's (google-crc32c's crc32c_extend,
 * whose address the caller passes in), never our own.
 *
 * read_ranges(table, sums, offsets, lengths, dest, out, crc_extend, fd=-1, fd_offset=0)
 *   table:   int64, 5 per chunk of the object, in object order, back to back:
 *            (object offset of the chunk's byte 0, its bytes (stored raw),
 *             data file descriptor or -1, file offset of its byte 0,
 *             index in sums of its first block's sum);
 *   sums:    uint32 per 4 KiB block of each chunk: the running CRC32C of the
 *            chunk's stored bytes up to that block's end
 *            (gpufeed.engine._blocksums); a chunk's last block may be short;
 *   offsets: uint64 per range (object offsets), lengths: uint32 per range;
 *   dest:    writable; range i lands at dest[lengths[0] + ... + lengths[i-1]],
 *            cut at the object's end;
 *   out:     writable int64 per range: the bytes read and checked, or -2
 *            where this loop did not serve the range (outside the object, a
 *            chunk without a descriptor, a short read, a sum that does not
 *            match): the caller serves those by its careful path, which says
 *            what is wrong;
 *   crc_extend: address of uint32_t f(uint32_t crc, const uint8_t *, size_t);
 *   fd, fd_offset: when fd >= 0, the ranges go to that file instead, packed
 *            from fd_offset as they would be in dest, and dest is a staging
 *            buffer: runs of ranges that fit in it are read and checked there,
 *            then their good bytes written with pwrite (a range longer than
 *            dest is left to the caller, -2).
 * Returns the number of ranges served; raises OSError when a write to fd fails
 * (ranges before it were written).
 *
 * Each piece of a range (its part in one chunk) is read with one preadv that
 * lands the range's bytes in dest and the rest of its first and last 4 KiB
 * blocks in scratch, so that the running CRC can continue from the sum of the
 * block before and be compared with the sum of the last block: every byte
 * served is checked, and none is read twice.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

#define BLOCK 4096u
#define COLS 5

typedef uint32_t (*crc_extend_t)(uint32_t crc, const uint8_t *data, size_t n);

typedef struct {
    const int64_t *t;
    Py_ssize_t chunks;
    const uint32_t *s;
    uint64_t nsums;
    crc_extend_t crc;
} object_t;

/* Index of the chunk holding object offset pos (the last whose start is <= pos). */
static Py_ssize_t find_chunk(const object_t *o, uint64_t pos) {
    Py_ssize_t lo = 0, hi = o->chunks - 1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        if ((uint64_t)o->t[mid * COLS] <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Read and check n bytes at offset rel of chunk c into d; 1 when they are good. */
static int read_piece(const object_t *o, Py_ssize_t c, uint64_t rel, uint64_t n, uint8_t *d) {
    const int64_t *row = o->t + c * COLS;
    uint64_t len = (uint64_t)row[1], first = rel / BLOCK, end = rel + n;
    uint64_t last = (end + BLOCK - 1) / BLOCK, stop = last * BLOCK < len ? last * BLOCK : len;
    uint64_t sum0 = (uint64_t)row[4];
    uint64_t head = rel - first * BLOCK, tail = stop - end;
    uint8_t before[BLOCK], after[BLOCK];
    if (row[2] < 0 || sum0 + last > o->nsums)
        return 0;
    struct iovec iov[3];
    int parts = 0;
    if (head)
        iov[parts++] = (struct iovec){before, head};
    iov[parts++] = (struct iovec){d, n};
    if (tail)
        iov[parts++] = (struct iovec){after, tail};
    uint64_t want = head + n + tail;
    off_t at = (off_t)(row[3] + (int64_t)(first * BLOCK));
    ssize_t k;
    do /* whole blocks (the common case of aligned reads): a plain pread, cheaper than preadv */
        k = parts == 1 ? pread((int)row[2], d, n, at) : preadv((int)row[2], iov, parts, at);
    while (k < 0 && errno == EINTR);
    if (k < 0 || (uint64_t)k != want)
        return 0; /* a short read: the careful path reads again and says why */
    uint32_t crc = first ? o->s[sum0 + first - 1] : 0;
    if (head)
        crc = o->crc(crc, before, head);
    crc = o->crc(crc, d, n);
    if (tail)
        crc = o->crc(crc, after, tail);
    return crc == o->s[sum0 + last - 1];
}

/* Read range i (want bytes at object offset start, cut at the object's end)
 * into d; its bytes, or -2 when this loop does not serve it. */
static int64_t read_range(const object_t *o, uint64_t size, uint64_t start, uint64_t want, uint8_t *d) {
    if (want == 0 || start >= size)
        return -2;
    uint64_t n = want < size - start ? want : size - start, got = 0;
    Py_ssize_t c = find_chunk(o, start);
    while (got < n && c < o->chunks) {
        const int64_t *row = o->t + c * COLS;
        uint64_t rel = start + got - (uint64_t)row[0], m = (uint64_t)row[1] - rel;
        if (m > n - got)
            m = n - got;
        if (!read_piece(o, c, rel, m, d + got))
            return -2;
        got += m;
        c++;
    }
    return got == n ? (int64_t)n : -2;
}

/* Write n bytes of buf at offset pos of fd; 0, or the errno of the failure. */
static int write_all(int fd, const uint8_t *buf, uint64_t n, uint64_t pos) {
    while (n > 0) {
        ssize_t k = pwrite(fd, buf, n, (off_t)pos);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? errno : EIO;
        buf += k;
        n -= (uint64_t)k;
        pos += (uint64_t)k;
    }
    return 0;
}

/* Write the good bytes of ranges [from, to), staged back to back from stage[0]
 * (ranges packed from file offset at), each run of good ranges in one pwrite. */
static int flush(int fd, const uint8_t *stage, const uint32_t *len, const int64_t *r, Py_ssize_t from,
                 Py_ssize_t to, uint64_t at) {
    uint64_t spos = 0, run = 0, run_len = 0;
    for (Py_ssize_t k = from; k < to; k++) {
        if (r[k] > 0 && run_len == spos - run) {
            run_len += (uint64_t)r[k]; /* joins the run when the run has no gap before it */
        } else if (r[k] > 0) {
            int err = run_len ? write_all(fd, stage + run, run_len, at + run) : 0;
            if (err)
                return err;
            run = spos;
            run_len = (uint64_t)r[k];
        }
        spos += len[k];
    }
    return run_len ? write_all(fd, stage + run, run_len, at + run) : 0;
}

static PyObject *read_ranges(PyObject *self, PyObject *args) {
    unsigned long long crc_addr;
    Py_buffer table, sums, offs, lens, dest, out;
    int fd = -1;
    long long fd_offset = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*K|iL", &table, &sums, &offs, &lens, &dest, &out, &crc_addr, &fd,
                          &fd_offset))
        return NULL;
    Py_ssize_t count = offs.len / 8, chunks = table.len / (8 * COLS);
    PyObject *result = NULL;
    if (offs.len % 8 || lens.len != count * 4 || out.len != count * 8 || sums.len % 4 ||
        table.len % (8 * COLS) || chunks == 0 || crc_addr == 0 || fd_offset < 0) {
        PyErr_SetString(PyExc_ValueError, "read_ranges: table, offsets, lengths and out disagree in size");
        goto done;
    }
    object_t o = {(const int64_t *)table.buf, chunks, (const uint32_t *)sums.buf, (uint64_t)(sums.len / 4),
                  (crc_extend_t)(uintptr_t)crc_addr};
    for (Py_ssize_t c = 0; c < chunks; c++) { /* chunks back to back from 0, as the caller promises */
        const int64_t *row = o.t + c * COLS;
        if (row[0] != (c ? row[-COLS] + row[1 - COLS] : 0) || row[1] <= 0 || row[4] < 0) {
            PyErr_SetString(PyExc_ValueError, "read_ranges: the chunk table is not back to back");
            goto done;
        }
    }
    const int64_t *lastrow = o.t + (chunks - 1) * COLS;
    uint64_t size = (uint64_t)(lastrow[0] + lastrow[1]), cap = (uint64_t)dest.len, pos = 0;
    const uint64_t *off = (const uint64_t *)offs.buf;
    const uint32_t *len = (const uint32_t *)lens.buf;
    int64_t *r = (int64_t *)out.buf;
    uint8_t *d = (uint8_t *)dest.buf;
    Py_ssize_t served = 0, run = 0;
    uint64_t spos = 0, run_at = (uint64_t)fd_offset;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && !err; i++) {
        if (fd < 0) {
            r[i] = pos + len[i] <= cap ? read_range(&o, size, off[i], len[i], d + pos) : -2;
        } else {
            if (spos + len[i] > cap) { /* the stage is full: write the run staged so far */
                err = flush(fd, d, len, r, run, i, run_at);
                run_at += spos;
                run = i;
                spos = 0;
            }
            r[i] = len[i] <= cap ? read_range(&o, size, off[i], len[i], d + spos) : -2;
            spos += len[i] <= cap ? len[i] : 0;
            if (len[i] > cap) { /* left to the caller: the run goes on after it */
                err = err ? err : flush(fd, d, len, r, run, i, run_at);
                run_at += spos + len[i];
                run = i + 1;
                spos = 0;
            }
        }
        served += r[i] > 0;
        pos += len[i];
    }
    if (fd >= 0 && !err)
        err = flush(fd, d, len, r, run, count, run_at);
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyLong_FromSsize_t(served);
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&sums);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&dest);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"read_ranges", read_ranges, METH_VARARGS, "Read and check a batch of ranges of one object (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpufeed._native.ranges", NULL, -1, methods};

PyMODINIT_FUNC PyInit_ranges(void) { return PyModule_Create(&module); }
