"""speculative_t5x: exact speculative decoding for T5 1.1 in JAX/Flax, the T5X way."""

import setuptools

setuptools.setup(
    name="speculative_t5x",
    version="0.1.0",
    description="Exact speculative decoding (Leviathan et al. 2023) for T5 1.1 in JAX/Flax, T5X-compatible.",
    # The gin configs and the demo task's data ship inside the package (speculative_t5x/configs,
    # speculative_t5x/data), so an installed package finds them from any working directory.
    packages=setuptools.find_packages(include=["speculative_t5x", "speculative_t5x.*"])
    + ["speculative_t5x.configs", "speculative_t5x.data"],
    package_dir={"speculative_t5x.configs": "configs", "speculative_t5x.data": "data"},
    package_data={"speculative_t5x.configs": ["*/*.gin"], "speculative_t5x.data": ["demo_ende/*"]},
    python_requires=">=3.11",
    install_requires=[
        "jax>=0.4.30",
        "flax>=0.10",
        "optax>=0.2",
        "orbax-checkpoint>=0.11",
        "gin-config>=0.5",
        "seqio>=0.0.19",
        "tensorflow-datasets>=4.9",
        "tensorflow>=2.16",
        "tensorstore>=0.1.60",
        "sentencepiece>=0.2",
        "numpy>=1.26",
        "absl-py>=2.0",
        "tqdm>=4.66",
        "msgpack>=1.0",
        "ml_dtypes>=0.4",
        "safetensors>=0.4",
        "etils[epath]>=1.5",
        "sacrebleu>=2.4",
        "rouge-score>=0.1.2",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3",
            "hypothesis>=6",
            "scipy>=1.11",
            "transformers>=4.40",
            "torch==2.13.0",
            "matplotlib>=3.8",
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6",
            "pyink>=24.10",
            "ruff>=0.6",
        ],
    },
)
