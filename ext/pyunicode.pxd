# Declarations of CPython's string internals that the kernels read directly, shared by
# ownership.pyx and verify.pyx (`from pyunicode cimport ...`). Declarations only: no module.
cdef extern from "Python.h":
    ctypedef unsigned char Py_UCS1
    ctypedef unsigned short Py_UCS2
    ctypedef unsigned int Py_UCS4_t "Py_UCS4"
    # A macro that is a no-op on 3.12+; kept so legacy (non-"ready") strings on 3.11 are safe.
    int PyUnicode_READY(object o) except -1
    bint PyUnicode_IS_ASCII(object o)
