"""Streamed module answers (spec v2.5 §3.2): negotiation, chunks, sessions, recovery."""
