"""Checkpoints: the coordinator (driver side), pending checkpoints, durable storage."""
