"""apc command-line tools (python -m user_dir.apc.tools.NAME)."""
