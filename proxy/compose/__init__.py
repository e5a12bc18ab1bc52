"""Module composition (composition.md): declarations, load-time resolution, execution.

``spec``, ``version``, ``paths``, ``condition`` and ``directives`` are leaves (parsed config);
``resolve`` checks a registry's composites; ``run`` executes one, each step a ``run_module`` call.
"""
