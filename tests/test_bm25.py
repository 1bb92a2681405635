"""The bm25s backend on a handful of passages: ranking, k, empty queries, save/load, numba = numpy (numba's
scorer compiled once per machine), and the index manifest every backend shares (settings and corpus digest
checked on open)."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from centralrl.config import RetrievalConfig
from centralrl.errors import ConfigError, RetrievalError
from centralrl.io import atomic_directory, read_json, write_json, write_jsonl
from centralrl.retrieval import build_index, open_retriever, save_index
from centralrl.retrieval.bm25 import Bm25sIndex
from centralrl.retrieval.recall import check_ks, recall_table
from centralrl.schema import Passage, Question, SubQuestion, read_passages

PASSAGES = [
    Passage("p1", "Telmarra", "Telmarra is a city in Oshvania, on the river Dun."),
    Passage("p2", "Varnel Okosi", "Varnel Okosi is a film director born in Telmarra."),
    Passage("p3", "The Ember Gate", "The Ember Gate is a film directed by Varnel Okosi."),
    Passage("p4", "Oshvania", "Oshvania is a country whose capital is Brelm."),
]


@pytest.fixture(scope="module")
def index():
    return Bm25sIndex.build(PASSAGES, k1=1.2, b=0.75, stemming=True, backend="numpy")


def test_ranks_the_distinctive_passage_first_and_keeps_query_order(index):
    results = index.search(["who directed The Ember Gate", "capital of Oshvania"], k=2)
    assert [hits[0].id for hits in results] == ["p3", "p4"]
    assert all(len(hits) <= 2 for hits in results)
    assert results[0][0].score >= results[0][-1].score


def test_stemming_matches_inflections(index):
    assert index.search(["directors"], k=1)[0][0].id in {"p2", "p3"}


def test_queries_without_known_terms_return_nothing(index):
    assert index.search(["zebra", "the of a", ""], k=3) == [[], [], []]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_stop_word_queries_return_nothing_and_leave_the_others_searched(backend):
    # a model's sub-questions can be empty or only stop words; bm25s (numba) refuses a batch whose first has no token
    index = Bm25sIndex.build(PASSAGES, k1=1.2, b=0.75, stemming=True, backend=backend)
    assert index.search(["", "the of a"], 3) == [[], []]
    hits = index.search(["the of a", "Oshvania capital", ""], 3)
    assert [len(row) for row in (hits[0], hits[2])] == [0, 0]
    assert hits[1] == index.search(["Oshvania capital"], 3)[0] and hits[1][0].id == "p4"


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_equal_scores_rank_in_passage_order_past_the_fetch_margin(backend):
    """30 passages score the same for the query and one scores higher: the hits are the higher one, then the tied
    ones in corpus order, with either scorer (bm25s ordered ties as its selection happened to: numba and numpy
    differently); 30 ties reach past the first fetch of k + TIE_MARGIN, so the search goes deeper."""
    twins = [Passage(f"t{i:02d}", "Twin", "Brelm lies on the river Dun.") for i in range(30)]
    best = Passage("best", "Brelm", "Brelm, Brelm: the river Dun runs through Brelm.")
    filler = [Passage(f"f{i}", f"Filler {i}", f"An unrelated town number {i}.") for i in range(20)]
    index = Bm25sIndex.build(filler[:10] + twins[::-1] + [best] + filler[10:], 1.2, 0.75, True, backend)
    for k in (1, 3, 12, 31):
        hits = index.search(["Brelm river"], k)[0]
        assert [h.id for h in hits] == ["best"] + [f"t{i:02d}" for i in range(29, 29 - (k - 1), -1)]
        assert len({h.score for h in hits[1:]}) <= 1


def test_k_larger_than_corpus(index):
    assert len(index.search(["Telmarra Oshvania Okosi Ember"], k=50)[0]) == 4


NUMBA_SEARCH = """
import json, sys
from bm25s.numba.retrieve_utils import _retrieve_internal_jitted_serial as scorer
from centralrl.retrieval.bm25 import Bm25sIndex

hits = Bm25sIndex.load(sys.argv[1], "numba").search(json.loads(sys.argv[2]), 3)
rows = [[[hit.id, hit.score] for hit in row] for row in hits]
print(json.dumps({"hits": rows, "loaded_from_cache": sum(scorer.stats.cache_hits.values())}))
"""


def test_numba_scorer_is_compiled_once_then_loaded_and_agrees_with_numpy(index, tmp_path):
    """Two processes searching with numba: the first compiles the scorer (bm25s compiled it in every process, ~12 s
    each here), the second loads it from numba's cache; both give the same hits, and numpy's."""
    queries = ["film director Telmarra", "Oshvania river", "Ember Gate"]
    index.save(tmp_path / "index")
    env = os.environ | {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}  # numba's first choice of cache folder
    command = [sys.executable, "-c", NUMBA_SEARCH, str(tmp_path / "index"), json.dumps(queries)]
    first, second = (
        json.loads(subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout)
        for _ in range(2)
    )
    assert (first["loaded_from_cache"], second["loaded_from_cache"]) == (0, 1)
    assert first["hits"] == second["hits"]
    numpy_hits = index.search(queries, 3)
    assert [[hit_id for hit_id, _ in row] for row in first["hits"]] == [[h.id for h in row] for row in numpy_hits]
    for numba_row, numpy_row in zip(first["hits"], numpy_hits):
        assert [score for _, score in numba_row] == pytest.approx([h.score for h in numpy_row], rel=1e-5)


def test_save_and_open_gives_the_same_results(tmp_path):
    cfg = RetrievalConfig()
    index = build_index(PASSAGES, cfg)
    with atomic_directory(tmp_path / "index") as tmp:
        save_index(index, cfg, len(PASSAGES), tmp)
    reopened = open_retriever(cfg, tmp_path / "index")
    queries = ["Varnel Okosi", "river Dun"]
    assert reopened.search(queries, 2) == index.search(queries, 2)


def test_open_refuses_an_index_built_with_other_settings(tmp_path):
    cfg = RetrievalConfig()
    save_index(build_index(PASSAGES, cfg), cfg, len(PASSAGES), tmp_path)
    with pytest.raises(RetrievalError, match=r"built with \{'k1': 1.2\}"):
        open_retriever(RetrievalConfig(k1=0.9), tmp_path)


def test_manifest_records_the_corpus_file_digest_and_open_refuses_another_corpus(tmp_path):
    cfg = RetrievalConfig(bm25s_backend="numpy")
    save_index(build_index(PASSAGES, cfg), cfg, len(PASSAGES), tmp_path / "index")
    write_jsonl(tmp_path / "corpus.jsonl", (p.to_json() for p in PASSAGES))  # as prepare_data writes it
    write_jsonl(tmp_path / "other.jsonl", (p.to_json() for p in PASSAGES[:3]))
    file_sha256 = hashlib.sha256((tmp_path / "corpus.jsonl").read_bytes()).hexdigest()
    assert read_json(tmp_path / "index" / "manifest.json")["corpus_sha256"] == file_sha256
    assert open_retriever(cfg, tmp_path / "index", tmp_path / "corpus.jsonl").search(["Brelm"], 1)[0][0].id == "p4"
    with pytest.raises(RetrievalError, match=r"built with \{'corpus_sha256': '[0-9a-f]{64}'\}, the corpus .*other"):
        open_retriever(cfg, tmp_path / "index", tmp_path / "other.jsonl")


def test_open_refuses_an_index_that_lacks_the_questions_supporting_passages(tmp_path):
    """Train and evaluate are not given the corpus: an index of another corpus was searched without a word."""
    cfg = RetrievalConfig(bm25s_backend="numpy")
    save_index(build_index(PASSAGES[:3], cfg), cfg, 3, tmp_path / "index")
    held = [Question("a", "Who?", ("x",), "toy", "test", supporting_passage_ids=(PASSAGES[0].id,))]
    other = held + [Question("b", "Who?", ("x",), "toy", "test", supporting_passage_ids=("p4", "p9", "p4"))]
    assert open_retriever(cfg, tmp_path / "index", questions=(held, "q.jsonl")).missing(["p4", PASSAGES[1].id]) == [
        "p4"
    ]
    with pytest.raises(
        RetrievalError,
        match=r"index: 2 of the 3 supporting passages of q\.jsonl are not in this index"
        r" \('p4', 'p9'\): an index of another corpus\?",
    ):
        open_retriever(cfg, tmp_path / "index", questions=(other, "q.jsonl"))


def test_a_hand_made_corpus_file_matches_the_index_built_from_it(tmp_path):
    rows = [{"text": p.text, "id": p.id, "title": p.title} for p in PASSAGES]  # json.dumps spacing, other key order
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = RetrievalConfig(bm25s_backend="numpy")
    save_index(build_index(read_passages(tmp_path / "corpus.jsonl"), cfg), cfg, len(rows), tmp_path / "index")
    assert open_retriever(cfg, tmp_path / "index", tmp_path / "corpus.jsonl").search(["Brelm"], 1)[0][0].id == "p4"


def test_a_damaged_index_is_named_before_any_search(tmp_path):
    """A truncated array was numpy's ValueError, a manifest that is no object an AttributeError, and a
    passages file cut short opened fine, then failed mid-rollout at the first hit past its end (IndexError)."""
    cfg = RetrievalConfig(bm25s_backend="numpy")
    damages = {
        "manifest.json": (lambda f: f.write_text("[]\n"), r"manifest\.json: not an index manifest"),
        "passages.jsonl": (lambda f: write_jsonl(f, [p.to_json() for p in PASSAGES[:2]]), r"4 indexed, 2 in passages"),
        "data.csc.index.npy": (lambda f: f.write_bytes(b"\x93NUMPY"), r"a damaged bm25s index \(ValueError"),
        # a passage's text edited, the count kept: searched and shown to the roles without a word
        "edited": (
            lambda f: write_jsonl(
                f.with_name("passages.jsonl"), [{**p.to_json(), "text": "edited"} for p in PASSAGES]
            ),
            r"holds other passages than its manifest\.json recorded",
        ),
        # bm25s's own k1 (the stored scores' one) and the manifest's passage count: read by nothing after the build
        "params.index.json": (
            lambda f: f.write_text(f.read_text().replace('"k1": 1.2', '"k1": 2.0')),
            r"built with \{'k1': 1\.2\}, its bm25s params\.index\.json has \{'k1': 2\.0\}",
        ),
        "count": (
            lambda f: write_json(
                f.with_name("manifest.json"), read_json(f.with_name("manifest.json")) | {"passages": 3}
            ),
            r"holds other passages than its manifest\.json recorded",
        ),
    }
    for name, (damage, says) in damages.items():
        save_index(build_index(PASSAGES, cfg), cfg, len(PASSAGES), tmp_path / name)
        damage(tmp_path / name / name)
        with pytest.raises(RetrievalError, match=says):
            open_retriever(cfg, tmp_path / name)


def test_open_without_index_says_how_to_build_it(tmp_path):
    with pytest.raises(RetrievalError, match="dvc repro build_index"):
        open_retriever(RetrievalConfig(), tmp_path)


def test_empty_corpus_is_refused():
    with pytest.raises(RetrievalError, match="empty corpus"):
        Bm25sIndex.build([], 1.2, 0.75, True)


def test_recall_table_hand_computed(index):
    questions = [
        # both gold passages share terms with the question: top-1 holds one of two -> recall@1 = 0.5
        Question(
            "q1",
            "Where was the director of The Ember Gate born?",
            ("Telmarra",),
            "b1",
            "test",
            ("p3", "p2"),
            (
                SubQuestion("Who directed The Ember Gate?", "Varnel Okosi", ("p3",)),
                SubQuestion("Where was Varnel Okosi born?", "Telmarra", ("p2",)),
            ),
        ),
        # gold p1 only: 'capital' is only in p4, so recall@1 = 0; 'Oshvania' reaches p1 within the top 3
        Question("q2", "What is the capital of Oshvania?", ("Brelm",), "b1", "test", ("p1",)),
        Question("q3", "No evidence here?", ("x",), "b2", "test"),
    ]
    table = recall_table(questions, index, ks=[1, 3])
    assert table["b1"]["questions"] == 2 and table["b1"]["with_passages"] == 2
    assert table["b1"]["recall@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert table["b1"]["recall@3"] == pytest.approx((1.0 + 1.0) / 2)
    assert table["b1"]["subquestion_recall@1"] == 1.0
    assert table["b2"] == {"questions": 1, "with_passages": 0}


def test_a_recall_k_that_covers_the_whole_corpus_is_refused():
    """recall@10 over 8 passages is 1 whatever the retriever does: build_index refuses it before its build."""
    check_ks([1, 3, 7], 8, "corpus.jsonl")
    with pytest.raises(ConfigError, match=r"recall_ks: \[8, 10\] not below the 8 passages of corpus\.jsonl"):
        check_ks([1, 8, 10], 8, "corpus.jsonl")


def test_saved_index_bytes_do_not_depend_on_the_hash_seed(tmp_path):
    """bm25s numbers its vocabulary in set order; ours is sorted, so two processes write the same bytes."""
    import os
    import subprocess
    import sys

    script = (
        "import sys; from centralrl.retrieval.bm25 import Bm25sIndex; from centralrl.schema import Passage; "
        "ps = [Passage(str(i), f't{i}', f'word{i} alpha beta gamma{i % 3} delta{i % 5}') for i in range(30)]; "
        "Bm25sIndex.build(ps, 1.2, 0.75, True, 'numpy').save(sys.argv[1])"
    )
    for seed in ("1", "2"):
        env = os.environ | {"PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", script, str(tmp_path / seed)], check=True, env=env)
    names = sorted(p.name for p in (tmp_path / "1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "2").iterdir())
    for name in names:
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes(), name
