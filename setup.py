"""speculative_t5x: exact speculative decoding for T5 1.1 in JAX/Flax, the T5X way."""

import pathlib

import setuptools

# What decoding, its timing and `make demo` need (no TensorFlow): requirements-decoding.txt, which
# `make demo` installs alone.
DECODING = [
    line.strip()
    for line in (pathlib.Path(__file__).parent / "requirements-decoding.txt")
    .read_text()
    .splitlines()
    if line.strip() and not line.startswith("#")
]
# seqio's tasks (read through tf.data), training and evaluation.
TASKS = [
    "seqio>=0.0.19",
    "tensorflow-datasets>=4.9",
    "tensorflow>=2.16",
    "sacrebleu>=2.4",
    "rouge-score>=0.1.2",
]

setuptools.setup(
    name="speculative_t5x",
    version="0.1.0",
    description="Exact speculative decoding (Leviathan et al. 2023) for T5 1.1 in JAX/Flax, T5X-compatible.",
    # Apache License 2.0, as T5X (LICENSE).
    license="Apache-2.0",
    license_files=["LICENSE"],
    # The gin configs and the demo task's data ship inside the package (speculative_t5x/configs,
    # speculative_t5x/data), so an installed package finds them from any working directory.
    packages=setuptools.find_packages(include=["speculative_t5x", "speculative_t5x.*"])
    + ["speculative_t5x.configs", "speculative_t5x.data"],
    package_dir={"speculative_t5x.configs": "configs", "speculative_t5x.data": "data"},
    package_data={"speculative_t5x.configs": ["*/*.gin"], "speculative_t5x.data": ["demo_ende/*"]},
    python_requires=">=3.11",
    install_requires=DECODING + TASKS,
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
            "import-linter>=2.1",
            # XLA:TPU on any host (tests/test_tpu_compile.py, scripts/aot_check.py --topology):
            # the release jax 0.10.2 pins in its `tpu` extra (tpu_topology.LIBTPU_FOR_JAX).
            "libtpu==0.0.42.*; platform_system == 'Linux' and platform_machine == 'x86_64'",
        ],
    },
)
