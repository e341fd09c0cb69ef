"""What the methods share: frozen-teacher loading, KD losses, parameter counting, GLUE metrics."""
