"""The defaults ``cogproxy policy tune`` and ``policy simulate`` state in their help, in a leaf:
building the command line's parser imports none of the policy or the stores."""

from __future__ import annotations

TOKENS_IN = 1000
TOKENS_OUT = 250
"""Tokens an escalation's extra call is priced at unless told (the store keeps no usage)."""
DEFAULT_DELTA = 0.05
"""``policy tune``'s guarantee holds with probability 1 - this unless told (the console's too)."""
