"""baselines command-line tools (python -m user_dir.baselines.tools.NAME)."""
