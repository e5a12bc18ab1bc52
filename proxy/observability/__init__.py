"""Logging and metrics setup."""
