"""Media inputs of modules (spec v2.5 §4, §11.1): validated, safely fetched, sent as provider parts.

    find (walk the input) -> read (base64 | file | url, size-capped while reading)
      -> sniff (magic bytes) -> checksum -> header facts -> Media (bytes + facts)

Nothing here calls a model; ``proxy.pipeline`` runs ``prepare_media`` before the ladder.
"""
