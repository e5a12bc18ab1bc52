"""cognitive-proxy: a sidecar reverse proxy that runs Cognitive Modules contracts."""

__version__ = "0.4.0"
