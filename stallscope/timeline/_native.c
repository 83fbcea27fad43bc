/* The timeline's hot path in C: what runs between two training steps.
 *
 * recorder.py has the same pieces in Python, used when this module is not built (no C
 * compiler at install time) or STALLSCOPE_NO_NATIVE is set; the two log the same events (into
 * an EventLog here, a list there) and fold them into the same state. The whole test suite runs
 * against both (make unit); tests/test_native_twins.py drives the two side by side with random
 * sequences of operations, tests/test_native.py compares the two folds on random logs, and make
 * sanitize runs the tests of this module against a build with ASan and UBSan (docs/development.md).
 *
 *   EventLog the log: (code, timestamp) pairs as C long longs, nothing allocated per event.
 *   Timer   the context manager ``scope.phase(name)`` hands out (recorder.PhaseTimer): logs
 *           (phase id, now) on enter and (LEAVE, now) on exit, then folds the log when full.
 *   Stream  the iterator behind ``scope.iter`` (recorder.Timeline._stream): logs (STEP, now)
 *           before each next() and (GOT, now) after it, reads the CPU clock around one wait per
 *           interval, hands the first item to ``on_first``, and logs (NONE, now) when the
 *           iterator ends or raises. The final wait is appended to ``result``.
 *   fold    Timeline._fold_events: applies the logged events to the phase totals, steps, rings
 *           and idle windows (it calls back ``timeline._close_window`` once per window).
 *   order_stats  stats.Distribution.of's numbers of an array('q') of step times: what a report
 *           of many short epochs makes twice for each (tests/test_native.py holds it to Python's).
 *   summary_numbers  report.build.summarize's numbers of an epoch's snapshot, rounded as Python
 *           rounds them (tests/test_native.py holds each to Python's, ties of the rounding too).
 *   json_ints  a list of ints as JSON text: the record of a run's last steps in report.json.
 *
 * Never hurt the run: StallScope's own errors (an Exception from a clock or a callback) go to
 * ``timeline._failed`` (which turns recording off), and the stream then passes the
 * remaining items through; an item already taken from the user's iterator is never dropped.
 * The user's exceptions propagate unchanged, and the stream can be resumed after one (the Python
 * twin, a generator, ends there). A clock that is time.perf_counter_ns is read with
 * clock_gettime(CLOCK_MONOTONIC), as CPython reads it on Linux; any other clock is called.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <string.h>
#include <time.h>

/* event codes: the same as recorder.py's (checked there at import) */
#define LEAVE (-1)
#define STEP (-2)
#define WAIT (-3)
#define GOT (-4)
#define NONE (-5)
#define END (-6)
/* built-in phase ids: the same as phases.BUILTIN_PHASES' order (checked there at import) */
#define DATA_ID 0
#define COMPUTE_ID 2
#define OTHER_ID 6
/* a step's phases as bits of an int64 (recorder.KIND_BITS): ids from this one on share its bit */
#define KIND_BITS 62
/* a recent step's phase times are kept per column (recorder.RECENT_COLUMNS): phase id ``i`` in
 * column ``i``; ids from the last column on (the custom phases) share it */
#define RECENT_COLUMNS 8

static PyObject *perf_counter_ns; /* time.perf_counter_ns */
static PyObject *code_leave; /* LEAVE as an int, for a timer whose target is a callable */
static PyObject *name_fold, *name_failed; /* the timeline's methods, by name */

/* ``value`` as a C long long. PyLong_AsLongLong goes through a byte-array conversion for any
 * int past 2**30, which timestamps all are: this reads the digits directly. */
static int
as_ll(PyObject *value, long long *out)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "stallscope: an int does not fit in 64 bits");
        return -1;
    }
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = v;
    return 0;
}

static int
read_clock(PyObject *clock, long long *out)
{
#if defined(__linux__)
    if (clock == perf_counter_ns && clock != NULL) {
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0) {
            *out = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
            return 0;
        }
    }
#endif
    PyObject *value = PyObject_CallNoArgs(clock);
    if (value == NULL) {
        return -1;
    }
    int rc = as_ll(value, out);
    Py_DECREF(value);
    return rc;
}

/* ---- EventLog -------------------------------------------------------------------------- */

/* The timeline's event log: (code, timestamp) pairs as C long longs, appended to in place. A list
 * of Python ints would allocate an int for each timestamp and free it again at the fold; this
 * allocates nothing per event once its buffer has grown to a fold's worth. From Python it is a
 * sequence of ints with ``extend``, ``copy`` (a list) and ``clear``, what recorder.py uses of a
 * list. It holds no Python objects. */
typedef struct {
    PyObject_HEAD
    long long *items;
    Py_ssize_t len;
    Py_ssize_t cap;
    /* the training thread's ident (0: any thread): a Timer entered or left on another thread logs
     * nothing, and the first such thread's ident is kept in ``foreign`` */
    unsigned long owner;
    unsigned long foreign;
} EventLog;

static PyTypeObject EventLogType;
#define EventLog_Check(op) Py_IS_TYPE((op), &EventLogType)
/* a cleared log keeps a buffer of up to this many entries; a larger one is freed */
#define KEEP_ENTRIES 8192

/* room for ``more`` entries after the last */
static int
log_reserve(EventLog *log, Py_ssize_t more)
{
    if (log->cap - log->len >= more) {
        return 0;
    }
    if (more > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(long long) - log->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = log->len + more, cap = log->cap > 0 ? log->cap : 64;
    while (cap < need) {
        cap *= 2;
    }
    long long *grown = PyMem_Realloc(log->items, (size_t)cap * sizeof(long long));
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    log->items = grown;
    log->cap = cap;
    return 0;
}

/* append (code, t): both or neither */
static int
log_event(PyObject *log, long long code, long long t)
{
    EventLog *self = (EventLog *)log;
    if (self->cap - self->len < 2 && log_reserve(self, 2) < 0) {
        return -1;
    }
    self->items[self->len] = code;
    self->items[self->len + 1] = t;
    self->len += 2;
    return 0;
}

/* append (code, t, then, t): all four or none */
static int
log_event_then(PyObject *log, long long code, long long t, long long then)
{
    EventLog *self = (EventLog *)log;
    if (self->cap - self->len < 4 && log_reserve(self, 4) < 0) {
        return -1;
    }
    long long *end = self->items + self->len;
    end[0] = code;
    end[1] = t;
    end[2] = then;
    end[3] = t;
    self->len += 4;
    return 0;
}

static void
log_clear(EventLog *self)
{
    self->len = 0;
    if (self->cap > KEEP_ENTRIES) {
        PyMem_Free(self->items);
        self->items = NULL;
        self->cap = 0;
    }
}

/* extend(values): the ints of an iterable appended, all or none (a half-logged event would shift
 * the pairs); what recorder.py's ``_push`` calls with a tuple */
static PyObject *
EventLog_extend(EventLog *self, PyObject *values)
{
    PyObject *seq = PySequence_Fast(values, "EventLog.extend needs an iterable of ints");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    long long local[8];
    long long *converted = n <= 8 ? local : PyMem_Malloc((size_t)n * sizeof(long long));
    if (converted == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    /* converted first: an item's __index__ may run Python, which may use this log */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_ll(PySequence_Fast_GET_ITEM(seq, i), &converted[i]) < 0) {
            n = -1;
            break;
        }
    }
    int rc = n >= 0 ? log_reserve(self, n) : -1;
    if (rc == 0) {
        memcpy(self->items + self->len, converted, (size_t)n * sizeof(long long));
        self->len += n;
    }
    if (converted != local) {
        PyMem_Free(converted);
    }
    Py_DECREF(seq);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* the entries as a list of ints (``Timeline.probe`` reads it from another thread) */
static PyObject *
EventLog_copy(EventLog *self, PyObject *Py_UNUSED(ignored))
{
    /* a snapshot first: making the list may collect garbage, whose finalizers may run Python
     * (and let another thread run) that folds or clears this log meanwhile */
    Py_ssize_t n = self->len;
    long long *snapshot = PyMem_Malloc(n > 0 ? (size_t)n * sizeof(long long) : 1);
    if (snapshot == NULL) {
        return PyErr_NoMemory();
    }
    if (n > 0) {
        memcpy(snapshot, self->items, (size_t)n * sizeof(long long));
    }
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *value = PyLong_FromLongLong(snapshot[i]);
        if (value == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, value);
    }
    PyMem_Free(snapshot);
    return out;
}

static PyObject *
EventLog_clear_method(EventLog *self, PyObject *Py_UNUSED(ignored))
{
    log_clear(self);
    Py_RETURN_NONE;
}

static int
EventLog_init(EventLog *self, PyObject *args, PyObject *kwds)
{
    PyObject *values = NULL;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "EventLog() takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "|O:EventLog", &values)) {
        return -1;
    }
    log_clear(self);
    if (values != NULL) {
        PyObject *rc = EventLog_extend(self, values);
        if (rc == NULL) {
            return -1;
        }
        Py_DECREF(rc);
    }
    return 0;
}

static Py_ssize_t
EventLog_length(EventLog *self)
{
    return self->len;
}

static PyObject *
EventLog_item(EventLog *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->len) {
        PyErr_SetString(PyExc_IndexError, "EventLog index out of range");
        return NULL;
    }
    return PyLong_FromLongLong(self->items[i]);
}

static PyObject *
EventLog_repr(EventLog *self)
{
    PyObject *items = EventLog_copy(self, NULL);
    if (items == NULL) {
        return NULL;
    }
    PyObject *out = PyUnicode_FromFormat("EventLog(%R)", items);
    Py_DECREF(items);
    return out;
}

static void
EventLog_dealloc(EventLog *self)
{
    PyMem_Free(self->items);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PySequenceMethods EventLog_as_sequence = {
    .sq_length = (lenfunc)EventLog_length,
    .sq_item = (ssizeargfunc)EventLog_item,
};

static PyMethodDef EventLog_methods[] = {
    {"extend", (PyCFunction)EventLog_extend, METH_O, "Append the ints of an iterable, all or none."},
    {"copy", (PyCFunction)EventLog_copy, METH_NOARGS, "The entries as a list of ints."},
    {"clear", (PyCFunction)EventLog_clear_method, METH_NOARGS, "Remove every entry."},
    {NULL},
};

static PyMemberDef EventLog_members[] = {
    {"owner", T_ULONG, offsetof(EventLog, owner), 0, "the thread whose phases are logged (0: any)"},
    {"foreign", T_ULONG, offsetof(EventLog, foreign), 0, "the first other thread that entered a phase (0: none)"},
    {NULL},
};

static PyTypeObject EventLogType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stallscope.timeline._native.EventLog",
    .tp_doc = PyDoc_STR("EventLog([values]): the timeline's event log, (code, timestamp) pairs as C ints"),
    .tp_basicsize = sizeof(EventLog),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)EventLog_init,
    .tp_dealloc = (destructor)EventLog_dealloc,
    .tp_repr = (reprfunc)EventLog_repr,
    .tp_as_sequence = &EventLog_as_sequence,
    .tp_methods = EventLog_methods,
    .tp_members = EventLog_members,
};

/* an event now: appended to ``target`` when it is an EventLog, else ``target((code, now))`` with
 * ``code_obj`` (``code`` as an int). The caller holds references to all of them: a clock written
 * in Python may run any code. */
static int
event(PyObject *target, PyObject *clock, long long code, PyObject *code_obj)
{
    long long t;
    if (read_clock(clock, &t) < 0) {
        return -1;
    }
    if (EventLog_Check(target)) {
        return log_event(target, code, t);
    }
    PyObject *when = PyLong_FromLongLong(t);
    if (when == NULL) {
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, code_obj, when);
    Py_DECREF(when);
    if (pair == NULL) {
        return -1;
    }
    PyObject *rc = PyObject_CallOneArg(target, pair);
    Py_DECREF(pair);
    if (rc == NULL) {
        return -1;
    }
    Py_DECREF(rc);
    return 0;
}

/* With an error set: StallScope's own Exception goes to ``owner.<method>(exc)`` and is cleared
 * (returns 0); anything else (KeyboardInterrupt) stays set (returns -1), as does an error that
 * the method raises. */
static int
contain_in(PyObject *owner, PyObject *method)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *rc = PyObject_CallMethodOneArg(owner, method, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (rc == NULL) {
        return -1;
    }
    Py_DECREF(rc);
    return 0;
}

/* ``contain_in`` the timeline: its ``_failed(exc)`` turns recording off */
static int
contain(PyObject *timeline)
{
    return contain_in(timeline, name_failed);
}

/* an object made with __new__ and never initialised, or a member deleted from Python */
static int
unready(int missing)
{
    if (missing) {
        PyErr_SetString(PyExc_RuntimeError, "stallscope: a native timeline object is not initialised");
    }
    return missing;
}

/* ---- Timer ----------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *code;   /* the phase id it enters */
    long long code_ll;
    PyObject *target; /* where events go: the log (an EventLog), or a callable taking (code, now) */
    PyObject *log;    /* the timeline's log: folded after a leave once it holds fold_at entries */
    PyObject *clock;
    PyObject *timeline; /* its _fold() and _failed(exc) */
    Py_ssize_t fold_at;
} Timer;

static int
Timer_init(Timer *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"code", "target", "log", "clock", "timeline", "fold_at", NULL};
    PyObject *code, *target, *log, *clock, *timeline;
    Py_ssize_t fold_at;
    long long code_ll;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!OOn:Timer", names, &PyLong_Type, &code, &target, &EventLogType,
                                     &log, &clock, &timeline, &fold_at)) {
        return -1;
    }
    if (self->clock != NULL) { /* its fields are read across calls into Python: never swapped */
        PyErr_SetString(PyExc_TypeError, "Timer is already initialised");
        return -1;
    }
    if (as_ll(code, &code_ll) < 0) {
        return -1;
    }
    if (!EventLog_Check(target) && !PyCallable_Check(target)) {
        PyErr_SetString(PyExc_TypeError, "Timer's target is an EventLog or a callable");
        return -1;
    }
    self->code_ll = code_ll;
    Py_XSETREF(self->code, Py_NewRef(code));
    Py_XSETREF(self->target, Py_NewRef(target));
    Py_XSETREF(self->log, Py_NewRef(log));
    Py_XSETREF(self->clock, Py_NewRef(clock));
    Py_XSETREF(self->timeline, Py_NewRef(timeline));
    self->fold_at = fold_at;
    return 0;
}

static int
Timer_unready(Timer *self)
{
    return unready(!self->code || !self->target || !self->log || !self->clock || !self->timeline);
}

/* whether this thread may log to ``log``: its owner, or any thread while it has none (or ``log``
 * is not an EventLog); the first other thread is remembered */
static int
owner_thread(PyObject *log)
{
    if (!EventLog_Check(log)) { /* ``log`` is a settable member: whatever it is, no owner */
        return 1;
    }
    EventLog *lg = (EventLog *)log;
    if (lg->owner == 0) {
        return 1;
    }
    unsigned long me = PyThread_get_thread_ident();
    if (me == lg->owner) {
        return 1;
    }
    if (lg->foreign == 0) {
        lg->foreign = me;
    }
    return 0;
}

static PyObject *
Timer_enter(Timer *self, PyObject *Py_UNUSED(ignored))
{
    if (Timer_unready(self)) {
        return NULL;
    }
    if (!owner_thread(self->log)) { /* another thread's phase: not the training's time */
        Py_RETURN_NONE;
    }
    PyObject *target = Py_NewRef(self->target); /* a member: Python may replace it meanwhile */
    int rc = event(target, self->clock, self->code_ll, self->code);
    Py_DECREF(target);
    if (rc < 0 && contain(self->timeline) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Timer_exit(Timer *self, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs))
{
    /* returns None: the user's exception, if any, propagates unchanged */
    if (Timer_unready(self)) {
        return NULL;
    }
    if (!owner_thread(self->log)) {
        Py_RETURN_NONE;
    }
    PyObject *target = Py_NewRef(self->target); /* a member: Python may replace it meanwhile */
    int rc = event(target, self->clock, LEAVE, code_leave);
    Py_DECREF(target);
    if (rc < 0) {
        if (contain(self->timeline) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (EventLog_Check(self->log) && ((EventLog *)self->log)->len >= self->fold_at) {
        PyObject *folded = PyObject_CallMethodNoArgs(self->timeline, name_fold);
        if (folded == NULL) {
            if (contain(self->timeline) < 0) {
                return NULL;
            }
        }
        else {
            Py_DECREF(folded);
        }
    }
    Py_RETURN_NONE;
}

static int
Timer_traverse(Timer *self, visitproc visit, void *arg)
{
    Py_VISIT(self->code);
    Py_VISIT(self->target);
    Py_VISIT(self->log);
    Py_VISIT(self->clock);
    Py_VISIT(self->timeline);
    return 0;
}

static int
Timer_clear(Timer *self)
{
    Py_CLEAR(self->code);
    Py_CLEAR(self->target);
    Py_CLEAR(self->log);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->timeline);
    return 0;
}

static void
Timer_dealloc(Timer *self)
{
    PyObject_GC_UnTrack(self);
    Timer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Timer_methods[] = {
    {"__enter__", (PyCFunction)Timer_enter, METH_NOARGS, "Enter the phase: log (phase id, now)."},
    {"__exit__", (PyCFunction)(void (*)(void))Timer_exit, METH_FASTCALL, "Leave it: log (LEAVE, now)."},
    {NULL},
};

static PyMemberDef Timer_members[] = {
    {"log", T_OBJECT_EX, offsetof(Timer, log), 0, "the log whose length triggers a fold"},
    {NULL},
};

static PyObject *
Timer_get_target(Timer *self, void *Py_UNUSED(closure))
{
    if (self->target == NULL) {
        PyErr_SetString(PyExc_AttributeError, "target");
        return NULL;
    }
    return Py_NewRef(self->target);
}

static int
Timer_set_target(Timer *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value != NULL && !EventLog_Check(value) && !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Timer's target is an EventLog or a callable");
        return -1;
    }
    Py_XSETREF(self->target, Py_XNewRef(value)); /* the old one freed last: that may run Python */
    return 0;
}

static PyGetSetDef Timer_getset[] = {
    {"target", (getter)Timer_get_target, (setter)Timer_set_target, "where events go: the log, or a callable", NULL},
    {NULL},
};

static PyTypeObject TimerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stallscope.timeline._native.Timer",
    .tp_doc = PyDoc_STR("Timer(code, target, log, clock, timeline, fold_at): recorder.PhaseTimer in C"),
    .tp_basicsize = sizeof(Timer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Timer_init,
    .tp_dealloc = (destructor)Timer_dealloc,
    .tp_traverse = (traverseproc)Timer_traverse,
    .tp_clear = (inquiry)Timer_clear,
    .tp_methods = Timer_methods,
    .tp_members = Timer_members,
    .tp_getset = Timer_getset,
};

/* ---- Stream ---------------------------------------------------------------------------- */

enum { RECORDING, PASSING, DONE };

typedef struct {
    PyObject_HEAD
    PyObject *it;       /* the user's iterator */
    PyObject *log;      /* the timeline's log */
    PyObject *clock;
    PyObject *cpu_clock;
    PyObject *switch_clock; /* the thread's voluntary context switches, read with the CPU time */
    PyObject *timeline; /* its _fold(), _failed(exc) and _add_data_cpu(cpu_ns, wall_ns, switches0, switches1) */
    PyObject *on_first; /* on_first(item, wait_ns) for the first item */
    PyObject *result;   /* a list: the final wait is appended to it */
    PyObject *token;    /* a list whose item 0 is ``mine`` while this stream records */
    PyObject *mine;
    long long cpu_due;  /* a wait beginning at or after this clock reading has its CPU read */
    long long interval;
    Py_ssize_t fold_at;
    int state;
    int first;
} Stream;

static int
Stream_init(Stream *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"it",     "log",   "clock",   "cpu_clock", "switch_clock", "timeline", "on_first",
                            "result", "token", "cpu_due", "interval",  "fold_at",      NULL};
    PyObject *it, *log, *clock, *cpu_clock, *switch_clock, *timeline, *on_first, *result, *token;
    long long cpu_due, interval;
    Py_ssize_t fold_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOOOO!O!LLn:Stream", names, &it, &EventLogType, &log, &clock,
                                     &cpu_clock, &switch_clock, &timeline, &on_first, &PyList_Type, &result,
                                     &PyList_Type, &token, &cpu_due, &interval, &fold_at)) {
        return -1;
    }
    if (self->it != NULL) { /* its fields are read across calls into Python: never swapped */
        PyErr_SetString(PyExc_TypeError, "Stream is already initialised");
        return -1;
    }
    if (!PyIter_Check(it) || PyList_GET_SIZE(token) != 1) {
        PyErr_SetString(PyExc_TypeError, "Stream needs an iterator and a one-item token list");
        return -1;
    }
    Py_XSETREF(self->it, Py_NewRef(it));
    Py_XSETREF(self->log, Py_NewRef(log));
    Py_XSETREF(self->clock, Py_NewRef(clock));
    Py_XSETREF(self->cpu_clock, Py_NewRef(cpu_clock));
    Py_XSETREF(self->switch_clock, Py_NewRef(switch_clock));
    Py_XSETREF(self->timeline, Py_NewRef(timeline));
    Py_XSETREF(self->on_first, Py_NewRef(on_first));
    Py_XSETREF(self->result, Py_NewRef(result));
    Py_XSETREF(self->token, Py_NewRef(token));
    Py_XSETREF(self->mine, Py_NewRef(PyList_GET_ITEM(token, 0)));
    self->cpu_due = cpu_due;
    self->interval = interval;
    self->fold_at = fold_at;
    self->state = RECORDING;
    self->first = 1;
    return 0;
}

static PyObject *
Stream_iter(PyObject *self)
{
    return Py_NewRef(self);
}

/* StallScope's own error before next(): contained, and the items pass through from here on */
static PyObject *
Stream_pass(Stream *self)
{
    self->state = PASSING;
    if (contain(self->timeline) < 0) {
        return NULL;
    }
    return Py_TYPE(self->it)->tp_iternext(self->it);
}

static PyObject *
Stream_next(Stream *self)
{
    if (unready(!self->it || !self->log || !self->clock || !self->cpu_clock || !self->switch_clock || !self->timeline ||
                !self->on_first || !self->result || !self->token || !self->mine)) {
        return NULL;
    }
    if (self->state == DONE) {
        return NULL;
    }
    if (self->state == PASSING || PyList_GET_SIZE(self->token) < 1 || PyList_GET_ITEM(self->token, 0) != self->mine) {
        self->state = PASSING; /* stopped (Timeline.end_streams): unrecorded */
        return Py_TYPE(self->it)->tp_iternext(self->it);
    }
    long long began, end, cpu0 = -1, cpu1, switches0 = -1, switches1;
    /* logged before next(): phases the loader itself times nest inside the wait */
    if (read_clock(self->clock, &began) < 0 || log_event(self->log, STEP, began) < 0) {
        return Stream_pass(self);
    }
    if (began >= self->cpu_due) {
        self->cpu_due = began + self->interval;
        if (read_clock(self->cpu_clock, &cpu0) < 0 || read_clock(self->switch_clock, &switches0) < 0) {
            return Stream_pass(self);
        }
    }
    PyObject *item = Py_TYPE(self->it)->tp_iternext(self->it);
    if (PyList_GET_SIZE(self->token) < 1 || PyList_GET_ITEM(self->token, 0) != self->mine) {
        /* stopped, or a new pass began, during next(): what it returned is not this pass's */
        self->state = PASSING;
        return item;
    }
    if (item == NULL) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_StopIteration)) {
            /* the loader's own error, or Ctrl-C: the wait ends, their exception propagates */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            if ((read_clock(self->clock, &end) < 0 || log_event(self->log, NONE, end) < 0) &&
                contain(self->timeline) < 0) {
                PyErr_Clear(); /* our own error while theirs is on its way: theirs wins */
            }
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        PyErr_Clear(); /* StopIteration: the pass is over */
        self->state = DONE;
        PyObject *wait = NULL;
        if (read_clock(self->clock, &end) < 0 || log_event(self->log, NONE, end) < 0 ||
            (wait = PyLong_FromLongLong(end - began)) == NULL || PyList_Append(self->result, wait) < 0) {
            contain(self->timeline); /* the pass ends all the same; a Ctrl-C stays set */
        }
        Py_XDECREF(wait);
        return NULL;
    }
    /* never lose the item: from here on an error of ours is contained and the item returned */
    PyObject *rc = NULL;
    if (read_clock(self->clock, &end) < 0 || log_event(self->log, GOT, end) < 0) {
        goto failed;
    }
    if (cpu0 >= 0) {
        if (read_clock(self->cpu_clock, &cpu1) < 0 || read_clock(self->switch_clock, &switches1) < 0) {
            goto failed;
        }
        rc = PyObject_CallMethod(self->timeline, "_add_data_cpu", "LLLL", cpu1 - cpu0, end - began, switches0,
                                 switches1);
        if (rc == NULL) {
            goto failed;
        }
        Py_CLEAR(rc);
    }
    if (self->first) {
        self->first = 0;
        rc = PyObject_CallFunction(self->on_first, "OL", item, end - began);
        if (rc == NULL) {
            goto failed;
        }
        Py_CLEAR(rc);
    }
    if (((EventLog *)self->log)->len >= self->fold_at) {
        rc = PyObject_CallMethodNoArgs(self->timeline, name_fold);
        if (rc == NULL) {
            goto failed;
        }
        Py_CLEAR(rc);
    }
    return item;
failed:
    self->state = PASSING; /* recording ends here either way (after an Exception, _failed stopped the timeline) */
    if (contain(self->timeline) < 0) {
        Py_DECREF(item); /* Ctrl-C inside StallScope's own work: it propagates */
        return NULL;
    }
    return item;
}

static int
Stream_traverse(Stream *self, visitproc visit, void *arg)
{
    Py_VISIT(self->it);
    Py_VISIT(self->log);
    Py_VISIT(self->clock);
    Py_VISIT(self->cpu_clock);
    Py_VISIT(self->switch_clock);
    Py_VISIT(self->timeline);
    Py_VISIT(self->on_first);
    Py_VISIT(self->result);
    Py_VISIT(self->token);
    Py_VISIT(self->mine);
    return 0;
}

static int
Stream_clear(Stream *self)
{
    Py_CLEAR(self->it);
    Py_CLEAR(self->log);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->cpu_clock);
    Py_CLEAR(self->switch_clock);
    Py_CLEAR(self->timeline);
    Py_CLEAR(self->on_first);
    Py_CLEAR(self->result);
    Py_CLEAR(self->token);
    Py_CLEAR(self->mine);
    return 0;
}

static void
Stream_dealloc(Stream *self)
{
    PyObject_GC_UnTrack(self);
    Stream_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stallscope.timeline._native.Stream",
    .tp_doc = PyDoc_STR("Stream(it, log, clock, cpu_clock, switch_clock, timeline, on_first, result, token, cpu_due, "
                        "interval, fold_at): recorder.Timeline._stream in C"),
    .tp_basicsize = sizeof(Stream),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Stream_init,
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_traverse = (traverseproc)Stream_traverse,
    .tp_clear = (inquiry)Stream_clear,
    .tp_iter = Stream_iter,
    .tp_iternext = (iternextfunc)Stream_next,
};

/* ---- fold ------------------------------------------------------------------------------ */

/* recorder.Timeline's folded state that the fold reads and writes, by attribute name: these are
 * written back when the fold ends, whether it ran to the end or not */
enum {
    S_CUR,
    S_MARK,
    S_IN_STEP,
    S_STEP_START,
    S_STEP_WAIT,
    S_DATA_MARK,
    S_RING_POS,
    S_STEPS,
    S_STEP_TOTAL,
    S_WIN_STEPS,
    S_STEP_COMPUTE0,
    S_STEP_KINDS,
    S_COUNT
};
static const char *state_names[S_COUNT] = {
    "_cur",       "_mark",     "_in_step", "_step_start", "_step_wait",
    "_data_mark", "_ring_pos", "_steps",   "_step_total", "_win_steps", "_step_compute0", "_step_kinds",
};
static PyObject *state_attrs[S_COUNT];
static PyObject *name_totals, *name_counts, *name_stack, *name_ring_step, *name_ring_wait, *name_ring_compute,
    *name_ring_kinds, *name_ring_start, *name_ring_phases, *name_step_phases0, *name_ring_size, *name_window_steps;

/* the timeline's rings of recent steps, in ``Timeline._recent_values`` order, then the steps'
 * starts, their phase times (``RECENT_COLUMNS`` a step) and the phase times when the step in
 * progress began (``RECENT_COLUMNS`` items) */
enum { R_STEP, R_WAIT, R_COMPUTE, R_KINDS, R_START, R_PHASES, R_PHASES0, R_COUNT };

/* an attribute of ``obj`` as a C long long */
static int
get_ll(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        return -1;
    }
    int rc = as_ll(value, out);
    Py_DECREF(value);
    return rc;
}

/* a list of ints read into a new C array of at least ``least`` items (zeros past its end) */
static long long *
read_ints(PyObject *list, Py_ssize_t least, Py_ssize_t *size)
{
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "stallscope: the fold needs lists of ints");
        return NULL;
    }
    PyObject *items = PyList_AsTuple(list); /* a snapshot: converting an item may run Python */
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    Py_ssize_t cap = n > least ? n : least;
    long long *out = PyMem_Calloc(cap > 0 ? (size_t)cap : 1, sizeof(long long));
    if (out == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_ll(PyTuple_GET_ITEM(items, i), &out[i]) < 0) {
            Py_DECREF(items);
            PyMem_Free(out);
            return NULL;
        }
    }
    Py_DECREF(items);
    *size = n;
    return out;
}

/* ``list[:] = values[:n]`` */
static int
write_ints(PyObject *list, const long long *values, Py_ssize_t n)
{
    PyObject *fresh = PyList_New(n);
    if (fresh == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyLong_FromLongLong(values[i]);
        if (value == NULL) {
            Py_DECREF(fresh);
            return -1;
        }
        PyList_SET_ITEM(fresh, i, value);
    }
    int rc = PyList_SetSlice(list, 0, PyList_GET_SIZE(list), fresh);
    Py_DECREF(fresh);
    return rc;
}

/* a ring of the timeline: an array('q') of ``size`` items, written in place */
static int
get_ring(PyObject *timeline, PyObject *name, Py_ssize_t size, Py_buffer *view)
{
    PyObject *ring = PyObject_GetAttr(timeline, name);
    if (ring == NULL) {
        return -1;
    }
    int rc = PyObject_GetBuffer(ring, view, PyBUF_WRITABLE | PyBUF_FORMAT);
    Py_DECREF(ring);
    if (rc < 0) {
        return -1;
    }
    if (view->itemsize != (Py_ssize_t)sizeof(long long) || view->format == NULL || strcmp(view->format, "q") != 0 ||
        view->len / view->itemsize < size) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "stallscope: a ring of the timeline is not an array('q') of its size");
        return -1;
    }
    return 0;
}

typedef struct {
    PyObject *totals_list, *counts_list, *stack_list;
    long long *totals, *counts, *stack;
    Py_ssize_t phases, depth, stack_cap;
    long long state[S_COUNT];
    long long window_left;
} Folding;

/* write what the fold did back to the timeline: after the last event, or at the one it stopped at */
static int
fold_write_back(PyObject *timeline, Folding *f)
{
    long long window_steps;
    if (get_ll(timeline, name_window_steps, &window_steps) < 0) {
        return -1;
    }
    f->state[S_WIN_STEPS] = window_steps - f->window_left;
    if (write_ints(f->totals_list, f->totals, f->phases) < 0 || write_ints(f->counts_list, f->counts, f->phases) < 0 ||
        write_ints(f->stack_list, f->stack, f->depth) < 0) {
        return -1;
    }
    for (int i = 0; i < S_COUNT; i++) {
        PyObject *value = i == S_IN_STEP ? PyBool_FromLong(f->state[i] != 0) : PyLong_FromLongLong(f->state[i]);
        if (value == NULL) {
            return -1;
        }
        int rc = PyObject_SetAttr(timeline, state_attrs[i], value);
        Py_DECREF(value);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

static int
stack_push(Folding *f, long long value)
{
    if (f->depth == f->stack_cap) {
        Py_ssize_t cap = f->stack_cap * 2 + 8;
        long long *grown = PyMem_Realloc(f->stack, (size_t)cap * sizeof(long long));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        f->stack = grown;
        f->stack_cap = cap;
    }
    f->stack[f->depth++] = value;
    return 0;
}

/* the phases' totals by column (``RECENT_COLUMNS``): the last one sums the phases from its id on */
static void
phase_columns(const Folding *f, long long *out)
{
    for (int c = 0; c < RECENT_COLUMNS; c++) {
        out[c] = 0;
    }
    for (Py_ssize_t i = 0; i < f->phases; i++) {
        out[i < RECENT_COLUMNS ? i : RECENT_COLUMNS - 1] += f->totals[i];
    }
}

/* the events' loop of Timeline._fold: stops at the first error, with the state as of the events
 * before the one that failed (a window's close that fails leaves its step counted) */
static int
fold_events(PyObject *timeline, const long long *events, Py_ssize_t n, Folding *f, Py_buffer *rings,
            long long ring_size)
{
    long long *st = f->state;
    long long *steps_ring = rings[R_STEP].buf, *waits_ring = rings[R_WAIT].buf;
    long long *compute_ring = rings[R_COMPUTE].buf, *kinds_ring = rings[R_KINDS].buf;
    long long *start_ring = rings[R_START].buf, *phases_ring = rings[R_PHASES].buf, *phases0 = rings[R_PHASES0].buf;
    if (n % 2) {
        PyErr_SetString(PyExc_ValueError, "stallscope: the event log has an odd length");
        return -1;
    }
    for (Py_ssize_t i = 0; i + 1 < n; i += 2) {
        long long code = events[i], t = events[i + 1];
        if (code >= f->phases) {
            PyErr_Format(PyExc_IndexError, "stallscope: event code %lld names no phase", code);
            return -1;
        }
        f->totals[st[S_CUR]] += t - st[S_MARK];
        st[S_MARK] = t;
        if (code >= 0) {
            if (stack_push(f, st[S_CUR]) < 0) {
                return -1;
            }
            st[S_CUR] = code;
            f->counts[code] += 1;
            st[S_STEP_KINDS] |= (long long)1 << (code < KIND_BITS ? code : KIND_BITS);
        }
        else if (code == LEAVE || code == GOT || code == NONE) {
            st[S_CUR] = f->depth ? f->stack[--f->depth] : OTHER_ID;
            if (code == GOT) { /* the wait is over, the step runs */
                st[S_IN_STEP] = 1;
                st[S_STEP_WAIT] = t - st[S_DATA_MARK];
            }
        }
        else {
            if (st[S_IN_STEP] && (code == STEP || code == END)) { /* the step in progress ends */
                st[S_IN_STEP] = 0;
                long long duration = t - st[S_STEP_START];
                st[S_STEP_TOTAL] += duration;
                long long pos = st[S_RING_POS];
                steps_ring[pos] = duration;
                waits_ring[pos] = st[S_STEP_WAIT];
                compute_ring[pos] = f->totals[COMPUTE_ID] - st[S_STEP_COMPUTE0];
                kinds_ring[pos] = st[S_STEP_KINDS];
                start_ring[pos] = st[S_STEP_START];
                {
                    long long column[RECENT_COLUMNS];
                    phase_columns(f, column);
                    long long *row = phases_ring + pos * RECENT_COLUMNS;
                    for (int c = 0; c < RECENT_COLUMNS; c++) {
                        row[c] = column[c] - phases0[c];
                    }
                }
                st[S_RING_POS] = pos + 1 < ring_size ? pos + 1 : 0;
                st[S_STEPS] += 1;
                if (--f->window_left <= 0) { /* below 0 after a close that was cut short */
                    /* the timeline closes the window (and may merge windows, doubling their
                     * length); it is handed the compute time credited up to ``t``. It must not
                     * register phases: the totals here are written back when the fold ends */
                    long long window_steps;
                    PyObject *rc = NULL;
                    PyObject *steps_value = NULL;
                    if (get_ll(timeline, name_window_steps, &window_steps) == 0 &&
                        (steps_value = PyLong_FromLongLong(window_steps - f->window_left)) != NULL &&
                        PyObject_SetAttr(timeline, state_attrs[S_WIN_STEPS], steps_value) == 0) {
                        rc = PyObject_CallMethod(timeline, "_close_window", "LL", t, f->totals[COMPUTE_ID]);
                    }
                    Py_XDECREF(steps_value);
                    if (rc == NULL) {
                        return -1;
                    }
                    Py_DECREF(rc);
                    if (get_ll(timeline, name_window_steps, &window_steps) < 0) {
                        return -1;
                    }
                    f->window_left = window_steps;
                }
            }
            if (code == STEP || code == WAIT) {
                if (code == STEP) {
                    st[S_STEP_START] = t;
                    st[S_STEP_COMPUTE0] = f->totals[COMPUTE_ID];
                    st[S_STEP_KINDS] = 0;
                    phase_columns(f, phases0);
                }
                st[S_DATA_MARK] = t;
                if (stack_push(f, st[S_CUR]) < 0) {
                    return -1;
                }
                st[S_CUR] = DATA_ID;
                f->counts[DATA_ID] += 1;
            }
        }
    }
    return 0;
}

static PyObject *
native_fold(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 2 && nargs != 3) || !(EventLog_Check(args[1]) || PyList_Check(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "fold(timeline, events[, upto]): events is an EventLog or a list");
        return NULL;
    }
    PyObject *timeline = args[0];
    /* how many entries to fold (an even number): all of them, or the first ``upto`` */
    Py_ssize_t upto = PY_SSIZE_T_MAX;
    if (nargs == 3) {
        upto = PyLong_AsSsize_t(args[2]);
        if (upto == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (upto < 0 || upto % 2) {
            PyErr_SetString(PyExc_ValueError, "fold: upto must be an even number >= 0");
            return NULL;
        }
    }
    /* the events as a C array of their own: the window's close runs Python, which could log more */
    long long *events;
    Py_ssize_t n;
    if (EventLog_Check(args[1])) { /* taken out of the log first: none is ever folded twice */
        EventLog *log = (EventLog *)args[1];
        if (upto != PY_SSIZE_T_MAX && upto > log->len) {
            PyErr_SetString(PyExc_ValueError, "fold: upto is past the end of the log");
            return NULL;
        }
        n = log->len < upto ? log->len : upto;
        events = PyMem_Malloc(n > 0 ? (size_t)n * sizeof(long long) : 1);
        if (events == NULL) {
            return PyErr_NoMemory();
        }
        if (n > 0) {
            memcpy(events, log->items, (size_t)n * sizeof(long long));
        }
        if (n == log->len) {
            log_clear(log);
        }
        else { /* the rest moves to the front */
            memmove(log->items, log->items + n, (size_t)(log->len - n) * sizeof(long long));
            log->len -= n;
        }
    }
    else if ((events = read_ints(args[1], 0, &n)) == NULL) {
        return NULL;
    }
    else if (upto != PY_SSIZE_T_MAX && upto > n) {
        PyMem_Free(events);
        PyErr_SetString(PyExc_ValueError, "fold: upto is past the end of the log");
        return NULL;
    }
    else if (n > upto) { /* a list is read, not changed */
        n = upto;
    }
    Folding f = {0};
    Py_buffer rings[R_COUNT] = {{0}};
    PyObject *ring_names[R_COUNT] = {name_ring_step,  name_ring_wait,   name_ring_compute, name_ring_kinds,
                                     name_ring_start, name_ring_phases, name_step_phases0};
    int have_rings = 0, rc = -1;
    long long ring_size, window_steps;
    PyObject *result = NULL;
    f.totals_list = PyObject_GetAttr(timeline, name_totals);
    f.counts_list = f.totals_list ? PyObject_GetAttr(timeline, name_counts) : NULL;
    f.stack_list = f.counts_list ? PyObject_GetAttr(timeline, name_stack) : NULL;
    if (f.stack_list == NULL) {
        goto done;
    }
    Py_ssize_t counted;
    if ((f.totals = read_ints(f.totals_list, 0, &f.phases)) == NULL ||
        (f.counts = read_ints(f.counts_list, 0, &counted)) == NULL ||
        (f.stack = read_ints(f.stack_list, 8, &f.depth)) == NULL) {
        goto done;
    }
    f.stack_cap = f.depth > 8 ? f.depth : 8;
    if (counted != f.phases || f.phases <= OTHER_ID) {
        PyErr_SetString(PyExc_ValueError, "stallscope: the timeline's totals and counts disagree");
        goto done;
    }
    for (int i = 0; i < S_COUNT; i++) {
        if (i == S_IN_STEP) {
            PyObject *value = PyObject_GetAttr(timeline, state_attrs[i]);
            int truth = value ? PyObject_IsTrue(value) : -1;
            Py_XDECREF(value);
            if (truth < 0) {
                goto done;
            }
            f.state[i] = truth;
        }
        else if (get_ll(timeline, state_attrs[i], &f.state[i]) < 0) {
            goto done;
        }
    }
    if (f.state[S_CUR] < 0 || f.state[S_CUR] >= f.phases) {
        PyErr_SetString(PyExc_ValueError, "stallscope: the timeline's current phase is out of range");
        goto done;
    }
    for (Py_ssize_t i = 0; i < f.depth; i++) {
        if (f.stack[i] < 0 || f.stack[i] >= f.phases) {
            PyErr_SetString(PyExc_ValueError, "stallscope: the timeline's phase stack is out of range");
            goto done;
        }
    }
    if (get_ll(timeline, name_ring_size, &ring_size) < 0 || get_ll(timeline, name_window_steps, &window_steps) < 0) {
        goto done;
    }
    f.window_left = window_steps - f.state[S_WIN_STEPS];
    if (ring_size < 1 || ring_size > PY_SSIZE_T_MAX / RECENT_COLUMNS || f.state[S_RING_POS] < 0 ||
        f.state[S_RING_POS] >= ring_size) {
        PyErr_SetString(PyExc_ValueError, "stallscope: the timeline's ring position is out of range");
        goto done;
    }
    for (; have_rings < R_COUNT; have_rings++) {
        Py_ssize_t items = have_rings == R_PHASES    ? (Py_ssize_t)ring_size * RECENT_COLUMNS
                           : have_rings == R_PHASES0 ? RECENT_COLUMNS
                                                     : (Py_ssize_t)ring_size;
        if (get_ring(timeline, ring_names[have_rings], items, &rings[have_rings]) < 0) {
            goto done;
        }
    }
    /* from here the state is written back whatever happens, as the Python fold's ``finally`` */
    rc = fold_events(timeline, events, n, &f, rings, ring_size);
    {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb); /* a write-back of its own does not lose the fold's error */
        if (fold_write_back(timeline, &f) < 0) {
            if (type != NULL) {
                PyErr_Clear();
            }
            else {
                rc = -1;
            }
        }
        if (type != NULL) {
            PyErr_Restore(type, value, tb);
        }
    }
done:
    for (int i = 0; i < have_rings; i++) {
        PyBuffer_Release(&rings[i]);
    }
    PyMem_Free(f.totals);
    PyMem_Free(f.counts);
    PyMem_Free(f.stack);
    Py_XDECREF(f.totals_list);
    Py_XDECREF(f.counts_list);
    Py_XDECREF(f.stack_list);
    PyMem_Free(events);
    if (rc == 0) {
        result = Py_NewRef(Py_None);
    }
    return result;
}

/* ---- order_stats --------------------------------------------------------------------- */

static int
cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* stats.Distribution.of's numbers, for an array('q') of nanoseconds: (n, mean, p10, p50, p90,
 * max) in seconds, each the same double as the Python one's. Its arithmetic is Python's, step by
 * step: ints exact (the sum in 64 bits, checked), each int made a double as Python makes it
 * (round to nearest), and the interpolation's product rounded before its sum (``volatile``: a
 * compiler that fuses a multiply-add, as on aarch64, would round once). None where that cannot
 * hold (a sum past 2**53, whose division Python does exactly; a sum or a difference of two values
 * past 64 bits): the Python code then does it. */
/* An array('q') held as a buffer: 0 with ``view`` filled (release it), -1 with TypeError. */
static int
get_q_array(PyObject *values, Py_buffer *view, const char *who)
{
    if (PyObject_GetBuffer(values, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->itemsize != (Py_ssize_t)sizeof(long long) || view->format == NULL ||
        !(strcmp(view->format, "q") == 0 || strcmp(view->format, "=q") == 0 || strcmp(view->format, "@q") == 0)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s: an array('q') was expected", who);
        return -1;
    }
    return 0;
}

/* order_stats' numbers of ``n`` > 0 values into ``out`` (mean, p10, p50, p90, max): 1 when made,
 * 0 where they cannot be made as Python makes them, -1 with an exception set. */
static int
order_numbers(const long long *values, Py_ssize_t n, double out[5])
{
    long long *ordered = PyMem_Malloc((size_t)n * sizeof(long long));
    if (ordered == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int made = 0;
    memcpy(ordered, values, (size_t)n * sizeof(long long));
    qsort(ordered, (size_t)n, sizeof(long long), cmp_ll);
    long long range;
    if (__builtin_sub_overflow(ordered[n - 1], ordered[0], &range)) {
        /* values far apart on both sides of 0: a difference of two would not fit in 64 bits */
        goto done;
    }
    const long long exact = 1LL << 53;
    long long sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (__builtin_add_overflow(sum, ordered[i], &sum)) {
            goto done;
        }
    }
    if (sum > exact || sum < -exact) {
        goto done;
    }
    static const double qs[3] = {0.10, 0.50, 0.90};
    long long last = (long long)n - 1;
    for (int k = 0; k < 3; k++) {
        volatile double pos = (double)last * qs[k]; /* rounded here, as Python rounds it */
        long long lo = (long long)pos; /* floor: pos >= 0 */
        long long hi = lo < last ? lo + 1 : last;
        volatile double part = (double)(ordered[hi] - ordered[lo]) * (pos - (double)lo);
        out[1 + k] = ((double)ordered[lo] + part) / 1e9;
    }
    out[0] = (double)sum / (double)n / 1e9;
    out[4] = (double)ordered[n - 1] / 1e9;
    made = 1;
done:
    PyMem_Free(ordered);
    return made;
}

/* stats.Distribution.of's numbers, for an array('q') of nanoseconds: (n, mean, p10, p50, p90,
 * max) in seconds, each the same double as the Python one's. Its arithmetic is Python's, step by
 * step: ints exact (the sum in 64 bits, checked), each int made a double as Python makes it
 * (round to nearest), and the interpolation's product rounded before its sum (``volatile``: a
 * compiler that fuses a multiply-add, as on aarch64, would round once). None where that cannot
 * hold (a sum past 2**53, whose division Python does exactly; a sum or a difference of two values
 * past 64 bits): the Python code then does it. */
static PyObject *
native_order_stats(PyObject *module, PyObject *values)
{
    Py_buffer view;
    if (get_q_array(values, &view, "order_stats") < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = view.len / view.itemsize;
    double out[5];
    int made;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "order_stats: no values");
    }
    else if ((made = order_numbers(view.buf, n, out)) == 1) {
        result = Py_BuildValue("(nddddd)", n, out[0], out[1], out[2], out[3], out[4]);
    }
    else if (made == 0) {
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    return result;
}

/* ---- summary_numbers -------------------------------------------------------------------- */

/* Python's ``round``, for the rare values the shortcut below cannot round as it does */
static PyObject *builtin_round;
static PyObject *digits_obj[7];
static PyObject *dist_keys[5];

/* round(x, digits) as Python rounds a float, into ``*out``: 0, or -1 with an exception set.
 * Python rounds the exact binary value to ``digits`` decimals (ties to even), then reads the
 * decimal back. Here y = x * 10**digits is rounded to the nearest integer k, and k / 10**digits
 * is the double nearest that decimal (both exact, one division). The product may be off by half
 * a unit in its last place, which moves k only where y lies that close to a tie: those few,
 * and values too large for the shortcut, go to Python's round. */
static int
round_like_python(double x, int digits, double *out)
{
    static const double scale[7] = {1.0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6};
    if (!isfinite(x) || x == 0.0) {
        *out = x;
        return 0;
    }
    double y = x * scale[digits];
    double a = fabs(y);
    if (a < 4503599627370496.0) { /* 2**52: y has a fractional part to look at */
        double f = a - floor(a);
        double ulp = nextafter(a, INFINITY) - a;
        if (fabs(f - 0.5) > 4 * ulp) {
            *out = nearbyint(y) / scale[digits];
            return 0;
        }
    }
    PyObject *value = PyFloat_FromDouble(x);
    if (value == NULL) {
        return -1;
    }
    PyObject *args[2] = {value, digits_obj[digits]};
    PyObject *rounded = PyObject_Vectorcall(builtin_round, args, 2, NULL);
    Py_DECREF(value);
    if (rounded == NULL) {
        return -1;
    }
    *out = PyFloat_AsDouble(rounded);
    Py_DECREF(rounded);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* d[key] = value: 0, or -1 with an exception set */
static int
set_double(PyObject *d, PyObject *key, double value)
{
    PyObject *v = PyFloat_FromDouble(value);
    if (v == NULL) {
        return -1;
    }
    int rc = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* report.build._dist of an array('q') of nanoseconds: its five numbers rounded to 6 decimals,
 * all 0.0 where there are none, or no wait at all; NULL with an exception set, or with none
 * (``*cannot``) where the numbers cannot be made as Python makes them. */
static PyObject *
dist_dict(PyObject *values, int *cannot)
{
    Py_buffer view;
    if (get_q_array(values, &view, "summary_numbers") < 0) {
        return NULL;
    }
    double numbers[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
    Py_ssize_t n = view.len / view.itemsize;
    int made = n > 0 ? order_numbers(view.buf, n, numbers) : 1;
    PyBuffer_Release(&view);
    if (made <= 0) {
        *cannot = made == 0;
        return NULL;
    }
    int zero = !(numbers[4] != 0.0 || numbers[0] != 0.0); /* ``not (d.max or d.mean)`` */
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return NULL;
    }
    for (int k = 0; k < 5; k++) {
        double r = 0.0;
        if ((!zero && round_like_python(numbers[k], 6, &r) < 0) || set_double(d, dist_keys[k], r) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* A Python int of at most 2**53 in size into ``*out``: 1, 0 when it is not one, -1 on error. */
static int
exact_int(PyObject *value, long long *out)
{
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow || v > (1LL << 53) || v < -(1LL << 53)) {
        return 0;
    }
    *out = v;
    return 1;
}

/* report.build.summarize's numbers of an epoch's snapshot, each the same double as the Python
 * code makes: (wall_s, steps_per_s, idle, fractions, largest, top, seconds, step_time_s,
 * data_wait_s). ``fractions`` is phase_fractions' dict before its residue is put on ``largest``
 * (None where there is none to put: no wall time, no phase), whose rounded fraction is ``top``;
 * ``idle`` is 1 - the compute share, unrounded. None where a number is not a plain int of at
 * most 2**53 in size or a phase's name not a str (Python's exact arithmetic then differs): the
 * Python code then makes them. */
static PyObject *
native_summary_numbers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyDict_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "summary_numbers(step, data_wait, phase_ns: dict, wall_ns, steps, compute_name)");
        return NULL;
    }
    PyObject *phase_ns = args[2], *compute_name = args[5];
    long long wall, steps;
    int ok;
    if ((ok = exact_int(args[3], &wall)) <= 0 || (ok = exact_int(args[4], &steps)) <= 0) {
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *fractions = PyDict_New(), *seconds = PyDict_New();
    PyObject *step_d = NULL, *wait_d = NULL, *largest = Py_None, *result = NULL;
    if (fractions == NULL || seconds == NULL) {
        goto done;
    }
    double top = -1.0, compute = 0.0;
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (PyDict_Next(phase_ns, &pos, &name, &value)) {
        long long ns;
        if (!PyUnicode_CheckExact(name) || (ok = exact_int(value, &ns)) == 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (ok < 0) {
            goto done;
        }
        double fraction = 0.0, secs = 0.0;
        if (wall > 0 && ns > 0 && round_like_python((double)ns / (double)wall, 6, &fraction) < 0) {
            goto done;
        }
        if (ns != 0 && round_like_python((double)ns / 1e9, 6, &secs) < 0) {
            goto done;
        }
        if (set_double(fractions, name, fraction) < 0 || set_double(seconds, name, secs) < 0) {
            goto done;
        }
        if (wall > 0 && fraction > top) {
            largest = name;
            top = fraction;
        }
        int same = PyUnicode_Compare(name, compute_name);
        if (same == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (same == 0) {
            compute = (double)ns;
        }
    }
    int cannot = 0;
    if ((step_d = dist_dict(args[0], &cannot)) == NULL || (wait_d = dist_dict(args[1], &cannot)) == NULL) {
        if (cannot) {
            PyErr_Clear();
            result = Py_NewRef(Py_None);
        }
        goto done;
    }
    double wall_s = (double)wall / 1e9, wall_r = 0.0, rate = 0.0;
    if (round_like_python(wall_s, 6, &wall_r) < 0 ||
        (wall > 0 && round_like_python((double)steps / wall_s, 4, &rate) < 0)) {
        goto done;
    }
    double idle = wall > 0 ? 1.0 - compute / (double)wall : 0.0;
    result = Py_BuildValue("(dddOOdOOO)", wall_r, rate, idle, fractions, largest, top, seconds, step_d, wait_d);
done:
    Py_XDECREF(fractions);
    Py_XDECREF(seconds);
    Py_XDECREF(step_d);
    Py_XDECREF(wait_d);
    return result;
}

/* ---- json_ints ------------------------------------------------------------------------ */

/* A list or tuple of ints as JSON, "[1,2,3]", as json.dumps writes it with no spaces; None where
 * an item is not a plain int of 64 bits (a bool, a float, a larger int): json.dumps then writes it.
 * The record of a run's last steps is thousands of small ints, one str object each in json. */
static PyObject *
native_json_ints(PyObject *module, PyObject *seq)
{
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) {
        PyErr_SetString(PyExc_TypeError, "json_ints: a list or tuple was expected");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    /* at most 20 characters (a sign and 19 digits) and a comma an item, and the brackets */
    if (n > (PY_SSIZE_T_MAX - 3) / 21) {
        return PyErr_NoMemory();
    }
    char *buf = PyMem_Malloc((size_t)n * 21 + 3);
    if (buf == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Py_ssize_t at = 0;
    buf[at++] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        /* read each item anew: a list is not changed here, nothing runs Python code */
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyLong_CheckExact(item)) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (v == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (i > 0) {
            buf[at++] = ',';
        }
        /* the digits backwards, then in place: snprintf took most of the time */
        char digits[20];
        int k = 0;
        unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
        do {
            digits[k++] = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (v < 0) {
            buf[at++] = '-';
        }
        while (k) {
            buf[at++] = digits[--k];
        }
    }
    buf[at++] = ']';
    result = PyUnicode_FromStringAndSize(buf, at);
done:
    PyMem_Free(buf);
    return result;
}

static PyMethodDef native_methods[] = {
    {"fold", (PyCFunction)(void (*)(void))native_fold, METH_FASTCALL,
     "fold(timeline, events[, upto]): apply the logged events (the first ``upto`` entries) to the timeline's "
     "folded state (Timeline._fold_events); they are taken out of an EventLog first."},
    {"order_stats", (PyCFunction)native_order_stats, METH_O,
     "order_stats(values): stats.Distribution.of's (n, mean, p10, p50, p90, max) of an array('q'), or None."},
    {"json_ints", (PyCFunction)native_json_ints, METH_O,
     "json_ints(items): a list or tuple of ints as JSON text (json.dumps's, no spaces), or None."},
    {"summary_numbers", (PyCFunction)(void (*)(void))native_summary_numbers, METH_FASTCALL,
     "summary_numbers(step, data_wait, phase_ns, wall_ns, steps, compute_name): report.build.summarize's numbers "
     "of an epoch's snapshot (wall_s, steps_per_s, idle, fractions, largest, top, seconds, step_time_s, "
     "data_wait_s), or None."},
    {NULL},
};

/* ---- StepHook -------------------------------------------------------------------------- */

/* Lightning's per-step touch points (hooks/lightning.py): a StepHook stands in for one of
 * Lightning's own callables (``inner``) and moves the fit's state machine (``_FitRun``) as its
 * Python method does (``slow``), in the usual case without a Python frame:
 *
 *   FETCH_BEGIN    inner() (starts Lightning's profiler), then: between two steps, a data wait
 *                  begins and the step in progress ends (_FitRun._fetch_began)
 *   FETCH_END      a step's batch arrived and h2d starts (_FitRun._fetch_ended), then inner()
 *                  (stops the profiler), even when that failed
 *   COMPUTE_BEGIN  inner(batch, ...) (Lightning's on_batch_start), then: h2d -> compute
 *                  (_FitRun._on_compute_begin(batch))
 *   COMPUTE_END    compute ends (_FitRun._on_compute_end), then inner(...) (update_lr_schedulers);
 *                  a second call in the same step finds nothing open and does nothing
 *
 * Anything else (the first step of an epoch, a logging call still open, a validation batch, a
 * timeline not started or stopped) calls ``slow``, the Python method, which handles every case.
 * With a phase watched (CUDA events around compute), the hook calls the timeline's listeners as
 * its own methods do. The fit's state and the timeline's are read and written in their
 * ``__slots__`` (at the offsets of their member descriptors, found once), where the Python
 * methods find them; the scope's ``_active`` in its ``__dict__``. StallScope's own errors go to
 * ``scope._fail(exc)``, as in the Python methods; ``inner``'s propagate unchanged. */

enum { FETCH_BEGIN, FETCH_END, COMPUTE_BEGIN, COMPUTE_END, HOOK_KINDS };

/* attribute names: the run's slots (up to K_ACTIVE), the scope's, then the timeline's slots
 * (K_DIRECT to K_DATA_STILL) and other attributes */
enum {
    K_CLOSED,
    K_TOP,
    K_LAZY,
    K_NESTED_FETCH,
    K_FIRST_WAIT,
    K_FETCHED,
    K_COUNT_TENSORS,
    K_ACTIVE,
    K_FAIL,
    K_DIRECT,
    K_DATA_T0,
    K_DATA_CPU_MARK,
    K_CPU_DUE,
    K_DATA_CPU_TOTAL,
    K_DATA_CPU_WALL,
    K_DATA_SWITCH_MARK,
    K_DATA_STILL,
    K_LOG,
    K_CLOCK,
    K_CPU_CLOCK,
    K_SWITCH_CLOCK,
    K_TRACK_ENTER,
    K_TRACK_LEAVE,
    K_COUNT
};
static const char *key_names[K_COUNT] = {
    /* the run's (K_ACTIVE: the scope's) */
    "closed", "_top", "_lazy", "_nested_fetch", "_first_wait_ns", "_fetched", "_count_tensors", "_active", "_fail",
    /* the timeline's */
    "_direct", "_data_t0", "_data_cpu_mark", "_cpu_due", "_data_cpu_total", "_data_cpu_wall", "_data_switch_mark",
    "_data_still_total", "_log", "_clock", "_cpu_clock", "_switch_clock", "_track_enter", "_track_leave",
};
static PyObject *keys[K_COUNT];
static PyObject *data_id; /* DATA_ID as an int */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *inner;    /* Lightning's callable */
    PyObject *slow;     /* the _FitRun method that handles every case */
    PyObject *run;      /* the _FitRun: its slots */
    PyObject *scope;    /* its _fail(exc) */
    PyObject *scope_state; /* its __dict__: _active */
    PyObject *timeline; /* its _direct, the data wait's fields, _fold and _track_enter/_track_leave */
    PyObject *log;      /* timeline._log */
    PyObject *clock;    /* timeline._clock */
    PyObject *cpu_clock;
    PyObject *switch_clock;
    PyObject *h2d;     /* the phase ids, as the run holds them */
    PyObject *compute;
    long long h2d_id, compute_id; /* the same, as logged */
    Py_ssize_t fold_at;
    long long interval; /* between two waits whose CPU time is read */
    /* where the run's (K_CLOSED..K_COUNT_TENSORS) and the timeline's (K_DIRECT..K_DATA_STILL)
     * attributes are in those objects: their __slots__, read and written as Python's own member
     * descriptors do, without a lookup by name */
    Py_ssize_t offsets[K_COUNT];
} StepHook;

/* ``name``'s offset in instances of ``type``: a writable object slot (``__slots__``) */
static int
slot_offset(PyTypeObject *type, PyObject *name, Py_ssize_t *offset)
{
    PyObject *descr = PyObject_GetAttr((PyObject *)type, name);
    if (descr == NULL && !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return -1;
    }
    PyErr_Clear();
    /* a member descriptor of this type or a base: another class's would address another layout */
    int ok = descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) && PyType_IsSubtype(type, PyDescr_TYPE(descr));
    if (ok) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        ok = member->type == T_OBJECT_EX && !(member->flags & READONLY) &&
             member->offset >= (Py_ssize_t)sizeof(PyObject) &&
             member->offset + (Py_ssize_t)sizeof(PyObject *) <= type->tp_basicsize;
        *offset = member->offset;
    }
    Py_XDECREF(descr);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "stallscope: %s.%U is not a slot", type->tp_name, name);
        return -1;
    }
    return 0;
}

/* the value in ``obj``'s slot ``key`` (borrowed), or NULL with an AttributeError when unset */
static PyObject *
slot_get(StepHook *self, PyObject *obj, int key)
{
    PyObject *value = *(PyObject **)((char *)obj + self->offsets[key]);
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "stallscope: %U is not set", keys[key]);
    }
    return value;
}

static void
slot_set(StepHook *self, PyObject *obj, int key, PyObject *value)
{
    PyObject **where = (PyObject **)((char *)obj + self->offsets[key]);
    PyObject *old = *where;
    *where = Py_NewRef(value);
    Py_XDECREF(old); /* last: freeing it could run code that reads the slot */
}

/* the timeline's int attribute ``key`` */
static int
timeline_ll(StepHook *self, int key, long long *out)
{
    PyObject *value = slot_get(self, self->timeline, key);
    return value == NULL ? -1 : as_ll(value, out);
}

static int
set_timeline_ll(StepHook *self, int key, long long value)
{
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return -1;
    }
    slot_set(self, self->timeline, key, number);
    Py_DECREF(number);
    return 0;
}

/* the run's attribute ``key`` (borrowed), or the scope's for K_ACTIVE; NULL with an error */
static PyObject *
run_get(StepHook *self, int key)
{
    if (key != K_ACTIVE) {
        return slot_get(self, self->run, key);
    }
    PyObject *value = PyDict_GetItemWithError(self->scope_state, keys[key]);
    if (value == NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_AttributeError, "stallscope: the scope has no %U", keys[key]);
    }
    return value;
}

static int
run_set(StepHook *self, int key, PyObject *value)
{
    slot_set(self, self->run, key, value);
    return 0;
}

/* a truth value of the run (``key``) or the scope (``K_ACTIVE``): 1, 0, or -1 with an error */
static int
truth(StepHook *self, int key)
{
    PyObject *value = run_get(self, key);
    if (value == NULL) {
        return -1;
    }
    Py_INCREF(value); /* borrowed from a slot or the scope's dict, which __bool__ could change */
    int rc = PyObject_IsTrue(value);
    Py_DECREF(value);
    return rc;
}

/* Timeline._direct: 0 (events go through its ``_push``), UNWATCHED (straight into its log) or
 * WATCHED (into its log, and a phase is watched: ``_track_enter``/``_track_leave`` follow each
 * event); -1 with an error */
enum { UNWATCHED = 1, WATCHED = 2 };

static int
direct(StepHook *self)
{
    long long value;
    if (timeline_ll(self, K_DIRECT, &value) < 0) {
        return -1;
    }
    return value == UNWATCHED || value == WATCHED ? (int)value : 0;
}

/* with a phase watched, what Timeline does after logging an event: ``_track_leave()`` when
 * ``leave``, then ``_track_enter(enter)`` unless ``enter`` is NULL */
static int
track(StepHook *self, int leave, PyObject *enter)
{
    PyObject *rc;
    if (leave) {
        rc = PyObject_CallMethodNoArgs(self->timeline, keys[K_TRACK_LEAVE]);
        if (rc == NULL) {
            return -1;
        }
        Py_DECREF(rc);
    }
    if (enter != NULL) {
        rc = PyObject_CallMethodOneArg(self->timeline, keys[K_TRACK_ENTER], enter);
        if (rc == NULL) {
            return -1;
        }
        Py_DECREF(rc);
    }
    return 0;
}

/* append (code, now) to the log, and (then, now) after it when ``then`` is not NO_PHASE */
#define NO_PHASE (-1000)

static int
log_now(StepHook *self, long long code, long long then, long long *now)
{
    if (read_clock(self->clock, now) < 0) {
        return -1;
    }
    return then == NO_PHASE ? log_event(self->log, code, *now) : log_event_then(self->log, code, *now, then);
}

static int
fold_if_full(StepHook *self)
{
    if (((EventLog *)self->log)->len < self->fold_at) {
        return 0;
    }
    PyObject *rc = PyObject_CallMethodNoArgs(self->timeline, name_fold);
    Py_XDECREF(rc);
    return rc == NULL ? -1 : 0;
}

/* ``top == pid`` for the run's phase (None or an id): 1, 0, or -1 with an error */
static int
is_phase(PyObject *top, PyObject *pid)
{
    if (top == pid) { /* the run stores its own id objects */
        return 1;
    }
    return top == Py_None ? 0 : PyObject_RichCompareBool(top, pid, Py_EQ);
}

/* the step's usual case: 1 when it was handled, 0 when ``slow`` must run, -1 on an error */
static int
usual(StepHook *self)
{
    PyObject *top = run_get(self, K_TOP);
    if (top == NULL) {
        return -1;
    }
    int no_top = top == Py_None;
    Py_INCREF(top); /* a comparison could run Python, which could change the run's state */
    int is_compute = is_phase(top, self->compute);
    int is_h2d = is_compute == 0 ? is_phase(top, self->h2d) : 0;
    Py_DECREF(top);
    if (is_compute < 0 || is_h2d < 0) {
        return -1;
    }
    if (self->kind == COMPUTE_END && !is_compute) {
        return 1; /* nothing open to end (the schedulers are stepped again, or no step ran) */
    }
    PyObject *lazy = run_get(self, K_LAZY);
    if (lazy == NULL) {
        return -1;
    }
    if (lazy != Py_None) {
        return 0;
    }
    int ready;
    switch (self->kind) {
    case FETCH_BEGIN:
        ready = no_top;
        break;
    case FETCH_END:
        ready = truth(self, K_NESTED_FETCH);
        if (ready < 0) {
            return -1;
        }
        PyObject *first_wait = run_get(self, K_FIRST_WAIT);
        if (first_wait == NULL) {
            return -1;
        }
        ready = !ready && first_wait != Py_None;
        break;
    case COMPUTE_BEGIN: {
        int fetched = truth(self, K_FETCHED), counting = truth(self, K_COUNT_TENSORS);
        if (fetched < 0 || counting < 0) {
            return -1;
        }
        ready = fetched && is_h2d && !counting;
        break;
    }
    default:
        ready = 1; /* COMPUTE_END with compute open */
    }
    if (!ready) {
        return 0;
    }
    int mode = direct(self);
    if (mode <= 0) {
        return mode;
    }
    int watched = mode == WATCHED;

    long long now;
    int rc = -1;
    switch (self->kind) {
    case FETCH_BEGIN: { /* Timeline.data_begin(new_step=True) */
        long long cpu_due, mark = -1, switches = -1;
        if (log_now(self, STEP, NO_PHASE, &now) < 0 || set_timeline_ll(self, K_DATA_T0, now) < 0) {
            break;
        }
        if ((watched && track(self, 0, data_id) < 0) || set_timeline_ll(self, K_DATA_CPU_MARK, -1) < 0 ||
            timeline_ll(self, K_CPU_DUE, &cpu_due) < 0) {
            break;
        }
        if (now >= cpu_due && (set_timeline_ll(self, K_CPU_DUE, now + self->interval) < 0 ||
                               read_clock(self->cpu_clock, &mark) < 0 ||
                               set_timeline_ll(self, K_DATA_CPU_MARK, mark) < 0 ||
                               read_clock(self->switch_clock, &switches) < 0 ||
                               set_timeline_ll(self, K_DATA_SWITCH_MARK, switches) < 0)) {
            break;
        }
        rc = 1;
        break;
    }
    case FETCH_END: { /* Timeline.data_end(got_item=True, then=h2d) */
        long long mark, cpu1 = -1, switches1 = -1, t0;
        if (timeline_ll(self, K_DATA_CPU_MARK, &mark) < 0 ||
            (mark >= 0 && (read_clock(self->cpu_clock, &cpu1) < 0 || read_clock(self->switch_clock, &switches1) < 0)) ||
            log_now(self, GOT, self->h2d_id, &now) < 0 || timeline_ll(self, K_DATA_T0, &t0) < 0) {
            break;
        }
        long long cpu_total, cpu_wall, switches0, still;
        if (mark >= 0 && (timeline_ll(self, K_DATA_CPU_TOTAL, &cpu_total) < 0 ||
                          timeline_ll(self, K_DATA_CPU_WALL, &cpu_wall) < 0 ||
                          timeline_ll(self, K_DATA_SWITCH_MARK, &switches0) < 0 ||
                          timeline_ll(self, K_DATA_STILL, &still) < 0 ||
                          set_timeline_ll(self, K_DATA_CPU_TOTAL, cpu_total + cpu1 - mark) < 0 ||
                          set_timeline_ll(self, K_DATA_CPU_WALL, cpu_wall + now - t0) < 0 ||
                          /* a wait that did not block keeps its time off a CPU (Timeline._add_data_cpu) */
                          (switches0 >= 0 && switches1 == switches0 && now - t0 > cpu1 - mark &&
                           set_timeline_ll(self, K_DATA_STILL, still + (now - t0) - (cpu1 - mark)) < 0) ||
                          set_timeline_ll(self, K_DATA_CPU_MARK, -1) < 0)) {
            break;
        }
        if ((watched && track(self, 1, self->h2d) < 0) || fold_if_full(self) < 0 ||
            run_set(self, K_FETCHED, Py_True) < 0 || run_set(self, K_TOP, self->h2d) < 0) {
            break;
        }
        rc = 1;
        break;
    }
    case COMPUTE_BEGIN: /* Timeline.switch(compute) */
        if (run_set(self, K_FETCHED, Py_False) < 0 || log_now(self, LEAVE, self->compute_id, &now) < 0 ||
            (watched && track(self, 1, self->compute) < 0) || run_set(self, K_TOP, self->compute) < 0) {
            break;
        }
        rc = 1;
        break;
    default: /* COMPUTE_END: Timeline.leave() */
        if (log_now(self, LEAVE, NO_PHASE, &now) < 0 || (watched && track(self, 1, NULL) < 0) ||
            fold_if_full(self) < 0 || run_set(self, K_TOP, Py_None) < 0) {
            break;
        }
        rc = 1;
    }
    return rc;
}

/* the step's part of the call: 0 when done (StallScope's errors contained), -1 with an error set */
static int
StepHook_step(StepHook *self, PyObject *batch)
{
    int closed = truth(self, K_CLOSED);
    int active = closed == 0 ? truth(self, K_ACTIVE) : 0;
    if (closed < 0 || active < 0) {
        return contain_in(self->scope, keys[K_FAIL]);
    }
    if (closed || !active) {
        return 0;
    }
    int rc = usual(self);
    if (rc < 0) {
        return contain_in(self->scope, keys[K_FAIL]);
    }
    if (rc == 0) { /* the Python method: it contains StallScope's errors itself */
        PyObject *done = batch != NULL ? PyObject_CallOneArg(self->slow, batch) : PyObject_CallNoArgs(self->slow);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    return 0;
}

/* ``batch`` of on_batch_start(batch, ...): the first argument, or the one named so */
static PyObject *
batch_arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs > 0) {
        return args[0];
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyUnicode_Check(PyTuple_GET_ITEM(kwnames, i)) &&
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "batch") == 0) {
            return args[i];
        }
    }
    return Py_None;
}

static PyObject *
StepHook_vectorcall(StepHook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (unready(!self->inner || !self->slow || !self->run || !self->scope || !self->scope_state || !self->timeline ||
                !self->log || !self->clock || !self->cpu_clock || !self->switch_clock || !self->h2d ||
                !self->compute)) {
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *result;
    switch (self->kind) {
    case FETCH_BEGIN:
    case COMPUTE_BEGIN:
        result = PyObject_Vectorcall(self->inner, args, nargsf, kwnames);
        if (result != NULL && self->kind == FETCH_BEGIN) { /* Lightning's fetch hooks return None */
            Py_SETREF(result, Py_NewRef(Py_None));
        }
        if (result != NULL &&
            StepHook_step(self, self->kind == COMPUTE_BEGIN ? batch_arg(args, nargs, kwnames) : NULL) < 0) {
            Py_CLEAR(result);
        }
        return result;
    case FETCH_END: {
        if (StepHook_step(self, NULL) == 0) {
            result = PyObject_Vectorcall(self->inner, args, nargsf, kwnames);
            if (result != NULL) {
                Py_SETREF(result, Py_NewRef(Py_None));
            }
            return result;
        }
        /* inner() runs even so (a ``finally``): its own error, if any, replaces this one, which
         * becomes its __context__ as in Python */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL) {
            PyException_SetTraceback(value, tb);
        }
        result = PyObject_Vectorcall(self->inner, args, nargsf, kwnames);
        if (result == NULL) {
            PyObject *type2, *value2, *tb2;
            PyErr_Fetch(&type2, &value2, &tb2);
            PyErr_NormalizeException(&type2, &value2, &tb2);
            if (value2 != NULL && value != NULL && value2 != value) {
                PyException_SetContext(value2, value); /* steals the reference to value */
                value = NULL;
            }
            PyErr_Restore(type2, value2, tb2);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return NULL;
        }
        Py_DECREF(result);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    default:
        if (StepHook_step(self, NULL) < 0) {
            return NULL;
        }
        return PyObject_Vectorcall(self->inner, args, nargsf, kwnames);
    }
}

static PyObject *
StepHook_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    StepHook *self = (StepHook *)PyType_GenericNew(type, args, kwds);
    if (self != NULL) {
        self->vectorcall = (vectorcallfunc)StepHook_vectorcall; /* before __init__: it checks */
    }
    return (PyObject *)self;
}

static int
StepHook_init(StepHook *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"kind", "inner", "slow", "run", "scope", "timeline", "h2d", "compute", "fold_at",
                            "interval", NULL};
    int kind;
    PyObject *inner, *slow, *run, *scope, *timeline, *h2d, *compute;
    Py_ssize_t fold_at;
    long long interval;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOOOOOO!O!nL:StepHook", names, &kind, &inner, &slow, &run, &scope,
                                     &timeline, &PyLong_Type, &h2d, &PyLong_Type, &compute, &fold_at, &interval)) {
        return -1;
    }
    if (self->inner != NULL) { /* its fields are read across calls into Python: never swapped */
        PyErr_SetString(PyExc_TypeError, "StepHook is already initialised");
        return -1;
    }
    if (kind < 0 || kind >= HOOK_KINDS || !PyCallable_Check(inner) || !PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_ValueError, "StepHook needs a kind in range(4) and two callables");
        return -1;
    }
    Py_ssize_t offsets[K_COUNT];
    for (int key = 0; key < K_COUNT; key++) {
        offsets[key] = -1;
        PyTypeObject *owner = key < K_ACTIVE                            ? Py_TYPE(run)
                              : key >= K_DIRECT && key <= K_DATA_STILL ? Py_TYPE(timeline)
                                                                          : NULL;
        if (owner != NULL && slot_offset(owner, keys[key], &offsets[key]) < 0) {
            return -1;
        }
    }
    PyObject *scope_state = PyObject_GenericGetDict(scope, NULL);
    if (scope_state == NULL) {
        return -1;
    }
    PyObject *log = PyObject_GetAttr(timeline, keys[K_LOG]);
    PyObject *clock = log != NULL ? PyObject_GetAttr(timeline, keys[K_CLOCK]) : NULL;
    PyObject *cpu_clock = clock != NULL ? PyObject_GetAttr(timeline, keys[K_CPU_CLOCK]) : NULL;
    PyObject *switch_clock = cpu_clock != NULL ? PyObject_GetAttr(timeline, keys[K_SWITCH_CLOCK]) : NULL;
    if (switch_clock == NULL) {
        Py_CLEAR(cpu_clock);
    }
    long long h2d_id = 0, compute_id = 0;
    if (cpu_clock != NULL && (as_ll(h2d, &h2d_id) < 0 || as_ll(compute, &compute_id) < 0)) {
        Py_CLEAR(cpu_clock);
    }
    else if (cpu_clock != NULL && (h2d_id < 0 || compute_id < 0)) {
        PyErr_SetString(PyExc_ValueError, "StepHook needs phase ids >= 0");
        Py_CLEAR(cpu_clock);
    }
    if (cpu_clock == NULL || !PyDict_Check(scope_state) || !EventLog_Check(log)) {
        if (cpu_clock != NULL) {
            PyErr_SetString(PyExc_TypeError, "StepHook needs a scope with a __dict__ and a timeline's log");
        }
        Py_DECREF(scope_state);
        Py_XDECREF(log);
        Py_XDECREF(clock);
        Py_XDECREF(cpu_clock);
        Py_XDECREF(switch_clock);
        return -1;
    }
    self->kind = kind;
    Py_XSETREF(self->inner, Py_NewRef(inner));
    Py_XSETREF(self->slow, Py_NewRef(slow));
    Py_XSETREF(self->run, Py_NewRef(run));
    memcpy(self->offsets, offsets, sizeof(offsets));
    Py_XSETREF(self->scope, Py_NewRef(scope));
    Py_XSETREF(self->scope_state, scope_state);
    Py_XSETREF(self->timeline, Py_NewRef(timeline));
    Py_XSETREF(self->log, log);
    Py_XSETREF(self->clock, clock);
    Py_XSETREF(self->cpu_clock, cpu_clock);
    Py_XSETREF(self->switch_clock, switch_clock);
    Py_XSETREF(self->h2d, Py_NewRef(h2d));
    Py_XSETREF(self->compute, Py_NewRef(compute));
    self->h2d_id = h2d_id;
    self->compute_id = compute_id;
    self->fold_at = fold_at;
    self->interval = interval;
    return 0;
}

static int
StepHook_traverse(StepHook *self, visitproc visit, void *arg)
{
    Py_VISIT(self->inner);
    Py_VISIT(self->slow);
    Py_VISIT(self->run);
    Py_VISIT(self->scope);
    Py_VISIT(self->scope_state);
    Py_VISIT(self->timeline);
    Py_VISIT(self->log);
    Py_VISIT(self->clock);
    Py_VISIT(self->cpu_clock);
    Py_VISIT(self->switch_clock);
    Py_VISIT(self->h2d);
    Py_VISIT(self->compute);
    return 0;
}

static int
StepHook_clear(StepHook *self)
{
    Py_CLEAR(self->inner);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->run);
    Py_CLEAR(self->scope);
    Py_CLEAR(self->scope_state);
    Py_CLEAR(self->timeline);
    Py_CLEAR(self->log);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->cpu_clock);
    Py_CLEAR(self->switch_clock);
    Py_CLEAR(self->h2d);
    Py_CLEAR(self->compute);
    return 0;
}

static void
StepHook_dealloc(StepHook *self)
{
    PyObject_GC_UnTrack(self);
    StepHook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef StepHook_members[] = {
    {"inner", T_OBJECT_EX, offsetof(StepHook, inner), READONLY, "Lightning's callable it stands in for"},
    {NULL},
};

static PyTypeObject StepHookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stallscope.timeline._native.StepHook",
    .tp_doc = PyDoc_STR("StepHook(kind, inner, slow, run, scope, timeline, h2d, compute, fold_at, interval): one of "
                        "Lightning's per-step touch points, the usual case in C"),
    .tp_basicsize = sizeof(StepHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(StepHook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = StepHook_new,
    .tp_init = (initproc)StepHook_init,
    .tp_dealloc = (destructor)StepHook_dealloc,
    .tp_traverse = (traverseproc)StepHook_traverse,
    .tp_clear = (inquiry)StepHook_clear,
    .tp_members = StepHook_members,
};

/* ---- HookBase -------------------------------------------------------------------------- */

/* The base of StallScope's Lightning callback (``hooks/lightning.py``). Lightning's dispatcher
 * reads six hooks of every callback a step (``getattr(callback, name)``, then ``callable``), and
 * StallScope answers None to the ones it does not need. A plain attribute read first looks the
 * name up on the type, in CPython's cache of type lookups, a table shared by the whole process,
 * where those few entries a step can evict Lightning's own and be evicted by them: each miss is a
 * walk through the class dicts. Here an ``on_*`` name whose value in the instance's ``__dict__``
 * is None is answered from that dict alone; every other read is the generic one (though, as with
 * any C getattro, the interpreter no longer specialises reads on these objects: none is per
 * step). The answer is the same: a value set by ``setattr`` lands in the instance's dict only
 * when the type has no data descriptor of that name. */

static PyObject *
HookBase_getattro(PyObject *self, PyObject *name)
{
    if (PyUnicode_CheckExact(name) && PyUnicode_KIND(name) == PyUnicode_1BYTE_KIND && PyUnicode_GET_LENGTH(name) > 3) {
        const Py_UCS1 *chars = PyUnicode_1BYTE_DATA(name);
        if (chars[0] == 'o' && chars[1] == 'n' && chars[2] == '_') {
            PyObject *dict = PyObject_GenericGetDict(self, NULL);
            if (dict == NULL) {
                PyErr_Clear(); /* the generic read below reports what is wrong */
            }
            else {
                int none = PyDict_GetItemWithError(dict, name) == Py_None; /* compared, not used */
                Py_DECREF(dict);
                if (none) {
                    Py_RETURN_NONE;
                }
                PyErr_Clear();
            }
        }
    }
    return PyObject_GenericGetAttr(self, name);
}

static PyTypeObject HookBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stallscope.timeline._native.HookBase",
    .tp_doc = PyDoc_STR("A base class whose on_* attributes set to None on the instance read without a type "
                        "lookup (StallScope's Lightning callback)."),
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_getattro = HookBase_getattro,
};

/* ---- module ---------------------------------------------------------------------------- */

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stallscope.timeline._native",
    .m_doc = PyDoc_STR("The timeline's hot path in C (see recorder.py for the Python equivalent)."),
    .m_size = -1,
    .m_methods = native_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL) {
        return NULL;
    }
    perf_counter_ns = PyObject_GetAttrString(time, "perf_counter_ns");
    Py_DECREF(time);
    if (perf_counter_ns == NULL) {
        return NULL;
    }
    if (!PyCFunction_Check(perf_counter_ns)) { /* patched (a fake clock): no shortcut, call it */
        Py_CLEAR(perf_counter_ns);
    }
    code_leave = PyLong_FromLong(LEAVE);
    PyObject *builtins = PyImport_ImportModule("builtins");
    if (builtins == NULL) {
        return NULL;
    }
    builtin_round = PyObject_GetAttrString(builtins, "round");
    Py_DECREF(builtins);
    if (builtin_round == NULL) {
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        if ((digits_obj[i] = PyLong_FromLong(i)) == NULL) {
            return NULL;
        }
    }
    static const char *dist_names[5] = {"mean", "p10", "p50", "p90", "max"};
    for (int i = 0; i < 5; i++) {
        if ((dist_keys[i] = PyUnicode_InternFromString(dist_names[i])) == NULL) {
            return NULL;
        }
    }
    name_fold = PyUnicode_InternFromString("_fold");
    name_failed = PyUnicode_InternFromString("_failed");
    for (int i = 0; i < S_COUNT; i++) {
        if ((state_attrs[i] = PyUnicode_InternFromString(state_names[i])) == NULL) {
            return NULL;
        }
    }
    name_totals = PyUnicode_InternFromString("_totals");
    name_counts = PyUnicode_InternFromString("_counts");
    name_stack = PyUnicode_InternFromString("_stack");
    name_ring_step = PyUnicode_InternFromString("_ring_step");
    name_ring_wait = PyUnicode_InternFromString("_ring_wait");
    name_ring_compute = PyUnicode_InternFromString("_ring_compute");
    name_ring_kinds = PyUnicode_InternFromString("_ring_kinds");
    name_ring_start = PyUnicode_InternFromString("_ring_start");
    name_ring_phases = PyUnicode_InternFromString("_ring_phases");
    name_step_phases0 = PyUnicode_InternFromString("_step_phases0");
    name_ring_size = PyUnicode_InternFromString("_ring_size");
    name_window_steps = PyUnicode_InternFromString("_window_steps");
    for (int i = 0; i < K_COUNT; i++) {
        if ((keys[i] = PyUnicode_InternFromString(key_names[i])) == NULL) {
            return NULL;
        }
    }
    data_id = PyLong_FromLong(DATA_ID);
    HookBaseType.tp_new = PyBaseObject_Type.tp_new; /* object's: checks its arguments as object() does */
    if (data_id == NULL || PyType_Ready(&StepHookType) < 0 || PyType_Ready(&HookBaseType) < 0) {
        return NULL;
    }
    if (!name_totals || !name_counts || !name_stack || !name_ring_step || !name_ring_wait || !name_ring_compute ||
        !name_ring_kinds || !name_ring_start || !name_ring_phases || !name_step_phases0 || !name_ring_size ||
        !name_window_steps) {
        return NULL;
    }
    if (!code_leave || !name_fold || !name_failed || PyType_Ready(&EventLogType) < 0 || PyType_Ready(&TimerType) < 0 ||
        PyType_Ready(&StreamType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObject(module, "EventLog", Py_NewRef((PyObject *)&EventLogType)) < 0 ||
        PyModule_AddObject(module, "Timer", Py_NewRef((PyObject *)&TimerType)) < 0 ||
        PyModule_AddObject(module, "Stream", Py_NewRef((PyObject *)&StreamType)) < 0 ||
        PyModule_AddObject(module, "StepHook", Py_NewRef((PyObject *)&StepHookType)) < 0 ||
        PyModule_AddObject(module, "HookBase", Py_NewRef((PyObject *)&HookBaseType)) < 0 ||
        PyModule_AddIntConstant(module, "FETCH_BEGIN", FETCH_BEGIN) < 0 ||
        PyModule_AddIntConstant(module, "FETCH_END", FETCH_END) < 0 ||
        PyModule_AddIntConstant(module, "COMPUTE_BEGIN", COMPUTE_BEGIN) < 0 ||
        PyModule_AddIntConstant(module, "COMPUTE_END", COMPUTE_END) < 0 ||
        PyModule_AddIntConstant(module, "LEAVE", LEAVE) < 0 || PyModule_AddIntConstant(module, "STEP", STEP) < 0 ||
        PyModule_AddIntConstant(module, "GOT", GOT) < 0 || PyModule_AddIntConstant(module, "NONE", NONE) < 0 ||
        PyModule_AddIntConstant(module, "WAIT", WAIT) < 0 || PyModule_AddIntConstant(module, "END", END) < 0 ||
        PyModule_AddIntConstant(module, "DATA_ID", DATA_ID) < 0 ||
        PyModule_AddIntConstant(module, "COMPUTE_ID", COMPUTE_ID) < 0 ||
        PyModule_AddIntConstant(module, "OTHER_ID", OTHER_ID) < 0 ||
        PyModule_AddIntConstant(module, "KIND_BITS", KIND_BITS) < 0 ||
        PyModule_AddIntConstant(module, "RECENT_COLUMNS", RECENT_COLUMNS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
