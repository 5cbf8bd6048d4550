"""pytest plugin of the tests' shared set-up (registered in tests/conftest.py), and the
fixture factories test modules build their own fixtures with.

- ``tiered_topics``: ``tiered_topics(spec, cluster, s3=None) -> TieredTopic``, a topic
  produced, tiered and trimmed as ``spec`` says (tests/helpers/tiered.py). Each spec is
  built once per run, on first use, and shared by every module asking for it: for modules
  that only read the topic and its store.
- ``own_tiered_topics``: the same factory for one module, which may change what it gets
  (stop its S3 server, add to its store, change its ACLs); its topics are deleted after
  the module.
- ``tiered_fixture(spec, ...)`` and ``proxy_fixture(**settings)`` make a module's
  ``tiered`` and ``proxy`` fixtures: ``tiered = tiered_fixture(SPEC)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.proxy import ProxyThread
from tests.helpers.tiered import TieredTopic, TieredTopics, TopicSpec


@pytest.fixture(scope="session")
def tiered_topics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopics]:
    topics = TieredTopics(tmp_path_factory.mktemp, shared=True)
    yield topics
    topics.delete_all()


@pytest.fixture(scope="module")
def own_tiered_topics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopics]:
    topics = TieredTopics(tmp_path_factory.mktemp, shared=False)
    yield topics
    topics.delete_all()


def tiered_fixture(spec: TopicSpec, *, cluster: str = "kafka_cluster", s3: str | None = None,
                   own: bool = False) -> Any:
    """A module fixture named ``tiered``: `spec` built on the fixture named `cluster`, its
    store on the S3 server of the fixture named `s3` (where the spec says S3); `own`: for
    this module alone (``own_tiered_topics``), else shared (``tiered_topics``)."""
    factory = "own_tiered_topics" if own else "tiered_topics"
    needs = [factory, cluster, *([s3] if s3 else [])]

    def tiered(**fixtures: Any) -> TieredTopic:
        return fixtures[factory](spec, fixtures[cluster], s3=fixtures[s3] if s3 else None)

    # pytest reads a fixture's dependencies from its signature: name them.
    tiered.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in needs])
    return pytest.fixture(scope="module", name="tiered")(tiered)


def proxy_fixture(**settings: Any) -> Any:
    """A module fixture named ``proxy``: a proxy in front of the module's ``tiered`` topic
    (its cluster and store), with these settings too."""

    @pytest.fixture(scope="module", name="proxy")
    def proxy(tiered: TieredTopic) -> Iterator[ProxyThread]:
        with tiered.proxy(**settings) as proxy:
            yield proxy

    return proxy
