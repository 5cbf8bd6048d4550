# Everything a fresh machine needs is set up by these targets.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
# Spark's Python workers must run the same interpreter as the driver.
export PYSPARK_PYTHON := $(abspath $(PY))
# Spark binds to loopback like every other server the tests and the demo start.
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: install jars test demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

# Apache Kafka jars from Maven Central, cached outside the repository.
jars: install
	$(PY) -m testbed jars

test: install jars
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The run command: Kafka, the pipeline and the proxy end to end on this machine.
demo: install jars
	$(PY) -m testbed.demo

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
