"""Elasticsearch BM25 backend: index the corpus into a cluster and answer batches of queries with one `_msearch`.

`ElasticsearchIndex.create(passages)` (re)creates the index and bulk-loads it; `search(queries, k)` implements
the `Retriever` protocol. It is the scale-out twin of the in-process bm25s backend (wiki-18 has 21M passages).

How it matches bm25s:
- Same BM25 parameters: the index's default similarity is `{"type": "BM25", "k1": k1, "b": b}` with k1 and b
  from `retrieval.k1` / `retrieval.b`. Lucene and bm25s (method "lucene") share the idf
  ln(1 + (N - df + 0.5) / (df + 0.5)) and the term weight tf / (tf + k1 * (1 - b + b * dl / avgdl)).
- One document per passage over title and text together: title and text are `copy_to` a `contents` field and
  the query is a `match` on `contents`, so a passage has one length and one term-frequency vector, as the
  bm25s side scores one "title text" string. (A multi_match over the two fields would score each field with
  its own length norm and add or max them: a different ranking.) title and text stay indexed on their own too.
- One shard (`number_of_shards: 1`), so df and avgdl are corpus-wide as in bm25s, not per shard. No replicas
  (`number_of_replicas: 0`), so a single-node cluster is green; add replicas on a real multi-node cluster.
- Analyzer: a custom one built to match bm25s: standard tokenizer, lowercase, the 33 Lucene English stop words
  (the list bm25s uses) and, with `stemming`, the `porter2` stemmer (Snowball English, as PyStemmer). What still
  differs: bm25s keeps only `\\w\\w+` tokens (one-character tokens dropped, ES keeps them) and Lucene stores
  document lengths lossily (one byte). Scores therefore
  agree closely, not to the last digit, and rankings can differ on near ties.

Retries: connection failures (refused, reset, DNS, timeout) and the answers of a busy or restarting cluster
(HTTP 429, 502, 503, 504) are retried, `max_retries` times with `backoff_seconds` doubling; other API errors (a
bad request, a missing index), TLS errors and answers that are not JSON are not, since retrying cannot fix
them. The client's own retries are off. Bulk items rejected with 429 (es_rejected_execution_exception: the write
queue is full) are retried, only those items, by the client's bulk helper with the same `max_retries` and
backoff (its sleep, not the injectable one), which also retries a bulk request refused whole with 429 before this
layer does. Exhausted retries raise `ServiceUnavailable` (a `RetrievalError` a caller may retry later);
everything else raises `RetrievalError`. Bulk chunks are retried whole, which is safe because every action
indexes by explicit `_id`.

Credentials come from the environment only (ELASTIC_API_KEY, or ELASTIC_USERNAME and ELASTIC_PASSWORD;
ELASTIC_CA_CERTS for a private CA), never from params.

How far this was tested without a real cluster (what the tests' HTTP double checks and what it does not):
docs/verification.md.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any, TypeVar

from elastic_transport import ConnectionError as TransportConnectionError
from elastic_transport import ConnectionTimeout, SerializationError, TlsError
from elasticsearch import ApiError, Elasticsearch
from elasticsearch.helpers import streaming_bulk
from tqdm import tqdm

from centralrl.config import ElasticsearchConfig, RetrievalConfig
from centralrl.errors import RetrievalError, ServiceUnavailable
from centralrl.retrieval.base import Hit, passage_line
from centralrl.schema import Passage

T = TypeVar("T")

RETRY_STATUSES = (429, 502, 503, 504)  # too many requests, bad gateway, unavailable, gateway timeout: try again

ANALYZER = "centralrl_bm25"
SEARCH_FIELD = "contents"
HOW_TO_CONNECT = (
    "Start a cluster (infra/elasticsearch/README.md) or set retrieval.elasticsearch.url in params.yaml to a "
    "running one; credentials come from the environment: ELASTIC_API_KEY, or ELASTIC_USERNAME and "
    "ELASTIC_PASSWORD (ELASTIC_CA_CERTS for a private CA)."
)


def index_settings(k1: float, b: float, stemming: bool) -> dict:
    """Index settings: BM25 with the given k1/b as the default similarity and the analyzer matching bm25s.

    >>> index_settings(1.2, 0.75, stemming=True)["analysis"]["analyzer"]["centralrl_bm25"]
    {'type': 'custom', 'tokenizer': 'standard', 'filter': ['lowercase', 'centralrl_stop', 'centralrl_stem']}
    """
    filters = ["lowercase", "centralrl_stop"] + (["centralrl_stem"] if stemming else [])
    return {
        "number_of_shards": 1,
        "number_of_replicas": 0,
        "similarity": {"default": {"type": "BM25", "k1": k1, "b": b}},
        "analysis": {
            "filter": {
                "centralrl_stop": {"type": "stop", "stopwords": "_english_"},
                "centralrl_stem": {"type": "stemmer", "language": "porter2"},  # Snowball English, as PyStemmer
            },
            "analyzer": {ANALYZER: {"type": "custom", "tokenizer": "standard", "filter": filters}},
        },
    }


def index_mappings() -> dict:
    """Mappings: id keyword; title and text copied into one `contents` field that queries match against."""
    text = {"type": "text", "analyzer": ANALYZER}
    return {
        "dynamic": "strict",
        "properties": {
            "id": {"type": "keyword"},
            "title": {**text, "copy_to": SEARCH_FIELD},
            "text": {**text, "copy_to": SEARCH_FIELD},
            SEARCH_FIELD: text,
        },
    }


def client_auth_from_env(url: str, environ: Mapping[str, str] | None = None) -> dict:
    """Client keyword arguments for credentials and CA, read from the environment only.

    >>> client_auth_from_env("http://localhost:9200", {"ELASTIC_API_KEY": "abc"})
    {'api_key': 'abc'}
    >>> client_auth_from_env("http://localhost:9200", {})
    {}
    """
    env = os.environ if environ is None else environ
    kwargs: dict[str, Any] = {}
    user, password = env.get("ELASTIC_USERNAME"), env.get("ELASTIC_PASSWORD")
    if env.get("ELASTIC_API_KEY"):
        kwargs["api_key"] = env["ELASTIC_API_KEY"]  # an API key wins over username/password when both are set
    elif user or password:
        if not (user and password):
            missing = "ELASTIC_PASSWORD" if user else "ELASTIC_USERNAME"
            raise RetrievalError(
                f"Elasticsearch credentials: {missing} is not set; set both ELASTIC_USERNAME and ELASTIC_PASSWORD, "
                "or ELASTIC_API_KEY"
            )
        kwargs["basic_auth"] = (user, password)
    ca_certs = env.get("ELASTIC_CA_CERTS")
    if ca_certs:
        if not url.startswith("https://"):
            raise RetrievalError(
                f"ELASTIC_CA_CERTS is set but retrieval.elasticsearch.url {url} is not https; use an https:// url "
                "or unset it"
            )
        if not Path(ca_certs).is_file():
            raise RetrievalError(f"ELASTIC_CA_CERTS: no such file {ca_certs}")
        kwargs["ca_certs"] = ca_certs
    return kwargs


def _reason(error: ApiError) -> str:
    """`type: reason` of an Elasticsearch error body, or the client's message when the body has no reason."""
    body = error.body if isinstance(error.body, dict) else {}
    detail = body.get("error")
    if isinstance(detail, dict):
        return f"{detail.get('type', 'error')}: {detail.get('reason', '')}"
    return str(detail or error.message)


def _item_reason(item: dict) -> str:
    detail = item.get("error")
    if isinstance(detail, dict):
        return f"{detail.get('type', 'error')}: {detail.get('reason', '')}"
    return f"status {item.get('status')}: {detail}"


class ElasticsearchIndex:
    """One Elasticsearch index of passages, scored with BM25(k1, b); a `Retriever`.

    `sleep` is the backoff's sleep (injectable so tests need not wait). The client is created here but connects
    lazily, on the first call.
    """

    def __init__(
        self,
        config: ElasticsearchConfig,
        k1: float,
        b: float,
        stemming: bool,
        *,
        query_batch_size: int = 256,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if query_batch_size < 1:
            raise ValueError(f"query_batch_size must be >= 1, got {query_batch_size}")
        self.config = config
        self.k1, self.b, self.stemming = k1, b, stemming
        self.query_batch_size = query_batch_size
        self._sleep = sleep
        self.corpus_sha256: str | None = None  # set by `create`
        tls = {"verify_certs": config.verify_certs} if config.url.startswith("https://") else {}
        self.client = Elasticsearch(
            config.url,
            request_timeout=config.request_timeout,
            max_retries=0,
            retry_on_timeout=False,
            **tls,
            **client_auth_from_env(config.url),
        )

    @classmethod
    def from_config(
        cls, retrieval: RetrievalConfig, *, sleep: Callable[[float], None] = time.sleep
    ) -> ElasticsearchIndex:
        """The index described by the `retrieval` section of params."""
        return cls(
            retrieval.elasticsearch,
            retrieval.k1,
            retrieval.b,
            retrieval.stemming,
            query_batch_size=retrieval.query_batch_size,
            sleep=sleep,
        )

    @property
    def index(self) -> str:
        return self.config.index

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ElasticsearchIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one request (or one idempotent group of requests), retrying connection failures and busy or
        unavailable answers (RETRY_STATUSES) with backoff."""
        url, attempts = self.config.url, self.config.max_retries + 1
        for attempt in range(attempts):
            try:
                return fn()
            except TlsError as error:
                raise RetrievalError(
                    f"Elasticsearch at {url}: TLS failed during {what}: {error}. Check the https url, "
                    "ELASTIC_CA_CERTS and retrieval.elasticsearch.verify_certs"
                ) from error
            except SerializationError as error:  # a proxy's page, a cut-off body: not the cluster's JSON
                raise RetrievalError(
                    f"Elasticsearch at {url}: {what} got an answer that is not Elasticsearch's JSON "
                    f"({str(error)[:300]}); check that retrieval.elasticsearch.url is the cluster's address and "
                    "nothing in between answers for it"
                ) from error
            except (TransportConnectionError, ConnectionTimeout) as error:
                if attempt + 1 == attempts:
                    raise ServiceUnavailable(
                        f"Elasticsearch at {url} unreachable during {what} after {attempts} attempts ({error}). "
                        f"{HOW_TO_CONNECT}"
                    ) from error
            except ApiError as error:
                failed = f"Elasticsearch at {url}: {what} failed with HTTP {error.meta.status}: {_reason(error)}"
                if error.meta.status not in RETRY_STATUSES:
                    raise RetrievalError(failed) from error
                if attempt + 1 == attempts:
                    raise ServiceUnavailable(f"{failed} ({attempts} attempts); try again later") from error
            self._sleep(self.config.backoff_seconds * 2**attempt)
        raise AssertionError("unreachable")  # the loop returns or raises

    def create(self, passages: Iterable[Passage], progress: bool = True) -> int:
        """Drop and recreate the index, bulk-index `passages` by id, refresh; return how many were indexed.
        `corpus_sha256` is then the digest of the passages sent (centralrl.retrieval.base.corpus_sha256).

        Raises RetrievalError naming the first failed passage id and its reason if any item fails; chunks
        before it stay indexed.
        """

        def reset() -> None:
            self.client.options(ignore_status=404).indices.delete(index=self.index)
            self.client.indices.create(
                index=self.index, settings=index_settings(self.k1, self.b, self.stemming), mappings=index_mappings()
            )

        self._call(f"recreating index {self.index}", reset)
        total = len(passages) if isinstance(passages, Sized) else None
        digest = hashlib.sha256()
        indexed = 0
        chunk_size = self.config.bulk_chunk_size
        stream = iter(passages)
        with tqdm(total=total, desc=f"indexing into {self.index}", unit="passage", disable=not progress) as bar:
            while chunk := list(itertools.islice(stream, chunk_size)):
                digest.update(b"".join(passage_line(p) for p in chunk))
                results = self._call(f"bulk indexing into {self.index}", lambda chunk=chunk: self._bulk(chunk))
                failed = [item for ok, item in results if not ok]
                indexed += len(results) - len(failed)
                bar.update(len(chunk))
                if failed:
                    item = next(iter(failed[0].values()))
                    raise RetrievalError(
                        f"bulk indexing into {self.index}: {len(failed)} of {len(chunk)} passages in a chunk failed; "
                        f"first: passage {item.get('_id')!r}: {_item_reason(item)} ({indexed} indexed before stopping)"
                    )
        self._call(f"refreshing {self.index}", lambda: self.client.indices.refresh(index=self.index))
        self.corpus_sha256 = digest.hexdigest()
        return indexed

    def _bulk(self, chunk: list[Passage]) -> list[tuple[bool, dict]]:
        actions = ({"_op_type": "index", "_id": p.id, "_source": p.to_json()} for p in chunk)
        return list(
            streaming_bulk(
                self.client,
                actions,
                chunk_size=len(chunk),
                index=self.index,
                raise_on_error=False,  # collect failed items and name the first one
                raise_on_exception=True,  # connection errors reach the retry in `_call`
                max_retries=self.config.max_retries,  # items rejected with 429 (a full write queue)
                initial_backoff=self.config.backoff_seconds,
            )
        )

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """For each query in order, up to `k` hits by descending BM25 score; one `_msearch` per query batch."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        hits: list[list[Hit]] = []
        for start in range(0, len(queries), self.query_batch_size):
            batch = queries[start : start + self.query_batch_size]
            searches: list[dict] = []
            for query in batch:
                searches += [{}, {"query": {"match": {SEARCH_FIELD: query}}, "size": k, "track_total_hits": False}]
            response = self._call(
                f"searching {self.index}",
                lambda searches=searches: self.client.msearch(index=self.index, searches=searches),
            )
            answers = response["responses"]
            if len(answers) != len(batch):
                raise RetrievalError(
                    f"msearch on {self.index}: {len(batch)} queries sent, {len(answers)} answers received"
                )
            for offset, answer in enumerate(answers):
                if "error" in answer:
                    raise RetrievalError(
                        f"msearch on {self.index}: query {start + offset} ({batch[offset]!r}) failed with status "
                        f"{answer.get('status')}: {_item_reason(answer)}"
                    )
                hits.append(
                    [
                        Hit(
                            id=h["_id"],
                            title=h["_source"]["title"],
                            text=h["_source"]["text"],
                            score=float(h["_score"]),
                        )
                        for h in answer["hits"]["hits"]
                    ]
                )
        return hits

    def missing(self, ids: Sequence[str]) -> list[str]:
        """Those of `ids` that are no document of the index, in order: one `_mget` (no sources) per query batch."""
        found: set[str] = set()
        for start in range(0, len(ids), self.query_batch_size):
            batch = list(ids[start : start + self.query_batch_size])
            answer = self._call(
                f"looking up passages in {self.index}",
                lambda batch=batch: self.client.mget(index=self.index, ids=batch, source=False),
            )
            found |= {doc["_id"] for doc in answer["docs"] if doc.get("found")}
        return [i for i in ids if i not in found]

    def uuid(self) -> str:
        """The cluster's id of the index (`settings.index.uuid`), new each time the index is created; an alias's
        indices' ids, space-separated."""
        answer = self._call(
            f"reading the settings of {self.index}", lambda: self.client.indices.get_settings(index=self.index)
        )
        return " ".join(sorted(index["settings"]["index"]["uuid"] for index in answer.body.values()))

    def count(self) -> int:
        """Passages searchable in the index now."""
        return int(self._call(f"counting {self.index}", lambda: self.client.count(index=self.index))["count"])

    def health(self) -> dict:
        """The cluster's `_cluster/health` answer (status green / yellow / red, node and shard counts)."""
        return dict(self._call("checking cluster health", lambda: self.client.cluster.health()).body)
