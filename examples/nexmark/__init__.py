"""Nexmark queries on abs-engine (operators/nexmark.py generates the events), each with a
plain Python batch oracle over the same events."""
