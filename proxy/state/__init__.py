"""Shared state behind a small Store interface: in memory by default, in Redis for replicas."""
