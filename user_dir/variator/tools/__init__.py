"""variator command-line tools (python -m user_dir.variator.tools.NAME)."""
