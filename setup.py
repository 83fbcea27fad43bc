"""Build script for the optional native hot path; the project's metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # optional: without a C compiler the install goes on, and StallScope uses its Python code
        Extension("stallscope.timeline._native", ["stallscope/timeline/_native.c"], optional=True),
    ]
)
