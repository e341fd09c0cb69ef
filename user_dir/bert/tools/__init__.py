"""bert command-line tools (python -m user_dir.bert.tools.NAME)."""
