/* The compiled twin of fetch_wire.py's two walks over every partition of a Fetch:
 * request_session and summarize_response. Same checks, same DecodeError messages, and no
 * Python object per partition. fetch_wire.py is the reference; tests/protocol runs both
 * over kio's messages, every truncation and mutated bytes.
 *
 * Positions and sizes are int64_t: a varint length can reach 2^35 - 1 and a legacy count
 * times an element size 2^35, so every sum stays exact, as Python's ints do. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#define FLEXIBLE_VERSION 12
#define TOPIC_ID_VERSION 13
#define OFFSET_OUT_OF_RANGE 1
#define ABORTED_SIZE 16 /* producer_id, first_offset */

static PyObject *DecodeError; /* tierproxy.protocol.errors.DecodeError */

typedef struct {
    const uint8_t *data;
    int64_t end;
    int version;
    int request; /* messages start "Fetch request v<version>" or "Fetch response" */
} Walk;

static inline int16_t
be16(const uint8_t *p)
{
    return (int16_t)(uint16_t)(((unsigned)p[0] << 8) | p[1]);
}

static inline int32_t
be32(const uint8_t *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

/* fetch_wire._need: `size` bytes at `pos`, else "<what> needs <size> bytes at offset <pos>, <left> left". */
static int
need(const Walk *w, int64_t pos, int64_t size, const char *what)
{
    if (size >= 0 && pos + size <= w->end) {
        return 0;
    }
    long long left = w->end > pos ? (long long)(w->end - pos) : 0;
    if (w->request) {
        PyErr_Format(DecodeError, "Fetch request v%d: %s needs %lld bytes at offset %lld, %lld left",
                     w->version, what, (long long)size, (long long)pos, left);
    } else {
        PyErr_Format(DecodeError, "Fetch response: %s needs %lld bytes at offset %lld, %lld left",
                     what, (long long)size, (long long)pos, left);
    }
    return -1;
}

/* headers.read_unsigned_varint: at most 5 bytes, as Kafka's ByteUtils. */
static int
uvarint(const Walk *w, int64_t *pos, int64_t *value)
{
    uint64_t result = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= w->end) {
            PyErr_SetString(DecodeError, "truncated varint");
            return -1;
        }
        uint8_t byte = w->data[(*pos)++];
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = (int64_t)result;
            return 0;
        }
        shift += 7;
        if (shift >= 35) {
            PyErr_SetString(DecodeError, "varint longer than 5 bytes");
            return -1;
        }
    }
}

/* headers.skip_tagged_fields */
static int
skip_tagged_fields(const Walk *w, int64_t *pos)
{
    int64_t count, tag, size;
    if (uvarint(w, pos, &count) < 0) {
        return -1;
    }
    for (int64_t i = 0; i < count; i++) {
        if (uvarint(w, pos, &tag) < 0 || uvarint(w, pos, &size) < 0) {
            return -1;
        }
        *pos += size;
        if (*pos > w->end) {
            PyErr_SetString(DecodeError, "truncated tagged field");
            return -1;
        }
    }
    return 0;
}

/* fetch_wire._read_length: an array's element count, or a string's or bytes' length (-1 for
 * null): an unsigned varint less one in flexible versions, else a legacy int16 or int32. */
static int
read_length(const Walk *w, int64_t *pos, int flexible, int legacy_size, const char *what, int64_t *length)
{
    if (flexible) {
        if (uvarint(w, pos, length) < 0) {
            return -1;
        }
        *length -= 1;
        return 0;
    }
    if (need(w, *pos, legacy_size, what) < 0) {
        return -1;
    }
    *length = legacy_size == 2 ? be16(w->data + *pos) : be32(w->data + *pos);
    *pos += legacy_size;
    return 0;
}

typedef PyObject *(*WalkFunction)(const Walk *);

/* `walk` over the buffer of (buffer, version), passed positionally. */
static PyObject *
walk_buffer(PyObject *const *args, Py_ssize_t nargs, const char *name, int request, WalkFunction walk)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 2 positional arguments (buffer, version), %zd given", name, nargs);
        return NULL;
    }
    long version = PyLong_AsLong(args[1]);
    if (version == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (version < INT16_MIN || version > INT16_MAX) {
        PyErr_Format(PyExc_ValueError, "%s(): version %ld is not an int16", name, version);
        return NULL;
    }
    Py_buffer buffer;
    if (PyObject_GetBuffer(args[0], &buffer, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Walk w = {buffer.buf, buffer.len, (int)version, request};
    PyObject *result = walk(&w);
    PyBuffer_Release(&buffer);
    return result;
}

/* ------------------------------------------------------------------------------ request */

/* fetch_wire._request_array: a count that is not null and within the bytes left. */
static int
request_array(const Walk *w, int64_t *pos, int flexible, const char *what, int64_t *count)
{
    if (read_length(w, pos, flexible, 4, what, count) < 0) {
        return -1;
    }
    /* every element takes a byte at least */
    if (*count < 0 || *count > w->end - *pos) {
        PyErr_Format(DecodeError, "Fetch request v%d: %s count %lld at offset %lld", w->version, what,
                     (long long)*count, (long long)*pos);
        return -1;
    }
    return 0;
}

/* fetch_wire._skip_string: past a (compact, from v12) string; null only where `nullable`. */
static int
skip_string(const Walk *w, int64_t *pos, int flexible, const char *what, int nullable)
{
    int64_t length;
    if (read_length(w, pos, flexible, 2, what, &length) < 0) {
        return -1;
    }
    if (nullable && length == -1) {
        return 0;
    }
    if (need(w, *pos, length, what) < 0) {
        return -1;
    }
    *pos += length;
    return 0;
}

/* fetch_wire._skip_topic: past a topic id (v13+) or name. */
static int
skip_topic(const Walk *w, int64_t *pos, int flexible)
{
    if (w->version >= TOPIC_ID_VERSION) {
        if (need(w, *pos, 16, "topic id") < 0) {
            return -1;
        }
        *pos += 16;
        return 0;
    }
    return skip_string(w, pos, flexible, "topic name", 0);
}

static PyObject *
walk_request(const Walk *w)
{
    const int version = w->version;
    const int flexible = version >= FLEXIBLE_VERSION;
    /* replica_id (v0-14), max_wait, min/max bytes, isolation */
    int64_t pos = version >= 15 ? 13 : 17;
    int32_t session_id = 0, session_epoch = -1; /* KIP-227: a full fetch without a session */
    int64_t topics, count;
    if (version >= 7) {
        if (need(w, pos, 8, "session") < 0) {
            return NULL;
        }
        session_id = be32(w->data + pos);
        session_epoch = be32(w->data + pos + 4);
        pos += 8;
    }
    /* partition, current_leader_epoch (v9+), fetch_offset, last_fetched_epoch (v12+),
     * log_start_offset (v5+), partition_max_bytes */
    const int64_t partition_size = 4 + (version >= 9 ? 4 : 0) + 8 + (version >= 12 ? 4 : 0)
                                   + (version >= 5 ? 8 : 0) + 4;
    if (request_array(w, &pos, flexible, "topics", &topics) < 0) {
        return NULL;
    }
    for (int64_t t = 0; t < topics; t++) {
        if (skip_topic(w, &pos, flexible) < 0 || request_array(w, &pos, flexible, "partitions", &count) < 0) {
            return NULL;
        }
        if (flexible) { /* each partition ends with its own tagged fields */
            for (int64_t p = 0; p < count; p++) {
                if (need(w, pos, partition_size, "partition") < 0) {
                    return NULL;
                }
                pos += partition_size;
                if (skip_tagged_fields(w, &pos) < 0) {
                    return NULL;
                }
            }
            if (skip_tagged_fields(w, &pos) < 0) {
                return NULL;
            }
        } else {
            if (need(w, pos, count * partition_size, "partitions") < 0) {
                return NULL;
            }
            pos += count * partition_size;
        }
    }
    if (version >= 7) {
        if (request_array(w, &pos, flexible, "forgotten topics", &topics) < 0) {
            return NULL;
        }
        for (int64_t t = 0; t < topics; t++) {
            if (skip_topic(w, &pos, flexible) < 0
                || request_array(w, &pos, flexible, "forgotten partitions", &count) < 0
                || need(w, pos, count * 4, "forgotten partitions") < 0) {
                return NULL;
            }
            pos += count * 4;
            if (flexible && skip_tagged_fields(w, &pos) < 0) {
                return NULL;
            }
        }
    }
    if (version >= 11 && skip_string(w, &pos, flexible, "rack id", 1) < 0) {
        return NULL;
    }
    if (flexible && skip_tagged_fields(w, &pos) < 0) {
        return NULL;
    }
    return Py_BuildValue("(ii)", (int)session_id, (int)session_epoch);
}

PyDoc_STRVAR(request_session_doc,
"request_session(body, version, /)\n--\n\n"
"(session_id, session_epoch) of a Fetch request body (after the request header), (0, -1)\n"
"before v7, once its structure is checked (every length within the body). Raises DecodeError.");

static PyObject *
request_session(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return walk_buffer(args, nargs, "request_session", 1, walk_request);
}

/* ----------------------------------------------------------------------------- response */

/* A topic name is UTF-8, as str() of it in the pure walk needs. Kafka's names are ASCII:
 * only a name with another byte is decoded to check it. */
static int
check_topic_name(const Walk *w, int64_t pos, int64_t length)
{
    const uint8_t *name = w->data + pos;
    for (int64_t i = 0; i < length; i++) {
        if (name[i] & 0x80) {
            PyObject *decoded = PyUnicode_DecodeUTF8((const char *)name, (Py_ssize_t)length, "strict");
            if (decoded != NULL) {
                Py_DECREF(decoded);
                return 0;
            }
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                PyErr_Format(DecodeError, "Fetch response: topic name at offset %lld is not UTF-8", (long long)pos);
            }
            return -1;
        }
    }
    return 0;
}

/* Past a topic id (v13+) or name. */
static int
skip_topic_key(const Walk *w, int64_t *pos, int flexible)
{
    int64_t length;
    if (w->version >= TOPIC_ID_VERSION) {
        if (need(w, *pos, 16, "topic id") < 0) {
            return -1;
        }
        *pos += 16;
        return 0;
    }
    if (read_length(w, pos, flexible, 2, "topic name length", &length) < 0) {
        return -1;
    }
    if (length < 0) {
        length = 0;
    }
    if (need(w, *pos, length, "topic name") < 0 || check_topic_name(w, *pos, length) < 0) {
        return -1;
    }
    *pos += length;
    return 0;
}

static PyObject *
walk_response(const Walk *w)
{
    const int version = w->version;
    const int flexible = version >= FLEXIBLE_VERSION;
    const uint8_t *data = w->data;
    int32_t throttle, session = 0;
    int16_t error = 0;
    int64_t pos, topics, partitions, aborted, size;
    int64_t records_size = 0, out_of_range = 0;
    if (version >= 7) {
        if (need(w, 0, 10, "header") < 0) {
            return NULL;
        }
        throttle = be32(data);
        error = be16(data + 4);
        session = be32(data + 6);
        pos = 10;
    } else {
        if (need(w, 0, 4, "throttle time") < 0) {
            return NULL;
        }
        throttle = be32(data);
        pos = 4;
    }
    /* partition_index, error_code, high_watermark, last_stable_offset, log_start_offset (v5+) */
    const int64_t fixed = version >= 5 ? 30 : 22;
    if (read_length(w, &pos, flexible, 4, "array length", &topics) < 0) {
        return NULL;
    }
    for (int64_t t = 0; t < topics; t++) {
        if (skip_topic_key(w, &pos, flexible) < 0
            || read_length(w, &pos, flexible, 4, "array length", &partitions) < 0) {
            return NULL;
        }
        for (int64_t p = 0; p < partitions; p++) {
            if (need(w, pos, fixed + 1, "partition") < 0) {
                return NULL;
            }
            out_of_range += be16(data + pos + 4) == OFFSET_OUT_OF_RANGE;
            pos += fixed;
            if (read_length(w, &pos, flexible, 4, "array length", &aborted) < 0) {
                return NULL;
            }
            if (aborted > 0) {
                if (flexible) { /* each entry ends with its own tagged fields */
                    for (int64_t i = 0; i < aborted; i++) {
                        if (need(w, pos, ABORTED_SIZE, "aborted transaction") < 0) {
                            return NULL;
                        }
                        pos += ABORTED_SIZE;
                        if (skip_tagged_fields(w, &pos) < 0) {
                            return NULL;
                        }
                    }
                } else {
                    if (need(w, pos, aborted * ABORTED_SIZE, "aborted transactions") < 0) {
                        return NULL;
                    }
                    pos += aborted * ABORTED_SIZE;
                }
            }
            if (version >= 11) {
                if (need(w, pos, 4, "preferred read replica") < 0) {
                    return NULL;
                }
                pos += 4;
            }
            /* records: bytes, the same length encoding as an array */
            if (read_length(w, &pos, flexible, 4, "array length", &size) < 0) {
                return NULL;
            }
            if (size < 0) {
                size = 0;
            }
            if (need(w, pos, size, "records") < 0) {
                return NULL;
            }
            pos += size;
            records_size += size;
            if (flexible && skip_tagged_fields(w, &pos) < 0) {
                return NULL;
            }
        }
        if (flexible && skip_tagged_fields(w, &pos) < 0) {
            return NULL;
        }
    }
    PyObject *tagged = Py_None;
    if (flexible) {
        int64_t start = pos;
        if (skip_tagged_fields(w, &pos) < 0) {
            return NULL;
        }
        tagged = PyLong_FromLongLong(start);
        if (tagged == NULL) {
            return NULL;
        }
    } else {
        Py_INCREF(tagged);
    }
    if (pos != w->end) {
        Py_DECREF(tagged);
        PyErr_Format(DecodeError, "Fetch response: %lld bytes after the payload", (long long)(w->end - pos));
        return NULL;
    }
    return Py_BuildValue("(iiiLLN)", (int)throttle, (int)error, (int)session, (long long)records_size,
                         (long long)out_of_range, tagged);
}

PyDoc_STRVAR(summarize_response_doc,
"summarize_response(payload, version, /)\n--\n\n"
"(throttle_time_ms, error_code, session_id, records size, partitions OFFSET_OUT_OF_RANGE,\n"
"offset of the top-level tagged fields or None before v12) of a Fetch response (v4+)\n"
"payload, once its structure is checked. Raises DecodeError.");

static PyObject *
summarize_response(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return walk_buffer(args, nargs, "summarize_response", 0, walk_response);
}

/* ------------------------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"request_session", (PyCFunction)(void (*)(void))request_session, METH_FASTCALL, request_session_doc},
    {"summarize_response", (PyCFunction)(void (*)(void))summarize_response, METH_FASTCALL, summarize_response_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "tierproxy.protocol._fetch_wire",
    "The compiled twin of tierproxy.protocol.fetch_wire's request_session and summarize_response.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__fetch_wire(void)
{
    PyObject *errors = PyImport_ImportModule("tierproxy.protocol.errors");
    if (errors == NULL) {
        return NULL;
    }
    DecodeError = PyObject_GetAttrString(errors, "DecodeError");
    Py_DECREF(errors);
    if (DecodeError == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
