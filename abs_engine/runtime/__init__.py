"""The worker-side runtime: channels, barrier alignment, the task run loop."""
