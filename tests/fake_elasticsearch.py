"""A test double of an outside service, the Elasticsearch REST API; not a double of our own code.

A real HTTP server (stdlib `ThreadingHTTPServer` on 127.0.0.1) that answers the official Python client 9.x
for exactly the subset of endpoints `centralrl.retrieval.elastic` uses:

    PUT /{index}                      create, storing settings and mappings (400 if it exists)
    DELETE /{index}                   delete (404 index_not_found_exception if absent)
    HEAD /{index}                     exists (200 / 404)
    GET /{index}/_settings            the stored settings plus `index.uuid` (a new one each time the index is created)
    PUT|POST [/{index}]/_bulk         NDJSON `index` actions, per-item results; documents become visible on refresh
    POST|GET /{index}/_refresh
    POST|GET /{index}/_count
    POST|GET [/{index}]/_msearch      NDJSON header/body pairs; `match` queries scored with BM25 in Python
    POST|GET /{index}/_mget           `ids` in the body: whether each is a document (realtime: refreshed or not)
    GET /_cluster/health

Anything else answers 400 with an Elasticsearch-shaped error, so a backend that starts calling something new
fails loudly. Every answer carries `X-Elastic-Product: Elasticsearch` (the client refuses a 2xx without it) and
the compatible-with=9 content type the client asks for.

BM25 is Lucene's (idf ln(1 + (N - df + 0.5) / (df + 0.5)), weight tf / (tf + k1 (1 - b + b dl / avgdl))), with k1
and b read from the index's stored `similarity.default` settings. Analysis is lowercase `\\w+` words (no stop
words, no stemming), and a `match` on a field searches that field plus every field whose mapping `copy_to`s it.

Test hooks: `requests` records what arrived (method, path, lower-cased headers, body); `reject_ids` makes bulk
items with those ids fail (standing in for a mapping conflict); `unavailable` answers every request 503;
`answer_next` lists HTTP statuses (429 or 503) the next requests get, one each, instead of an answer;
`busy_bulks` makes the next that many bulk requests reject every item with 429 (a full write queue); `garbled`
answers every request with a body that is not JSON (a proxy's page in the cluster's clothes, a cut-off answer).
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit
from uuid import uuid4

CONTENT_TYPE = "application/vnd.elasticsearch+json;compatible-with=9"
BUILTIN_ANALYZERS = {"standard", "simple", "whitespace", "stop", "keyword", "english"}
KNOWN_SETTINGS = {"number_of_shards", "number_of_replicas", "similarity", "analysis", "refresh_interval"}
SEARCH_BODY_KEYS = {"query", "size", "track_total_hits"}


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens.

    >>> tokenize("Hello, World's 2 cats!")
    ['hello', 'world', 's', '2', 'cats']
    """
    return re.findall(r"\w+", text.lower())


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeIndex:
    settings: dict
    mappings: dict
    docs: dict[str, dict] = field(default_factory=dict)  # searchable (refreshed)
    pending: dict[str, dict] = field(default_factory=dict)  # indexed, visible after the next refresh
    uuid: str = field(default_factory=lambda: uuid4().hex)

    def similarity(self) -> tuple[float, float]:
        settings = self.settings.get("index", self.settings)
        default = settings.get("similarity", {}).get("default", {})
        return float(default.get("k1", 1.2)), float(default.get("b", 0.75))


class EsError(Exception):
    """An Elasticsearch error answer: HTTP status, error type and reason."""

    def __init__(self, status: int, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.kind, self.reason = status, kind, reason

    def body(self) -> dict:
        cause = {"type": self.kind, "reason": self.reason}
        return {"error": {"root_cause": [cause], **cause}, "status": self.status}


def _index_missing(name: str) -> EsError:
    return EsError(404, "index_not_found_exception", f"no such index [{name}]")


def _busy() -> EsError:
    return EsError(429, "es_rejected_execution_exception", "rejected execution of coordinating operation")


def _unavailable() -> EsError:
    return EsError(503, "cluster_block_exception", "blocked by: [SERVICE_UNAVAILABLE/1/state not recovered];")


class FakeElasticsearch:
    """The HTTP double. Use as a context manager, or `start()` / `stop()`; `url` once started."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.indices: dict[str, FakeIndex] = {}
        self.requests: list[RecordedRequest] = []
        self.reject_ids: dict[str, str] = {}
        self.unavailable = False
        self.answer_next: list[int] = []
        self.busy_bulks = 0
        self.garbled = False
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeElasticsearch:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes; without this each costs ~40 ms

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {key.lower(): value for key, value in self.headers.items()}
                status, payload = fake.handle(self.command, self.path, headers, body)
                data = b"" if payload is None else json.dumps(payload).encode()
                data = b"<html>upstream sent an invalid response</html>" if fake.garbled else data
                self.send_response(status)
                self.send_header("X-Elastic-Product", "Elasticsearch")
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeElasticsearch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def paths(self, suffix: str = "") -> list[str]:
        """Methods and paths received so far (query strings dropped), optionally only those ending in `suffix`."""
        return [f"{r.method} {urlsplit(r.path).path}" for r in self.requests if urlsplit(r.path).path.endswith(suffix)]

    # --- routing -----------------------------------------------------------------------------------------------

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict | None]:
        with self._lock:
            self.requests.append(RecordedRequest(method, target, headers, body))
            try:
                if self.unavailable:
                    raise _unavailable()
                if self.answer_next:
                    raise {429: _busy, 503: _unavailable}[self.answer_next.pop(0)]()
                return self._route(method, urlsplit(target).path, body)
            except EsError as error:
                return error.status, (None if method == "HEAD" else error.body())

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, dict | None]:
        parts = [p for p in path.split("/") if p]
        if parts == ["_cluster", "health"] and method == "GET":
            return 200, self._health()
        if len(parts) == 1 and not parts[0].startswith("_"):
            name = parts[0]
            if method == "PUT":
                return 200, self._create(name, json.loads(body or b"{}"))
            if method == "DELETE":
                if self.indices.pop(name, None) is None:
                    raise _index_missing(name)
                return 200, {"acknowledged": True}
            if method == "HEAD":
                return (200 if name in self.indices else 404), None
        if parts and parts[-1] == "_bulk" and len(parts) <= 2 and method in ("PUT", "POST"):
            return 200, self._bulk(parts[0] if len(parts) == 2 else None, body)
        if parts and parts[-1] == "_msearch" and len(parts) <= 2 and method in ("GET", "POST"):
            return 200, self._msearch(parts[0] if len(parts) == 2 else None, body)
        if len(parts) == 2 and parts[1] == "_refresh" and method in ("GET", "POST"):
            index = self._get(parts[0])
            index.docs.update(index.pending)
            index.pending.clear()
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if len(parts) == 2 and parts[1] == "_settings" and method == "GET":
            index = self._get(parts[0])
            settings = {**index.settings.get("index", index.settings), "uuid": index.uuid}
            return 200, {parts[0]: {"settings": {"index": settings}}}
        if len(parts) == 2 and parts[1] == "_count" and method in ("GET", "POST"):
            if body and json.loads(body):
                raise EsError(400, "illegal_argument_exception", "the double supports _count without a body only")
            shards = {"total": 1, "successful": 1, "skipped": 0, "failed": 0}
            return 200, {"count": len(self._get(parts[0]).docs), "_shards": shards}
        if len(parts) == 2 and parts[1] == "_mget" and method in ("GET", "POST"):  # realtime, as Elasticsearch's
            index = self._get(parts[0])
            ids = json.loads(body)["ids"]
            return 200, {
                "docs": [{"_index": parts[0], "_id": i, "found": i in index.docs or i in index.pending} for i in ids]
            }
        raise EsError(400, "illegal_argument_exception", f"no handler found for uri [{path}] and method [{method}]")

    def _get(self, name: str) -> FakeIndex:
        if name not in self.indices:
            raise _index_missing(name)
        return self.indices[name]

    # --- endpoints ---------------------------------------------------------------------------------------------

    def _health(self) -> dict:
        return {
            "cluster_name": "fake",
            "status": "green",
            "timed_out": False,
            "number_of_nodes": 1,
            "number_of_data_nodes": 1,
            "active_primary_shards": len(self.indices),
            "active_shards": len(self.indices),
            "relocating_shards": 0,
            "initializing_shards": 0,
            "unassigned_shards": 0,
        }

    def _create(self, name: str, body: dict) -> dict:
        if name in self.indices:
            raise EsError(400, "resource_already_exists_exception", f"index [{name}] already exists")
        unknown_body = set(body) - {"settings", "mappings"}
        if unknown_body:
            raise EsError(400, "parse_exception", f"unknown key(s) {sorted(unknown_body)} in the create index request")
        settings, mappings = body.get("settings", {}), body.get("mappings", {})
        flat = settings.get("index", settings)
        unknown = set(flat) - KNOWN_SETTINGS
        if unknown:
            raise EsError(400, "illegal_argument_exception", f"unknown setting [index.{sorted(unknown)[0]}]")
        defined = set(flat.get("analysis", {}).get("analyzer", {}))
        for prop, spec in mappings.get("properties", {}).items():
            analyzer = spec.get("analyzer")
            if analyzer is not None and analyzer not in BUILTIN_ANALYZERS | defined:
                reason = f"analyzer [{analyzer}] has not been configured in mappings (field [{prop}])"
                raise EsError(400, "mapper_parsing_exception", reason)
        self.indices[name] = FakeIndex(settings, mappings)
        return {"acknowledged": True, "shards_acknowledged": True, "index": name}

    def _bulk(self, default_index: str | None, body: bytes) -> dict:
        lines = [line for line in body.decode().split("\n") if line.strip()]
        items, errors = [], False
        busy, self.busy_bulks = self.busy_bulks > 0, max(0, self.busy_bulks - 1)
        for header_line, source_line in zip(lines[0::2], lines[1::2]):
            ((op, meta),) = json.loads(header_line).items()
            if op != "index":
                reason = f"the double supports bulk `index` actions only, got [{op}]"
                raise EsError(400, "illegal_argument_exception", reason)
            name, doc_id = meta.get("_index", default_index), meta.get("_id")
            result = {"_index": name, "_id": doc_id}
            index = self.indices.get(name)
            if index is None:
                error = _index_missing(name)
            elif busy:
                error = _busy()
            elif doc_id in self.reject_ids:
                error = EsError(400, "document_parsing_exception", self.reject_ids[doc_id])
            else:
                error = self._strict_fields(index, json.loads(source_line))
            if error is None:
                index.pending[doc_id] = json.loads(source_line)
                result.update({"_version": 1, "result": "created", "status": 201})
            else:
                errors = True
                result.update({"status": error.status, "error": {"type": error.kind, "reason": error.reason}})
            items.append({op: result})
        return {"took": 1, "errors": errors, "items": items}

    @staticmethod
    def _strict_fields(index: FakeIndex, source: dict) -> EsError | None:
        if index.mappings.get("dynamic") in ("strict", "false", False):
            unknown = set(source) - set(index.mappings.get("properties", {}))
            if unknown:
                field_name = sorted(unknown)[0]
                reason = f"mapping set to strict, dynamic introduction of [{field_name}] within [_doc] is not allowed"
                return EsError(400, "strict_dynamic_mapping_exception", reason)
        return None

    def _msearch(self, default_index: str | None, body: bytes) -> dict:
        lines = [line for line in body.decode().split("\n") if line.strip()]
        if len(lines) % 2:
            raise EsError(400, "illegal_argument_exception", "msearch body must be header/body line pairs")
        responses = []
        for header_line, search_line in zip(lines[0::2], lines[1::2]):
            header, search = json.loads(header_line), json.loads(search_line)
            try:
                responses.append(self._search(header.get("index", default_index), search))
            except EsError as error:
                responses.append(error.body())
        return {"took": 1, "responses": responses}

    def _search(self, name: str | None, search: dict) -> dict:
        unknown = set(search) - SEARCH_BODY_KEYS
        if unknown:
            raise EsError(400, "parsing_exception", f"Unknown key for a START_OBJECT in [{sorted(unknown)[0]}].")
        if name is None:
            raise EsError(400, "action_request_validation_exception", "Validation Failed: 1: no index given;")
        index = self._get(name)
        query = search.get("query", {})
        if list(query) != ["match"] or len(query["match"]) != 1:
            reason = f"the double supports a single-field `match` query only, got {json.dumps(query)}"
            raise EsError(400, "parsing_exception", reason)
        ((field_name, spec),) = query["match"].items()
        text = spec["query"] if isinstance(spec, dict) else spec
        size = int(search.get("size", 10))
        scored = self._bm25(index, field_name, tokenize(str(text)))
        top = sorted(scored, key=lambda pair: -pair[1])[:size]  # stable: ties keep index order, as Lucene's doc ids
        hits = [
            {"_index": name, "_id": doc_id, "_score": score, "_source": index.docs[doc_id]} for doc_id, score in top
        ]
        return {
            "took": 1,
            "timed_out": False,
            "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
            "hits": {
                "total": {"value": len(scored), "relation": "eq"},
                "max_score": top[0][1] if top else None,
                "hits": hits,
            },
            "status": 200,
        }

    @staticmethod
    def _field_tokens(index: FakeIndex, field_name: str, doc: dict) -> list[str]:
        properties = index.mappings.get("properties", {})
        sources = [name for name, spec in properties.items() if field_name in _as_list(spec.get("copy_to"))]
        values = [doc.get(name) for name in [*sources, field_name]]
        return [token for value in values if isinstance(value, str) for token in tokenize(value)]

    def _bm25(self, index: FakeIndex, field_name: str, terms: list[str]) -> list[tuple[str, float]]:
        k1, b = index.similarity()
        docs = {doc_id: self._field_tokens(index, field_name, doc) for doc_id, doc in index.docs.items()}
        docs = {doc_id: tokens for doc_id, tokens in docs.items() if tokens}
        if not docs or not terms:
            return []
        avgdl = sum(len(tokens) for tokens in docs.values()) / len(docs)
        counts = {doc_id: Counter(tokens) for doc_id, tokens in docs.items()}
        df = Counter(term for counter in counts.values() for term in counter)
        scored = []
        for doc_id, counter in counts.items():
            norm = k1 * (1 - b + b * len(docs[doc_id]) / avgdl)
            score = 0.0
            for term in terms:  # a repeated query term counts again, as the SHOULD clauses of a match query
                tf = counter.get(term, 0)
                if tf:
                    idf = math.log(1 + (len(docs) - df[term] + 0.5) / (df[term] + 0.5))
                    score += idf * tf / (tf + norm)
            if score > 0:
                scored.append((doc_id, score))
        return scored


def _as_list(value: object) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]
