"""Shared fixtures. Tests are a package (tests/__init__.py) so that functions defined in
test modules can be shipped to worker processes by reference (they import them)."""

from __future__ import annotations

import collections
import os

import pytest

from abs_engine.testing import write_zipf_corpus

# The S3 test server's dummy credentials, set before anything starts: a Spark session's JVM
# (and the workers the Spark executor launches from it) keeps the environment it started
# with, so setting them only when the server starts left workers without them whenever
# Spark had started first, and the server then stored their uploads 50 bytes longer than
# sent (verification refused those checkpoints; the job restarted from scratch).
S3_TEST_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
for _k, _v in S3_TEST_ENV.items():
    os.environ.setdefault(_k, _v)


@pytest.fixture(scope="session")
def mypy_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One mypy cache for the session's type checks (fresh: nothing stale from another
    tree): the second check reuses the package's analysis instead of redoing it."""
    return str(tmp_path_factory.mktemp("mypy-cache"))


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def small_corpus(corpus_dir: str) -> str:
    """200k words, 2k-word vocabulary."""
    return write_zipf_corpus(os.path.join(corpus_dir, "small.txt"), 200_000, vocabulary=2_000, seed=1)


@pytest.fixture(scope="session")
def medium_corpus(corpus_dir: str) -> str:
    """2M words, 10k-word vocabulary: long enough (about a second) to kill workers mid-run."""
    return write_zipf_corpus(os.path.join(corpus_dir, "medium.txt"), 2_000_000, vocabulary=10_000, seed=2)


def batch_word_count(path: str) -> collections.Counter[str]:
    """The exact oracle for word count: a plain single-process batch computation."""
    c: collections.Counter[str] = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            c.update(line.split())
    return c


@pytest.fixture(scope="session")
def spark():
    """One quiet local SparkSession for the whole test run (start-up is paid once)."""
    from abs_engine.spark_session import embedded_session, stop_embedded

    session = embedded_session()
    yield session
    stop_embedded()


@pytest.fixture(scope="session")
def text_dir(corpus_dir: str) -> str:
    """A directory of 6 text files (a multi-file input), 600k words in all."""
    d = os.path.join(corpus_dir, "multi")
    os.makedirs(d, exist_ok=True)
    for i in range(6):
        write_zipf_corpus(os.path.join(d, f"part-{i}.txt"), 100_000, vocabulary=3_000, seed=100 + i)
    return d


def batch_word_count_dir(path: str) -> collections.Counter[str]:
    c: collections.Counter[str] = collections.Counter()
    for name in sorted(os.listdir(path)):
        c.update(batch_word_count(os.path.join(path, name)))
    return c


@pytest.fixture(scope="session")
def s3_server() -> object:
    """A real S3-compatible server (moto's, over HTTP on loopback) for the whole run, with
    one bucket; yields ``uri(prefix)`` -> an ``s3://`` URI that reaches it. Credentials
    are dummies in the environment (worker processes inherit them)."""
    from moto.server import ThreadedMotoServer
    from pyarrow import fs as pafs

    for k, v in S3_TEST_ENV.items():
        os.environ.setdefault(k, v)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"{host}:{port}"
    pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1",
                      allow_bucket_creation=True).create_dir("abs-test")

    def uri(prefix: str) -> str:
        return f"s3://abs-test/{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"

    yield uri
    server.stop()


#: For a test that tests/examples/test_netns_cluster.py covers and goes beyond (a real
#: multi-host standalone cluster, S3 checkpoints, executors and whole hosts SIGKILLed):
#: skipped where that test is required to run (ABS_ENGINE_REQUIRE_CLUSTER, which CI sets:
#: there it fails rather than skips), so the suite does not pay twice; run everywhere else.
covered_by_the_cluster_test = pytest.mark.skipif(
    bool(os.environ.get("ABS_ENGINE_REQUIRE_CLUSTER")),
    reason="tests/examples/test_netns_cluster.py covers this on a multi-host cluster (ABS_ENGINE_REQUIRE_CLUSTER)")


def _races_its_kills(item: pytest.Item) -> bool:
    """A chaos test whose kills are not held for: KillOnCheckpoints without ``open_gate``
    (its job must still run when the n-th checkpoint completes, which depends on the
    machine's pace). Such a test runs alone (marker ``serial``), not beside another."""
    import inspect

    fn = getattr(item, "function", None)
    try:
        source = inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):
        return False
    holds = ("open_gate", "GatedSource(", "stop(postgres")  # held by a gate, or until the test ends it
    return "KillOnCheckpoints(" in source and not any(h in source for h in holds)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _races_its_kills(item):
            item.add_marker(pytest.mark.serial)
