"""Deployment: fairseq export (fc-export), Hugging Face transformers (fc-export-hf), ONNX Runtime (fc-export-onnx), CTranslate2 (fc-ct2)."""
