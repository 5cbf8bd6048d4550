"""The compiled accelerators; everything else about the distribution is in pyproject.toml.

Each is optional, as aiokafka's: where no C compiler (or no Python headers) is, the build
skips it and the pure-Python twin runs (`tierproxy.protocol.extensions`).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("tierproxy.protocol._fetch_wire", ["protocol/_fetch_wire.c"], optional=True),
    Extension("tierproxy.pipeline._record_arrays", ["pipeline/_record_arrays.c"], optional=True),
])
