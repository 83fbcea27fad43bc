/* The timeline's hot path in C: what runs between two training steps.
 *
 * recorder.py has the same two pieces in Python, used when this module is not built (no C
 * compiler at install time) or STALLSCOPE_NO_NATIVE is set; the two log the same events into
 * the same list, and the test suite runs the timeline and scope tests against both.
 *
 *   Timer   the context manager ``scope.phase(name)`` hands out (recorder.PhaseTimer): logs
 *           (phase id, now) on enter and (LEAVE, now) on exit, then folds the log when full.
 *   Stream  the iterator behind ``scope.iter`` (recorder.Timeline._stream): logs (STEP, now)
 *           before each next() and (GOT, now) after it, reads the CPU clock around one wait per
 *           interval, hands the first item to ``on_first``, and logs (NONE, now) when the
 *           iterator ends or raises. The final wait is appended to ``result``.
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
#include <time.h>

/* event codes: the same as recorder.py's (checked there at import) */
#define LEAVE (-1)
#define STEP (-2)
#define GOT (-4)
#define NONE (-5)

static PyObject *perf_counter_ns; /* time.perf_counter_ns */
static PyObject *code_leave, *code_step, *code_got, *code_none;
static PyObject *name_fold, *name_failed; /* the timeline's methods, by name */

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
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* append code and t to the list ``log`` */
static int
push(PyObject *log, PyObject *code, long long t)
{
    PyObject *when = PyLong_FromLongLong(t);
    if (when == NULL) {
        return -1;
    }
    int rc = PyList_Append(log, code);
    if (rc == 0) {
        rc = PyList_Append(log, when);
    }
    Py_DECREF(when);
    return rc;
}

/* an event now: appended to ``target`` when it is a list, else ``target((code, now))``. The
 * caller holds references to all three: a clock written in Python may run any code. */
static int
event(PyObject *target, PyObject *clock, PyObject *code)
{
    long long t;
    if (read_clock(clock, &t) < 0) {
        return -1;
    }
    if (PyList_CheckExact(target)) {
        return push(target, code, t);
    }
    PyObject *when = PyLong_FromLongLong(t);
    if (when == NULL) {
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, code, when);
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

/* With an error set: StallScope's own Exception goes to ``timeline._failed`` and is cleared
 * (returns 0); anything else (KeyboardInterrupt) stays set (returns -1), as does an error that
 * ``_failed`` raises. */
static int
contain(PyObject *timeline)
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
    PyObject *rc = PyObject_CallMethodOneArg(timeline, name_failed, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (rc == NULL) {
        return -1;
    }
    Py_DECREF(rc);
    return 0;
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
    PyObject *target; /* where events go: the log (a list), or a callable taking (code, now) */
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
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OOn:Timer", names, &code, &target, &PyList_Type, &log, &clock,
                                     &timeline, &fold_at)) {
        return -1;
    }
    if (self->clock != NULL) { /* its fields are read across calls into Python: never swapped */
        PyErr_SetString(PyExc_TypeError, "Timer is already initialised");
        return -1;
    }
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

static PyObject *
Timer_enter(Timer *self, PyObject *Py_UNUSED(ignored))
{
    if (Timer_unready(self)) {
        return NULL;
    }
    PyObject *target = Py_NewRef(self->target); /* a member: Python may replace it meanwhile */
    int rc = event(target, self->clock, self->code);
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
    PyObject *target = Py_NewRef(self->target); /* a member: Python may replace it meanwhile */
    int rc = event(target, self->clock, code_leave);
    Py_DECREF(target);
    if (rc < 0) {
        if (contain(self->timeline) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (PyList_Check(self->log) && PyList_GET_SIZE(self->log) >= self->fold_at) {
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
    {"target", T_OBJECT_EX, offsetof(Timer, target), 0, "where events go: the log, or a callable"},
    {"log", T_OBJECT_EX, offsetof(Timer, log), 0, "the log whose length triggers a fold"},
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
};

/* ---- Stream ---------------------------------------------------------------------------- */

enum { RECORDING, PASSING, DONE };

typedef struct {
    PyObject_HEAD
    PyObject *it;       /* the user's iterator */
    PyObject *log;      /* the timeline's log */
    PyObject *clock;
    PyObject *cpu_clock;
    PyObject *timeline; /* its _fold(), _failed(exc) and _add_data_cpu(cpu_ns, wall_ns) */
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
    static char *names[] = {"it",    "log",     "clock",    "cpu_clock", "timeline", "on_first", "result",
                            "token", "cpu_due", "interval", "fold_at",   NULL};
    PyObject *it, *log, *clock, *cpu_clock, *timeline, *on_first, *result, *token;
    long long cpu_due, interval;
    Py_ssize_t fold_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOOO!O!LLn:Stream", names, &it, &PyList_Type, &log, &clock,
                                     &cpu_clock, &timeline, &on_first, &PyList_Type, &result, &PyList_Type, &token,
                                     &cpu_due, &interval, &fold_at)) {
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
    if (unready(!self->it || !self->log || !self->clock || !self->cpu_clock || !self->timeline || !self->on_first ||
                !self->result || !self->token || !self->mine)) {
        return NULL;
    }
    if (self->state == DONE) {
        return NULL;
    }
    if (self->state == PASSING || PyList_GET_SIZE(self->token) < 1 || PyList_GET_ITEM(self->token, 0) != self->mine) {
        self->state = PASSING; /* stopped (Timeline.end_streams): unrecorded */
        return Py_TYPE(self->it)->tp_iternext(self->it);
    }
    long long began, end, cpu0 = -1, cpu1;
    /* logged before next(): phases the loader itself times nest inside the wait */
    if (read_clock(self->clock, &began) < 0 || push(self->log, code_step, began) < 0) {
        return Stream_pass(self);
    }
    if (began >= self->cpu_due) {
        self->cpu_due = began + self->interval;
        if (read_clock(self->cpu_clock, &cpu0) < 0) {
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
            if ((read_clock(self->clock, &end) < 0 || push(self->log, code_none, end) < 0) &&
                contain(self->timeline) < 0) {
                PyErr_Clear(); /* our own error while theirs is on its way: theirs wins */
            }
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        PyErr_Clear(); /* StopIteration: the pass is over */
        self->state = DONE;
        PyObject *wait = NULL;
        if (read_clock(self->clock, &end) < 0 || push(self->log, code_none, end) < 0 ||
            (wait = PyLong_FromLongLong(end - began)) == NULL || PyList_Append(self->result, wait) < 0) {
            contain(self->timeline); /* the pass ends all the same; a Ctrl-C stays set */
        }
        Py_XDECREF(wait);
        return NULL;
    }
    /* never lose the item: from here on an error of ours is contained and the item returned */
    PyObject *rc = NULL;
    if (read_clock(self->clock, &end) < 0 || push(self->log, code_got, end) < 0) {
        goto failed;
    }
    if (cpu0 >= 0) {
        if (read_clock(self->cpu_clock, &cpu1) < 0) {
            goto failed;
        }
        rc = PyObject_CallMethod(self->timeline, "_add_data_cpu", "LL", cpu1 - cpu0, end - began);
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
    if (PyList_GET_SIZE(self->log) >= self->fold_at) {
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
    .tp_doc = PyDoc_STR("Stream(it, log, clock, cpu_clock, timeline, on_first, result, token, cpu_due, interval, "
                        "fold_at): recorder.Timeline._stream in C"),
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

/* ---- module ---------------------------------------------------------------------------- */

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stallscope.timeline._native",
    .m_doc = PyDoc_STR("The timeline's hot path in C (see recorder.py for the Python equivalent)."),
    .m_size = -1,
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
    code_step = PyLong_FromLong(STEP);
    code_got = PyLong_FromLong(GOT);
    code_none = PyLong_FromLong(NONE);
    name_fold = PyUnicode_InternFromString("_fold");
    name_failed = PyUnicode_InternFromString("_failed");
    if (!code_leave || !code_step || !code_got || !code_none || !name_fold || !name_failed || PyType_Ready(&TimerType) < 0 ||
        PyType_Ready(&StreamType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObject(module, "Timer", Py_NewRef((PyObject *)&TimerType)) < 0 ||
        PyModule_AddObject(module, "Stream", Py_NewRef((PyObject *)&StreamType)) < 0 ||
        PyModule_AddIntConstant(module, "LEAVE", LEAVE) < 0 || PyModule_AddIntConstant(module, "STEP", STEP) < 0 ||
        PyModule_AddIntConstant(module, "GOT", GOT) < 0 || PyModule_AddIntConstant(module, "NONE", NONE) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
