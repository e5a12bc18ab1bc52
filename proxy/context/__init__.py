"""The context protocol (spec context-protocol.md): explicit context in, emitted context out.

``spec``: the parsed ``context`` section of a module manifest; ``identity``: sessions, users and
key namespaces; ``sanitise``: what the model may see; ``builder``: context the proxy supplies;
``check``: validation of ``_context``; ``store``: where context lives; ``cache``: the result cache;
``step``: the two pipeline steps (before the upstream call, after the decision).
"""
