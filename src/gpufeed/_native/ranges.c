/* gpufeed._native.ranges: the fast path's batch of small checked reads in
 * one call, with the interpreter lock released once for the whole batch.
 *
 * Why native code: a batch of 4 KiB reads in Python pays the interpreter
 * for every item (a pread call, a CRC call, the lock handed over and back
 * around each pread), several microseconds each, which caps batched 4 KiB
 * reads well under what the page cache gives (docs/small-reads.md). This
 * loop does only the reads and the comparisons; the CRC32C itself is the
 * kept library's (google-crc32c's crc32c_extend, whose address the caller
 * passes in), never our own.
 *
 * read_ranges(fd, base, size, offsets, lengths, dest, sums, out, crc_extend)
 *   fd, base:  the data file and the file offset of the object's byte 0;
 *   size:      the object's bytes (one raw chunk of that file);
 *   offsets:   uint64 per range (object offsets), lengths: uint32 per range;
 *   dest:      writable; range i lands at dest[lengths[0] + ... + lengths[i-1]];
 *   sums:      uint32 per 4 KiB block: the running CRC32C of the stored bytes
 *              up to that block's end (gpufeed.engine._blocksums);
 *   out:       writable int64 per range: the bytes read and checked, or -2
 *              where this loop did not serve the range (not whole blocks, past
 *              the end, a short read, a sum that does not match): the caller
 *              serves those by its careful path, which says what is wrong;
 *   crc_extend: address of uint32_t f(uint32_t crc, const uint8_t *, size_t).
 * Returns the number of ranges served.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <unistd.h>

#define BLOCK 4096u

typedef uint32_t (*crc_extend_t)(uint32_t crc, const uint8_t *data, size_t n);

static PyObject *read_ranges(PyObject *self, PyObject *args) {
    int fd;
    long long base, size;
    unsigned long long crc_addr;
    Py_buffer offs, lens, dest, sums, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "iLLy*y*w*y*w*K", &fd, &base, &size, &offs, &lens, &dest, &sums, &out,
                          &crc_addr))
        return NULL;
    Py_ssize_t count = offs.len / 8;
    PyObject *result = NULL;
    if (offs.len % 8 || lens.len != count * 4 || out.len != count * 8 || sums.len % 4 || base < 0 ||
        size < 0 || crc_addr == 0) {
        PyErr_SetString(PyExc_ValueError, "read_ranges: offsets, lengths and out disagree in count");
        goto done;
    }
    const uint64_t *o = (const uint64_t *)offs.buf;
    const uint32_t *l = (const uint32_t *)lens.buf;
    const uint32_t *s = (const uint32_t *)sums.buf;
    int64_t *r = (int64_t *)out.buf;
    uint8_t *d = (uint8_t *)dest.buf;
    uint64_t nsums = (uint64_t)(sums.len / 4), usize = (uint64_t)size, cap = (uint64_t)dest.len;
    crc_extend_t crc = (crc_extend_t)(uintptr_t)crc_addr;
    Py_ssize_t served = 0;
    Py_BEGIN_ALLOW_THREADS
    uint64_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t start = o[i], want = l[i];
        int64_t res = -2;
        if (pos + want <= cap && start < usize && start % BLOCK == 0) {
            uint64_t n = want < usize - start ? want : usize - start;
            uint64_t first = start / BLOCK, last = first + (n + BLOCK - 1) / BLOCK;
            if (n > 0 && (n % BLOCK == 0 || start + n == usize) && last <= nsums) {
                uint64_t got = 0;
                while (got < n) {
                    ssize_t k = pread(fd, d + pos + got, n - got, (off_t)(base + start + got));
                    if (k < 0 && errno == EINTR)
                        continue;
                    if (k <= 0)
                        break;
                    got += (uint64_t)k;
                }
                if (got == n && crc(first ? s[first - 1] : 0, d + pos, n) == s[last - 1]) {
                    res = (int64_t)n;
                    served++;
                }
            }
        }
        r[i] = res;
        pos += want;
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(served);
done:
    PyBuffer_Release(&offs);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&dest);
    PyBuffer_Release(&sums);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"read_ranges", read_ranges, METH_VARARGS, "Read and check a batch of whole-block ranges (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpufeed._native.ranges", NULL, -1, methods};

PyMODINIT_FUNC PyInit_ranges(void) { return PyModule_Create(&module); }
