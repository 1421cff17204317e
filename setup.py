"""spot-jax: soft prompts (Prompt Tuning, SPoT, SMoP, Residual) for frozen T5 in JAX/Flax."""
import setuptools

setuptools.setup(
    name="spot-jax",
    version="0.1.0",
    description="Soft-prompt adaptation of frozen T5 models in JAX/Flax: Prompt Tuning, SPoT, "
                "SMoP, Residual Prompt Tuning.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["spot_jax", "spot_jax.*", "tasks", "tasks.*"]),
    package_data={"": ["*.gin"],
                  # The embedded toy T5: vocabulary, README, loss log and its T5X checkpoint
                  # (zarr arrays are folders holding a hidden .zarray and chunk files); the
                  # embedded toy decoder: the same files, its checkpoint a Hugging Face folder.
                  "spot_jax": ["embedded/toy_t5/*", "embedded/toy_t5/checkpoint/*",
                               "embedded/toy_t5/checkpoint/*/*",
                               "embedded/toy_t5/checkpoint/*/.zarray",
                               "embedded/toy_decoder/*", "embedded/toy_decoder/checkpoint/*"]},
    install_requires=[
        "jax>=0.6,<0.11",
        "flax>=0.10,<0.13",
        "optax>=0.2.4,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
        "tensorstore>=0.1.70",
        "gin-config>=0.5.0",
        # JAX's persistent compilation cache (spot_jax.infer's, COMPILATION_CACHE_DIR) locks its
        # files with it; without it JAX warns on every start and writes no cache.
        "filelock>=3.12",
        "seqio>=0.0.19",
        "tensorflow-datasets>=4.9.6",
        "importlib_resources",
        "sentencepiece>=0.2",
        "safetensors>=0.4",
        "msgpack>=1.0",
        "numpy>=1.26",
        "scipy>=1.11",
        "scikit-learn>=1.3",
        "tensorboard>=2.15",
        "matplotlib>=3.7",
        # chat templates (tokenizer_config.json), rendered as transformers renders them
        "jinja2>=3.1.6",
        # python -m spot_jax.serve: the HTTP front and its metrics
        "starlette>=0.37",
        "uvicorn>=0.29",
        "httptools>=0.6",  # uvicorn's faster HTTP/1.1 parser (picked by http="auto")
        "uvloop>=0.19; sys_platform != 'win32'",  # uvicorn's faster event loop (loop="auto")
        "prometheus-client>=0.20",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",  # .ci/run: two workers, one test file each at a time
            "ruff>=0.6",  # .ci/run: lines of at most 100 characters (ruff.toml)
            "torch==2.13.0",
            "transformers>=4.45,<6",
            "peft==0.21.2",  # PEFT adapter interop tests (tests/serve/test_peft.py)
            "openai>=1.30",  # the HTTP server's OpenAI-client test (tests/serve/test_http.py)
            "httpx>=0.27",
            "qwix>=0.1.8,<0.2",  # QUANTIZATION tests (tests/backbones/test_quantization.py)
        ],
        # Weight-only int8/int4/nf4 frozen backbones (QUANTIZATION): qwix does the quantized
        # matmuls; 0.1.8 is the release tested with this jax/flax.
        "quant": ["qwix>=0.1.8,<0.2"],
        "hf": ["datasets>=2.18"],
        # T5 parity tests (tests/backbones/t5/test_parity_tasks.py): what t5's preprocessors,
        # postprocessors and metrics import. t5==0.9.4 itself pins tfds-nightly/seqio-nightly,
        # so it is installed separately with `pip install --no-deps t5==0.9.4` (see .ci/run).
        "t5parity": ["babel", "sacrebleu", "rouge-score", "editdistance", "immutabledict"],
        # t5x itself is installed from its repository (docs/t5x.md); these are what it needs
        # beyond spot-jax's own dependencies.
        "t5x": ["grain", "cached-property", "chex", "aqtp", "fiddle", "clu"],
        # The peers of `python -m benchmarks` (run from a checkout; benchmarks/ is not installed).
        "bench": ["torch==2.13.0", "transformers>=4.45,<6", "peft==0.21.2",
                  "aiohttp>=3.9"],  # benchmarks.serve_http's load generator
    },
)
