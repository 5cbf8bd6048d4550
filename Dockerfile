# syntax=docker/dockerfile:1
# The tierproxy images, two targets of this one file:
#   proxy     (the default, the last stage) `pip install '.[loadtest]'`: the proxy and
#             `tierproxy loadtest`, no Spark and no Java; runs `tierproxy serve`
#   pipeline  `pip install '.[pipeline]'` and a Java runtime for Spark; runs `tierproxy tier`
# docker-compose.yml builds each for its service and mounts the configuration at
# /etc/tierproxy/tierproxy.properties.
#
#   docker build --target proxy -t tierproxy .
#   docker build --target pipeline -t tierproxy-pipeline .

# bookworm: the Debian release whose openjdk-17-jre-headless the pipeline installs.
FROM python:3.11-slim-bookworm AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A fixed uid so volume ownership is predictable. Never root at run time.
RUN groupadd --system --gid 10001 tierproxy \
 && useradd --system --uid 10001 --gid tierproxy --home-dir /var/lib/tierproxy --create-home \
        --shell /usr/sbin/nologin tierproxy
# The packages of pyproject.toml (testbed/, tests only, stays out).
WORKDIR /opt/tierproxy/src
COPY pyproject.toml setup.py README.md ./
COPY protocol ./protocol
COPY config ./config
COPY client ./client
COPY storage ./storage
COPY cache ./cache
COPY remote_log ./remote_log
COPY proxy ./proxy
COPY pipeline ./pipeline
COPY tierproxy ./tierproxy

FROM base AS pipeline
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
RUN pip install '.[pipeline]' && rm -rf build *.egg-info
# Spark's Python workers run the interpreter of the driver.
ENV PYSPARK_PYTHON=python3
WORKDIR /var/lib/tierproxy
USER tierproxy
CMD ["tierproxy", "tier", "--config", "/etc/tierproxy/tierproxy.properties", "--every", "30s"]

FROM base AS proxy
# A C compiler only while pip builds the compiled Fetch walks (setup.py), gone after.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install '.[loadtest]' && rm -rf build *.egg-info \
 && apt-get purge -y --auto-remove gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /var/lib/tierproxy
USER tierproxy
EXPOSE 9192 9194 9404
# Healthy once the bootstrap listener of the mounted configuration accepts connections.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import socket, sys; from config import load; port = load(sys.argv[1])['proxy.bootstrap.port']; socket.create_connection(('127.0.0.1', port), 3).close()", "/etc/tierproxy/tierproxy.properties"]
CMD ["tierproxy", "serve", "--config", "/etc/tierproxy/tierproxy.properties"]
