"""Executors start the workers of a plan and drive the job (coordinator, recovery)."""
