"""The pipeline's SparkSession, from tierproxy's configuration.

`spark.master` and `spark.app.name` come from the configuration; when the job was started
with `spark-submit --master ...`, the submitted master wins (the pipeline then runs
unchanged on standalone, YARN or Kubernetes). Python workers must run the same interpreter
as the driver: PYSPARK_PYTHON is set to it unless given.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from tierproxy.config import Config, SPARK_APP_NAME, SPARK_MASTER

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def is_loopback_master(master: str) -> bool:
    """local[...] or a master on this machine's loopback: the driver then binds to 127.0.0.1 too."""
    if master.startswith("local"):
        return True
    return urlsplit(master).hostname in _LOOPBACK


def spark_session(config: Config, conf: Mapping[str, str] | None = None):
    """Gets or creates the SparkSession; `conf` adds Spark settings (`spark.ui.enabled`, ...)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    # Under spark-submit the JVM already runs (it told us its gateway port) with the
    # submitted settings as system properties; SparkConf reads them once the gateway is
    # up. Otherwise pyspark's launcher would default the master to local[*].
    submitted = SparkConf(loadDefaults=False)
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        from pyspark import SparkContext

        SparkContext._ensure_initialized()
        submitted = SparkConf()
    master = submitted.get("spark.master", None) or config[SPARK_MASTER]
    app_name = submitted.get("spark.app.name", None) or config[SPARK_APP_NAME]
    builder = SparkSession.builder.master(master).appName(app_name)
    # The pipeline prints its own progress; Spark's console bar would interleave with it.
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    if is_loopback_master(master) and not submitted.contains("spark.driver.host"):
        # SPARK_LOCAL_IP too: the JVM picks its address before any setting is read.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def max_task_attempts(spark) -> int:
    """How many times Spark runs a failing task: local[N,F] says F (plain local never
    retries), other masters spark.task.maxFailures (4)."""
    conf = spark.sparkContext.getConf()
    master = conf.get("spark.master", "local")
    if master.startswith("local"):
        inside = master[len("local"):].strip("[]")
        parts = inside.split(",")
        return int(parts[1]) if len(parts) == 2 else 1
    return int(conf.get("spark.task.maxFailures", "4"))


def task_slots(spark) -> int:
    """How many tasks Spark runs at once: its default parallelism (local[N]: N; a cluster:
    its executors' cores, unless spark.default.parallelism says otherwise) over
    spark.task.cpus."""
    sc = spark.sparkContext
    return max(1, sc.defaultParallelism // int(sc.getConf().get("spark.task.cpus", "1")))


def run_job(spark, group: str, description: str, items: Sequence[Any], task: Callable[[Any], Any],
            poll: Callable[[bool], object]) -> list[Any]:
    """`task` over `items` on Spark, one task each, under job group `group`; the results in
    order. `poll(final)` runs every half second while the job runs (progress lines), and
    once more with final=True when it is over."""
    sc = spark.sparkContext
    outcome: dict[str, Any] = {}

    def job() -> None:
        try:
            # A job group is a property of the calling thread: set it where the job runs.
            sc.setJobGroup(group, description)
            outcome["results"] = sc.parallelize(items, len(items)).map(task).collect()
        except BaseException as e:  # handed to the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=job, name=f"{group}-job", daemon=True)
    thread.start()
    while True:
        thread.join(0.5)
        alive = thread.is_alive()
        poll(not alive)
        if not alive:
            break
    if "error" in outcome:
        raise outcome["error"]
    return outcome["results"]
