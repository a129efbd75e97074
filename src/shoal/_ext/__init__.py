"""Compiled kernels (built from ext/*.pyx). Import them only through shoal.kernels."""
