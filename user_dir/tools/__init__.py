"""Command-line tools of the plug-in (measurement, checkpoint averaging)."""
