"""The Elasticsearch backend, run with the official client against an HTTP double of Elasticsearch (no cluster
here)."""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
import time
from importlib.metadata import version

import pytest
from elasticsearch import BadRequestError

from centralrl.config import ElasticsearchConfig, RetrievalConfig
from centralrl.errors import RetrievalError, ServiceUnavailable
from centralrl.io import read_json
from centralrl.retrieval import build_index, open_retriever, save_index
from centralrl.retrieval.elastic import ElasticsearchIndex
from centralrl.schema import Passage
from tests.fake_elasticsearch import FakeElasticsearch

from conftest import REPO, write_params

WORDS = [
    "amber", "basalt", "cobalt", "dune", "ember", "fjord", "glacier", "harbor", "iris", "jasper",
    "kelp", "lagoon", "meadow", "nectar", "onyx", "prairie", "quartz", "reef", "sierra", "tundra",
    "umber", "valley", "willow", "xenon", "yarrow", "zephyr", "acorn", "bramble", "cedar", "delta",
    "estuary", "fern", "granite", "heath", "inlet", "juniper", "knoll", "lichen", "marsh", "nettle",
    "oasis", "pebble", "quarry", "ravine", "sorrel", "thistle", "upland", "vortex", "wharf", "yew",
]  # fmt: skip


def corpus(n: int = 50, tag: str = "") -> list[Passage]:
    """n passages sharing filler words, each with one distinctive word in its title and text."""
    return [
        Passage(
            id=f"p{tag}{i}",
            title=f"The {WORDS[i]} station",
            text=f"A survey of the {WORDS[i]} site near the river, recorded in year {1900 + i} by the field team.",
        )
        for i in range(n)
    ]


def free_port() -> int:
    """A port nothing listens on (bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def no_elastic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ELASTIC_API_KEY", "ELASTIC_USERNAME", "ELASTIC_PASSWORD", "ELASTIC_CA_CERTS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake():
    with FakeElasticsearch() as server:
        yield server


class Sleeps(list):
    """An injectable sleep that records its delays and does not wait."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def make_index(url: str, *, k1: float = 1.2, b: float = 0.75, sleep=None, **es) -> ElasticsearchIndex:
    config = ElasticsearchConfig(url=url, index="test-corpus", **{"max_retries": 2, "backoff_seconds": 0.01, **es})
    return ElasticsearchIndex(config, k1, b, stemming=True, sleep=sleep if sleep is not None else Sleeps())


def test_create_count_and_search_in_one_msearch(fake: FakeElasticsearch) -> None:
    index = make_index(fake.url, bulk_chunk_size=8)
    assert index.create(corpus(), progress=True) == 50
    assert index.count() == 50
    assert len(fake.paths("/_bulk")) == 7  # 50 passages in chunks of 8

    queries = ["glacier station survey", "the vortex site", "juniper", "amber river"]
    before = len(fake.paths("/_msearch"))
    results = index.search(queries, k=3)
    assert len(fake.paths("/_msearch")) == before + 1
    assert [hits[0].id for hits in results] == ["p6", "p47", "p35", "p0"]
    assert [len(hits) for hits in results] == [3, 3, 1, 3]  # filler words match every passage, "juniper" one
    top = results[0][0]
    assert (top.title, top.text) == (corpus()[6].title, corpus()[6].text)
    assert all(h1.score >= h2.score for hits in results for h1, h2 in zip(hits, hits[1:]))
    assert [len(hits) for hits in index.search(["juniper", "the river"], k=1)] == [1, 1]
    assert index.search(["nothing matches zzz"], k=5) == [[]]


def test_missing_looks_passages_up_by_id_in_batches(fake: FakeElasticsearch) -> None:
    config = RetrievalConfig(query_batch_size=2, elasticsearch=ElasticsearchConfig(url=fake.url, index="lookup"))
    index = ElasticsearchIndex.from_config(config, sleep=Sleeps())
    index.create(corpus(5))
    assert index.missing(["p4", "q1", "p0", "q2", "p2"]) == ["q1", "q2"]
    assert len(fake.paths("/_mget")) == 3  # 5 ids, 2 per request


def test_query_batches_preserve_order(fake: FakeElasticsearch) -> None:
    config = RetrievalConfig(query_batch_size=2, elasticsearch=ElasticsearchConfig(url=fake.url, index="batched"))
    index = ElasticsearchIndex.from_config(config, sleep=Sleeps())
    index.create(corpus(), progress=False)
    picks = [44, 3, 17, 29, 8]
    results = index.search([f"{WORDS[i]}" for i in picks], k=2)
    assert [hits[0].id for hits in results] == [f"p{i}" for i in picks]
    assert len(fake.paths("/_msearch")) == 3  # 5 queries in batches of 2


def test_index_created_with_configured_bm25_and_analyzer(fake: FakeElasticsearch) -> None:
    make_index(fake.url, k1=0.9, b=0.4).create(corpus(5), progress=False)
    stored = fake.indices["test-corpus"]
    assert stored.settings["similarity"] == {"default": {"type": "BM25", "k1": 0.9, "b": 0.4}}
    analysis = stored.settings["analysis"]
    assert analysis["analyzer"]["centralrl_bm25"]["filter"] == ["lowercase", "centralrl_stop", "centralrl_stem"]
    assert analysis["filter"]["centralrl_stem"] == {"type": "stemmer", "language": "porter2"}
    assert stored.mappings["properties"]["id"] == {"type": "keyword"}
    assert stored.mappings["properties"]["title"]["copy_to"] == "contents"

    plain = ElasticsearchIndex(ElasticsearchConfig(url=fake.url, index="plain"), 1.2, 0.75, stemming=False)
    plain.create(corpus(5), progress=False)
    analyzer = fake.indices["plain"].settings["analysis"]["analyzer"]["centralrl_bm25"]
    assert analyzer["filter"] == ["lowercase", "centralrl_stop"]  # no stemming


def test_k1_and_b_reach_the_scores(fake: FakeElasticsearch) -> None:
    def top_score(k1: float, b: float) -> float:
        index = make_index(fake.url, k1=k1, b=b)
        index.create(corpus(), progress=False)
        return index.search(["quartz survey"], k=1)[0][0].score

    assert top_score(1.2, 0.75) != pytest.approx(top_score(0.5, 0.1))


def test_recreate_replaces_the_old_index(fake: FakeElasticsearch) -> None:
    index = make_index(fake.url)
    index.create(corpus(50, tag="old"), progress=False)
    assert index.create(corpus(10, tag="new"), progress=False) == 10
    assert index.count() == 10
    assert [hit.id for hit in index.search(["willow"], k=3)[0]] == []  # word 22 lived only in the old index
    assert index.search(["cobalt"], k=1)[0][0].id == "pnew2"


def test_index_directory_opens_only_the_cluster_index_it_was_built_with(fake: FakeElasticsearch, tmp_path) -> None:
    def cfg(index: str = "shared", url: str = fake.url, k1: float = 1.2) -> RetrievalConfig:
        return RetrievalConfig(backend="elasticsearch", k1=k1, elasticsearch=ElasticsearchConfig(url=url, index=index))

    save_index(build_index(corpus(20), cfg()), cfg(), 20, tmp_path / "a")
    manifest = read_json(tmp_path / "a" / "manifest.json")
    assert (manifest["index_uuid"], manifest["passages"]) == (fake.indices["shared"].uuid, 20)
    assert open_retriever(cfg(), tmp_path / "a").search(["amber"], k=1)[0][0].id == "p0"

    with pytest.raises(RetrievalError, match=r"built with \{'index': 'shared'\}, params say \{'index': 'other'\}"):
        open_retriever(cfg(index="other"), tmp_path / "a")
    with pytest.raises(
        RetrievalError, match=rf"built with \{{'url': '{fake.url}'\}}, params say \{{'url': 'http://es:9200'\}}"
    ):
        open_retriever(cfg(url="http://es:9200"), tmp_path / "a")

    build_index(corpus(5, tag="x"), cfg(k1=0.5))  # another experiment rebuilds the same cluster index
    with pytest.raises(RetrievalError, match="cluster index shared at .* was rebuilt or changed since") as caught:
        open_retriever(cfg(), tmp_path / "a")
    assert "'passages': 20}, now {'index_uuid': " in str(caught.value) and "'passages': 5}" in str(caught.value)


@pytest.mark.parametrize(
    ("env", "header"),
    [
        ({"ELASTIC_API_KEY": "a2V5OnNlY3JldA=="}, "ApiKey a2V5OnNlY3JldA=="),
        (
            {"ELASTIC_USERNAME": "elastic", "ELASTIC_PASSWORD": "s3cret"},
            "Basic " + base64.b64encode(b"elastic:s3cret").decode(),
        ),
    ],
)
def test_credentials_come_from_env(
    fake: FakeElasticsearch, monkeypatch: pytest.MonkeyPatch, env: dict, header: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    make_index(fake.url).health()
    assert fake.requests[-1].headers.get("authorization") == header


def test_no_credentials_sends_no_authorization(fake: FakeElasticsearch) -> None:
    make_index(fake.url).health()
    assert "authorization" not in fake.requests[-1].headers


def test_half_set_credentials_or_http_ca_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("ELASTIC_USERNAME", "elastic")
    with pytest.raises(RetrievalError, match="ELASTIC_PASSWORD is not set"):
        make_index("http://127.0.0.1:9")
    monkeypatch.delenv("ELASTIC_USERNAME")
    ca = tmp_path / "ca.pem"
    ca.write_text("not used")
    monkeypatch.setenv("ELASTIC_CA_CERTS", str(ca))
    with pytest.raises(RetrievalError, match="not https"):
        make_index("http://127.0.0.1:9")


def test_unreachable_url_retries_with_backoff_then_names_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    sleeps = Sleeps()
    index = make_index(url, sleep=sleeps, max_retries=3, backoff_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as caught:  # a RetrievalError the flow may retry later
        index.health()
    assert time.monotonic() - started < 5
    assert sleeps == [0.5, 1.0, 2.0]  # max_retries retries, doubling
    message = str(caught.value)
    assert url in message and "after 4 attempts" in message
    assert "retrieval.elasticsearch.url" in message and "ELASTIC_API_KEY" in message


def test_server_coming_up_late_is_reached_by_backoff() -> None:
    port = free_port()
    late = FakeElasticsearch(port=port)
    timer = threading.Timer(0.3, late.start)
    timer.start()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    try:
        index = make_index(late.url, sleep=sleep, max_retries=6, backoff_seconds=0.1)
        assert index.health()["status"] == "green"
        assert sleeps[:2] == [0.1, 0.2] and 2 <= len(sleeps) < 6  # failed at first, then got through
        assert late.paths() == ["GET /_cluster/health"]
    finally:
        timer.join()
        late.stop()


def test_api_errors_are_not_retried(fake: FakeElasticsearch) -> None:
    sleeps = Sleeps()
    index = make_index(fake.url, sleep=sleeps)
    with pytest.raises(
        RetrievalError, match=r"HTTP 404: index_not_found_exception: no such index \[test-corpus\]"
    ) as caught:
        index.count()
    assert not isinstance(caught.value, ServiceUnavailable)
    assert sleeps == []
    assert fake.paths() == ["POST /test-corpus/_count"]


def test_busy_or_unavailable_answers_are_retried(fake: FakeElasticsearch) -> None:
    sleeps = Sleeps()
    index = make_index(fake.url, sleep=sleeps, max_retries=2, backoff_seconds=0.5)
    fake.answer_next = [429, 503]
    assert index.health()["status"] == "green"
    assert sleeps == [0.5, 1.0] and fake.paths() == ["GET /_cluster/health"] * 3
    fake.unavailable = True
    with pytest.raises(ServiceUnavailable, match=r"HTTP 503: cluster_block_exception: .* \(3 attempts\)"):
        index.health()


def test_an_answer_that_is_not_json_is_named_not_a_traceback(fake: FakeElasticsearch) -> None:
    index = make_index(fake.url)
    fake.garbled = True
    with pytest.raises(RetrievalError, match=r"127.0.0.1:\d+: checking cluster health got an answer that is not"):
        index.health()
    assert fake.paths() == ["GET /_cluster/health"]  # not retried: a page in place of the cluster stays there


def test_bulk_items_rejected_as_busy_are_retried(fake: FakeElasticsearch) -> None:
    index = make_index(fake.url, bulk_chunk_size=5, backoff_seconds=0)
    fake.busy_bulks = 2
    assert index.create(corpus(10), progress=False) == 10
    assert index.count() == 10
    assert len(fake.paths("/_bulk")) == 4  # the first chunk sent three times


def test_bulk_item_failure_names_the_passage(fake: FakeElasticsearch) -> None:
    fake.reject_ids["p7"] = "failed to parse field [text]"
    sleeps = Sleeps()
    index = make_index(fake.url, sleep=sleeps, bulk_chunk_size=5)
    reason = r"passage 'p7': document_parsing_exception: failed to parse field \[text\]"
    with pytest.raises(RetrievalError, match=reason) as caught:
        index.create(corpus(), progress=False)
    assert "(9 indexed before stopping)" in str(caught.value)  # chunk 1, and chunk 2 but p7
    assert len(fake.paths("/_bulk")) == 2 and sleeps == []


def test_per_query_msearch_error_names_the_query(fake: FakeElasticsearch) -> None:
    index = make_index(fake.url)
    with pytest.raises(RetrievalError, match=r"query 0 \('amber'\) failed with status 404: index_not_found_exception"):
        index.search(["amber", "onyx"], k=2)


def test_the_double_rejects_unknown_routes(fake: FakeElasticsearch) -> None:
    index = make_index(fake.url)
    with pytest.raises(BadRequestError) as caught:
        index.client.perform_request("GET", "/_nodes/stats")
    assert caught.value.meta.status == 400
    assert "no handler found for uri [/_nodes/stats]" in json.dumps(caught.value.body)


def test_the_index_flow_hashes_no_task_inputs(fake: FakeElasticsearch, prefect_server, tmp_path, capfd) -> None:
    """Prefect's default cache policy hashed every task's inputs: the cluster's retriever cannot be pickled (an
    ERROR and a 30-line traceback in the flow's log), and hashing a big corpus took seconds."""
    from flows.indexing import indexing_flow
    from stages import prepare_data

    es = {"url": fake.url, "index": "flow-corpus", "max_retries": 0}
    params = write_params(tmp_path, {"retrieval": {"backend": "elasticsearch", "elasticsearch": es}})
    data = {name: tmp_path / f"{name}.jsonl" for name in ("train", "test", "corpus")}
    prepare_data.main(
        ["--params", str(params), *[f"--{k}={v}" for k, v in data.items()], f"--metrics={tmp_path}/d.json"]
    )
    index, recall = str(tmp_path / "index"), str(tmp_path / "recall.json")
    metrics = indexing_flow(str(params), str(data["corpus"]), [str(data["test"])], index, recall)
    assert "recall@1" in metrics["test"]["synth-1hop"]
    assert "cache key" not in capfd.readouterr().err


def test_the_index_flow_names_a_cluster_that_is_down_before_reading_the_corpus(prefect_server, tmp_path) -> None:
    """It read the corpus (minutes for wiki-18) and then failed; here the corpus is not even there, and the
    cluster is named, not the missing file."""
    from flows.indexing import indexing_flow

    url = f"http://127.0.0.1:{free_port()}"
    es = {"url": url, "max_retries": 0}
    params = write_params(
        tmp_path,
        {"retrieval": {"backend": "hybrid", "hybrid": {"backends": ["elasticsearch", "dense"]}, "elasticsearch": es}},
    )
    gone = str(tmp_path / "gone.jsonl")
    with pytest.raises(ServiceUnavailable, match=rf"Elasticsearch at {url} unreachable during checking cluster"):
        indexing_flow(str(params), gone, [gone], str(tmp_path / "index"), str(tmp_path / "recall.json"))


def test_the_compose_files_default_to_a_server_the_installed_client_supports() -> None:
    """Elastic's clients work with a server of their own minor version or newer; the compose files defaulted to
    9.0.2 while the client installed was 9.5."""
    client = tuple(int(part) for part in version("elasticsearch").split(".")[:2])
    for path in ("infra/compose.yaml", "infra/elasticsearch/docker-compose.yml", "infra/.env.example"):
        text = (REPO / path).read_text(encoding="utf-8")
        tags = re.findall(r"ES_VERSION(?::-|=)(\d+)\.(\d+)\.\d+", text)
        assert tags, f"{path}: no ES_VERSION default"
        for major, minor in tags:
            assert client <= (int(major), int(minor)), f"{path}: server {major}.{minor} is older than client {client}"
