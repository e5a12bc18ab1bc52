"""Offline calibration tools: reliability figures from verdicts, maps (``cogproxy calibration``)."""
