/* The records of one uncompressed record batch (v2) as the buffers of Arrow columns: the
 * compiled twin of tierproxy.pipeline.record_arrays' pure-Python path, which reads them with
 * aiokafka's decoder one record at a time. Keys and values are copied into one data buffer
 * each with Arrow's int32 offsets and validity bitmaps; no Python object is made per record
 * unless the record has headers.
 *
 * decode(records, count, base_offset, base_timestamp, append_time) -> (
 *     offsets, timestamps,                               int64 each, native order
 *     key_validity | None, key_nulls, key_offsets, key_data,
 *     value_validity | None, value_nulls, value_offsets, value_data,
 *     headers | None)                                    a list: a tuple of (str, bytes | None) per record
 *
 * `records` is what follows the 61-byte batch header, decompressed; `append_time`, when not
 * None, is every record's timestamp (LOG_APPEND_TIME: the batch's max timestamp). Raises
 * ValueError when the records do not decode or do not fill `records` exactly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int
varlong(const uint8_t *buf, Py_ssize_t len, Py_ssize_t *pos, int64_t *out)
{
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*pos >= len)
            return -1;
        uint8_t b = buf[(*pos)++];
        value |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(value >> 1) ^ -(int64_t)(value & 1); /* zigzag */
            return 0;
        }
    }
    return -1;
}

static PyObject *
fail(const char *what, Py_ssize_t index)
{
    PyErr_Format(PyExc_ValueError, "record %zd: %s", index, what);
    return NULL;
}

/* A length field: negative (null) when `nullable`, as Kafka's DefaultRecord reads keys and
 * values, else 0 to what is left of the buffer. */
static int
length(const uint8_t *buf, Py_ssize_t len, Py_ssize_t *pos, int nullable, int64_t *out)
{
    if (varlong(buf, len, pos, out) < 0)
        return -1;
    if (*out < 0 && nullable)
        return 0;
    if (*out < 0 || *out > len - *pos)
        return -1;
    return 0;
}

/* Record i's key or value (a nullable length, then its bytes): appended to its column's data
 * and offsets, or counted null. */
static int
column_add(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *pos, Py_ssize_t i, uint8_t *valid, int32_t *offsets,
           char *data, Py_ssize_t *fill, Py_ssize_t *nulls)
{
    int64_t n;
    if (length(buf, end, pos, 1, &n) < 0)
        return -1;
    if (n < 0) {
        (*nulls)++;
    } else {
        valid[i >> 3] |= (uint8_t)(1 << (i & 7));
        memcpy(data + *fill, buf + *pos, (size_t)n);
        *fill += n;
        *pos += n;
    }
    offsets[i + 1] = (int32_t)*fill;
    return 0;
}

static PyObject *
decode(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count;
    long long base_offset, base_timestamp;
    PyObject *append_time_obj;
    if (!PyArg_ParseTuple(args, "y*nLLO", &view, &count, &base_offset, &base_timestamp, &append_time_obj))
        return NULL;
    PyObject *result = NULL, *offsets = NULL, *timestamps = NULL, *key_valid = NULL, *key_offsets = NULL,
             *key_data = NULL, *value_valid = NULL, *value_offsets = NULL, *value_data = NULL, *headers = NULL,
             *empty = NULL;
    long long append_time = 0;
    int log_append_time = append_time_obj != Py_None;
    if (log_append_time) {
        append_time = PyLong_AsLongLong(append_time_obj);
        if (append_time == -1 && PyErr_Occurred())
            goto done;
    }
    if (view.len > INT32_MAX) { /* Arrow's binary offsets are int32 */
        PyErr_Format(PyExc_ValueError, "%zd bytes of records: more than a binary column's offsets hold", view.len);
        goto done;
    }
    if (count < 0 || count > view.len) { /* a record is at least 7 bytes */
        PyErr_Format(PyExc_ValueError, "%zd records cannot fit %zd bytes", count, view.len);
        goto done;
    }
    const uint8_t *buf = view.buf;
    const Py_ssize_t len = view.len;
    Py_ssize_t bitmap = (count + 7) / 8;
    offsets = PyBytes_FromStringAndSize(NULL, count * 8);
    timestamps = PyBytes_FromStringAndSize(NULL, count * 8);
    key_valid = PyBytes_FromStringAndSize(NULL, bitmap);
    value_valid = PyBytes_FromStringAndSize(NULL, bitmap);
    key_offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * 4);
    value_offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * 4);
    /* Keys and values together are fewer bytes than the records: sized down once filled. */
    key_data = PyBytes_FromStringAndSize(NULL, len);
    value_data = PyBytes_FromStringAndSize(NULL, len);
    if (!offsets || !timestamps || !key_valid || !value_valid || !key_offsets || !value_offsets || !key_data ||
        !value_data)
        goto done;
    int64_t *offs = (int64_t *)PyBytes_AS_STRING(offsets), *ts = (int64_t *)PyBytes_AS_STRING(timestamps);
    uint8_t *kvalid = (uint8_t *)PyBytes_AS_STRING(key_valid), *vvalid = (uint8_t *)PyBytes_AS_STRING(value_valid);
    int32_t *koffs = (int32_t *)PyBytes_AS_STRING(key_offsets), *voffs = (int32_t *)PyBytes_AS_STRING(value_offsets);
    char *kdata = PyBytes_AS_STRING(key_data), *vdata = PyBytes_AS_STRING(value_data);
    memset(kvalid, 0, bitmap);
    memset(vvalid, 0, bitmap);
    Py_ssize_t key_nulls = 0, value_nulls = 0, kfill = 0, vfill = 0, pos = 0;
    koffs[0] = voffs[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t size, ts_delta, offset_delta, header_count;
        if (varlong(buf, len, &pos, &size) < 0 || size < 0 || size > len - pos) {
            fail("its length runs past the batch", i);
            goto done;
        }
        Py_ssize_t end = pos + (Py_ssize_t)size;
        int64_t attributes; /* unused; an int8, read as a varint as the reference (aiokafka) does: the
                               same for every record Kafka writes, whose attributes are 0 */
        if (varlong(buf, end, &pos, &attributes) < 0 || varlong(buf, end, &pos, &ts_delta) < 0 ||
            varlong(buf, end, &pos, &offset_delta) < 0) {
            fail("truncated before its key", i);
            goto done;
        }
        offs[i] = base_offset + offset_delta;
        ts[i] = log_append_time ? append_time : base_timestamp + ts_delta;
        if (column_add(buf, end, &pos, i, kvalid, koffs, kdata, &kfill, &key_nulls) < 0) {
            fail("bad key length", i);
            goto done;
        }
        if (column_add(buf, end, &pos, i, vvalid, voffs, vdata, &vfill, &value_nulls) < 0) {
            fail("bad value length", i);
            goto done;
        }
        if (varlong(buf, end, &pos, &header_count) < 0 || header_count < 0 || header_count > end - pos) {
            fail("bad header count", i);
            goto done;
        }
        if (header_count > 0) {
            if (headers == NULL) {
                empty = PyTuple_New(0);
                headers = empty ? PyList_New(count) : NULL;
                if (headers == NULL)
                    goto done;
                for (Py_ssize_t j = 0; j < count; j++) {
                    Py_INCREF(empty);
                    PyList_SET_ITEM(headers, j, empty);
                }
            }
            PyObject *tuple = PyTuple_New((Py_ssize_t)header_count);
            if (tuple == NULL)
                goto done;
            PyList_SetItem(headers, i, tuple); /* the list owns it, and drops the empty tuple */
            for (int64_t h = 0; h < header_count; h++) {
                int64_t hkey_len, hvalue_len;
                if (length(buf, end, &pos, 0, &hkey_len) < 0) {
                    fail("bad header key length", i);
                    goto done;
                }
                PyObject *key = PyUnicode_DecodeUTF8((const char *)buf + pos, (Py_ssize_t)hkey_len, "strict");
                if (key == NULL)
                    goto done;
                pos += hkey_len;
                if (length(buf, end, &pos, 1, &hvalue_len) < 0) {
                    Py_DECREF(key);
                    fail("bad header value length", i);
                    goto done;
                }
                PyObject *value;
                if (hvalue_len < 0) {
                    value = Py_None;
                    Py_INCREF(value);
                } else {
                    value = PyBytes_FromStringAndSize((const char *)buf + pos, (Py_ssize_t)hvalue_len);
                    pos += hvalue_len;
                }
                PyObject *pair = value ? PyTuple_Pack(2, key, value) : NULL;
                Py_DECREF(key);
                Py_XDECREF(value);
                if (pair == NULL)
                    goto done;
                PyTuple_SET_ITEM(tuple, (Py_ssize_t)h, pair);
            }
        }
        if (pos != end) {
            fail("its fields do not fill its length", i);
            goto done;
        }
    }
    if (pos != len) {
        PyErr_Format(PyExc_ValueError, "%zd bytes after the last of %zd records", len - pos, count);
        goto done;
    }
    if (_PyBytes_Resize(&key_data, kfill) < 0 || _PyBytes_Resize(&value_data, vfill) < 0)
        goto done;
    result = Py_BuildValue("(OOOnOOOnOOO)", offsets, timestamps, key_nulls ? key_valid : Py_None, key_nulls,
                           key_offsets, key_data, value_nulls ? value_valid : Py_None, value_nulls, value_offsets,
                           value_data, headers ? headers : Py_None);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(offsets);
    Py_XDECREF(timestamps);
    Py_XDECREF(key_valid);
    Py_XDECREF(value_valid);
    Py_XDECREF(key_offsets);
    Py_XDECREF(value_offsets);
    Py_XDECREF(key_data);
    Py_XDECREF(value_data);
    Py_XDECREF(headers);
    Py_XDECREF(empty);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "The records of an uncompressed batch as Arrow column buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_arrays", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__record_arrays(void)
{
    return PyModule_Create(&module);
}
