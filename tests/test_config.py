"""The typed config: defaults load, every profile validates, bad params are named by dotted path."""

import shutil

import pytest
import yaml

from centralrl.config import Config, deep_merge, load_config
from centralrl.errors import ConfigError

from conftest import REPO, write_params


def test_params_yaml_is_the_schema_default():
    """params.yaml spells out the defaults: a new field must appear in both or neither."""
    assert load_config(REPO / "params.yaml") == Config()


@pytest.mark.parametrize("profile", sorted(p.stem for p in (REPO / "profiles").glob("*.yaml")))
def test_every_profile_validates(profile, tmp_path):
    cfg = load_config(write_params(tmp_path, profile=profile))
    assert cfg.profile == profile


@pytest.mark.parametrize("profile", ["paper-1.5b", "paper-3b"])
def test_paper_profiles_evaluate_their_bf16_backbone_itself(profile, tmp_path):
    """They inherited eval_precision float32, so greedy evaluation built float32 copies of the bf16 backbone and of
    every merged adapter (tens of GB on the 3B joint arm); auto is bf16 on their GPU, the backbone's own dtype."""
    cfg = load_config(write_params(tmp_path, profile=profile))
    assert cfg.models["main"].dtype == "bfloat16" and cfg.harness.eval_precision == "auto"


def test_profile_overlays_params(tmp_path):
    cfg = load_config(write_params(tmp_path, {"data": {"synthetic": {"seed": 99}}}, profile="smoke"))
    assert cfg.data.synthetic.seed == 99  # from the override
    assert cfg.data.synthetic.n_people == 24  # from profiles/smoke.yaml
    assert cfg.data.synthetic.distractor_sentences == 2  # from params.yaml


def test_unknown_key_is_named_by_dotted_path(tmp_path):
    params = write_params(tmp_path, {"retrieval": {"elasticsearch": {"urll": "http://x"}}})
    with pytest.raises(ConfigError, match=r"retrieval\.elasticsearch\.urll: unknown param"):
        load_config(params)


def test_unknown_key_inside_a_list_item(tmp_path):
    params = write_params(tmp_path, {"data": {"questions": [{"kind": "synthetic", "benchmrk": "x"}]}})
    with pytest.raises(ConfigError, match=r"data\.questions\.0\.benchmrk: unknown param"):
        load_config(params)


def test_mistyped_value_names_path_and_value(tmp_path):
    params = write_params(tmp_path, {"data": {"synthetic": {"distractor_sentences": "many"}}})
    with pytest.raises(ConfigError, match=r"data\.synthetic\.distractor_sentences: .*integer.*'many'"):
        load_config(params)


def test_a_bad_param_is_named_in_the_file_it_came_from(tmp_path):
    """A typo in profiles/smoke.yaml was reported as one in params.yaml."""
    params = write_params(tmp_path)
    profile = tmp_path / "profiles" / "smoke.yaml"
    profile.write_text(profile.read_text() + "lora: {r: 0}\n")
    with pytest.raises(ConfigError) as error:
        load_config(params)
    assert str(error.value) == (
        f"invalid params in {profile} (profile smoke):\n  lora.r: Input should be greater than or equal to 1 (got 0)"
    )
    raw = yaml.safe_load(params.read_text())
    params.write_text(yaml.safe_dump(raw | {"evaluate": {"chunk_sise": 8}}))
    with pytest.raises(ConfigError) as error:
        load_config(params, {"threads": 0})
    assert str(error.value).splitlines() == [
        f"invalid params in {params}, {profile} and the values set on the command line (profile smoke):",
        f"  lora.r: Input should be greater than or equal to 1 (got 0) (in {profile})",
        f"  evaluate.chunk_sise: unknown param (not in the config schema; check its spelling and section) "
        f"(in {params})",
        "  threads: must be auto or a whole number of threads from 1 (got 0) (in the values set on the command line)",
    ]


@pytest.mark.parametrize("threads", [0, "two", True])
def test_threads_is_auto_or_a_positive_count_in_one_message(tmp_path, threads):
    with pytest.raises(ConfigError, match=r"invalid params.*:\n  threads: must be auto or a whole number") as error:
        load_config(write_params(tmp_path, {"threads": threads}))
    assert str(error.value).count("\n") == 1  # was: one line per union member, named literal['auto'], constrained-int


def test_invariants_explain_what_is_allowed(tmp_path):
    params = write_params(tmp_path, {"retrieval": {"b": 1.5}, "data": {"questions": [{"kind": "popqa", "path": "x"}]}})
    with pytest.raises(ConfigError) as error:
        load_config(params)
    message = str(error.value)
    assert "retrieval.b: Input should be less than or equal to 1" in message
    assert "data.questions.0: a popqa source needs benchmark, split" in message


def test_unknown_profile_lists_the_known_ones(tmp_path):
    params = write_params(tmp_path, profile="nosuch")
    with pytest.raises(ConfigError, match=r"no profile 'nosuch'.*known: default, paper-1.5b, paper-3b, realqa, smoke"):
        load_config(params)


def test_a_profile_given_as_the_params_file_is_said_to_be_one(tmp_path):
    """It read 'no profile 'default' (profiles/profiles/default.yaml not found); known: none'."""
    write_params(tmp_path)
    with pytest.raises(ConfigError, match=r"smoke.yaml looks like a profile, not a params file: .*profile: smoke"):
        load_config(tmp_path / "profiles" / "smoke.yaml")


@pytest.mark.parametrize("profile", ["../params", "/etc/x", "a b", True])  # True: YAML's `profile: yes`
def test_a_profile_that_is_no_file_name_of_profiles_is_refused(tmp_path, profile):
    """'../params' read params.yaml itself as the overlay, refused only by accident of its keys."""
    params = write_params(tmp_path)
    with pytest.raises(ConfigError, match="is not a profile name"):
        load_config(params, {"profile": profile})


def test_profile_file_may_not_switch_profile(tmp_path):
    params = write_params(tmp_path)
    (tmp_path / "profiles" / "smoke.yaml").write_text(yaml.safe_dump({"profile": "default"}))
    with pytest.raises(ConfigError, match="must not set 'profile'"):
        load_config(params)


def test_config_is_frozen():
    cfg = Config()
    with pytest.raises(Exception, match="frozen"):
        cfg.seed = 3


def test_deep_merge_replaces_lists_and_merges_mappings():
    merged = deep_merge({"a": {"b": 1, "c": [1, 2]}}, {"a": {"c": [3]}})
    assert merged == {"a": {"b": 1, "c": [3]}}


def test_a_profile_may_not_set_a_matrix_axis(tmp_path):
    """dvc.yaml expands the matrix from params.yaml alone: a seed list in a profile would be silently ignored."""
    params = write_params(tmp_path)
    (tmp_path / "profiles" / "smoke.yaml").write_text(yaml.safe_dump({"seeds": [0, 1, 2]}))
    with pytest.raises(ConfigError, match=r"smoke.yaml: sets seeds, an axis of the DVC matrix.*params.yaml alone"):
        load_config(params)


@pytest.mark.parametrize(
    ("axes", "hint"),
    [
        ({"arms": {"solo": {"topology": "single_agent"}}}, "(move its arms: mapping into params.yaml)"),
        ({"references": {"base": {"topology": "central"}}, "seeds": [4]}, "(move its references: mapping into params"),
    ],
)
def test_a_profile_setting_a_matrix_axis_is_told_how_to_set_that_axis(tmp_path, axes, hint):
    """The hint always read -S 'seeds=[0,1,2]', also for a profile that set arms or references (for which -S,
    Hydra's override, takes no new key and replaces no whole mapping)."""
    params = write_params(tmp_path)
    (tmp_path / "profiles" / "smoke.yaml").write_text(yaml.safe_dump(axes))
    with pytest.raises(ConfigError) as error:
        load_config(params)
    assert hint in str(error.value) and ("seeds" in axes) == ("dvc exp run -S 'seeds=[4]'" in str(error.value))


def test_a_backbone_only_a_profile_defines_is_refused(tmp_path):
    """The plan listed prepare_model@large and the rest, and `dvc repro` refused each: dvc.yaml tracks
    models.<backbone> of params.yaml ("Parameters 'models.large' are missing from 'params.yaml'")."""
    params = write_params(tmp_path, {"backbones": ["main", "large"]})
    (tmp_path / "profiles" / "smoke.yaml").write_text("models:\n  large: {source: tiny_qwen2, dtype: bfloat16}\n")
    with pytest.raises(ConfigError, match=r"smoke\.yaml: defines models\.large, a backbone of `backbones`, which "):
        load_config(params)
    raw = yaml.safe_load(params.read_text())
    raw["models"]["large"] = {"source": "tiny_qwen2"}
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert load_config(params).models["large"].dtype == "bfloat16"  # defined there, the profile may change it


def test_budget_sets_exactly_one_limit(tmp_path):
    params = write_params(tmp_path, {"budgets": {"both": {"steps": 2, "flops": 1.0e9}}})
    with pytest.raises(
        ConfigError, match=r"budgets\.both: a budget sets exactly one of steps, trained_tokens, flops, wall_seconds"
    ):
        load_config(params)


def test_claim_must_name_two_arms(tmp_path):
    params = write_params(tmp_path, {"claim": ["central_only", "jiont"]})
    with pytest.raises(
        ConfigError, match=r"\n  claim: \[.jiont.\] are not entries of arms \(known: central_only, joint\)"
    ) as error:
        load_config(params)
    assert "seeds" not in str(error.value)  # a rule across the whole params names its fields, not every param
    with pytest.raises(ConfigError, match=r"are not entries of arms \(known: none, arms is empty\)"):
        load_config(params, {"arms": {}})  # was "(known: )"


A_FILE = {"path": "x.jsonl", "benchmark": "b", "split": "test"}  # a question file's fields


@pytest.mark.parametrize(
    "override, named",
    [
        ({"harness": {"temperature": float("inf")}}, r"harness\.temperature: Input should be a finite number"),
        ({"seeds": [-1]}, r"seeds\.0: Input should be greater than or equal to 0"),  # a stage name "train@a--1-main"
        ({"compare": {"seed": -1}}, r"compare\.seed: Input should be greater than or equal to 0"),  # numpy refuses it
        ({"compare": {"permutations": 2**40}}, r"compare\.permutations: Input should be less than or equal"),
        ({"tracking": {"experiment": ""}}, r"tracking\.experiment: String should have at least 1 character"),
        ({"tracking": {"uri": "mlflow.db"}}, r"tracking\.uri: a file store .* which MLflow 3 refuses"),
        ({"lora": {"target_modules": []}}, r"lora\.target_modules: List should have at least 1 item"),
        (
            {"data": {"questions": [{"kind": "synthetic", "limit": 10**20}]}},
            r"data\.questions\.0\.limit: Input should",
        ),
        ({"seeds": [2**64]}, r"seeds\.0: Input should be less than or equal to"),  # torch.manual_seed's traceback
        ({"warmstart": {"seed": 2**64}}, r"warmstart\.seed: Input should be less than or equal to"),
        (  # counted twice by the size check, written once: steps drew fewer questions than asked, in silence
            {"data": {"synthetic": {"question_types": ["1hop", "2hop", "1hop"]}}},
            r"data\.synthetic\.question_types: 1hop listed more than once",
        ),
        (  # a synthetic world of no questions: accepted beside a training file without a limit
            {"data": {"synthetic": {"question_types": []}}},
            r"data\.synthetic\.question_types: List should have at least 1 item",
        ),
        ({"arms": {"joint": {"trainable_roles": ["central", "central"]}}}, r"trainable_roles: central listed more"),
        # a rule across sections was reported at '<top level>'
        (
            {"budgets": {"cut": {"steps": 80}}},
            r"\n  across sections: budgets \{'cut': 80\} \(steps\) exceed train\.grpo",
        ),
        # these three were reported at '<top level>', without the value
        ({"seeds": [0, 1, 0]}, r"\n  seeds: 0 listed more than once \(got \[0, 1, 0\]\)"),
        ({"backbones": ["mian"]}, r"\n  backbones: \['mian'\] are not entries of models \(known: main\) \(got"),
        ({"claim": ["joint", "joint"]}, r"\n  claim: compares 'joint' with itself; name two different arms \(got"),
        ({"retrieval": {"recall_ks": [1, 3, 1]}}, r"retrieval\.recall_ks: 1 listed more than once"),
        (  # a hybrid's recall@100 came from lists fused 100 deep, not the 50 its top_k searches fuse
            {"retrieval": {"recall_ks": [1, 100], "compare_backends": ["hybrid"]}},
            r"retrieval: recall_ks 100 above hybrid\.candidates 50: .* raise hybrid\.candidates to 100",
        ),
        (
            {"retrieval": {"backend": "hybrid", "top_k": 60, "recall_ks": [1, 70]}},
            r"retrieval: recall_ks 70, top_k 60 above hybrid\.candidates 50",
        ),
        (  # ignored: the synthetic world writes both splits under its own benchmark names
            {"data": {"questions": [{"kind": "synthetic", "limit": 30, "split": "test"}]}},
            r"data\.questions\.0: a synthetic source takes no limit, split: it writes both splits",
        ),
        (  # prepare_data then refused every id as given twice, naming no param
            {"data": {"questions": [{"kind": "synthetic"}, {"kind": "synthetic"}]}},
            r"data: questions 0 and 1 read the same questions \(synthetic\); list each source once",
        ),
        ({"tracking": {"uri": "sqlite://"}}, r"tracking\.uri: sqlite:// is an in-memory database: every run would"),
        ({"tracking": {"uri": " "}}, r"tracking\.uri: blank; use sqlite:///mlflow\.db"),
        (  # a 27-line traceback from the stage's server check
            {"tracking": {"uri": "http://[::1"}},
            r"tracking\.uri: http://\[::1 is not a valid URL \(Invalid IPv6 URL\)",
        ),
        (  # ignored in silence: every row of the NQ-open file was read
            {"data": {"questions": [{**A_FILE, "kind": "nq_open", "source_filter": "tq"}]}},
            r"data\.questions\.0\.source_filter: a nq_open source does not read source_filter \(it would be "
            r"ignored\); only kinds qa_jsonl, searchr1_parquet take it \(got 'tq'\)",
        ),
        (
            {"data": {"questions": [{**A_FILE, "kind": "qa_jsonl", "dataset_config": "nq"}]}},
            r"data\.questions\.0\.dataset_config: a qa_jsonl source does not read dataset_config .* only kind "
            r"hf_dataset takes it",
        ),
        (  # a pin that nothing reads would say the questions were pinned
            {"data": {"questions": [{**A_FILE, "kind": "flashrag_jsonl", "dataset_revision": "v1"}]}},
            r"data\.questions\.0\.dataset_revision: a flashrag_jsonl source does not read dataset_revision .* only "
            r"kind hf_dataset takes it",
        ),
        (  # the hub was read; prepare_data named the unread path as its input
            {"data": {"questions": [{**A_FILE, "kind": "hf_dataset", "dataset_id": "d", "dataset_split": "test"}]}},
            r"data\.questions\.0\.path: a hf_dataset source does not read path .* only kinds flashrag_jsonl, "
            r"searchr1_parquet,",
        ),
        (  # each was ignored in silence: SmolLM2 loaded whatever name_or_path said
            {"models": {"main": {"name_or_path": "x", "revision": "abc"}}},
            r"models\.main: name_or_path, revision: not read by source tiny_qwen2 \(name_or_path is for source hf;",
        ),
    ],
)
def test_values_a_stage_would_fail_on_late_are_refused_at_load(tmp_path, override, named):
    """Each was accepted: the first stage to use it failed with a traceback, some after their work."""
    with pytest.raises(ConfigError, match=named):
        load_config(write_params(tmp_path, override))


def test_a_number_yaml_read_as_text_gets_a_hint(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    params.write_text("profile: smoke\ntrain:\n  grpo:\n    learning_rate: 1e-4\n")
    with pytest.raises(ConfigError, match=r"\(got '1e-4'\); YAML reads 1e-4 as text: write 1\.0e-4"):
        load_config(params)


def test_a_yaml_merge_key_merges_and_a_key_given_twice_is_still_refused(tmp_path):
    """`<<: {...}` (or `<<: *anchor`) is YAML that yaml.safe_load reads; the duplicate-key check refused it as
    "not valid YAML: could not determine a constructor for the tag ...merge"."""
    params = write_params(tmp_path)
    profile = tmp_path / "profiles" / "smoke.yaml"
    profile.write_text(
        "train:\n  dev: &dev {questions: 3, every: 3}\nwarmstart:\n  <<: {questions: 8, epochs: 2}\n  epochs: 1\n"
    )
    cfg = load_config(params)
    assert (cfg.train.dev.every, cfg.warmstart.questions, cfg.warmstart.epochs) == (3, 8, 1)  # its own key wins
    profile.write_text("warmstart: {questions: 8}\nwarmstart: {epochs: 2}\n")
    with pytest.raises(
        ConfigError, match=r"smoke\.yaml: not valid YAML: key 'warmstart' given twice \(first on line 1"
    ):
        load_config(params)


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///mlflow.db",
        "http://127.0.0.1:5000",
        "https://u:p@mlflow.example",
        "postgresql://db/mlflow",
        "postgresql+psycopg2://u:p@db:5432/mlflow",
        "mysql+pymysql://db/m",
        "mssql+pyodbc://db/m",
        "databricks",
        "databricks://profile",
    ],
)
def test_a_tracking_store_mlflow_accepts_loads(tmp_path, uri):
    assert load_config(write_params(tmp_path, {"tracking": {"uri": uri}})).tracking.uri == uri


@pytest.mark.parametrize("uri", ["ftp://u:secret@x", "s3://bucket/mlruns", "postgres://db/m", "sqlite+://x.db"])
def test_a_tracking_uri_of_no_tracking_store_is_refused_at_load(tmp_path, uri):
    """ftp://x was accepted: the stage failed after its work with MLflow's UnsupportedModelRegistryStoreURI."""
    with pytest.raises(
        ConfigError,
        match=r"tracking\.uri: scheme '.*' is not an MLflow tracking store; use one of "
        r"sqlite, postgresql, mysql, mssql, http, https, databricks",
    ) as error:
        load_config(write_params(tmp_path, {"tracking": {"uri": uri}}))
    assert "secret" not in str(error.value)
    assert "(got '" + uri.replace(":secret", ":***") + "')" in str(error.value)


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"])
def test_an_empty_params_or_profile_file_is_refused(tmp_path, text):
    """It became the whole default experiment without a word; an empty profile, the default under its name."""
    params = write_params(tmp_path)
    params.write_text(text)
    with pytest.raises(ConfigError, match=r"params\.yaml is empty: it holds no params, only blank lines or comments"):
        load_config(params)
    params.write_text("profile: smoke\n")  # a partial file still overlays the code defaults
    assert load_config(params).profile == "smoke"
    (tmp_path / "profiles" / "smoke.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"smoke\.yaml is empty: .*or write \{\} for a profile that changes nothing"):
        load_config(params)
    (tmp_path / "profiles" / "smoke.yaml").write_text("{}  # overlays nothing\n")
    assert load_config(params).data.synthetic.n_people == Config().data.synthetic.n_people


def test_a_blank_profile_is_named_with_the_known_ones(tmp_path):
    """`profile:` with no value said: no profile None (profiles/None.yaml not found)."""
    params = write_params(tmp_path)
    params.write_text(params.read_text().replace("profile: smoke", "profile:"))
    says = r"profile: blank in .*params\.yaml; set it to a profile: default, paper-1\.5b, paper-3b, realqa, smoke$"
    with pytest.raises(ConfigError, match=says):
        load_config(params)
    for blank in ("", "  "):
        with pytest.raises(ConfigError, match=says):
            load_config(params, {"profile": blank})


def test_a_params_file_not_utf8_names_line_column_and_offset(tmp_path):
    params = write_params(tmp_path)
    params.write_bytes(b"profile: smoke\n# caf\xe9\n")
    with pytest.raises(
        ConfigError, match=r"params\.yaml: not UTF-8 \(byte 0xe9\) on line 2, column 6 \(byte offset 20\)"
    ):
        load_config(params)
    params.write_bytes("profile: smoke\n# ça caf".encode() + b"\xe9\n")  # ç is 2 bytes, 1 character
    with pytest.raises(ConfigError, match=r"on line 2, column 9 \(byte offset 24\)"):
        load_config(params)


def test_a_params_change_the_profile_would_undo_is_refused(tmp_path):
    """`dvc exp run -S train.grpo.steps=5` under the smoke profile trained 2 steps: the profile won in silence."""
    params = write_params(tmp_path)
    raw = yaml.safe_load(params.read_text())
    raw["train"]["grpo"]["steps"] = 5  # what `dvc exp run -S` writes into params.yaml
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError, match=r"train\.grpo\.steps: .* sets 5 but profile smoke sets 2, and the profile"):
        load_config(params)
    load_config(write_params(tmp_path / "same", {"train": {"grpo": {"steps": 5}}}))  # set in both: no conflict


def test_question_sources_the_profile_would_replace_are_refused(tmp_path):
    """The realqa profile replaced params.yaml's own data.questions and data.corpus in silence (lists of
    mappings were not compared)."""
    params = write_params(tmp_path, profile="realqa")
    load_config(params)  # params.yaml's sources as the default writes them: nothing to undo
    raw = yaml.safe_load(params.read_text())
    raw["data"]["questions"].append({"kind": "qa_jsonl", "path": "mine.jsonl", "benchmark": "mine", "split": "test"})
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError, match=r"data\.questions: .* sets \[\{'kind': 'synthetic'\}, .*mine\.jsonl.*"):
        load_config(params)


def test_an_arm_without_an_untrained_start_is_refused(tmp_path):
    """`references: {}` ran the whole pipeline, then compare failed with a StopIteration traceback."""
    params = write_params(tmp_path)
    raw = yaml.safe_load(params.read_text())
    raw["references"] = {"single_agent": {"topology": "single_agent"}}
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError, match=r"references has no harness of topology central: the report measures"):
        load_config(params)
