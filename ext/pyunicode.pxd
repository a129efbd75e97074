# CPython's string internals that the kernels read directly, shared by ownership.pyx and
# verify.pyx (`from pyunicode cimport ...`): declarations and one inline helper, no module.
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_KIND

cdef extern from "Python.h":
    ctypedef unsigned char Py_UCS1
    ctypedef unsigned short Py_UCS2
    ctypedef unsigned int Py_UCS4_t "Py_UCS4"
    # A macro that is a no-op on 3.12+; kept so legacy (non-"ready") strings on 3.11 are safe.
    int PyUnicode_READY(object o) except -1
    bint PyUnicode_IS_ASCII(object o)


cdef struct UnicodeView:
    Py_ssize_t length  # in code points
    unsigned int kind  # PyUnicode_1BYTE_KIND, _2BYTE_KIND or _4BYTE_KIND: the width of a code point
    const void* data   # the code points, read in place


cdef inline UnicodeView unicode_view(str s) except *:
    # Where a str's code points are (the str made "ready" first, for legacy strings on 3.11).
    cdef UnicodeView view
    PyUnicode_READY(s)
    view.length = PyUnicode_GET_LENGTH(s)
    view.kind = PyUnicode_KIND(s)
    view.data = PyUnicode_DATA(s)
    return view
