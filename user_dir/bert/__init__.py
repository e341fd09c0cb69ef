"""Pretrained BERT-family encoders in fairseq: ``--arch hf_bert`` / ``hf_minilm_l6`` (hf_bert_model.py),
filled by user_dir/bert/tools/import_hf.py from Hugging Face checkpoints."""
from . import hf_bert_model  # noqa: F401  registers the hf_bert model and its archs
