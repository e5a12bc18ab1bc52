"""cognitive-proxy: a sidecar reverse proxy that runs Cognitive Modules contracts."""

__version__ = "0.3.1"
