"""ghost command-line tools (python -m user_dir.ghost.tools.NAME)."""
