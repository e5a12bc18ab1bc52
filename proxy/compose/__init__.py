"""Module composition (composition.md): declarations, load-time resolution, execution.

``spec``, ``version``, ``paths``, ``condition`` and ``directives`` are leaves (parsed config);
``proxy.module.resolve`` checks a registry's composites (the registry's own step, so the module
layer never imports this package's runner); ``run`` executes one, each step a ``run_module`` call.
"""
