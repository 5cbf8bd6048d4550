# Everything a fresh machine needs is set up by these targets.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
# Spark's Python workers must run the same interpreter as the driver.
export PYSPARK_PYTHON := $(abspath $(PY))
# Spark binds to loopback like every other server the tests and the demo start.
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: system install jars test demo demo-secure clean

# Debian packages, installed with apt-get only when missing (one `apt-get update`, and
# only then); a no-op on a machine that has them. COMMAND:PACKAGE pairs: kcat for the
# kcat test, a Java runtime for Kafka and Spark, Maven for the Kafka jars, Prometheus
# (promtool and the server) for the tests of deploy/rules/, a C compiler (and below, the
# Python headers) for the compiled accelerators, which the tests compare with the
# pure-Python code.
SYSTEM_PACKAGES := kcat:kcat java:openjdk-17-jre-headless mvn:maven promtool:prometheus gcc:gcc

system:
	@missing=""; \
	for pair in $(SYSTEM_PACKAGES); do \
	  command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	$(PYTHON) -c 'import ensurepip' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	$(PYTHON) -c 'import os, sysconfig; os.stat(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
	  >/dev/null 2>&1 || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  echo "installing with apt-get:$$missing"; \
	  $$sudo apt-get update -qq && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# setup.py and the C sources: the editable install builds the compiled modules in place.
$(VENV)/.installed: pyproject.toml setup.py $(wildcard */*.c) | system
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

# Apache Kafka jars from Maven Central, cached outside the repository.
jars: system install
	$(PY) -m testbed jars

test: system install jars
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The run command: Kafka, the pipeline and the proxy end to end on this machine.
demo: system install jars
	$(PY) -m testbed.demo

# The same with nothing plaintext: SASL_SSL broker, SCRAM logins, TLS at the proxy.
demo-secure: system install jars
	$(PY) -m testbed.demo --secure

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache */*.so
